"""Unit tests of rlhf_ppo_mujoco.py's pieces: preference model, reward ensemble, labels, teacher, pair selection and
label schedule (the preference loss and the synthetic teacher also of the other two scripts, which share them).
Expectations come from the definitions (C17, B-Pref) or from seeded statistics; nothing is trained on an environment."""

import importlib
import math
import threading

import gymnasium as gym
import numpy as np
import pytest
import rlhf_ppo_mujoco as rl
import torch
from helpers import assert_the_pairs_kept_are_the_most_disagreed_on
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def seeded_torch():
    torch.manual_seed(0)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------------------------------
# helpers


def make_segments(rng, n, length, obs_dim=3, act_dim=1, real_steps=None):
    """Random segments (n, length, ...) with true reward obs[..., 0]; `real_steps` (n,) ends each one in a termination
    after that many steps (the rest are absorbing steps: mask 0, everything zeroed, as sample_segments makes them)."""
    real_steps = np.full(n, length) if real_steps is None else real_steps
    mask = (np.arange(length) < real_steps[:, None]).astype(np.float32)
    obs = rng.normal(size=(n, length, obs_dim)).astype(np.float32) * mask[..., None]
    act = rng.normal(size=(n, length, act_dim)).astype(np.float32) * mask[..., None]
    return {"obs": obs, "act": act, "mask": mask, "true_reward": obs[..., 0].copy()}


def random_terminations(rng, n, length):
    """Real steps per segment: about half the segments end in a termination somewhere inside."""
    return np.where(rng.random(n) < 0.5, rng.integers(1, length + 1, n), length)


def fill_buffer(rng, n, length=5, size=3, obs_dim=3, act_dim=1, terminations=False):
    """A LabelBuffer holding n pairs of random segments labelled by the perfect synthetic teacher."""
    real = (lambda: random_terminations(rng, n, length)) if terminations else (lambda: None)
    left = make_segments(rng, n, length, obs_dim, act_dim, real())
    right = make_segments(rng, n, length, obs_dim, act_dim, real())
    mu = rl.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"])
    buffer = rl.LabelBuffer(n, length, obs_dim, act_dim, size, rng)
    assert buffer.add(left, right, mu) == n
    return buffer


def random_steps(rng, n, obs_dim=3, act_dim=1):
    return (torch.as_tensor(rng.normal(size=(n, dim)), dtype=torch.float32) for dim in (obs_dim, act_dim))


def make_rollout(rng, steps, envs, obs_dim=3, act_dim=1, p_terminated=0.0, p_truncated=0.0):
    """A rollout dict shaped (steps, envs, ...) whose true reward tells where a step came from: code(t, e) = 1 + 10t + e."""
    assert envs < 10
    code = 1 + 10 * np.arange(steps)[:, None] + np.arange(envs)[None, :]
    return {
        "obs": rng.normal(size=(steps, envs, obs_dim)).astype(np.float32),
        "act": rng.normal(size=(steps, envs, act_dim)).astype(np.float32),
        "true_reward": code.astype(np.float32),
        "terminated": rng.random((steps, envs)) < p_terminated,
        "truncated": rng.random((steps, envs)) < p_truncated,
    }


def member_mlp(weights, biases, k, x):
    """Member k's MLP, computed layer by layer from its own slice of the batched parameters."""
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = x @ w[k] + b[k, 0]
        if i < len(weights) - 1:
            x = torch.where(x > 0, x, 0.01 * x)
    return x[..., 0]


def member_reward(ensemble, k, obs, act):
    """Member k's per-step reward."""
    return member_mlp(ensemble.weights, ensemble.biases, k, torch.cat([torch.as_tensor(obs), torch.as_tensor(act)], -1))


def member_potential(ensemble, k, obs):
    """Member k's potential of observations (--reward-potential)."""
    return member_mlp(ensemble.potential_weights, ensemble.potential_biases, k, torch.as_tensor(obs))


def member_return(ensemble, k, segments):
    """Member k's return: its reward on real steps plus its absorbing-state reward on each absorbing step."""
    seg = rl.to_torch(segments)
    real = member_reward(ensemble, k, seg["obs"], seg["act"]) * seg["mask"]
    return real.sum(-1) + ensemble.absorbing_reward[k] * (1 - seg["mask"]).sum(-1)


def set_absorbing(ensemble, values):
    with torch.no_grad():
        ensemble.absorbing_reward.copy_(torch.as_tensor(values, dtype=torch.float32))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ---------------------------------------------------------------------------------------------------------------------
# 1. preference loss


def scalar_loss(margin, mu, noise, dtype=torch.float64):
    return rl.preference_loss(torch.tensor(margin, dtype=dtype), torch.tensor(0.0, dtype=dtype), mu, noise)


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.3])
def test_preference_loss_is_the_noisy_bradley_terry_cross_entropy(rng, noise):
    r_left, r_right = rng.normal(0, 3, (2, 300))
    mu = rng.choice([0.0, 0.5, 1.0], 300)
    loss = rl.preference_loss(torch.as_tensor(r_left), torch.as_tensor(r_right), torch.as_tensor(mu), noise)
    p = (1 - noise) * sigmoid(r_left - r_right) + noise / 2
    np.testing.assert_allclose(loss.numpy(), -(mu * np.log(p) + (1 - mu) * np.log(1 - p)), rtol=1e-7, atol=1e-10)


def test_label_noise_bounds_the_loss_of_a_confidently_wrong_prediction():
    for margin in (-10.0, -1e3, -1e6):
        loss = scalar_loss(margin, 1.0, 0.1, torch.float32)
        assert torch.isfinite(loss) and loss <= -math.log(0.05) + 1e-5
    noiseless = [scalar_loss(-margin, 1.0, 0.0).item() for margin in (1, 5, 20, 50)]
    assert all(a < b for a, b in zip(noiseless, noiseless[1:]))
    assert noiseless[-1] > 49  # -log sigmoid(-50) ~ 50: nothing bounds it


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco", "rlhf_a2c_atari", "rlhf_moving_dot"])
@pytest.mark.parametrize("noise", [0.0, 1e-9])
def test_a_sure_model_without_label_noise_keeps_a_finite_loss_and_gradient_in_float32(script, noise):
    # --label-noise 0 (or below float32's resolution): sigmoid(20) rounds to 1 in float32, and 0 * log(0) was NaN in
    # the loss and its gradient, which Adam then wrote into every weight
    preference_loss = importlib.import_module(script).preference_loss
    margins = np.array([-200.0, -20.0, -1.0, 1.0, 20.0, 200.0])
    for mu in (0.0, 0.5, 1.0):
        left = torch.tensor(margins, dtype=torch.float32, requires_grad=True)
        loss = preference_loss(left, torch.zeros(6), torch.full((6,), mu), noise)
        loss.sum().backward()
        # the same loss in float64 from both sigmoids, each a small number computed without cancellation
        p_left, p_right = (1 - noise) * sigmoid(margins) + noise / 2, (1 - noise) * sigmoid(-margins) + noise / 2
        expected = -(mu * np.log(p_left) + (1 - mu) * np.log(p_right))
        np.testing.assert_allclose(loss.detach().numpy(), expected, rtol=1e-5, atol=1e-6)
        assert torch.isfinite(left.grad).all(), (mu, left.grad)


class MixedDevices(TorchDispatchMode):
    """Records each operation whose tensor arguments lie on more than one device (a GPU refuses most of them)."""

    def __init__(self):
        super().__init__()
        self.operations = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = {x.device.type for x in tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor)}
        if len(devices) > 1:
            self.operations.append((str(func), sorted(devices)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco", "rlhf_a2c_atari", "rlhf_moving_dot"])
def test_the_preference_loss_computes_on_the_device_of_the_returns(script):
    # on a GPU, the label noise's term was a CPU tensor that torch.logaddexp refused: rlhf_a2c_atari.py (CUDA by
    # default) stopped at its first step of reward training. Here the returns lie on the "meta" device, which a CPU
    # machine has too, and every operation is checked for a second device
    preference_loss = importlib.import_module(script).preference_loss
    left, right, mu = torch.zeros(4, device="meta"), torch.zeros(4, device="meta"), torch.full((4,), 0.5, device="meta")
    with MixedDevices() as mixed:
        loss = preference_loss(left, right, mu, 0.1)
    assert mixed.operations == [] and loss.device.type == "meta"


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_an_equal_label_is_fitted_best_by_equal_returns(noise):
    r_right = torch.tensor(0.7, dtype=torch.float64)
    r_left = r_right.clone().requires_grad_(True)
    loss = rl.preference_loss(r_left, r_right, 0.5, noise)
    loss.backward()
    assert abs(r_left.grad.item()) < 1e-12
    for margin in (-2.0, 2.0):
        assert rl.preference_loss(r_right + margin, r_right, 0.5, noise).item() > loss.item() + 1e-2


# ---------------------------------------------------------------------------------------------------------------------
# 2. reward ensemble


def test_ensemble_members_are_independent_mlps_over_any_leading_dims(rng):
    ensemble = rl.RewardEnsemble(3, 2, size=4)
    for lead in [(7,), (5, 2, 6)]:
        obs = torch.as_tensor(rng.normal(size=lead + (3,)), dtype=torch.float32)
        act = torch.as_tensor(rng.normal(size=lead + (2,)), dtype=torch.float32)
        with torch.no_grad():
            out = ensemble(obs, act)
            assert out.shape == (4,) + lead
            for k in range(4):
                torch.testing.assert_close(out[k], member_reward(ensemble, k, obs, act), rtol=1e-5, atol=1e-5)
    flat = out.reshape(4, -1)
    for i in range(4):
        for j in range(i + 1, 4):
            assert (flat[i] - flat[j]).abs().max() > 1e-3, f"members {i} and {j} compute the same reward"
            for w in ensemble.weights:  # initialised independently, layer by layer
                assert not torch.equal(w[i], w[j])


@pytest.mark.parametrize("p", [0.5, 0.25])
def test_dropout_scales_each_hidden_unit_by_zero_or_its_inverse_keep_rate_in_training_mode_only(rng, p):
    ensemble = rl.RewardEnsemble(3, 2, size=3, dropout=p)
    ensemble.dropout_generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a second layer that copies the first's units and an output that reads unit 0 of it
        ensemble.weights[1].copy_(torch.eye(64).expand(3, 64, 64)), ensemble.biases[1].zero_()
        ensemble.weights[2].zero_(), ensemble.weights[2][:, 0].fill_(1.0), ensemble.biases[2].zero_()
        obs, act = random_steps(rng, 20000, 3, 2)
        predicted = ensemble.eval()(obs, act)
        for k in range(3):  # predictions: no dropout
            torch.testing.assert_close(predicted[k], member_reward(ensemble, k, obs, act), rtol=1e-5, atol=1e-5)
        trained_on = ensemble.train()(obs, act)
    # leaky ReLU is positively homogeneous: unit 0 kept by both layers' masks (1 - p)^2 of the time, then scaled by
    # 1 / (1 - p) twice, so the output is its prediction's 0 or 1 / (1 - p)^2 times, on average the prediction
    ratio = (trained_on / predicted).flatten()
    assert sorted(ratio.round(decimals=3).abs().unique().tolist()) == pytest.approx([0.0, 1 / (1 - p) ** 2], abs=1e-3)
    assert (ratio > 0).float().mean().item() == pytest.approx((1 - p) ** 2, abs=0.01)
    assert ratio.mean().item() == pytest.approx(1.0, abs=0.03)


def test_a_new_ensemble_and_both_copies_of_the_reward_training_predict_without_dropout(rng):
    # PPO's reward and the pairs' disagreement come from these: dropout there would be noise from the global generator
    obs, act = random_steps(rng, 50)
    ensemble = rl.RewardEnsemble(3, 1, size=3, dropout=0.5)
    training = rl.RewardModelTraining(ensemble, 1e-3)
    for model in (ensemble, training.ensemble, training.training_ensemble):
        assert not model.training
        torch.testing.assert_close(model.normalized_reward(obs, act), model.normalized_reward(obs, act), rtol=0, atol=0)
    training.close()


def test_a_gradient_step_trains_with_dropout_and_leaves_the_model_predicting_without(rng):
    minibatch = fill_buffer(rng, 64).get()
    stepped = []
    for dropout, seed in [(0.5, 1), (0.5, 1), (0.5, 2), (0.0, 1)]:
        torch.manual_seed(0)  # the same initial weights each time
        ensemble = rl.RewardEnsemble(3, 1, size=3, dropout=dropout)
        ensemble.dropout_generator = torch.Generator().manual_seed(seed)
        rl.reward_gradient_step(ensemble, torch.optim.Adam(ensemble.parameters(), 1e-3), minibatch, torch.zeros(3), 0.1)
        assert not ensemble.training
        stepped.append(torch.cat([w.detach().flatten() for w in ensemble.weights]))
    assert torch.equal(stepped[0], stepped[1])  # the masks come from the ensemble's generator
    assert not torch.equal(stepped[0], stepped[2]) and not torch.equal(stepped[0], stepped[3])
    failing = rl.RewardEnsemble(3, 1, size=3, dropout=0.5)
    with pytest.raises(TypeError, match="NoneType"):  # a step that fails (here: no label noise) still leaves it predicting
        rl.reward_gradient_step(failing, torch.optim.Adam(failing.parameters()), minibatch, torch.zeros(3), None)
    assert not failing.training


def test_segment_returns_add_the_absorbing_reward_for_each_step_after_a_termination(rng):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    set_absorbing(ensemble, [-1.5, 0.25, 3.0])
    length, n = 6, 40
    segments = make_segments(rng, n, length, real_steps=rng.integers(1, length + 1, n))
    segments["obs"] += 5 * (1 - segments["mask"][..., None])  # what sits in absorbing steps must not count
    with torch.no_grad():
        returns = ensemble.segment_returns(rl.to_torch(segments))
        assert returns.shape == (3, n)
        for k in range(3):
            torch.testing.assert_close(returns[k], member_return(ensemble, k, segments), rtol=1e-5, atol=1e-5)
        # pairs shaped (n/2, 2, L), as the label buffer stores them, sum the same way
        paired = {key: value.reshape((n // 2, 2) + value.shape[1:]) for key, value in segments.items()}
        torch.testing.assert_close(ensemble.segment_returns(rl.to_torch(paired)), returns.reshape(3, n // 2, 2))


def test_with_a_potential_a_segment_return_adds_its_change_over_the_real_steps_and_ppos_reward_does_not(rng):
    assert not any("potential" in key for key in rl.RewardEnsemble(3, 1, size=3).state_dict())  # off: as before
    ensemble = rl.RewardEnsemble(3, 1, size=3, potential=True)
    set_absorbing(ensemble, [-1.5, 0.25, 3.0])
    length, n = 6, 40
    segments = make_segments(rng, n, length, real_steps=rng.integers(1, length + 1, n))
    segments["obs"] += 5 * (1 - segments["mask"][..., None])  # what sits in absorbing steps must not count
    last_real = segments["obs"][np.arange(n), segments["mask"].sum(-1).astype(int) - 1]
    obs, act = random_steps(rng, 100)
    with torch.no_grad():
        returns = ensemble.segment_returns(rl.to_torch(segments))
        for k in range(3):
            change = member_potential(ensemble, k, last_real) - member_potential(ensemble, k, segments["obs"][:, 0])
            assert change.abs().max() > 0.01
            torch.testing.assert_close(returns[k], member_return(ensemble, k, segments) + change, rtol=1e-5, atol=1e-5)
        paired = {key: value.reshape((n // 2, 2) + value.shape[1:]) for key, value in segments.items()}
        torch.testing.assert_close(ensemble.segment_returns(rl.to_torch(paired)), returns.reshape(3, n // 2, 2))
        ensemble.fit_normalization(ensemble(obs, act))
        ppo_reward = ensemble.normalized_reward(obs, act)
        for w in ensemble.potential_weights:
            w.mul_(3.0)
        # PPO is paid the step reward alone: a potential three times as steep changes the segments' returns only
        torch.testing.assert_close(ensemble.normalized_reward(obs, act), ppo_reward, rtol=0, atol=0)
        assert (ensemble.segment_returns(rl.to_torch(segments)) - returns).abs().max() > 0.01
    # the validation pass (its losses set the L2 coefficients) compares the returns the gradient steps train on
    buffer = fill_buffer(rng, 50, length=6, terminations=True)
    left, right, batch = buffer.get()
    step_rewards, labels = rl.label_step_rewards(ensemble, buffer)
    train_loss, _, _ = rl.validate_reward_model(ensemble, step_rewards, labels, 0.1)
    with torch.no_grad():
        losses = rl.preference_loss(ensemble.segment_returns(left), ensemble.segment_returns(right), batch["mu"], 0.1)
    weight = batch["weight"].T
    torch.testing.assert_close(train_loss, (losses * weight).sum(1) / weight.sum(1).clamp(min=1))


def test_the_potential_takes_no_dropout_so_its_change_over_a_segment_telescopes_in_gradient_steps_too(rng):
    # one mask for the first step and another for the last would make a segment of one real step change the potential
    ensemble = rl.RewardEnsemble(3, 1, size=3, dropout=0.5, potential=True)
    ensemble.dropout_generator = torch.Generator().manual_seed(0)
    segments = rl.to_torch(make_segments(rng, 20, 5, real_steps=np.ones(20, int)))
    obs, _ = random_steps(rng, 50)
    with torch.no_grad():
        predicted = ensemble.potential(obs)
        ensemble.train()
        torch.testing.assert_close(ensemble.potential(obs), predicted, rtol=0, atol=0)
        assert (ensemble.potential_change(segments["obs"], segments["mask"]) == 0).all()
        ensemble.eval()


def test_anchoring_the_fallen_state_at_zero_keeps_every_predicted_preference(rng):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    set_absorbing(ensemble, [-1.5, 0.25, 3.0])
    length, n = 6, 40
    segments = make_segments(rng, n, length, real_steps=random_terminations(rng, n, length))
    obs, act, mask = (torch.as_tensor(segments[k]) for k in ("obs", "act", "mask"))
    with torch.no_grad():
        ensemble.fit_normalization(ensemble(obs, act)[:, mask > 0])  # zero mean over the judged steps, as in a run
    rewards = ensemble.normalized_reward(obs, act).numpy()
    absorbing = ensemble.normalized_absorbing_reward()
    assert abs(absorbing) > 0.1  # the zero-mean scale leaves the fall somewhere else than 0
    shifted, shifted_absorbing = rl.anchor_at_absorbing(rewards, absorbing)
    assert shifted_absorbing == 0.0

    def returns(step_rewards, absorbing_reward):  # as the preference model sums a segment
        return (step_rewards * segments["mask"]).sum(-1) + absorbing_reward * (1 - segments["mask"]).sum(-1)

    before, after = returns(rewards, absorbing), returns(shifted, shifted_absorbing)
    # Bradley-Terry sees only differences of returns: every pair of segments is predicted exactly as before
    np.testing.assert_allclose(before[:, None] - before[None], after[:, None] - after[None], atol=1e-4)
    # a step now earns more than falling exactly when the model ranks it above the fallen state
    np.testing.assert_array_equal(shifted > 0, rewards > absorbing)


@pytest.mark.parametrize("anchor", [True, False])
def test_predicted_return_is_the_return_of_the_reward_ppo_optimises(rng, anchor):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    set_absorbing(ensemble, [-2.0, -1.0, -3.0])
    steps, envs = 7, 2
    obs = rng.standard_normal((steps, envs, 3)).astype(np.float32)
    act = rng.uniform(-1, 1, (steps, envs, 1)).astype(np.float32)
    with torch.no_grad():
        ensemble.fit_normalization(ensemble(torch.as_tensor(obs), torch.as_tensor(act)).reshape(3, -1))
    assert abs(ensemble.normalized_absorbing_reward()) > 0.1  # the zero-mean scale leaves the fall away from 0
    dones = np.zeros((steps, envs), bool)
    dones[2, 0] = dones[6, 0] = dones[4, 1] = True  # env 0: two episodes (one of them carried in), env 1: one
    carried_in = np.array([1.5, 0.0])  # the return so far of env 0's episode that began in the last rollout
    episode_returns = carried_in.copy()
    rewards, absorbing, finished = rl.learned_reward_for_ppo(ensemble, obs, act, dones, episode_returns, anchor)
    if anchor:
        assert absorbing == 0.0
    # each finished episode's learned return sums the very rewards PPO is given (anchored or not)
    expected = [carried_in[0] + rewards[:3, 0].sum(), rewards[:5, 1].sum(), rewards[3:7, 0].sum()]
    np.testing.assert_allclose(finished, expected, rtol=1e-5)
    np.testing.assert_allclose(episode_returns, [0.0, rewards[5:, 1].sum()], rtol=1e-5)  # env 1's goes on


@pytest.mark.parametrize("potential", [False, True])
def test_l2_penalty_is_each_members_sum_of_squared_weights_without_biases(potential):
    ensemble = rl.RewardEnsemble(3, 1, size=3, potential=potential)
    weights = [*ensemble.weights, *ensemble.potential_weights]  # the potential's too (--reward-potential)
    assert len(weights) == (6 if potential else 3)
    with torch.no_grad():
        for b in [*ensemble.biases, *ensemble.potential_biases]:
            b.add_(10.0)  # biases (and the absorbing reward) must not count
        ensemble.absorbing_reward.fill_(10.0)
    penalty = ensemble.l2_penalty()
    expected = [sum(torch.linalg.norm(w[k].flatten()) ** 2 for w in weights) for k in range(3)]
    torch.testing.assert_close(penalty, torch.stack(expected))
    penalty[1].backward()  # member 1's penalty pulls on its own weights only
    for w in weights:
        torch.testing.assert_close(w.grad[1], 2 * w[1].detach())
        assert (w.grad[[0, 2]] == 0).all()
    assert all(b.grad is None or (b.grad == 0).all() for b in [*ensemble.biases, *ensemble.potential_biases])


# ---------------------------------------------------------------------------------------------------------------------
# 3. reward normalisation


@pytest.mark.parametrize("target_std", [1.0, 0.05])
def test_normalised_reward_has_zero_mean_and_the_target_std_on_the_fitted_steps(rng, target_std):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    obs, act = random_steps(rng, 500)
    with torch.no_grad():
        ensemble.fit_normalization(ensemble(obs, act), target_std)
    reward = ensemble.normalized_reward(obs, act).numpy()
    assert reward.shape == (500,)
    assert abs(reward.mean()) < 1e-3 * target_std
    assert reward.std() == pytest.approx(target_std, rel=1e-2)


def test_each_member_is_normalised_separately(rng):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    obs, act = random_steps(rng, 500)
    with torch.no_grad():
        ensemble.fit_normalization(ensemble(obs, act))
        before = ensemble.normalized_reward(obs, act)
        ensemble.weights[-1][1] *= 10  # an affine change of member 1's output: 10 x its reward + a constant
        ensemble.biases[-1][1] += 5
        assert (ensemble.normalized_reward(obs, act) - before).abs().max() > 0.1  # it matters until refitted
        ensemble.fit_normalization(ensemble(obs, act))
        torch.testing.assert_close(ensemble.normalized_reward(obs, act), before, rtol=0, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------------------
# 4. reward-model training


def test_reward_model_learns_a_known_reward_from_synthetic_preferences(rng):
    buffer = fill_buffer(rng, 400)  # true reward: obs[..., 0]
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=3e-3)
    rl.train_reward_model(ensemble, optimizer, buffer, torch.full((3,), 1e-4), 300, 64, 0.1, rng)
    step_rewards, labels = rl.label_step_rewards(ensemble, buffer)
    train_loss, val_loss, val_accuracy = rl.validate_reward_model(ensemble, step_rewards, labels, 0.1)
    rl.fit_reward_normalization(ensemble, step_rewards, labels, 1.0)
    assert train_loss.shape == val_loss.shape == (3,)
    assert val_accuracy > 0.85
    obs, act = random_steps(rng, 2000)
    learned = ensemble.normalized_reward(obs, act).numpy()
    assert np.corrcoef(learned, obs[:, 0].numpy())[0, 1] > 0.9


def posture_shift_segments(rng, n, length):
    """Segments whose observations are a posture (a random walk: it persists from step to step), a velocity and a
    distractor; a segment's true return is its velocities plus 3 x its posture's change from its first step to its last,
    as a locomotion task's clip pays a shift of its root body as the body bends (benchmark/notes/posture_shift.py)."""
    posture = np.cumsum(rng.normal(0, 0.5, (n, length)), 1) + rng.normal(0, 1, (n, 1))
    velocity = rng.normal(0, 0.3, (n, length)) + rng.normal(0, 0.3, (n, 1))
    obs = np.stack([posture, velocity, rng.normal(size=(n, length))], -1).astype(np.float32)
    true_reward = velocity.copy()
    true_reward[:, -1] += 3 * (posture[:, -1] - posture[:, 0])
    act = rng.normal(size=(n, length, 1)).astype(np.float32)
    return {"obs": obs, "act": act, "mask": np.ones((n, length), np.float32), "true_reward": true_reward.astype(np.float32)}


@pytest.mark.parametrize("potential", [False, True])
def test_a_learned_potential_takes_the_posture_shift_so_the_step_reward_pays_the_velocity_not_the_posture(rng, potential):
    n, length = 400, 10
    left, right = posture_shift_segments(rng, n, length), posture_shift_segments(rng, n, length)
    buffer = rl.LabelBuffer(n, length, 3, 1, 3, rng)
    buffer.add(left, right, rl.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"]))
    ensemble = rl.RewardEnsemble(3, 1, size=3, potential=potential)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=3e-3)
    rl.train_reward_model(ensemble, optimizer, buffer, torch.full((3,), 1e-4), 300, 64, 0.1, rng)
    step_rewards, labels = rl.label_step_rewards(ensemble, buffer)
    rl.fit_reward_normalization(ensemble, step_rewards, labels, 1.0)
    held_out = posture_shift_segments(rng, 300, length)
    obs, act = torch.as_tensor(held_out["obs"].reshape(-1, 3)), torch.as_tensor(held_out["act"].reshape(-1, 1))
    step_reward = ensemble.normalized_reward(obs, act).numpy()
    pays_velocity, pays_posture = (np.corrcoef(step_reward, obs[:, i].numpy())[0, 1] for i in (1, 0))
    if potential:  # the potential is the posture; the step reward, what PPO gets, is the velocity
        with torch.no_grad():
            assert np.corrcoef(ensemble.potential(obs).mean(0).numpy(), obs[:, 0].numpy())[0, 1] > 0.95
        assert pays_velocity > 0.9 and abs(pays_posture) < 0.2
    else:  # the step reward alone must explain the posture shift too, and follows the velocity far less closely
        assert pays_velocity < 0.8


def test_validation_changes_nothing_and_the_normalisation_is_refit_only_when_asked(rng):
    buffer = fill_buffer(rng, 200, size=3, terminations=True)
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    before = {k: v.clone() for k, v in ensemble.state_dict().items()}
    step_rewards, batch = rl.label_step_rewards(ensemble, buffer)
    rl.validate_reward_model(ensemble, step_rewards, batch, 0.1)
    for key, value in ensemble.state_dict().items():
        torch.testing.assert_close(value, before[key])
    rl.fit_reward_normalization(ensemble, step_rewards, batch, 0.5)
    judged = batch["mask"] > 0  # absorbing steps are not judged steps
    reward = ensemble.normalized_reward(batch["obs"][judged], batch["act"][judged]).numpy()
    assert abs(reward.mean()) < 1e-4 and reward.std() == pytest.approx(0.5, rel=1e-2)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_a_round_in_the_thread_trains_as_in_the_main_thread_and_ppos_copy_takes_it_only_when_it_is_done(rng, dropout):
    args = rl.Args(reward_updates=5, reward_eval_every=2, reward_batch_size=32)
    threaded, in_line = (rl.RewardModelTraining(rl.RewardEnsemble(3, 1, 3, dropout=dropout), 1e-3) for _ in range(2))
    in_line.ensemble.load_state_dict(threaded.ensemble.state_dict())
    in_line.training_ensemble.load_state_dict(threaded.training_ensemble.state_dict())
    buffer = fill_buffer(rng, 100, terminations=True)
    rng_threaded, rng_in_line = np.random.default_rng(1), np.random.default_rng(1)
    gate, copies = threading.Event(), ("ensemble", "training_ensemble")
    try:
        for round_number in (1, 2):  # the second round ends in a validation pass (--reward-eval-every 2)
            before = {copy: {k: v.clone() for k, v in getattr(threaded, copy).state_dict().items()} for copy in copies}
            gate.clear()
            threaded.thread.submit(gate.wait)  # hold the thread: the round queues behind this
            threaded.start_round(buffer, args, rng_threaded)
            in_line.train(buffer, 1, args.reward_updates, args, rng_in_line)
            # while the thread is held both copies are as they were: the round waits in the thread (start_round did not
            # train here, in the caller's), and PPO's copy does not change while it runs
            assert not threaded.job.done()
            for copy in copies:
                for key, value in getattr(threaded, copy).state_dict().items():
                    torch.testing.assert_close(value, before[copy][key], rtol=0, atol=0)
            gate.set()
            threaded.finish_round()
            for copy in copies:
                for key, value in getattr(threaded, copy).state_dict().items():
                    torch.testing.assert_close(value, getattr(in_line, copy).state_dict()[key], rtol=0, atol=0)
            assert threaded.rounds == in_line.rounds == round_number
        assert not math.isnan(threaded.val_accuracy)  # the validation pass's figures and L2 adaptation came back
        torch.testing.assert_close(threaded.l2_coef, in_line.l2_coef, rtol=0, atol=0)
    finally:
        gate.set()  # a failed assertion must not leave the thread held (close waits for it)
        threaded.close()


def test_training_in_the_main_thread_waits_for_the_round_under_way(rng):
    # two rounds at once would step the same weights, optimizer and dropout generator from two threads
    args = rl.Args(reward_updates=3, reward_eval_every=100, reward_batch_size=16)
    training = rl.RewardModelTraining(rl.RewardEnsemble(3, 1, 3, dropout=0.5), 1e-3)
    buffer, gate = fill_buffer(rng, 40), threading.Event()
    try:
        training.thread.submit(gate.wait)  # hold the thread: the round queues behind this
        training.start_round(buffer, args, rng)
        threading.Timer(0.2, gate.set).start()
        training.train(buffer, 1, 3, args, rng)
        assert training.job is None and training.rounds == 2  # the threaded round ended (and was taken) first
    finally:
        gate.set()
        training.close()


def test_closing_the_reward_training_raises_the_last_rounds_error_and_stops_the_thread(rng):
    training = rl.RewardModelTraining(rl.RewardEnsemble(3, 1, size=3), 1e-3)
    training.start_round(fill_buffer(rng, 20), rl.Args(reward_updates=1, label_noise=None), rng)  # fails in the thread
    with pytest.raises(TypeError, match="NoneType"):  # the last round's error reaches the run, not lost with the thread
        training.close()
    with pytest.raises(RuntimeError, match="shutdown"):
        training.thread.submit(int)


# ---------------------------------------------------------------------------------------------------------------------
# 5. bootstrap ensemble


def test_each_member_validates_on_the_labels_its_bootstrap_leaves_out(rng):
    """C17 2.2.3: each member trains on a resample of the labels with replacement, and 1/e of them is held out; a
    resample of n from n leaves out each label with probability (1 - 1/n)^n -> 1/e: the out-of-bag labels."""
    size, n = 4, 5000
    buffer = fill_buffer(rng, n, length=2, size=size, obs_dim=1)
    is_val, weight = buffer.data["is_val"][:n], buffer.data["weight"][:n]
    np.testing.assert_array_equal(is_val, weight == 0)  # validation = out of bag, nothing else
    np.testing.assert_allclose(is_val.mean(0), 1 / math.e, atol=0.03)
    np.testing.assert_allclose((weight > 0).mean(0), 1 - 1 / math.e, atol=0.03)  # distinct labels each member trains on
    for k in range(size):  # Poisson(1): the online form of the bootstrap's multiplicities
        assert (weight[:, k] == np.round(weight[:, k])).all()
        assert weight[:, k].mean() == pytest.approx(1, abs=0.06)
        assert weight[:, k].var() == pytest.approx(1, abs=0.1)
    p = 1 / math.e
    for i in range(size):
        for j in range(i + 1, size):  # each member draws its own split, independently of the others
            assert (is_val[:, i] == is_val[:, j]).mean() == pytest.approx(p**2 + (1 - p) ** 2, abs=0.03)


def test_label_buffer_keeps_every_label_beyond_its_capacity(rng):
    buffer = fill_buffer(rng, 10, size=2)
    left, right = make_segments(rng, 4, 5), make_segments(rng, 4, 5)
    assert buffer.add(left, right, np.ones(4)) == 4  # nothing dropped: the buffer grows
    assert buffer.size == 14
    _, _, batch = buffer.get()
    np.testing.assert_array_equal(batch["obs"][10:, 0].numpy(), left["obs"])
    np.testing.assert_array_equal(batch["mu"][10:].numpy(), np.ones(4))


def test_the_l2_band_compares_validation_loss_with_the_bootstrap_weighted_loss_each_member_trained_on(rng):
    buffer = fill_buffer(rng, 300, size=3, terminations=True)
    weight = rng.integers(0, 4, (300, 3)).astype(np.float32)  # multiplicities 0-3, as a bootstrap draws them
    buffer.data["weight"][:300], buffer.data["is_val"][:300] = weight, weight == 0
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    train_loss, val_loss, _ = rl.validate_reward_model(ensemble, *rl.label_step_rewards(ensemble, buffer), 0.1)
    left, right, batch = buffer.get()
    with torch.no_grad():
        losses = rl.preference_loss(ensemble.segment_returns(left), ensemble.segment_returns(right), batch["mu"], 0.1)
    w = torch.as_tensor(weight).T
    torch.testing.assert_close(train_loss, (losses * w).sum(1) / w.sum(1))
    torch.testing.assert_close(val_loss, torch.stack([losses[k][weight[:, k] == 0].mean() for k in range(3)]))


def test_training_ignores_the_labels_a_member_gives_weight_zero(rng):
    buffer = fill_buffer(rng, 64, size=2, terminations=True)
    buffer.data["weight"][:, 0] = 0  # member 0 holds out everything
    buffer.data["weight"][:, 1] = 1
    ensemble = rl.RewardEnsemble(3, 1, size=2)
    before = [p.detach().clone() for p in ensemble.parameters()]
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-2)
    rl.train_reward_model(ensemble, optimizer, buffer, torch.zeros(2), 10, 32, 0.1, rng)
    for old, new in zip(before, ensemble.parameters()):
        assert torch.equal(old[0], new[0].detach())
        assert not torch.equal(old[1], new[1].detach())


# ---------------------------------------------------------------------------------------------------------------------
# 6. pair selection


def test_disagreement_is_the_variance_of_the_members_preference_probabilities(rng):
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    set_absorbing(ensemble, [-4.0, 0.0, 4.0])
    left = make_segments(rng, 8, 4)
    right = {k: v.copy() for k, v in left.items()}  # identical real segments: every member says 50/50
    for key in left:  # except pair 5, whose left segment ends in a termination after 2 steps
        left[key][5, 2:] = 0
    scores = rl.disagreement(ensemble, left, right)
    with torch.no_grad():
        p = torch.stack(
            [torch.sigmoid(member_return(ensemble, k, left) - member_return(ensemble, k, right)) for k in range(3)]
        )
    np.testing.assert_allclose(scores, p.numpy().var(0), rtol=1e-5, atol=1e-12)
    assert np.argmax(scores) == 5 and scores[5] > 1e-3 and np.delete(scores, 5).max() < 1e-12


@pytest.fixture
def selection_setup(rng):
    rollout = make_rollout(rng, 30, 2, p_terminated=0.1, p_truncated=0.03)
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    set_absorbing(ensemble, [-3.0, 0.0, 3.0])
    return ensemble, rollout


def test_variance_selection_keeps_the_candidates_the_members_disagree_on_most(selection_setup):
    ensemble, rollout = selection_setup
    num_pairs, multiplier, length = 5, 8, 4
    left, right = rl.select_pairs(np.random.default_rng(3), ensemble, rollout, length, num_pairs, multiplier, "variance")
    replay = np.random.default_rng(3)  # draws the same candidates as select_pairs did
    candidates = [rl.sample_segments(replay, rollout, length, num_pairs * multiplier) for _ in range(2)]
    assert_the_pairs_kept_are_the_most_disagreed_on(
        rl.disagreement(ensemble, left, right), rl.disagreement(ensemble, *candidates), num_pairs
    )
    for i in range(num_pairs):  # each chosen pair is a candidate pair, left and right kept together
        same = [
            np.array_equal(left["true_reward"][i], a) and np.array_equal(right["true_reward"][i], b)
            for a, b in zip(candidates[0]["true_reward"], candidates[1]["true_reward"])
        ]
        assert any(same)


def test_random_selection_keeps_the_pairs_as_drawn(selection_setup):
    ensemble, rollout = selection_setup
    left, right = rl.select_pairs(np.random.default_rng(3), ensemble, rollout, 4, 5, 8, "random")
    replay = np.random.default_rng(3)
    for chosen in (left, right):
        drawn = rl.sample_segments(replay, rollout, 4, 5)
        for key in drawn:
            np.testing.assert_array_equal(chosen[key], drawn[key])


def test_no_pair_shows_one_segment_twice():
    """The two sides of the pairs are drawn apart: now and then both are the same segment, a label wasted (a rater shown
    one clip twice; the synthetic teacher answers "equal"). Such a pair gets another right side. Here 10 pairs of a
    rollout with 27 segment starts, 40 draws: drawn apart, about 15 of the 400 random pairs would be one segment twice."""
    rollout = make_rollout(np.random.default_rng(0), 12, 3)  # true_reward: each step's own code
    for seed in range(40):  # (variance selection never keeps such a pair: the members cannot disagree on it)
        left, right = rl.select_pairs(np.random.default_rng(seed), None, rollout, 4, 10, 1, "random")
        assert not (left["true_reward"] == right["true_reward"]).all(1).any(), seed


# ---------------------------------------------------------------------------------------------------------------------
# 7. segments


def valid_starts(rollout, length):
    """Starts (t, e) of the segments that stay in one episode: they stop at a termination (then absorbing steps) or
    after `length` steps, never cross a time-limit truncation, and never run past the rollout's end."""
    terminated, truncated = rollout["terminated"], rollout["truncated"]
    steps, envs = terminated.shape
    valid = set()
    for t0 in range(steps):
        for e in range(envs):
            for j in range(length):
                t = t0 + j
                if t >= steps or (truncated[t, e] and not terminated[t, e] and j < length - 1):
                    break
                if terminated[t, e] or j == length - 1:
                    valid.add((t0, e))
                    break
    return valid


def test_segments_are_windows_of_one_episode_padded_with_absorbing_steps(rng):
    length, steps, envs = 6, 40, 3
    rollout = make_rollout(rng, steps, envs, p_terminated=0.06, p_truncated=0.06)
    rollout["terminated"][34:, 1] = rollout["truncated"][34:, 1] = False
    rollout["terminated"][37, 1] = True  # segments from 34-37 run past the rollout's end after this termination
    rollout["terminated"][5:11, 2] = rollout["truncated"][5:11, 2] = False
    rollout["terminated"][10, 2] = rollout["truncated"][10, 2] = True  # a termination at the time limit
    segments = rl.sample_segments(rng, rollout, length, 3000)
    mask = segments["mask"]
    assert mask.shape == segments["true_reward"].shape == (3000, length) and segments["obs"].shape == (3000, length, 3)
    assert set(np.unique(mask)) <= {0.0, 1.0} and (mask[:, 0] == 1).all()
    assert (np.diff(mask, axis=1) <= 0).all()  # real steps first, then absorbing ones
    t0, e = np.divmod(segments["true_reward"][:, 0].astype(int) - 1, 10)
    expected_starts = valid_starts(rollout, length)
    assert {(34, 1), (37, 1), (7, 2)} <= expected_starts and (38, 1) not in expected_starts
    assert set(zip(t0.tolist(), e.tolist())) == expected_starts
    done = rollout["terminated"] | rollout["truncated"]
    for j in range(length):
        real = mask[:, j] == 1
        t = t0[real] + j
        assert (t < steps).all()
        for key in ("obs", "act", "true_reward"):
            np.testing.assert_array_equal(segments[key][real, j], rollout[key][t, e[real]])
            assert (segments[key][~real, j] == 0).all()
        if j < length - 1:
            ends_here = real & (mask[:, j + 1] == 0)
            goes_on = real & (mask[:, j + 1] == 1)
            assert rollout["terminated"][t0[ends_here] + j, e[ends_here]].all()
            assert not done[t0[goes_on] + j, e[goes_on]].any()


def test_segments_of_a_pair_pool_come_from_all_its_rollouts_and_never_span_two(rng):
    length, steps, envs = 5, 30, 2
    pair_pool = []
    for i in range(3):  # rollout i's true rewards are its steps' codes, offset by 1000 i
        rollout = make_rollout(rng, steps, envs, p_terminated=0.05, p_truncated=0.05)
        rollout["true_reward"] += 1000 * i
        pair_pool.append((i + 1, rollout))
    segments = rl.sample_segments(rng, rl.join_rollouts(pair_pool), length, 3000)
    real = segments["mask"] == 1
    source, code = np.divmod(segments["true_reward"][:, 0].astype(int), 1000)
    assert set(source.tolist()) == {0, 1, 2}
    t0, e = np.divmod(code - 1, 10)
    for i, (_, rollout) in enumerate(pair_pool):  # each one a valid window of its own rollout, as from that rollout alone
        from_here = source == i
        assert set(zip(t0[from_here].tolist(), e[from_here].tolist())) == valid_starts(rollout, length)
        for j in range(length):
            picked = from_here & real[:, j]
            assert (segments["true_reward"][picked, j] == rollout["true_reward"][t0[picked] + j, e[picked]]).all()


def test_a_rollout_without_room_for_a_segment_is_refused(rng):
    rollout = make_rollout(rng, 10, 2)
    rollout["truncated"][::2] = True  # episodes of 2 steps: no 3-step segment fits
    with pytest.raises(RuntimeError, match="no valid segment in the rollout"):
        rl.sample_segments(rng, rollout, 3, 4)


# ---------------------------------------------------------------------------------------------------------------------
# 8. label schedule

SCHEDULES = [
    {},  # the defaults: 1M steps, 1400 labels, 1 x 2048-step rollouts
    {"labels": 700},
    {"total_timesteps": 123457, "labels": 333, "num_envs": 1, "num_steps": 1000, "num_minibatches": 8, "pretrain_steps": 5000},
    {"total_timesteps": 30000, "labels": 101, "segment_len": 25},
    {"total_timesteps": 2_000_001, "num_envs": 4, "num_steps": 512, "labels": 1401, "pretrain_fraction": 0.3},
    {
        "total_timesteps": 9999,
        "num_envs": 1,
        "num_steps": 1024,
        "pretrain_steps": 1000,
        "labels": 77,
        "pretrain_fraction": 0.5,
    },
    {"total_timesteps": 30000, "labels": 2},  # a quarter of 2 rounds to 0: the reward model still gets one label
    {"total_timesteps": 30000, "labels": 1},
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # validate_args probes Hopper-v4 (gymnasium prefers v5)
@pytest.mark.parametrize("overrides", SCHEDULES)
def test_label_schedule_spends_the_budget_exactly_at_the_c17_rate(overrides):
    args = rl.Args(**overrides)
    rl.fill_runtime_fields(args)
    rl.validate_args(args)
    per_iteration = rl.label_schedule(args)
    pre = args.pretrain_iterations
    assert per_iteration.shape == (args.num_iterations,) and pre >= 1
    assert (per_iteration >= 0).all() and per_iteration.sum() == args.labels
    pretrain = max(1, round(args.labels * args.pretrain_fraction))  # RL never starts without a reward model
    assert per_iteration[:pre].sum() == pretrain
    assert per_iteration[:pre].max() - per_iteration[:pre].min() <= 1  # spread evenly over the initial policy's rollouts
    steps_so_far = np.arange(pre + 1, args.num_iterations + 1) * args.batch_size
    rate = args.schedule_horizon / (steps_so_far + args.schedule_horizon)
    ideal = (args.labels - pretrain) * np.cumsum(rate) / rate.sum()
    post = per_iteration[pre:]
    assert np.abs(np.cumsum(post) - ideal).max() <= 1
    half = len(post) // 2
    first, second = post[:half].sum(), post[len(post) - half :].sum()
    ideal_first, ideal_second = ideal[half - 1], ideal[-1] - ideal[len(post) - half - 1]
    assert first >= second
    if ideal_first - ideal_second > 2:
        assert first > second


# ---------------------------------------------------------------------------------------------------------------------
# 9. synthetic teacher


def teacher_pairs(rng, n=20000, length=4):
    left, right = rng.normal(size=(2, n, length))
    return left, right, left.sum(1) - right.sum(1)


def test_perfect_teacher_prefers_the_larger_return_and_calls_exact_ties_equal(rng):
    left, right = rng.integers(-2, 3, (2, 20000, 4)).astype(np.float64)
    diff = left.sum(1) - right.sum(1)
    assert (diff == 0).sum() > 1000
    mu = rl.SyntheticTeacher(rng).preferences(left, right)
    np.testing.assert_array_equal(mu, np.where(diff > 0, 1.0, np.where(diff < 0, 0.0, 0.5)))


def test_boltzmann_teacher_prefers_left_with_probability_sigmoid_beta_d(rng):
    beta = 0.7
    left, right, diff = teacher_pairs(rng)
    mu = rl.SyntheticTeacher(rng, beta=beta).preferences(left, right)
    assert set(np.unique(mu)) == {0.0, 1.0}
    for bin_ in np.array_split(np.argsort(diff), 10):
        assert mu[bin_].mean() == pytest.approx(sigmoid(beta * diff[bin_]).mean(), abs=0.05)


@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_teacher_with_mistakes_flips_a_share_epsilon_of_answers(rng, epsilon):
    left, right, diff = teacher_pairs(rng)
    mu = rl.SyntheticTeacher(rng, epsilon=epsilon).preferences(left, right)
    assert set(np.unique(mu)) == {0.0, 1.0}
    assert (mu != (diff > 0)).mean() == pytest.approx(epsilon, abs=0.02)


def test_myopic_teacher_weighs_recent_steps_more(rng):
    gamma, length = 0.5, 4
    left, right, diff = teacher_pairs(rng, length=length)
    weights = gamma ** (length - 1 - np.arange(length))  # the last step counts fully, the first gamma^(L-1)
    discounted = left @ weights - right @ weights
    assert (np.sign(discounted) != np.sign(diff)).sum() > 1000  # pairs where the two orders disagree
    teacher = rl.SyntheticTeacher(rng, gamma=gamma)
    np.testing.assert_array_equal(teacher.preferences(left, right), (discounted > 0).astype(float))
    assert teacher.preferences(np.array([[3.0, 0, 0, 0]]), np.array([[0.0, 0, 0, 1]]))[0] == 0.0


def test_teacher_skips_pairs_where_both_segments_are_below_the_threshold(rng):
    threshold = 1.0
    left, right, diff = teacher_pairs(rng, n=2000)
    skipped = np.maximum(left.sum(1), right.sum(1)) < threshold
    assert 0.1 < skipped.mean() < 0.9
    teacher = rl.SyntheticTeacher(rng, skip_threshold=threshold)
    mu = teacher.preferences(left, right)
    np.testing.assert_array_equal(np.isnan(mu), skipped)
    np.testing.assert_array_equal(mu[~skipped], (diff > 0)[~skipped])
    pair = [{"true_reward": r, "obs": rng.normal(size=r.shape + (3,))} for r in (left, right)]
    teacher.ask(*pair)
    ((answered_left, answered_right, answered_mu),) = teacher.poll()
    for answered, asked in zip((answered_left, answered_right), pair):
        for key in asked:
            np.testing.assert_array_equal(answered[key], asked[key][~skipped])
    np.testing.assert_array_equal(answered_mu, (diff > 0)[~skipped])
    assert teacher.poll() == []


def test_teacher_calls_pairs_within_the_margin_equal(rng):
    margin = 0.5
    left, right, diff = teacher_pairs(rng)
    mu = rl.SyntheticTeacher(rng, equal_margin=margin).preferences(left, right)
    assert (np.abs(diff) <= margin).mean() > 0.05
    np.testing.assert_array_equal(mu, np.where(np.abs(diff) <= margin, 0.5, (diff > 0).astype(float)))


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco", "rlhf_a2c_atari", "rlhf_moving_dot"])
def test_a_myopic_teacher_skips_and_ties_on_the_undiscounted_returns_as_b_pref_does(script, rng):
    # B-Pref's get_label: the skip threshold and the equal margin compare the segments' plain sums; only the choice
    # between the two uses the discounted ones
    left, right, diff = teacher_pairs(rng, length=4)
    weights = 0.5 ** (3 - np.arange(4))
    discounted = left @ weights - right @ weights
    teacher = importlib.import_module(script).SyntheticTeacher(rng, gamma=0.5, equal_margin=0.5)
    equal = np.abs(diff) <= 0.5
    assert (equal != (np.abs(discounted) <= 0.5)).sum() > 1000
    np.testing.assert_array_equal(teacher.preferences(left, right), np.where(equal, 0.5, (discounted > 0).astype(float)))
    teacher = importlib.import_module(script).SyntheticTeacher(rng, gamma=0.5, skip_threshold=1.0)
    skipped = np.maximum(left.sum(1), right.sum(1)) < 1.0
    assert (skipped != (np.maximum(left @ weights, right @ weights) < 1.0)).sum() > 1000
    np.testing.assert_array_equal(np.isnan(teacher.preferences(left, right)), skipped)


@pytest.mark.parametrize("feedback", ["synthetic", "human"])
def test_every_teacher_has_the_interface_the_training_loop_uses(tmp_path, feedback, rng):
    """The loop never asks which teacher it has: make_teacher builds it; start, ask, poll, pending, wait_for_answers,
    save, load and close do the rest."""
    args = rl.Args(feedback=feedback, label_server="http://127.0.0.1:9")
    teacher = rl.make_teacher(args, str(tmp_path), rng, {})
    assert isinstance(teacher, rl.SyntheticTeacher if feedback == "synthetic" else rl.HumanTeacher)
    teacher.load()  # a new run: nothing to load
    left, right = make_segments(rng, 3, 5), make_segments(rng, 3, 5)
    for segments in (left, right):
        segments["sim_state"] = rng.normal(size=(3, 12))
    teacher.ask(left, right)
    stop = threading.Event()
    if feedback == "synthetic":  # it answers when asked
        assert teacher.start() is teacher and teacher.wait_for_answers(stop)
        ((answered_left, _, mu),) = teacher.poll()
        np.testing.assert_array_equal(answered_left["obs"], left["obs"])
        assert teacher.pending == 0 and len(mu) == 3 and teacher.poll() == []
    else:  # not started: nothing is sent, every pair waits for people
        stop.set()
        assert not teacher.wait_for_answers(stop)
        assert teacher.pending == 3 and teacher.poll() == []
    teacher.save()
    teacher.close()


def test_query_labels_asks_only_what_the_schedule_lacks_and_stores_the_answers(rng):
    buffer = fill_buffer(rng, 10)
    teacher = rl.SyntheticTeacher(rng)
    ensemble = rl.RewardEnsemble(3, 1, size=3)
    rollout = make_rollout(rng, 64, 2)
    args = rl.Args(segment_len=5)
    rl.query_labels(rng, ensemble, teacher, buffer, rollout, 10, "variance", args)
    assert buffer.size == 10  # the buffer already holds what is due: nothing asked
    rl.query_labels(rng, ensemble, teacher, buffer, rollout, 16, "variance", args)
    assert buffer.size == 16  # 6 asked, answered at once, stored
    _, _, batch = buffer.get(slice(10, 16))
    returns = batch["true_reward"].sum(-1)  # (6, 2): the synthetic teacher's answers follow the true returns
    np.testing.assert_array_equal(batch["mu"].numpy(), (returns[:, 0] > returns[:, 1]).float().numpy())


def test_pairs_the_synthetic_teacher_skips_are_asked_again_at_once_until_the_labels_due_are_held(rng):
    """--teacher-skip-threshold: a skipped pair is no label, and another is asked in its place. The synthetic teacher
    answers when asked, so the places are filled in the same call, from the same rollout; they were filled only by the
    next iteration's call, so the pretraining labels fell short of their share, and a run ended short of --labels. A
    rollout whose pairs all get skipped ends the asking."""
    ensemble, args = rl.RewardEnsemble(3, 1, size=3), rl.Args(segment_len=5)
    rollout = make_rollout(rng, 64, 2)  # step rewards 1 + 10t + e: a segment's return grows with its start
    threshold = 5 * (1 + 10 * 32)  # about half the segments return less: about a quarter of the pairs are skipped
    buffer = rl.LabelBuffer(40, 5, 3, 1, 3, rng)
    rl.query_labels(rng, ensemble, rl.SyntheticTeacher(rng, skip_threshold=threshold), buffer, rollout, 30, "random", args)
    assert buffer.size == 30
    returns = buffer.get(slice(0, 30))[2]["true_reward"].sum(-1)  # (30, 2)
    assert (returns.max(1).values >= threshold).all()  # every label held is one the teacher answered
    flat = {**rollout, "true_reward": np.zeros_like(rollout["true_reward"])}  # every pair below the threshold
    rl.query_labels(rng, ensemble, rl.SyntheticTeacher(rng, skip_threshold=1.0), buffer, flat, 40, "variance", args)
    assert buffer.size == 30


# ---------------------------------------------------------------------------------------------------------------------
# 10-11. L2 adaptation, running statistics


def test_adapt_l2_keeps_the_validation_loss_between_1_1_and_1_5_times_the_training_loss():
    l2 = torch.full((5,), 1e-3)
    train = torch.full((5,), 0.4)
    val = torch.tensor([0.8, 0.41, 0.5, math.nan, 0.62])  # ratios 2, 1.025, 1.25, none yet, 1.55
    torch.testing.assert_close(rl.adapt_l2(l2, train, val, factor=2.0), torch.tensor([2e-3, 5e-4, 1e-3, 1e-3, 2e-3]))
    adapted = rl.adapt_l2(l2, train, val)
    assert adapted[0] > l2[0] and adapted[4] > l2[4] and adapted[1] < l2[1]
    assert adapted[2] == l2[2] and adapted[3] == l2[3]


@pytest.mark.parametrize("shape", [(), (3,)])
def test_running_mean_std_matches_numpy_over_the_concatenated_batches(rng, shape):
    rms = rl.RunningMeanStd(shape)
    batches = [rng.normal(5.0, 2.0, (n,) + shape) for n in (1, 7, 100, 33)]
    for batch in batches:
        rms.update(batch)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, everything.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, everything.var(0), rtol=1e-3)
    assert rms.count == pytest.approx(len(everything), abs=1e-3)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("env_id", ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4"])
def test_videos_follow_the_robot_when_it_has_gone_far(tmp_path, env_id):
    env = rl.make_env(env_id, 0, True, tmp_path, {})()
    env.reset(seed=0)
    sim = env.unwrapped

    def robot_share(frame):  # the robots are tan (0.8, 0.6, 0.4), the floor a grey-green checkerboard
        return np.mean(frame[..., 0].astype(int) - frame[..., 2] > 60)

    at_start = robot_share(env.render())
    qpos = sim.data.qpos.copy()
    qpos[0] += 30.0  # 30 m down the track, as far as a fast run goes in a few seconds
    sim.set_state(qpos, sim.data.qvel)
    assert robot_share(env.render()) > 0.5 * at_start > 0
    env.close()


@pytest.mark.parametrize("fps", [20, 25, 30, 50, 67, 125])  # the render rates of the MuJoCo tasks, and one odd one
def test_gif_frames_play_in_real_time_at_about_15_per_second(fps):
    stride = rl.gif_frame_stride(fps)
    frame_ms = 1000 * stride / fps
    if fps != 67:  # GIF stores whole hundredths of a second: these rates have a stride that fits
        assert frame_ms % 10 == 0
    assert 7 <= fps / stride <= 20


@pytest.mark.parametrize("input_norm", [True, False])
def test_pretraining_standardises_the_reward_inputs_by_the_labelled_steps_only(rng, input_norm):
    buffer = fill_buffer(rng, 40, terminations=True)
    mask = buffer.data["mask"][:40]
    buffer.data["obs"][:40] = (buffer.data["obs"][:40] * 3 + 5) * mask[..., None]  # absorbing steps stay 0
    training = rl.RewardModelTraining(rl.RewardEnsemble(3, 1), 1e-3)
    rl.pretrain_reward_model(training, buffer, rl.Args(pretrain_epochs=1, reward_input_norm=input_norm), rng)
    real = torch.as_tensor(buffer.data["obs"][:40][mask > 0])
    expected_mean, expected_std = (real.mean(0), real.std(0)) if input_norm else (torch.zeros(3), torch.ones(3))
    for ensemble in (training.ensemble, training.training_ensemble):  # PPO's copy takes them too
        torch.testing.assert_close(ensemble.input_mean, expected_mean)
        torch.testing.assert_close(ensemble.input_std, expected_std)


def test_the_fewest_segment_starts_of_a_rollout_are_those_counted_one_by_one():
    """validate_args refuses a label budget that some rollout cannot hold: its count of the steps a segment can start at
    (never across an episode's end), over every step of an episode a rollout can begin at, against a direct count."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        num_steps, episode_len = int(rng.integers(2, 150)), int(rng.integers(1, 100))
        segment_len = int(rng.integers(1, min(num_steps, episode_len) + 1))
        counted = []
        for offset in range(episode_len):  # the rollout begins `offset` steps into an episode
            ends = range(episode_len - offset, num_steps, episode_len)  # steps that begin a new episode
            starts = [t for t in range(num_steps - segment_len + 1) if not any(t < end < t + segment_len for end in ends)]
            counted.append(len(starts))
        assert rl.fewest_segment_starts(num_steps, segment_len, episode_len) == min(counted)
    assert rl.fewest_segment_starts(2048, 50) == 1999  # no time limit


def test_rollouts_with_falls_hold_at_least_the_segments_counted_for_episodes_run_to_their_time_limit():
    """The capacity check counts episodes that all reach the time limit; an episode that falls (a termination) ends
    early, and a segment may run into it. sample_segments asked for that many segments of a rollout with falls draws
    them all from different starts (had it fewer valid starts, it would draw with replacement: a repeat)."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        episode_len = int(rng.integers(5, 120))
        num_steps, segment_len = int(rng.integers(episode_len, 400)), int(rng.integers(2, episode_len + 1))
        fall_chance, age = rng.choice([0.0, 0.003, 0.02, 0.1, 0.5]), int(rng.integers(0, episode_len))
        terminated, truncated = np.zeros((num_steps, 1), bool), np.zeros((num_steps, 1), bool)
        for t in range(num_steps):  # one environment: an episode under way, then episodes that fall or time out
            age += 1
            terminated[t] = rng.random() < fall_chance
            truncated[t] = not terminated[t] and age == episode_len
            age = 0 if terminated[t] or truncated[t] else age
        step_ids = np.arange(num_steps, dtype=np.float32)[:, None, None]  # each step's observation is its index
        rollout = {"obs": step_ids, "act": step_ids, "true_reward": np.ones((num_steps, 1))}
        rollout |= {"terminated": terminated, "truncated": truncated}
        count = rl.fewest_segment_starts(num_steps, segment_len, episode_len)
        if count == 0:
            continue
        segments = rl.sample_segments(rng, rollout, segment_len, count)
        starts = segments["obs"][:, 0, 0]
        assert len(np.unique(starts)) == count, (num_steps, segment_len, episode_len, fall_chance)


def test_restored_environments_show_the_restored_state_not_the_reset_one(tmp_path):
    """A resumed run films on the episode under way (a kill saved no clip of it): its first frame is drawn from MuJoCo's
    body positions, which restoring the state left at the fresh environment's reset pose until the next step."""

    def one_hopper():
        return gym.vector.SyncVectorEnv([rl.make_env("Hopper-v4", 0, False, str(tmp_path), {})])

    stopped, rng = one_hopper(), np.random.default_rng(0)
    stopped.reset(seed=0)
    for _ in range(15):
        stopped.step(rng.uniform(-1, 1, (1, 3)))
    saved = rl.environment_states(stopped)
    older = [{name: value for name, value in state.items() if name != "poses"} for state in saved]  # before 2026-12-04
    for states in (saved, older):  # the poses saved, or computed from the state (mj_forward)
        resumed = one_hopper()
        resumed.reset(seed=1)
        rl.restore_environment_states(resumed, states)
        body_positions = [envs.envs[0].unwrapped.data.xpos for envs in (resumed, stopped)]
        np.testing.assert_allclose(*body_positions, atol=1e-5)


def test_a_clip_length_that_is_not_a_number_is_refused_where_the_checks_do_not_run(tmp_path):
    """--eval-only does not run validate_args: --video-seconds nan filmed whole episodes without a word."""
    with pytest.raises(SystemExit, match="--video-seconds must be 0"):
        rl.make_env("Hopper-v4", 0, True, str(tmp_path), {}, video_seconds=float("nan"))()
    # and the video flags without --capture-video, on a resume or an evaluation, did nothing without a word
    for given in ({"video_format": "gif"}, {"eval_only": True, "video_seconds": 3.0}):
        with pytest.raises(SystemExit, match="error: --video-(format|seconds) is for --capture-video"):
            rl.resumed_args(rl.Args(resume=str(tmp_path), **given), {"args": vars(rl.Args())})
    with pytest.raises(SystemExit, match="error: --eval-episodes is for --eval-only"):  # a resumed training run
        rl.resumed_args(rl.Args(resume=str(tmp_path), eval_episodes=3), {"args": vars(rl.Args())})


def test_a_checkpoint_without_an_episode_count_resumes_filming_after_the_videos_already_there(tmp_path):
    """A checkpoint from before 2026-12-02 has no episode count: the resumed run numbered its episodes from 0 again, and
    its videos replaced the earlier ones (episode-0, -1, -8, ...). They number on after the last one saved."""
    filmed = gym.vector.SyncVectorEnv([rl.make_env("Hopper-v4", 0, True, str(tmp_path), {})])
    filmed.reset(seed=0)
    for episode in (0, 1, 8):
        (tmp_path / "videos" / f"episode-{episode}.mp4").write_bytes(b"an earlier video")
    state = rl.environment_states(filmed)[0]
    del state["episode_count"]
    rl.restore_environment_states(filmed, [state])
    recorder = rl.video_recorder(filmed.envs[0])
    assert recorder.episode == 9 and recorder.frames is None  # the episode under way: a part of one, not filmed
    filmed.close()
    assert {path.read_bytes() for path in (tmp_path / "videos").iterdir()} == {b"an earlier video"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the v4 ids (gymnasium prefers v5)
@pytest.mark.parametrize("env_id", ["Hopper-v4", "Ant-v4", "Reacher-v4", "Humanoid-v4"])
def test_a_restored_environment_steps_on_exactly_as_the_one_it_was_saved_from(tmp_path, env_id):
    """Some tasks read body positions before they simulate (Ant's torso, Humanoid's centre of mass, Reacher-v4's
    fingertip), and an uninterrupted run holds those of the last substep's start: recomputed from the state as it was
    restored, they gave the first step after a resume another reward, and the resumed run went another way."""

    def one_env():
        return gym.vector.SyncVectorEnv([rl.make_env(env_id, 0, False, str(tmp_path), {})])

    stopped, rng = one_env(), np.random.default_rng(0)
    stopped.reset(seed=0)
    actions = rng.uniform(-0.4, 0.4, (25, 1, *stopped.single_action_space.shape))
    for action in actions[:20]:
        stopped.step(action)
    resumed = one_env()
    resumed.reset(seed=1)
    rl.restore_environment_states(resumed, rl.environment_states(stopped))
    for action in actions[20:]:
        (obs_stopped, reward_stopped, *_), (obs_resumed, reward_resumed, *_) = stopped.step(action), resumed.step(action)
        assert reward_resumed[0] == reward_stopped[0] and np.array_equal(obs_resumed, obs_stopped)
