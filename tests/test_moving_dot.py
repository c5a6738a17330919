"""rlhf_moving_dot.py: the environment's dynamics, bounds and reward; its observations; segments, the preference
database and the reward model; a subprocess run of every mode (synthetic on positions and on pixels, true reward,
offline, human through a live label server); and learning from preferences alone."""

import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import pytest
import rlhf_moving_dot as dot
import torch
from helpers import (
    assert_sigterm_stops_like_ctrl_c,
    RLHF_TAGS,
    assert_tags,
    assert_answers_follow_true_returns,
    assert_clear_error,
    only_run_dir,
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


def run_dot(cwd, args, timeout=300):
    return run_script(cwd, args, timeout, script=SCRIPT)


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


def test_reward_model_learns_the_dots_reward_from_synthetic_preferences():
    """Labels of random-walk segments from the perfect teacher; the fitted ensemble's normalised reward must track
    the true reward on fresh steps."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    env = gym.make("MovingDot-v0").unwrapped
    env.reset(seed=0)

    def walk(steps):
        position, act, reward = [], [], []
        for _ in range(steps):
            position.append(env.position.copy())
            act.append(int(rng.integers(5)))
            reward.append(env.step(act[-1])[1])
            if rng.random() < 0.02:
                env.reset(seed=int(rng.integers(1 << 30)))
        return {"position": np.array(position, np.int16), "act": np.array(act), "true_reward": np.array(reward, np.float32)}

    steps = walk(4000)
    rollout = {k: v.reshape(1000, 4, *v.shape[1:]) for k, v in steps.items()}
    rollout["truncated"] = np.zeros((1000, 4), bool)
    left, right = dot.sample_segments(rng, rollout, 10, 400), dot.sample_segments(rng, rollout, 10, 400)
    buffer = dot.LabelBuffer(400, 10, 3, rng)
    buffer.add(left, right, dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"]))
    ensemble = dot.RewardEnsemble((2,), 5, 3)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-3)
    dot.train_reward_model(ensemble, optimizer, buffer, "position", torch.full((3,), 1e-4), 800, 64, 0.1, rng)
    _, _, val_accuracy = dot.evaluate_reward_model(ensemble, buffer, "position", 0.1, 1.0)
    fresh = walk(2000)
    predicted = ensemble.normalized_reward(
        torch.as_tensor(dot.observe(fresh["position"], "position")), torch.as_tensor(fresh["act"])
    )
    assert val_accuracy > 0.8
    assert np.corrcoef(predicted.numpy(), fresh["true_reward"])[0, 1] > 0.8
    assert abs(predicted.mean().item()) < 0.3 and 0.7 < predicted.std().item() < 1.3  # normalised


# ---------------------------------------------------------------------------------------------------------------------
# every mode, run as a user runs it


def test_synthetic_run_logs_saves_labels_and_model_and_evaluates(tmp_path):
    result = run_dot(tmp_path, TINY + " --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("MovingDot-v0-position__rlhf_moving_dot__1__")
    logged = scalars(run_dir)
    assert_tags(logged, RLHF_TAGS + ["charts/predicted_return"])
    assert logged["labels/total"][-1][1] == 30
    assert "step 1536" in result.stdout and "labels 30/30" in result.stdout
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


def test_pixel_run_scores_frames_with_a_cnn_reward_model(tmp_path):
    result = run_dot(tmp_path, TINY + " --observation pixels --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    losses = [value for _, value in scalars(run_dir)["reward_model/loss"]]
    assert np.isfinite(losses).all()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    reward_state = checkpoint["reward_ensemble"]
    assert any(value.dim() == 4 for value in reward_state.values())  # convolution kernels: it reads frames
    # the saved model scores frames: rebuilt from the checkpoint, it gives the labelled segments finite, varied rewards
    ensemble = dot.RewardEnsemble((1, 42, 32), 5, 3)
    ensemble.load_state_dict(reward_state)
    labels = np.load(run_dir / "labels.npz")
    rewards = dot.label_step_rewards(ensemble, labels, "pixels")
    assert rewards.shape == (3, 30, 2, 5) and torch.isfinite(rewards).all() and rewards.std() > 0


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


def test_human_feedback_run_learns_from_a_rater_behind_the_label_server(tmp_path, label_server):
    server = label_server()
    args = TINY + f" --feedback human --label-server {server.url} --pretrain-fraction 0.5 --save-model"
    with rating_by_script(server) as answered:
        trainer = subprocess.run(
            [sys.executable, str(SCRIPT), *args.split()], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
    assert trainer.returncode == 0, trainer.stdout + trainer.stderr
    assert "labels 15/15 from the initial policy" in trainer.stdout
    labels = np.load(only_run_dir(tmp_path) / "labels.npz")
    assert len(labels["mu"]) >= 15
    true_returns = labels["true_reward"].sum(-1)
    expected = np.sign(true_returns[:, 0] - true_returns[:, 1]) / 2 + 0.5  # the rater's answers
    np.testing.assert_array_equal(labels["mu"], expected)
    status, clip = server.call("GET", f"/clips/{next(iter(answered))}-left")
    assert status == 200 and clip[:4] == b"\x1a\x45\xdf\xa3"  # WebM


def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_the_checkpoint(tmp_path):
    assert_sigterm_stops_like_ctrl_c(tmp_path, TINY.replace("--total-timesteps 1536", "--total-timesteps 51200"), SCRIPT)


def test_unanswered_human_pairs_are_saved_and_asked_again(tmp_path):
    rng = np.random.default_rng(0)
    rollout = coded_rollout(rng)
    left, right = dot.sample_segments(rng, rollout, 6, 3), dot.sample_segments(rng, rollout, 6, 3)
    teacher = dot.HumanTeacher("http://127.0.0.1:9", None, "exp", "Which?")
    teacher.ask(left, right)
    teacher.save(str(tmp_path / "pending.npz"))
    resumed = dot.HumanTeacher("http://127.0.0.1:9", None, "exp", "Which?")
    resumed.load(str(tmp_path / "pending.npz"))
    assert resumed.pending == 3 and resumed.queued == ["exp-000000", "exp-000001", "exp-000002"]
    for i, pair_id in enumerate(resumed.queued):
        for key in dot.SEGMENT_KEYS:
            np.testing.assert_array_equal(resumed.waiting[pair_id][0][key], left[key][i])
            np.testing.assert_array_equal(resumed.waiting[pair_id][1][key], right[key][i])
    # the clip people see is the segment's path: the dot at each step's position, one frame per step
    segment = dot.index_segments(left, 0)
    segment["position"] = segment["position"] + np.array([50, 70], np.int16)  # inside the field
    (tmp_path / "clip.webm").write_bytes(resumed._encode(segment))
    frames = imageio.mimread(tmp_path / "clip.webm")
    assert len(frames) == 6
    for frame, position in zip(frames, segment["position"]):
        brightest = np.unravel_index(frame[..., 0].astype(int).argmax(), frame.shape[:2])
        assert np.abs(np.array(brightest) - position).max() <= 2


@pytest.mark.parametrize(
    "args, message",
    [
        ("--offline --feedback human", "--offline labels its database with the synthetic teacher"),
        ("--preference-db prefs.sqlite", "--preference-db is the database of --offline"),
        ("--labels 0", "--labels must be positive"),
        ("--segment-len 200", "--segment-len 200 must be between 1 and the rollout length"),
        ("--labels 100000 --total-timesteps 20000", "--labels 100000 is too large for this run"),
        ("--total-timesteps 8192", "leaves no RL after 8 pretraining rollouts"),
        ("--eval-only", "--eval-only needs --resume"),
    ],
)
def test_bad_arguments_get_a_clear_message_not_a_traceback(tmp_path, args, message):
    assert_clear_error(run_dot(tmp_path, args, timeout=120), message)


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


def test_the_dot_learns_to_reach_the_centre_from_synthetic_preferences(tmp_path):
    started = time.time()
    result = run_dot(tmp_path, "--total-timesteps 120000 --seed 1", timeout=600)
    assert result.returncode == 0, result.stderr
    returns = [value for _, value in scalars(only_run_dir(tmp_path))["charts/episodic_return"]]
    random_mean = np.mean(random_policy_returns())
    # the optimum is the start's distance to the centre, about 60-90 on average; a random walk drifts away
    assert np.mean(returns[-8:]) > max(random_mean, 0) + 40, (random_mean, returns[-16:])
    print(f"learned in {time.time() - started:.0f} s: final {np.mean(returns[-8:]):.1f}, random policy {random_mean:.1f}")
