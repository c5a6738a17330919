"""rlhf_moving_dot.py: the environment's dynamics, bounds and reward; its observations; segments, the preference
database and the reward model; a subprocess run of every mode (synthetic on positions and on pixels, true reward,
offline, human through a live label server); and learning from preferences alone."""

import re
import signal
import threading
import time
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import pytest
import rlhf_moving_dot as dot
import torch
import tyro
from helpers import (
    LABEL_SERVER_RESTART_CHECKS,
    TEACHER_STOP_AND_END_CHECKS,
    assert_only_a_second_ctrl_c_stops_at_once,
    start_trainer,
    assert_the_pairs_kept_are_the_most_disagreed_on,
    assert_a_resumed_run_is_not_refused_its_own_settings,
    assert_a_run_killed_after_pretraining_resumes_pretrained,
    assert_a_kill_after_a_checkpoint_loses_no_label,
    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice,
    assert_the_fields_computed_at_run_time_are_not_flags,
    assert_a_new_run_never_writes_into_another_runs_folder,
    assert_a_run_folder_given_as_a_dot_keeps_its_name,
    assert_a_resumed_run_keeps_its_videos,
    assert_a_run_stopped_in_the_label_wait_resumes_where_it_stopped,
    assert_the_label_token_stays_out_of_the_logs,
    assert_a_run_the_label_server_refuses_saves_and_says_so,
    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once,
    assert_processes_of_a_run_never_share_a_pair_id,
    assert_the_finished_run_closed_its_pairs,
    assert_sigterm_stops_like_ctrl_c,
    RLHF_TAGS,
    assert_tags,
    assert_answers_follow_true_returns,
    assert_clear_error,
    assert_predicted_returns_are_of_whole_episodes,
    assert_resumes_it_cannot_do_are_refused_and_change_nothing,
    interrupt_run,
    only_run_dir,
    progress_lines,
    run_script,
    scalars,
    rating_by_script,
)

torch.set_num_threads(1)
SCRIPT = Path(dot.__file__)
STAY, UP, DOWN, LEFT, RIGHT = range(5)
# a tiny run: 2 pretraining rollouts of 4 envs x 64 steps, 4 RL iterations, 30 labels of 5-step segments, 100-step episodes
TINY = (
    "--total-timesteps 1536 --num-envs 4 --num-steps 64 --pretrain-steps 512 --labels 30 --segment-len 5 --episode-steps 100"
)
TINY += " --pretrain-epochs 5 --reward-eval-every 2"


def run_dot(cwd, args, timeout=300, cold=False):
    return run_script(cwd, args, timeout, script=SCRIPT, cold=cold)


def dot_env(position, observation="position"):
    env = gym.make("MovingDot-v0", observation=observation)
    env.reset(seed=0)
    env.unwrapped.position = np.array(position)
    return env


# ---------------------------------------------------------------------------------------------------------------------
# the environment


@pytest.mark.parametrize("action, move", [(STAY, (0, 0)), (UP, (-1, 0)), (DOWN, (1, 0)), (LEFT, (0, -1)), (RIGHT, (0, 1))])
def test_each_action_moves_the_dot_one_pixel(action, move):
    env = dot_env((50, 60))
    env.step(action)
    np.testing.assert_array_equal(env.unwrapped.position, np.array((50, 60)) + move)


@pytest.mark.parametrize(
    "position, action, reward",
    [
        ((50, 80), DOWN, 1.0),  # above the centre, moving down: closer
        ((50, 80), UP, -1.0),
        ((150, 80), UP, 1.0),
        ((105, 30), RIGHT, 1.0),  # left of the centre, moving right: closer
        ((105, 30), LEFT, -1.0),
        ((105, 130), LEFT, 1.0),
        ((60, 40), STAY, 0.0),
        ((105, 80), STAY, 0.0),  # at the centre, staying: nothing changes
        ((105, 80), UP, -1.0),  # at the centre, every move takes it away
    ],
)
def test_reward_is_plus_one_closer_minus_one_further_zero_otherwise(position, action, reward):
    assert dot_env(position).step(action)[1] == reward


@pytest.mark.parametrize(
    "position, action", [((4, 60), UP), ((205, 60), DOWN), ((60, 4), LEFT), ((60, 155), RIGHT), ((4, 4), UP)]
)
def test_the_dot_stays_inside_the_field_and_pushing_the_border_earns_nothing(position, action):
    env = dot_env(position)
    _, reward, *_ = env.step(action)
    np.testing.assert_array_equal(env.unwrapped.position, position)
    assert reward == 0.0


def test_episodes_start_anywhere_inside_and_last_2000_steps():
    env = gym.make("MovingDot-v0")
    starts = np.array([env.unwrapped.position for seed in range(300) if env.reset(seed=seed)])
    assert (starts >= dot.LOW).all() and (starts <= dot.HIGH).all()
    assert len({tuple(p) for p in starts}) > 250  # random starts, not one fixed position
    rng = np.random.default_rng(0)
    for step in range(1, 2001):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(5)))
        assert not terminated and truncated == (step == 2000)


def test_position_observation_is_the_scaled_position():
    obs, *_ = dot_env((105, 80)).step(DOWN)
    np.testing.assert_allclose(obs, ((106 - 105) / 105, 0.0), atol=1e-6)
    obs, *_ = dot_env((4, 155)).step(STAY)
    assert obs[0] < -0.95 and obs[1] > 0.9


def test_pixel_observation_shows_the_dot_where_it_is_and_every_one_pixel_move():
    env = dot_env((100, 50), "pixels")
    frame, *_ = env.step(STAY)
    assert frame.shape == (1, 42, 32) and frame.dtype == np.uint8
    row, col = np.unravel_index(frame[0].argmax(), frame[0].shape)
    assert (row, col) == (100 // 5, 50 // 5)  # the brightest block holds the dot's centre
    assert abs(int(frame.sum()) - 255) <= 4  # the 5x5 dot's whole light, spread over the blocks it covers
    seen = [frame]
    for action in (DOWN, RIGHT, UP, LEFT):
        seen.append(env.step(action)[0])
        assert not np.array_equal(seen[-1], seen[-2])  # a one-pixel move changes the frame
    np.testing.assert_array_equal(seen[0], seen[-1])  # back where it started: the same frame
    # observe() draws the same frames from positions, as the reward model's segments use them
    np.testing.assert_array_equal(dot.observe(np.array([100, 50]), "pixels"), seen[0])


def test_keypoints_of_a_frame_follow_the_dot():
    """The reward model's pixel features: with a convolution that sums a frame's brightness around each place, each
    feature map's soft-argmax is the dot's place on the field, scaled to [-1, 1]; moving the dot down moves the row
    only."""
    keypoints = dot.Keypoints((1, 42, 32), channels=1)
    with torch.no_grad():
        keypoints.conv.weight.fill_(10.0)  # 3x3 sums (stride 2 sees every block), bright enough to stand out
        keypoints.conv.bias.zero_()
    found = []
    for position in [(100, 50), (180, 50), (20, 140)]:
        frame = torch.as_tensor(dot.observe(np.array(position), "pixels"))[None]
        found.append(keypoints(dot.as_input(frame))[0].detach().numpy())
        expected = np.array(position) / (205, 155) * 2 - 1  # rows 0-209, columns 0-159: about [-1, 1]
        np.testing.assert_allclose(found[-1], expected, atol=0.15)
    assert found[1][0] > found[0][0] + 0.6 and found[1][1] == pytest.approx(found[0][1], abs=0.05)


def test_rendered_frame_shows_the_dot_and_the_centre():
    frame = dot_env((30, 140)).render()
    assert frame.shape == (210, 160, 3)
    assert (frame[28:33, 138:143] == 255).all() and frame[105, 80, 0] > frame[0, 0, 0]


# ---------------------------------------------------------------------------------------------------------------------
# segments, database, reward model


def coded_rollout(rng, steps=64, envs=3, truncate_at=()):
    """Rollout arrays (steps, envs, ...) whose positions say where each step came from: (t, e); `truncate_at` steps
    end an episode in every env."""
    t, e = np.meshgrid(np.arange(steps), np.arange(envs), indexing="ij")
    truncated = np.zeros((steps, envs), bool)
    truncated[list(truncate_at)] = True
    return {
        "position": np.stack([t, e], -1).astype(np.int16),
        "act": rng.integers(0, 5, (steps, envs)),
        "true_reward": rng.integers(-1, 2, (steps, envs)).astype(np.float32),
        "truncated": truncated,
    }


def test_variance_selection_keeps_the_candidate_pairs_the_members_disagree_on_most():
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    torch.manual_seed(0)
    ensemble = dot.RewardEnsemble((2,), 5, size=3)  # untrained members: they disagree, pair by pair
    left, right = dot.select_pairs(np.random.default_rng(3), ensemble, "position", rollout, 5, 6, 8, "variance")
    replay = np.random.default_rng(3)  # draws the same candidates as select_pairs did
    candidates = [dot.sample_segments(replay, rollout, 5, 6 * 8) for _ in range(2)]
    kept, scores = (dot.disagreement(ensemble, "position", *pair) for pair in ((left, right), candidates))
    assert_the_pairs_kept_are_the_most_disagreed_on(kept, scores, 6)


def test_pairs_the_synthetic_teacher_skips_are_asked_again_at_once_until_the_labels_due_are_held():
    """As in rlhf_ppo_mujoco.py: a skipped pair's place is filled in the same call, from the same rollout (it was filled
    only by the next iteration's: a run ended short of --labels, and pretraining on fewer labels than its share); a
    rollout whose pairs all get skipped ends the asking."""
    rng = np.random.default_rng(0)
    rollout, args = coded_rollout(rng), dot.Args(segment_len=5)  # rewards -1, 0, 1: about a third of the pairs skipped
    buffer = dot.LabelBuffer(40, 5, 3, rng)
    dot.query_labels(rng, None, dot.SyntheticTeacher(rng, skip_threshold=1.0), buffer, None, rollout, 30, "random", args)
    assert buffer.size == 30
    returns = buffer.data["true_reward"][:30].sum(-1)  # (30, 2)
    assert (returns.max(1) >= 1.0).all()  # every label held is one the teacher answered
    flat = {**rollout, "true_reward": np.zeros_like(rollout["true_reward"])}  # every pair below the threshold
    dot.query_labels(rng, None, dot.SyntheticTeacher(rng, skip_threshold=1.0), buffer, None, flat, 40, "random", args)
    assert buffer.size == 30


def test_no_pair_shows_one_segment_twice():
    """As in rlhf_ppo_mujoco.py: a pair whose two sides are the same segment gets another right side (20 x 10 pairs of
    a rollout with 30 starts)."""
    rollout = coded_rollout(np.random.default_rng(0), steps=14, envs=3)  # 10 starts of 5-step segments per env
    for seed in range(20):
        left, right = dot.select_pairs(np.random.default_rng(seed), None, "position", rollout, 5, 10, 1, "random")
        assert not (left["position"] == right["position"]).all((1, 2)).any(), seed


def test_segments_are_consecutive_steps_of_one_episode():
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng, truncate_at=(20, 41))
    segments = dot.sample_segments(rng, rollout, 8, 3000)
    t, e = segments["position"][..., 0], segments["position"][..., 1]
    assert (np.diff(t, axis=1) == 1).all() and (e == e[:, :1]).all()  # 8 consecutive steps of one env
    np.testing.assert_array_equal(segments["act"], rollout["act"][t, e])
    np.testing.assert_array_equal(segments["true_reward"], rollout["true_reward"][t, e])
    # an episode may end at a segment's last step, never inside it: starts 14-20 and 35-41 would cross
    crossing = set(range(14, 21)) | set(range(35, 42))
    assert set(t[:, 0]) == set(range(64 - 8 + 1)) - crossing
    with pytest.raises(RuntimeError, match="no valid segment"):
        dot.sample_segments(rng, coded_rollout(rng, truncate_at=range(0, 64, 4)), 8, 1)


def test_the_synthetic_teacher_prefers_the_segment_with_more_true_reward_and_calls_a_tie_equal():
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)  # rewards -1, 0 and 1: many 5-step segments tie
    left, right = dot.sample_segments(rng, rollout, 5, 200), dot.sample_segments(rng, rollout, 5, 200)
    mu = dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"])
    assert (mu == 0.5).sum() > 10
    assert_answers_follow_true_returns({"true_reward": np.stack([left["true_reward"], right["true_reward"]], 1), "mu": mu})


def test_preference_database_keeps_pairs_across_connections(tmp_path):
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    left, right = dot.sample_segments(rng, rollout, 6, 7), dot.sample_segments(rng, rollout, 6, 7)
    mu = dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"])
    database = dot.PreferenceDatabase(str(tmp_path / "prefs.sqlite"))
    database.add(left, right, mu)
    database.close()
    reopened = dot.PreferenceDatabase(str(tmp_path / "prefs.sqlite"))
    assert reopened.count(6) == 7 and reopened.count(5) == 0
    loaded_left, loaded_right, loaded_mu = reopened.load(6, 100)
    for key in dot.SEGMENT_KEYS:
        np.testing.assert_array_equal(loaded_left[key], left[key])
        np.testing.assert_array_equal(loaded_right[key], right[key])
    np.testing.assert_array_equal(loaded_mu, mu)
    assert len(reopened.load(6, 3)[2]) == 3


@pytest.mark.parametrize("observation", ["position", "pixels"])
def test_reward_ensemble_scores_segments_of_either_observation(observation):
    rng = np.random.default_rng(0)
    obs_shape = dot.observe(np.zeros(2, int), observation).shape
    ensemble = dot.RewardEnsemble(obs_shape, 5, size=3)
    segments = dot.sample_segments(rng, coded_rollout(rng), 6, 4)
    returns = dot.segment_returns(ensemble, segments, observation)
    assert returns.shape == (3, 4)
    assert not torch.allclose(returns[0], returns[1])  # independent members


@pytest.mark.parametrize("observation", ["position", "pixels"])
def test_the_progress_form_pays_nothing_for_staying_pushing_against_the_border_or_a_loop(observation):
    """--reward-form progress scores a step as f(next observation) - f(observation): whatever f has learned, a step
    that leaves the dot where it was earns 0 and a move there and back sums to 0. The action form, r(o, a), does not."""
    torch.manual_seed(0)
    positions = np.array([[50, 60], [dot.LOW[0], 70], [100, 100], [99, 100], [100, 100], [100, 101]])
    actions = np.array([STAY, UP, UP, DOWN, RIGHT, LEFT])  # stay; push at the top border; two loops
    obs_shape = dot.observe(np.zeros(2, int), observation).shape
    with torch.no_grad():
        progress = dot.RewardEnsemble(obs_shape, 5, 3, progress=True)(*dot.reward_inputs(positions, actions, observation))
        action = dot.RewardEnsemble(obs_shape, 5, 3)(*dot.reward_inputs(positions, actions, observation))
    torch.testing.assert_close(progress[:, :2], torch.zeros(3, 2))
    torch.testing.assert_close(progress[:, 2] + progress[:, 3], torch.zeros(3))
    torch.testing.assert_close(progress[:, 4] + progress[:, 5], torch.zeros(3))
    assert (progress[:, 2:].abs() > 1e-5).all()  # a move is scored: f is not flat
    assert (action[:, :2].abs() > 1e-3).all() and ((action[:, 2] + action[:, 3]).abs() > 1e-3).all()


def test_the_next_observation_the_reward_model_reads_is_the_one_the_environment_shows():
    """The progress form reads each step's next frame as observe(move(position, action)), made from the positions the
    rollout records: in the training loop's vector env (same-step autoreset) that must be the frame the environment
    returns, at the border too, wherever the episode did not end at that step (the reset frame comes then)."""
    envs = gym.vector.SyncVectorEnv(
        [dot.make_env("pixels", 30, i, False, None) for i in range(4)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    checked = 0
    for _ in range(200):
        envs.envs[0].unwrapped.position, envs.envs[1].unwrapped.position = dot.LOW.copy(), dot.HIGH.copy()  # corners
        positions = np.array([env.unwrapped.position for env in envs.envs])  # as the rollout records them
        actions = rng.integers(5, size=4)
        next_obs, _, _, truncated, _ = envs.step(actions)
        made = dot.reward_inputs(positions, actions, "pixels")[2].numpy()
        np.testing.assert_array_equal(made[~truncated], next_obs[~truncated])
        checked += (~truncated).sum()
    assert checked > 700 and truncated.dtype == bool
    envs.close()


@pytest.mark.parametrize("reward_form", ["action", "progress"])
def test_reward_model_learns_the_dots_reward_from_synthetic_preferences(reward_form):
    """Labels of random-walk segments from the perfect teacher; the fitted ensemble's normalised reward must track
    the true reward on fresh steps, in either form."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    env = gym.make("MovingDot-v0").unwrapped
    env.reset(seed=0)

    def walk(steps):
        position, act, reward, restarted = [], [], [], []
        for _ in range(steps):
            position.append(env.position.copy())
            act.append(int(rng.integers(5)))
            reward.append(env.step(act[-1])[1])
            restarted.append(rng.random() < 0.02)
            if restarted[-1]:
                env.reset(seed=int(rng.integers(1 << 30)))
        return {
            "position": np.array(position, np.int16),
            "act": np.array(act),
            "true_reward": np.array(reward, np.float32),
            "truncated": np.array(restarted),
        }

    # four walks of 1000 steps side by side, as a vector env's rollout (steps, envs): each column one walk in order
    rollout = {k: v.reshape(4, 1000, *v.shape[1:]).swapaxes(0, 1) for k, v in walk(4000).items()}
    left, right = dot.sample_segments(rng, rollout, 10, 400), dot.sample_segments(rng, rollout, 10, 400)
    buffer = dot.LabelBuffer(400, 10, 3, rng)
    buffer.add(left, right, dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"]))
    ensemble = dot.RewardEnsemble((2,), 5, 3, progress=reward_form == "progress")
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-3)
    dot.train_reward_model(ensemble, optimizer, buffer, "position", torch.full((3,), 1e-4), 800, 64, 0.1, rng)
    step_rewards = dot.label_step_rewards(ensemble, buffer.get(), "position")
    _, _, val_accuracy = dot.validate_reward_model(step_rewards, buffer.get(), 0.1)
    dot.fit_reward_normalization(ensemble, step_rewards, 1.0)
    fresh = walk(2000)
    predicted = ensemble.normalized_reward(*dot.reward_inputs(fresh["position"], fresh["act"], "position"))
    assert val_accuracy > 0.8
    assert np.corrcoef(predicted.numpy(), fresh["true_reward"])[0, 1] > 0.8
    assert abs(predicted.mean().item()) < 0.3 and 0.7 < predicted.std().item() < 1.3  # normalised


def segment_pairs(rng, count, segment_len=5):
    """`count` labelled pairs of random-walk segments: (left, right, mu) as the teacher hands them over."""
    rollout = coded_rollout(rng)
    left, right = dot.sample_segments(rng, rollout, segment_len, count), dot.sample_segments(rng, rollout, segment_len, count)
    return left, right, dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"])


def test_label_buffer_keeps_every_label_beyond_its_capacity(tmp_path):
    rng = np.random.default_rng(0)
    left, right, mu = segment_pairs(rng, 7)
    buffer = dot.LabelBuffer(3, 5, 3, rng)
    buffer.add(dot.index_segments(left, slice(0, 5)), dot.index_segments(right, slice(0, 5)), mu[:5])
    buffer.add(dot.index_segments(left, slice(5, 7)), dot.index_segments(right, slice(5, 7)), mu[5:])
    assert buffer.size == 7
    held = buffer.get()
    np.testing.assert_array_equal(held["mu"], mu)
    for key in dot.SEGMENT_KEYS:
        np.testing.assert_array_equal(held[key][:, 0], left[key])
        np.testing.assert_array_equal(held[key][:, 1], right[key])
    # and a saved file with more labels than the budget (answers saved after a checkpoint) loads whole
    buffer.save(str(tmp_path / "labels.npz"))
    loaded = dot.LabelBuffer(2, 5, 3, rng)
    loaded.load(str(tmp_path / "labels.npz"))
    assert loaded.size == 7
    for key, value in held.items():
        np.testing.assert_array_equal(loaded.get()[key], value)


def test_each_member_trains_on_its_bootstrap_and_validates_on_its_out_of_bag_labels():
    """C17 2.2.3's 1/e held out is the bootstrap's out-of-bag share: a member's Poisson(1) weight is 0 for about 37%
    of the labels, those are its validation set, and it trains on the other ~63% (distinct labels)."""
    rng = np.random.default_rng(0)
    left, right, mu = segment_pairs(rng, 30000, segment_len=2)
    buffer = dot.LabelBuffer(30000, 2, 3, rng)
    buffer.add(left, right, mu)
    weight, is_val = buffer.get()["weight"], buffer.get()["is_val"]
    trained_on = (weight > 0).mean(0)
    np.testing.assert_allclose(trained_on, 1 - 1 / np.e, atol=0.01)
    np.testing.assert_array_equal(is_val, weight == 0)  # validation = out of bag, nothing else is held out
    np.testing.assert_allclose(weight.mean(0), 1.0, atol=0.02)  # Poisson(1): a resample of the same size
    assert weight.max() >= 4  # a label drawn several times, as in a resample with replacement
    assert (weight[:, 0] != weight[:, 1]).mean() > 0.5  # each member its own resample


def test_training_loss_is_the_bootstrap_weighted_loss_each_member_was_trained_on():
    rng = np.random.default_rng(1)
    torch.manual_seed(0)
    left, right, mu = segment_pairs(rng, 6)
    buffer = dot.LabelBuffer(6, 5, 2, rng)
    buffer.add(left, right, mu)
    weight = np.array([[3, 0], [0, 1], [1, 2], [2, 0], [0, 1], [1, 4]], np.float32)
    buffer.data["weight"][:6], buffer.data["is_val"][:6] = weight, weight == 0
    ensemble = dot.RewardEnsemble((2,), 5, size=2)
    before = {name: value.clone() for name, value in ensemble.state_dict().items()}
    labels = buffer.get()
    train_loss, val_loss, _ = dot.validate_reward_model(dot.label_step_rewards(ensemble, labels, "position"), labels, 0.1)
    for name, value in ensemble.state_dict().items():  # validating changes nothing, the reward normalisation included
        assert torch.equal(value, before[name]), name
    # the same losses computed here from each member's predicted segment returns
    returns = dot.segment_returns(ensemble, buffer.get(), "position").detach().numpy()  # (members, labels, 2)
    p_left = 0.9 / (1 + np.exp(returns[..., 1] - returns[..., 0])) + 0.05
    losses = -(mu * np.log(p_left) + (1 - mu) * np.log(1 - p_left))  # (members, labels)
    expected_train = (losses * weight.T).sum(1) / weight.T.sum(1)
    expected_val = (losses * (weight.T == 0)).sum(1) / (weight.T == 0).sum(1)
    np.testing.assert_allclose(train_loss.numpy(), expected_train, rtol=1e-5)
    np.testing.assert_allclose(val_loss.numpy(), expected_val, rtol=1e-5)


@pytest.mark.parametrize("observation", ["position", "pixels"])
def test_a_round_in_the_thread_trains_as_in_the_main_thread_and_ppos_copy_takes_it_only_when_it_is_done(observation):
    rng = np.random.default_rng(2)
    args = dot.Args(observation=observation, reward_updates=5, reward_eval_every=2, reward_batch_size=32)
    obs_shape = dot.observe(np.zeros(2, int), observation).shape
    threaded, in_line = (dot.RewardModelTraining(dot.RewardEnsemble(obs_shape, 5, 3), 1e-3) for _ in range(2))
    in_line.ensemble.load_state_dict(threaded.ensemble.state_dict())
    in_line.training_ensemble.load_state_dict(threaded.training_ensemble.state_dict())
    buffer = dot.LabelBuffer(100, 5, 3, rng)
    buffer.add(*segment_pairs(rng, 100))
    rng_threaded, rng_in_line = np.random.default_rng(1), np.random.default_rng(1)
    gate, copies = threading.Event(), ("ensemble", "training_ensemble")
    try:
        for round_number in (1, 2):  # the second round ends in a validation pass (--reward-eval-every 2)
            before = {copy: {k: v.clone() for k, v in getattr(threaded, copy).state_dict().items()} for copy in copies}
            gate.clear()
            threaded.thread.submit(gate.wait)  # hold the thread: the round queues behind this
            threaded.start_round(buffer, args, rng_threaded)
            in_line.train(buffer, 1, args.reward_updates, args, rng_in_line)
            buffer.add(*segment_pairs(rng, 3))  # answers arriving while the round runs are not the round's
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
        assert not np.isnan(threaded.val_accuracy)  # the validation pass's figures and L2 adaptation came back
        torch.testing.assert_close(threaded.val_loss, in_line.val_loss, rtol=0, atol=0)
        torch.testing.assert_close(threaded.l2_coef, in_line.l2_coef, rtol=0, atol=0)
    finally:
        gate.set()  # a failed assertion must not leave the thread held (close waits for it)
        threaded.close()


# ---------------------------------------------------------------------------------------------------------------------
# every mode, run as a user runs it


def test_an_episode_that_begins_with_rl_gets_its_predicted_return(tmp_path):
    # 64-step episodes end with each pretraining rollout: the first episode of RL begins with it and is whole
    result = run_dot(tmp_path, TINY.replace("--episode-steps 100", "--episode-steps 64"))
    assert result.returncode == 0, result.stderr
    logged = scalars(only_run_dir(tmp_path))
    assert assert_predicted_returns_are_of_whole_episodes(logged, rl_start=512, num_envs=4, batch_size=256) == 0


def test_synthetic_run_logs_saves_labels_and_model_and_evaluates(tmp_path):
    result = run_dot(tmp_path, TINY + " --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("MovingDot-v0-position__rlhf_moving_dot__1__")
    logged = scalars(run_dir)
    assert_tags(logged, RLHF_TAGS + ["charts/predicted_return"])
    assert logged["labels/total"][-1][1] == 30
    assert "step 1536" in result.stdout and "labels 30/30" in result.stdout
    # not short ones from the episodes under way when pretraining (2 rollouts of 4 envs x 64 steps) ended
    assert assert_predicted_returns_are_of_whole_episodes(logged, rl_start=512, num_envs=4, batch_size=256) > 0
    labels = np.load(run_dir / "labels.npz")
    assert labels["position"].shape == (30, 2, 5, 2) and labels["act"].shape == (30, 2, 5)
    assert_answers_follow_true_returns(labels)
    # a label's positions are the dot's real path: one pixel (or none) per step, the move its action makes
    moves = np.diff(labels["position"].astype(int), axis=2)
    expected = dot.MOVES[labels["act"][:, :, :-1]]
    at_border = (labels["position"][:, :, 1:] == dot.LOW) | (labels["position"][:, :, 1:] == dot.HIGH)
    assert np.all((moves == expected) | at_border)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1536 and {"agent", "reward_ensemble"} <= set(checkpoint)
    evaluation = run_dot(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1")
    assert evaluation.returncode == 0, evaluation.stderr
    assert "eval: 1 episodes of MovingDot-v0: true return" in evaluation.stdout
    # the same episode filmed (--capture-video is the evaluating command's, as in rlhf_ppo_mujoco.py; it was refused,
    # and a run trained filming filmed no evaluation): in runs/NAME/eval/videos, the first frame and one per step
    filmed_twice = run_dot(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 2 --capture-video")
    assert filmed_twice.returncode == 0, filmed_twice.stderr
    assert sorted(clip.name for clip in (run_dir / "eval" / "videos").iterdir()) == ["episode-0.mp4", "episode-1.mp4"]
    filmed = run_dot(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1 --capture-video")
    assert filmed.returncode == 0, filmed.stderr
    assert filmed.stdout.splitlines()[-1] == evaluation.stdout.splitlines()[-1]
    clips = sorted((run_dir / "eval" / "videos").iterdir())
    assert [clip.name for clip in clips] == ["episode-0.mp4"]  # this evaluation's clip only, not the last one's
    frames = imageio.mimread(clips[0])
    assert len(frames) == 101  # --episode-steps 100
    assert np.abs(np.asarray(frames[-1], float) - frames[0]).mean() > 0  # the dot moved
    # the evaluated agent is the saved one, acting its most likely action: a policy whose likeliest action is to stay
    # (p 0.29; sampled, it moves 71% of the time) never moves, and earns exactly 0
    checkpoint["agent"]["actor.weight"].zero_()
    checkpoint["agent"]["actor.bias"][:] = torch.tensor([1.0, 0.5, 0.5, 0.5, 0.5])
    torch.save(checkpoint, run_dir / "checkpoint.pt")
    evaluation = run_dot(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 2")
    assert "eval: 2 episodes of MovingDot-v0: true return 0.0 +- 0.0" in evaluation.stdout, evaluation.stdout


@pytest.mark.slow
def test_pixel_run_scores_frames_with_a_cnn_reward_model(tmp_path):
    result = run_dot(tmp_path, TINY + " --observation pixels --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    losses = [value for _, value in scalars(run_dir)["reward_model/loss"]]
    assert np.isfinite(losses).all()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    reward_state = checkpoint["reward_ensemble"]
    assert any(value.dim() == 4 for value in reward_state.values())  # convolution kernels: it reads frames
    assert checkpoint["args"]["reward_form"] == "progress"  # the default on frames
    # the saved model scores frames: rebuilt from the checkpoint, it gives the labelled segments finite, varied rewards
    ensemble = dot.RewardEnsemble((1, 42, 32), 5, 3, progress=True)
    ensemble.load_state_dict(reward_state)
    labels = np.load(run_dir / "labels.npz")
    rewards = dot.label_step_rewards(ensemble, labels, "pixels")
    assert rewards.shape == (3, 30, 2, 5) and torch.isfinite(rewards).all() and rewards.std() > 0


@pytest.mark.slow
def test_true_reward_mode_queries_no_labels_and_captures_video(tmp_path):
    result = run_dot(tmp_path, TINY + " --feedback true-reward --capture-video")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    assert "losses/policy_loss" in logged and not any(tag.startswith(("reward_model/", "labels/")) for tag in logged)
    assert logged["losses/policy_loss"][0][0] == 256  # PPO updates from the first rollout on
    assert not (run_dir / "labels.npz").exists()
    frames = imageio.mimread(run_dir / "videos" / "episode-1.mp4")  # episodes 0 and 1 are recorded
    assert len(frames) == 101 and frames[0].shape == (210, 160, 3) and frames[0].max() == 255  # the dot is drawn


@pytest.mark.slow
def test_a_resumed_run_numbers_its_videos_after_the_earlier_ones_and_replaces_none(tmp_path):
    # stopped in episode 1 or 2 of environment 0 (100-step episodes, 64 steps an iteration), after episode 0's video
    assert_a_resumed_run_keeps_its_videos(tmp_path, TINY + " --feedback true-reward --capture-video --save-model", SCRIPT)


@pytest.mark.slow
def test_offline_run_builds_the_database_once_and_keeps_its_reward_model_frozen(tmp_path):
    database = tmp_path / "prefs.sqlite"
    args = TINY.replace("--total-timesteps 1536", "--total-timesteps 2048") + f" --offline --preference-db {database}"
    first = run_dot(tmp_path, args + " --exp-name first")
    assert first.returncode == 0, first.stderr
    assert "reward model fitted on 30 labels" in first.stdout
    assert dot.PreferenceDatabase(str(database)).count(5) == 30
    (run_dir,) = (tmp_path / "runs").glob("*first*")
    logged = scalars(run_dir)
    assert [value for _, value in logged["labels/total"]][-1] == 30
    # every label comes before RL, and the fitted model is never trained again
    assert min(step for step, _ in logged["losses/policy_loss"]) > 512
    assert len({value for _, value in logged["reward_model/loss"]}) == 1
    assert "reward_model/true_correlation" in logged

    second = run_dot(tmp_path, args + " --exp-name second")
    assert second.returncode == 0, second.stderr
    assert "offline: 30 labelled pairs loaded from the preference database" in second.stdout
    assert dot.PreferenceDatabase(str(database)).count(5) == 30  # nothing labelled twice

    # a run with another teacher is refused the database, which it would otherwise take as its own labels
    other_teacher = run_dot(tmp_path, args + " --exp-name third --teacher-epsilon 0.2")
    assert other_teacher.returncode != 0
    assert "was labelled by a teacher with --teacher-epsilon 0.0" in other_teacher.stderr, other_teacher.stderr[-2000:]
    assert "this run's teacher has --teacher-epsilon 0.2" in other_teacher.stderr
    assert dot.PreferenceDatabase(str(database)).count(5) == 30
    assert not list((tmp_path / "runs").glob("*third*"))  # refused before its run folder was made (README: Flags)


@pytest.mark.slow
def test_an_offline_run_killed_while_fitting_labels_no_pair_twice(tmp_path):
    """Offline runs label every pair before their first checkpoint, so none is asked twice: a run killed (-9) while its
    reward model is fitted on the database cannot resume into asking the last pretraining rollout's pairs again (a
    checkpoint written as that rollout began would let it, adding them to the database a second time)."""
    database = tmp_path / "prefs.sqlite"
    args = (
        TINY.replace("--pretrain-epochs 5", "--pretrain-epochs 2000") + f" --offline --preference-db {database} --save-model"
    )
    trainer, output, reader = start_trainer(tmp_path, args, SCRIPT, cold=True)  # killed at a chosen moment
    try:
        deadline = time.time() + 120
        while not (database.exists() and dot.PreferenceDatabase(str(database)).count(5) == 30):  # every label in
            assert time.time() < deadline and trainer.poll() is None, "".join(output)
            time.sleep(0.05)
        time.sleep(0.5)
        assert trainer.poll() is None and "reward model fitted" not in "".join(output)  # killed while fitting
        trainer.kill()
        trainer.wait(timeout=60)
    finally:
        trainer.kill()
    reader.join(timeout=30)
    # killed before its first checkpoint: nothing to resume, and nothing added to the database
    resumed = run_dot(tmp_path, f"--resume {only_run_dir(tmp_path)}")
    assert resumed.returncode == 1 and "no checkpoint at" in resumed.stderr, resumed.stderr[-2000:]
    assert dot.PreferenceDatabase(str(database)).count(5) == 30
    # started again on the same database: it takes the 30 labels there and asks for none
    again = run_dot(tmp_path, TINY + f" --offline --preference-db {database}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert dot.PreferenceDatabase(str(database)).count(5) == 30


@pytest.mark.slow
def test_human_feedback_run_learns_from_a_rater_behind_the_label_server(tmp_path, label_server):
    server = label_server()
    args = TINY + f" --feedback human --label-server {server.url} --pretrain-fraction 0.5 --save-model"
    with rating_by_script(server) as answered:
        trainer = run_script(tmp_path, args, timeout=600, script=SCRIPT)
    assert trainer.returncode == 0, trainer.stdout + trainer.stderr
    assert "labels 15/15 from the initial policy" in trainer.stdout
    assert_the_finished_run_closed_its_pairs(server, only_run_dir(tmp_path), trainer.stdout)
    labels = np.load(only_run_dir(tmp_path) / "labels.npz")
    assert len(labels["mu"]) >= 15
    true_returns = labels["true_reward"].sum(-1)
    expected = np.sign(true_returns[:, 0] - true_returns[:, 1]) / 2 + 0.5  # the rater's answers
    np.testing.assert_array_equal(labels["mu"], expected)
    status, clip = server.call("GET", f"/clips/{next(iter(answered))}-left")
    assert status == 200 and clip[:4] == b"\x1a\x45\xdf\xa3"  # WebM


@pytest.mark.slow
def test_a_run_the_label_server_starts_refusing_saves_before_it_stops(tmp_path, label_server):
    args = TINY.replace("--total-timesteps 1536", "--total-timesteps 1000000") + " --feedback human --pretrain-fraction 0.5"
    run_dir, _, _ = assert_a_run_the_label_server_refuses_saves_and_says_so(
        tmp_path, args + " --save-model", label_server, "step ", SCRIPT
    )
    assert len(np.load(run_dir / "labels.npz")["mu"]) >= 15  # the pretraining labels, and any since


def test_the_label_token_stays_out_of_the_logs(tmp_path):
    assert_the_label_token_stays_out_of_the_logs(tmp_path, f"{TINY} --feedback human", SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_stopped_in_the_label_wait_resumes_where_it_stopped(tmp_path, label_server, sig):
    args = f"{TINY} --feedback human --pretrain-fraction 0.5"  # 100-step episodes in 4 environments
    assert_a_run_stopped_in_the_label_wait_resumes_where_it_stopped(tmp_path, args, label_server, 100, 4, SCRIPT, sig)


def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_the_checkpoint(tmp_path):
    assert_sigterm_stops_like_ctrl_c(tmp_path, TINY.replace("--total-timesteps 1536", "--total-timesteps 51200"), SCRIPT)


def test_unanswered_human_pairs_are_saved_and_asked_again(tmp_path):
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    left, right = dot.sample_segments(rng, rollout, 6, 3), dot.sample_segments(rng, rollout, 6, 3)
    run_dir = tmp_path / "exp"  # the run folder's name is the experiment's name on the label server
    run_dir.mkdir()
    teacher = dot.HumanTeacher(str(run_dir), "http://127.0.0.1:9", None, "Which?")
    teacher.ask(left, right)
    teacher.save()
    assert (run_dir / "pending_pairs.npz").exists()
    resumed = dot.HumanTeacher(str(run_dir), "http://127.0.0.1:9", None, "Which?")
    resumed.load()
    assert resumed.pending == 3 and resumed.queued == list(teacher.waiting)  # under the ids they were posted with
    for i, pair_id in enumerate(resumed.queued):
        for key in dot.SEGMENT_KEYS:
            np.testing.assert_array_equal(resumed.waiting[pair_id][0][key], left[key][i])
            np.testing.assert_array_equal(resumed.waiting[pair_id][1][key], right[key][i])
    # the clip people see is the segment's path: the dot at each step's position, then where its last step took it
    # (every move the teacher judges is shown: a 1-step segment was one still frame, its move not shown)
    segment = dot.index_segments(left, 0)
    segment["position"] = segment["position"] + np.array([50, 70], np.int16)  # inside the field
    segment["act"][-1] = 4  # the last step moves right
    (tmp_path / "clip.webm").write_bytes(resumed._encode(segment))
    frames = imageio.mimread(tmp_path / "clip.webm")
    path = [*segment["position"], segment["position"][-1] + [0, 1]]
    assert len(frames) == 7
    for frame, position in zip(frames, path):
        brightest = np.unravel_index(frame[..., 0].astype(int).argmax(), frame.shape[:2])
        assert np.abs(np.array(brightest) - position).max() <= 2
    one_step = {"position": np.array([[100, 80]], np.int16), "act": np.array([2])}  # a step down
    (tmp_path / "one.webm").write_bytes(resumed._encode(one_step))
    first, last = imageio.mimread(tmp_path / "one.webm")  # the dot, then the dot a pixel down
    assert np.abs(first.astype(int) - last).max() > 100


@pytest.mark.parametrize("assert_it, poll_interval, server_args", TEACHER_STOP_AND_END_CHECKS)
def test_a_human_teacher_keeps_its_pairs_and_answers_at_a_stop_and_at_the_end(
    tmp_path, label_server, assert_it, poll_interval, server_args
):
    server, rng = label_server(*server_args), np.random.default_rng(0)
    rollout = coded_rollout(rng)
    (tmp_path / "exp").mkdir()
    assert_it(
        server,
        lambda: dot.HumanTeacher(str(tmp_path / "exp"), server.url, None, "Which?", poll_interval=poll_interval),
        lambda n: (dot.sample_segments(rng, rollout, 6, n), dot.sample_segments(rng, rollout, 6, n)),
    )


@pytest.mark.parametrize("assert_it", LABEL_SERVER_RESTART_CHECKS)
def test_a_label_server_restarted_on_another_database_stops_the_teacher(tmp_path, label_server, assert_it):
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    (tmp_path / "exp").mkdir()
    assert_it(
        label_server,
        lambda url: dot.HumanTeacher(str(tmp_path / "exp"), url, None, "Which?", poll_interval=0.2, pair_check_interval=0.5),
        lambda n: (dot.sample_segments(rng, rollout, 6, n), dot.sample_segments(rng, rollout, 6, n)),
    )


def test_processes_of_a_run_never_share_a_pair_id(tmp_path):
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    assert_processes_of_a_run_never_share_a_pair_id(
        lambda: dot.HumanTeacher(str(tmp_path / "exp"), "http://127.0.0.1:9", None, "Which?"),
        lambda n: (dot.sample_segments(rng, rollout, 6, n), dot.sample_segments(rng, rollout, 6, n)),
    )


def test_a_run_name_the_label_server_cannot_take_is_refused_before_the_run_folder_is_made(tmp_path):
    # README: bad arguments stop the script before anything is created (this one was refused once the run folder and its
    # TensorBoard file existed)
    assert_clear_error(
        run_dot(tmp_path, f"{TINY} --feedback human --exp-name {'x' * 90}"), "too long for the label server's ids"
    )
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_name_the_label_server_cannot_take_stops_the_run_at_once(tmp_path, label_server):
    server, rng = label_server(), np.random.default_rng(0)
    rollout = coded_rollout(rng)

    def new_teacher(name):
        (tmp_path / name).mkdir(exist_ok=True)
        return dot.HumanTeacher(str(tmp_path / name), server.url, None, "Which?", poll_interval=0.2)

    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once(
        server, new_teacher, lambda n: (dot.sample_segments(rng, rollout, 6, n), dot.sample_segments(rng, rollout, 6, n))
    )


def test_a_run_folder_given_as_a_dot_keeps_its_name_as_the_experiment(tmp_path, monkeypatch):
    assert_a_run_folder_given_as_a_dot_keeps_its_name(
        tmp_path, monkeypatch, lambda run_dir: dot.HumanTeacher(run_dir, "http://127.0.0.1:9", None, "Which?")
    )


def test_a_new_run_never_writes_into_the_folder_of_a_run_of_its_name_started_in_the_same_second(tmp_path):
    args = "--total-timesteps 512 --num-envs 4 --num-steps 64 --feedback true-reward --exp-name clash --seed 3"
    assert_a_new_run_never_writes_into_another_runs_folder(tmp_path, args, "MovingDot-v0-position__clash__3", SCRIPT)


def test_a_kill_between_saving_the_labels_and_the_pending_pairs_adds_no_answer_twice(tmp_path, label_server, monkeypatch):
    server, rng = label_server(), np.random.default_rng(0)
    rollout = coded_rollout(rng)
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    labels_path, buffer = str(run_dir / "labels.npz"), dot.LabelBuffer(10, 6, 3, rng)

    def store(teacher):
        dot.store_answers(teacher, buffer, None)
        dot.save_labels(buffer, teacher, labels_path)

    def resume(teacher):
        resumed_buffer = dot.LabelBuffer(10, 6, 3, rng)
        dot.load_labels(resumed_buffer, teacher, labels_path)
        return resumed_buffer.size

    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice(
        server,
        monkeypatch,
        lambda: dot.HumanTeacher(str(run_dir), server.url, None, "Which?", poll_interval=0.2),
        lambda n: (dot.sample_segments(rng, rollout, 6, n), dot.sample_segments(rng, rollout, 6, n)),
        store,
        resume,
    )


@pytest.mark.parametrize("kind", ["synthetic", "human"])
def test_every_teacher_has_the_interface_the_training_loop_uses(tmp_path, kind):
    """The loop never asks which teacher it has: start, ask, poll, pending, wait_for_answers, save, load, close."""
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    left, right = dot.sample_segments(rng, rollout, 6, 3), dot.sample_segments(rng, rollout, 6, 3)
    if kind == "synthetic":
        teacher = dot.SyntheticTeacher(rng)
    else:  # not started: nothing is sent, so every asked pair stays unanswered
        teacher = dot.HumanTeacher(str(tmp_path), "http://127.0.0.1:9", None, "Which?")
    teacher.load()  # a new run: nothing to load
    assert teacher.pending == 0
    teacher.ask(left, right)
    stop = threading.Event()
    if kind == "synthetic":
        assert teacher.start() is teacher and teacher.wait_for_answers(stop)  # answers when asked
        ((got_left, _, mu),) = teacher.poll()
        np.testing.assert_array_equal(got_left["position"], left["position"])
        assert teacher.pending == 0 and len(mu) == 3 and teacher.poll() == []
    else:
        stop.set()
        assert not teacher.wait_for_answers(stop)  # stopped while pairs wait for people
        assert teacher.pending == 3 and teacher.poll() == []
    teacher.save()


@pytest.mark.slow
@pytest.mark.parametrize("labels", [1, 2])
def test_a_budget_of_one_or_two_labels_pretrains_on_at_least_one(tmp_path, labels):
    result = run_dot(tmp_path, TINY.replace("--labels 30", f"--labels {labels}"))
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    at_pretraining_end = [value for step, value in logged["labels/total"] if step == 512]
    assert at_pretraining_end[0] >= 1  # the reward model is fitted on something before RL starts
    assert logged["labels/total"][-1][1] == labels and len(np.load(run_dir / "labels.npz")["mu"]) == labels
    for tag in ("losses/policy_loss", "losses/value_loss", "charts/predicted_return"):
        assert np.isfinite([value for _, value in logged[tag]]).all(), tag  # no NaN reward reached PPO


def test_a_teacher_that_skips_every_pretraining_pair_stops_the_run_with_a_clear_error(tmp_path):
    # a 5-step segment earns at most 5: a threshold of 100 skips every pair
    result = run_dot(tmp_path, TINY + " --teacher-skip-threshold 100 --save-model")
    assert_clear_error(result, "error: pretraining ended with no preference label")
    assert "--teacher-skip-threshold" in result.stderr  # says what to change
    run_dir = only_run_dir(tmp_path)
    assert len(np.load(run_dir / "labels.npz")["mu"]) == 0  # saved (empty) like any stopped run's
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    # kept from before the last pretraining rollout (2 of 256 steps), the environments as they were then (64 steps into
    # their 100-step episodes): it held them a rollout further on (28)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (1, 256)
    assert [state["elapsed_steps"] for state in checkpoint["env_states"]] == [64] * 4
    assert "checkpoint of step 256 kept" in result.stdout


@pytest.mark.slow
def test_pretraining_pairs_are_random_whatever_the_selection(tmp_path):
    """C17 2.2.4's disagreement of an untrained ensemble is noise: the pairs asked before RL starts are drawn at random
    with --selection variance too (the same seed gives the same pretraining labels), and by disagreement after."""
    runs = {}
    for selection in ("variance", "random"):
        result = run_dot(tmp_path, TINY + f" --selection {selection} --exp-name {selection}")
        assert result.returncode == 0, result.stderr
        (run_dir,) = (tmp_path / "runs").glob(f"*__{selection}__*")
        pretrained = [value for step, value in scalars(run_dir)["labels/total"] if step == 512][0]
        runs[selection] = (np.load(run_dir / "labels.npz"), int(pretrained))
    (variance, pretrained), (random_pairs, _) = runs["variance"], runs["random"]
    assert pretrained > 0
    for key in ("position", "act", "mu"):
        np.testing.assert_array_equal(variance[key][:pretrained], random_pairs[key][:pretrained])
    assert not np.array_equal(variance["position"][pretrained:], random_pairs["position"][pretrained:])


# ---------------------------------------------------------------------------------------------------------------------
# stopping and resuming

LONG_STEPS = 10240  # 40 iterations: time to stop a run in between
LONG = TINY.replace("--total-timesteps 1536", f"--total-timesteps {LONG_STEPS}")


def events_since(run_dir, before):
    """Scalars of the TensorBoard events file a resumed run wrote (not in `before`)."""
    (events,) = set(run_dir.glob("events.*")) - before
    return scalars(events)


@pytest.mark.slow
def test_a_resumed_run_asks_only_the_labels_its_schedule_still_misses(tmp_path):
    out, err = interrupt_run(tmp_path, LONG + " --save-model --checkpoint-every 100000", "step ", SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    # answers saved after the checkpoint, as a kill -9 between a label save and a checkpoint leaves them
    with np.load(run_dir / "labels.npz") as saved:
        labels = {k: np.concatenate([saved[k], saved[k][:4]]) if saved[k].ndim else saved[k] for k in saved.files}
    np.savez(run_dir / "labels.npz", **labels)
    held = len(labels["mu"])
    before = set(run_dir.glob("events.*"))
    resumed = run_dot(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {checkpoint['global_step']} with {held} labels" in resumed.stdout
    settings = dot.Args(**checkpoint["args"])
    dot.fill_runtime_fields(settings)
    schedule = dot.label_schedule(settings)
    assert held < settings.labels == schedule.sum()
    # labels follow the schedule from where they stand: asked only once the schedule has passed them, never early
    curve = events_since(run_dir, before)["labels/total"]
    expected = [max(held, int(schedule[: step // settings.batch_size].sum())) for step, _ in curve]
    assert [int(value) for _, value in curve] == expected
    assert curve[-1][1] == settings.labels and len(np.load(run_dir / "labels.npz")["mu"]) == settings.labels


def test_a_run_killed_after_pretraining_resumes_with_its_reward_model_pretrained(tmp_path):
    assert_a_run_killed_after_pretraining_resumes_pretrained(tmp_path, TINY, 512, SCRIPT)


@pytest.mark.slow
def test_a_run_killed_right_after_a_checkpoint_resumes_with_every_label_the_checkpoint_counted(tmp_path):
    args = TINY.replace("--total-timesteps 1536", "--total-timesteps 2560")  # 10 iterations
    assert_a_kill_after_a_checkpoint_loses_no_label(tmp_path, args, "step 1024,", SCRIPT, dot)  # 768: the first


@pytest.mark.slow
def test_a_pixel_checkpoint_from_before_reward_form_resumes_with_its_action_form_model(tmp_path):
    """Frames now default to the progress form; a checkpoint saved before --reward-form existed holds an r(o, a) model
    (soft-argmax keypoints) and must go on with it, not fail to load into the new default."""
    args = TINY.replace("--total-timesteps 1536", "--total-timesteps 5120")  # 20 iterations: stopped after the first
    args += " --observation pixels --reward-form action --save-model --checkpoint-every 100000"
    out, err = interrupt_run(tmp_path, args, "step ", SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    del checkpoint["args"]["reward_form"]
    torch.save(checkpoint, run_dir / "checkpoint.pt")

    resumed = run_dot(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert final["global_step"] == 5120 and final["args"]["reward_form"] == "action"
    assert any(name.endswith("log_temperature") for name in final["reward_ensemble"])  # the soft-argmax keypoints


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("uninterrupted")
    # cold: a run from a fresh interpreter, the other from the zygote (warm_start.py)
    result = run_dot(cwd, LONG + " --save-model", cold=True)
    assert result.returncode == 0, result.stderr
    return only_run_dir(cwd), result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", ["pretraining: step", "step "])
def test_a_run_stopped_and_resumed_ends_exactly_as_the_same_seed_uninterrupted(tmp_path, uninterrupted_run, stop_after):
    """SIGTERM stops the run at the end of the iteration under way; the checkpoint carries every random generator,
    the environments and the counters, so the resumed run goes on as if it had never stopped."""
    uninterrupted_dir, uninterrupted_stdout = uninterrupted_run
    out, err = interrupt_run(tmp_path, LONG + " --save-model", stop_after, SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"]
    assert 0 < stopped_at < LONG_STEPS
    if stop_after == "pretraining: step":  # stopped in pretraining (2 rollouts of 256 steps): at its end, or between them
        assert stopped_at in (256, 512), stopped_at
    else:  # in RL
        assert stopped_at > 512, stopped_at
    before = set(run_dir.glob("events.*"))
    resumed = run_dot(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    ours = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    theirs = torch.load(uninterrupted_dir / "checkpoint.pt", weights_only=False)
    for part in ("agent", "reward_ensemble"):
        for name, value in theirs[part].items():
            assert torch.equal(ours[part][name], value), (part, name)
    assert torch.equal(ours["l2_coef"], theirs["l2_coef"])
    assert ours["fits"] == theirs["fits"]  # the count that decides when the reward model is validated went on too
    ours, theirs = np.load(run_dir / "labels.npz"), np.load(uninterrupted_dir / "labels.npz")
    for key in theirs.files:  # the same pairs, answers, validation splits and bootstrap weights
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    # and the resumed part of the run logged what the uninterrupted one did at the same steps
    resumed_log, whole_log = events_since(run_dir, before), scalars(uninterrupted_dir)
    for tag in ("losses/policy_loss", "reward_model/loss", "charts/episodic_return"):
        whole = [(step, value) for step, value in whole_log[tag] if step > stopped_at]
        assert resumed_log[tag] == whole, tag
    # and printed the same progress lines: their true and learned returns are means over the last 10 episodes
    assert progress_lines(resumed.stdout, stopped_at) == progress_lines(uninterrupted_stdout, stopped_at)


BAD_SETTINGS = [
    ("--offline --feedback human", "--offline labels its database with the synthetic teacher"),
    ("--preference-db prefs.sqlite", "--preference-db is the database of --offline"),
    # was a database with pairs of the RL policy: the pairs skipped before RL were asked again during it
    ("--offline --teacher-skip-threshold 0", "--offline labels every pair before RL; a skipping teacher"),
    ("--labels 0", "--labels must be positive"),
    # one member has no disagreement: variance selection kept the first candidates, random selection unsaid
    ("--ensemble-size 1", "--selection variance needs --ensemble-size 2 or more"),
    ("--num-minibatches 0", "--num-minibatches must be positive"),
    # a one-step minibatch's advantages have no standard deviation: the update was NaN
    ("--num-minibatches 1024", "minibatches of 1 step: --norm-adv needs 2 or more"),
    ("--update-epochs 0", "--update-epochs must be positive"),  # was a run that never updated its policy
    ("--segment-len 200", "--segment-len 200 must be between 1 and the rollout length"),
    ("--labels 100000 --total-timesteps 20000", "--labels 100000 is too large for this run"),
    # a segment never crosses an episode's end: with 10-step episodes, one start per episode (11-12 a rollout per env)
    ("--labels 3000 --episode-steps 10", "a rollout can hold as few as 44 pairs of 10-step segments (episodes of 10 steps)"),
    ("--labels 3000 --episode-steps 10", "in a pretraining rollout. Use fewer labels, a shorter --segment-len, more --pretr"),
    ("--labels 10000 --pretrain-fraction 0.01 --episode-steps 10", "in an RL rollout. Use fewer labels, a shorter --segm"),
    # a rollout that begins inside an episode holds fewer than the first (here 31 starts, not 79): was a crash mid-run
    ("--num-steps 128 --episode-steps 150 --segment-len 100 --num-envs 2 --labels 20 --total-timesteps 20480", "as few as 0"),
    # offline pairs may repeat segments, but a rollout with none crashed the run at its second pretraining rollout
    ("--offline --num-envs 1 --num-steps 16 --segment-len 10 --episode-steps 12 --labels 4", "can hold as few as 0 segments"),
    ("--total-timesteps 8192", "leaves no RL after 8 pretraining rollouts"),
]


# numbers that were accepted and then crashed a run or silently changed it; checked in this process only
BAD_NUMBERS = [
    ("--pretrain-steps 0", "--pretrain-steps must be positive"),  # was a run with no pretraining
    ("--schedule-horizon 0", "--schedule-horizon must be a positive number of steps"),
    ("--teacher-beta -1", "--teacher-beta must be positive"),
    ("--teacher-equal-margin -0.5", "--teacher-equal-margin must be at least 0"),
    # two 10-step segments' true returns differ by 20 at most: every answer was "equal", the labels said nothing
    ("--teacher-equal-margin 20 --segment-len 10", "--teacher-equal-margin 20 makes every answer equal"),
    ("--teacher-equal-margin 20 --teacher-gamma 0.5 --segment-len 10", "true returns differ by at most 20"),
    ("--checkpoint-every 5", "--checkpoint-every is for --save-model"),  # no checkpoint was written
    ("--eval-episodes 3", "error: --eval-episodes is for --eval-only"),  # a training run evaluates nothing
    ("--selection random --candidate-multiplier 4", "error: --candidate-multiplier is for --selection variance"),
    ("--reward-std -1", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward-eval"),
    ("--reward-lr inf", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward-eval"),
    ("--reward-batch-size 0", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward"),
    ("--checkpoint-every 0", "--learning-rate (finite), --checkpoint-every and --eval-episodes must be positive"),
    ("--learning-rate inf", "--learning-rate (finite), --checkpoint-every and --eval-episodes must be positive"),
    ("--feedback true-reward --gamma nan", "--gamma must be a number, not nan"),  # passed every check; nan weights then
    ("--threads 0", "--threads must be positive and --seed in [0, 2**32 - 1] (got 0, 1)"),  # tracebacks, both
    ("--seed -1", "--threads must be positive and --seed in [0, 2**32 - 1] (got 1, -1)"),
    ("--gae-lambda 2", "--gamma and --gae-lambda must be in [0, 1], --clip-coef and --max-grad-norm positive"),
    ("--label-token s3cret", "error: --label-token is for --feedback human"),  # the synthetic teacher answered
    ("--feedback true-reward --instruction Which --clip-fps 3", "error: --instruction, --clip-fps are for --feedback human"),
    ("--feedback human --teacher-gamma 0.9 --teacher-equal-margin 1", "error: --teacher-gamma, --teacher-equal-margin are"),
    ("--segment-len 200 --episode-steps 100 --num-steps 256", "--segment-len 200 is longer than an episode"),  # was mid-run
    # tracebacks from sqlite3 once the run had begun
    ("--offline --preference-db no/such/folder/p.sqlite", "--preference-db no/such/folder/p.sqlite: no folder no/such/folder"),
    (f"--offline --preference-db {SCRIPT}", f"--preference-db {SCRIPT} is not an SQLite database"),
]


@pytest.mark.parametrize("args, message", BAD_SETTINGS + BAD_NUMBERS)
def test_validate_args_rejects_impossible_settings_with_a_message(args, message):
    settings = tyro.cli(dot.Args, args=args.split())
    dot.fill_runtime_fields(settings)
    with pytest.raises(SystemExit, match=re.escape(message)):
        dot.validate_args(settings)


# each bad command line, run as a user runs it (a subprocess each: only two in the fast subset)
@pytest.mark.parametrize(
    "args, message",
    [pytest.param(*case, marks=pytest.mark.slow) for case in BAD_SETTINGS[:-2]]
    + [BAD_SETTINGS[-2], ("--eval-only", "--eval-only needs --resume")],
)
def test_bad_arguments_get_a_clear_message_not_a_traceback(tmp_path, args, message):
    assert_clear_error(run_dot(tmp_path, args, timeout=120), message)


def test_only_a_second_ctrl_c_stops_at_once():
    assert_only_a_second_ctrl_c_stops_at_once(dot)


def test_the_fields_computed_at_run_time_are_not_flags(capsys):
    fields = ["batch_size", "minibatch_size", "num_iterations", "pretrain_iterations"]
    assert_the_fields_computed_at_run_time_are_not_flags(dot.Args, fields, capsys)


def test_a_resumed_run_is_not_refused_its_own_settings_that_a_new_run_would_be():
    assert_a_resumed_run_is_not_refused_its_own_settings(dot)
    # and those refused since 2026-12-04 (a run started before could not be resumed or evaluated)
    offline = "--offline --num-envs 1 --num-steps 16 --segment-len 10 --episode-steps 12 --labels 4"
    for flags in ("--teacher-equal-margin 20 --segment-len 10", offline):
        settings = tyro.cli(dot.Args, args=[*flags.split(), "--resume", "runs/old"])
        dot.fill_runtime_fields(settings)
        dot.validate_args(settings)


def test_a_resume_that_cannot_be_done_as_asked_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    assert_resumes_it_cannot_do_are_refused_and_change_nothing(tmp_path, dot, "env_kwargs")  # a MuJoCo setting


# ---------------------------------------------------------------------------------------------------------------------
# learning from preferences alone


def random_policy_returns(episodes=8):
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("MovingDot-v0"))
    rng, returns = np.random.default_rng(0), []
    for seed in range(episodes):
        env.reset(seed=seed)
        done = False
        while not done:
            *_, terminated, truncated, info = env.step(int(rng.integers(5)))
            done = terminated or truncated
        returns.append(float(info["episode"]["r"]))
    return returns


@pytest.mark.slow
def test_the_dot_learns_to_reach_the_centre_from_synthetic_preferences(tmp_path):
    started = time.time()
    result = run_dot(tmp_path, "--total-timesteps 120000 --seed 1", timeout=600)
    assert result.returncode == 0, result.stderr
    returns = [value for _, value in scalars(only_run_dir(tmp_path))["charts/episodic_return"]]
    random_mean = np.mean(random_policy_returns())
    # the optimum is the start's distance to the centre, about 60-90 on average; a random walk drifts away
    assert np.mean(returns[-8:]) > max(random_mean, 0) + 40, (random_mean, returns[-16:])
    print(f"learned in {time.time() - started:.0f} s: final {np.mean(returns[-8:]):.1f}, random policy {random_mean:.1f}")
