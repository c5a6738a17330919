"""rlhf_a2c_atari.py: the preprocessing and the score masking on real game frames, segments and the frame stacks they
rebuild, the CNN reward model, the label buffer and schedule, and a subprocess run of each mode (synthetic, true reward
with video, human through a live label server, interrupted and resumed; marked slow)."""

import contextlib
import io
import math
import re
import signal
import time
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import pytest
import rlhf_a2c_atari as atari
import torch
from helpers import (
    LABEL_SERVER_RESTART_CHECKS,
    TEACHER_STOP_AND_END_CHECKS,
    assert_only_a_second_ctrl_c_stops_at_once,
    assert_the_fields_computed_at_run_time_are_not_flags,
    assert_the_pairs_kept_are_the_most_disagreed_on,
    assert_a_resumed_run_is_not_refused_its_own_settings,
    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice,
    assert_a_run_the_label_server_refuses_saves_and_says_so,
    assert_a_new_run_never_writes_into_another_runs_folder,
    assert_a_run_folder_given_as_a_dot_keeps_its_name,
    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once,
    assert_processes_of_a_run_never_share_a_pair_id,
    assert_the_finished_run_closed_its_pairs,
    assert_sigterm_stops_like_ctrl_c,
    RLHF_TAGS,
    assert_tags,
    assert_clear_error,
    assert_predicted_returns_are_of_whole_episodes,
    assert_resumes_it_cannot_do_are_refused_and_change_nothing,
    assert_the_label_token_stays_out_of_the_logs,
    answer_all_but_one_pair_the_run_waits_for,
    assert_the_answers_given_in_the_wait_were_taken,
    start_trainer,
    interrupt_run,
    only_run_dir,
    run_script,
    scalars,
    assert_the_settings_show_once_per_start,
    rating_by_script,
)
from PIL import Image

torch.set_num_threads(1)
SCRIPT = Path(atari.__file__)
# a tiny run: 2 envs x 5 steps per iteration, label rounds of 100 steps per env (200 steps), 2 pretraining rounds,
# 1200 steps in all; 12 labels of 5-step segments
TINY = (
    "--total-timesteps 1200 --num-envs 2 --round-steps 100 --pretrain-steps 400 --labels 12 --pretrain-labels 6 "
    "--segment-len 5 --pretrain-epochs 2 --reward-batch-size 4 --reward-train-every 4 --reward-eval-every 2 "
    "--reward-eval-labels 8 --log-every 10 --noop-max 2 --threads 1"
)


def run_atari(cwd, args, timeout=300, cold=False):
    return run_script(cwd, args, timeout, script=SCRIPT, cold=cold)


def checked_args(**settings):
    """Args with the run-time fields filled in, then validated, as the script does before creating anything."""
    args = atari.Args(**settings)
    atari.fill_runtime_fields(args)
    atari.validate_args(args)
    return args


def validation_pass(ensemble, buffer, count, label_noise=0.1, target_std=0.05):
    """The figures of validate_reward_model on the `count` latest labels, and the normalisation refit on their steps,
    as the script's validation pass does."""
    train_loss, val_loss, val_accuracy, step_rewards = atari.validate_reward_model(
        ensemble, buffer.get(buffer.latest(count)), label_noise
    )
    ensemble.fit_normalization(step_rewards.reshape(ensemble.size, -1), target_std)
    return train_loss, val_loss, val_accuracy


def raw_env(game):
    """The game without preprocessing: one step is one frame, deterministic (no sticky actions)."""
    env = gym.make(f"{game}NoFrameskip-v4", obs_type="grayscale")
    env.reset(seed=0)
    return env


# ---------------------------------------------------------------------------------------------------------------------
# score masking and preprocessing, on real frames

# RAM bytes that hold each game's displayed score (and, for Enduro and BeamRider, the counters C17 also blanked),
# found by watching which bytes change exactly when the game pays a reward
SCORE_BYTES = {
    "Pong": [13, 14],  # computer, player
    "Breakout": [76, 77],
    "Enduro": [41, 42, 43, 44],  # odometer, cars left to pass
    "BeamRider": [9, 10, 11, 84],  # score, enemies left
    "Seaquest": [56, 57, 58],
    "Qbert": [89, 90, 91],
    "SpaceInvaders": [102, 103, 104, 105],  # both players
}
GAME_NAMES = {
    "Pong": "pong",
    "Breakout": "breakout",
    "Enduro": "enduro",
    "BeamRider": "beam_rider",
    "Seaquest": "seaquest",
    "Qbert": "qbert",
    "SpaceInvaders": "space_invaders",
}


def screens_after(ale, state, poke=None, frames=8):
    """The grey screens of `frames` no-op frames from a saved state, after writing one RAM byte if `poke` is given."""
    ale.restoreState(state)
    if poke is not None:
        ale.setRAM(*poke)
    screens = []
    for _ in range(frames):
        ale.act(0)
        screens.append(ale.getScreenGrayscale().copy())
    return screens


@pytest.mark.parametrize("game", sorted(SCORE_BYTES))
def test_the_blanked_area_covers_the_score_digits_on_real_frames(game):
    env, rng = raw_env(game), np.random.default_rng(0)
    ale = env.unwrapped.ale
    assert atari.atari_game(f"{game}NoFrameskip-v4") == GAME_NAMES[game]
    states = []
    for t in range(900):  # a few moments of a game played at random
        env.step(int(rng.integers(env.action_space.n)))
        if t % 300 == 299:
            states.append(ale.cloneState())
    area = np.zeros((210, 160), bool)
    for top, bottom, left, right in atari.SCORE_AREAS[GAME_NAMES[game]]:
        area[top:bottom, left:right] = True
    assert area.mean() < 0.25  # the game itself stays visible
    for byte in SCORE_BYTES[game]:
        changed = np.zeros((210, 160), bool)
        for state in states:
            ale.restoreState(state)
            value = int(ale.getRAM()[byte])
            for before, after in zip(screens_after(ale, state), screens_after(ale, state, (byte, value ^ 1))):
                changed |= before != after
                # with the score blanked, a different score leaves no trace in what the reward model sees
                np.testing.assert_array_equal(
                    atari.blank_score(before, GAME_NAMES[game]), atari.blank_score(after, GAME_NAMES[game])
                )
        assert changed.any(), f"byte {byte} did not change the screen: not a score byte"
        assert area[changed].all()


def test_preprocessing_repeats_each_action_four_frames_keeps_the_max_of_the_last_two_and_blanks_the_score():
    env = atari.make_env("PongNoFrameskip-v4", 0, False, None, noop_max=0)()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert all((frame == obs[0]).all() for frame in obs)  # a new game fills the stack with its first frame
    ale = env.unwrapped.ale
    for _ in range(60):  # into the game, where the ball moves
        env.step(2)
    state, frame_number = ale.cloneState(), ale.getEpisodeFrameNumber()
    obs, reward, *_ = env.step(3)
    assert ale.getEpisodeFrameNumber() == frame_number + 4
    # the same four frames by hand
    ale.restoreState(state)
    screens = []
    for _ in range(4):
        ale.act(3)
        screens.append(ale.getScreenGrayscale().copy())
    expected = atari.blank_score(np.maximum(screens[2], screens[3]), "pong")
    expected = np.asarray(Image.fromarray(expected).resize((84, 84), Image.BILINEAR))
    np.testing.assert_array_equal(obs[-1], expected)
    assert (obs[-1][:9] == 0).all() and obs[-1][12:].mean() > 20  # rows 0-23 of 210 (the scores) are black


def test_no_op_resets_start_games_at_different_frames_and_v5_ids_keep_sticky_actions():
    env = atari.make_env("PongNoFrameskip-v4", 0, False, None, noop_max=30)()
    starts = set()
    for seed in range(6):
        env.reset(seed=seed)
        starts.add(env.unwrapped.ale.getEpisodeFrameNumber())
    assert len(starts) > 2 and all(1 <= s <= 30 for s in starts)
    v5 = atari.make_env("ALE/Pong-v5", 0, False, None)()
    v5.reset(seed=0)
    before = v5.unwrapped.ale.getEpisodeFrameNumber()
    v5.step(0)
    assert v5.unwrapped.ale.getEpisodeFrameNumber() == before + 4  # the wrapper skips frames, not ALE (no 16-frame steps)
    assert v5.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_a_resumed_run_restarts_its_games_from_new_starts_not_the_runs_first_ones():
    """The emulators' state is not saved: a resumed run restarts its games. From the run's seed they replayed the run's
    first game starts (each environment's no-op count, and a -v5 id's sticky-action stream) at every resume. Checked
    here: the no-op counts."""

    def starts(seed):  # each environment's no-op count, as the script's vector env seeds them (seed, seed + 1, ...)
        envs = gym.vector.SyncVectorEnv([atari.make_env("PongNoFrameskip-v4", i, False, None) for i in range(4)])
        envs.reset(seed=seed)
        counts = [env.unwrapped.ale.getEpisodeFrameNumber() for env in envs.envs]
        envs.close()
        return counts

    assert atari.games_seed(7, 1) == 7  # a new run: its own seed
    first = starts(7)
    resumed = {iteration: atari.games_seed(7, iteration) for iteration in (101, 2001, 2002)}
    assert len(set(resumed.values()) | {7}) == 4 and atari.games_seed(7, 101) == resumed[101]  # one per resume point
    for seed in resumed.values():
        assert starts(seed) != first
    assert atari.games_seed(8, 101) != resumed[101]  # and per run seed


@pytest.mark.parametrize("one_row", [False, True])
def test_segments_rebuild_the_frame_stacks_the_agent_saw_across_game_starts(one_row):
    # games cut after 23 steps, so a round of 60 steps holds several game starts, each with a repeated first frame;
    # one_row: the done flags arrive in the loop's buffer of one row, written again at every step (--num-steps 1)
    def short_games():
        return gym.wrappers.TimeLimit(atari.make_env("PongNoFrameskip-v4", 0, False, None, noop_max=5)(), 23)

    envs = gym.vector.SyncVectorEnv([short_games, short_games], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(0)
    round_steps, segment_len = 60, 6
    history, seen = atari.new_history(round_steps, 2), []
    obs, _ = envs.reset(seed=0)
    dones = np.zeros((1, 2), bool)
    for history_index in range(round_steps):
        act = rng.integers(6, size=2)
        seen.append(obs)
        next_obs, reward, terminated, truncated, _ = envs.step(act)
        dones[0] = terminated | truncated
        atari.record_step(history, history_index, obs, act, reward, dones[0] if one_row else terminated | truncated)
        obs = next_obs
    seen = np.stack(seen)  # (steps, envs, 4, 84, 84)
    segments = atari.sample_segments(rng, history, segment_len, 300)
    stacks = atari.segment_stacks(segments["frames"])  # (300, L, 4, 84, 84)
    matched = 0
    for n in range(300):
        # find the segment's place in the round by its actions and frames, then compare every stack
        places = [
            (t, e)
            for t in range(round_steps - segment_len + 1)
            for e in range(2)
            if (history["act"][t : t + segment_len, e] == segments["act"][n]).all()
            and (seen[t : t + segment_len, e] == stacks[n]).all()
        ]
        assert places, f"segment {n} is not a sequence of stacks the agent saw"
        t, e = places[0]
        assert not history["done"][t : t + segment_len - 1, e].any()  # no game ends inside a segment
        matched += 1
    assert matched == 300
    # some segments begin right at a game start, where the stack repeats the first frame
    first_steps = stacks[:, 0]
    assert any((s[0] == s[3]).all() and (s[3] != 0).any() for s in first_steps)


# ---------------------------------------------------------------------------------------------------------------------
# the reward model, labels and schedule


def test_cnn_reward_model_follows_c17_shapes_with_batch_norm_and_dropout():
    net = atari.RewardNet()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size[0], c.stride[0], c.out_channels) for c in convs] == [(7, 3, 16), (5, 2, 16), (3, 1, 16), (3, 1, 16)]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == 4
    assert all(m.p == 0.5 for m in net.modules() if isinstance(m, torch.nn.Dropout))
    hidden = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert (hidden[0].in_features, hidden[0].out_features, hidden[1].out_features) == (16 * 7 * 7, 64, 1)
    ensemble = atari.RewardEnsemble(3)
    stacks = torch.randint(0, 255, (5, 2, 4, 84, 84), dtype=torch.uint8)
    assert ensemble(stacks).shape == (3, 5, 2)
    ensemble.train()
    assert not torch.equal(ensemble(stacks), ensemble(stacks))  # dropout while training
    ensemble.eval()
    assert torch.equal(ensemble(stacks), ensemble(stacks))  # none when predicting
    # the L2 penalty counts convolution and linear weights, not batch norm's scale
    expected = sum(
        (m.weight**2).sum() for m in ensemble.members[0].modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
    )
    assert ensemble.l2_penalty()[0].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("p", [0.5, 0.25])
def test_byte_dropout_drops_a_p_share_everywhere_keeps_the_mean_and_routes_gradients_through_kept_units(p):
    torch.manual_seed(0)
    dropout = atari.ByteDropout(p).train()
    # channels-last input, as the reward model's: the mask must follow the layout, every element drawn
    x = torch.ones(64, 16, 26, 26).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    y = dropout(x)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.005)
    # no position is favoured: the 8 bytes of each 64-bit draw and every channel drop at the same rate
    by_byte = kept.permute(0, 2, 3, 1).reshape(-1, 8).float().mean(0)
    by_channel = kept.float().mean((0, 2, 3))
    assert by_byte.sub(1 - p).abs().max().item() < 0.01 and by_channel.sub(1 - p).abs().max().item() < 0.01
    assert torch.unique(y).tolist() == pytest.approx([0.0, 1 / (1 - p)])  # the kept units scaled to keep the mean
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)  # dropped units pass no gradient
    assert not torch.equal(dropout(x), dropout(x))  # a new mask each call
    dropout.eval()
    assert torch.equal(dropout(x), x)


def test_byte_dropout_near_1_keeps_one_byte_value_in_256_rather_than_dividing_by_zero():
    """--reward-dropout takes [0, 1) and ByteDropout rounds p to a multiple of 1/256: from 255.5/256 on that was 256
    byte values of 256 dropped, and the rescale 256 / (256 - dropped) divided by zero at the first reward-model step,
    after the pretraining rollouts. It keeps one value in 256 (p 255/256), as rlhf_ppo_mujoco.py's dropout does."""
    torch.manual_seed(0)
    y = atari.ByteDropout(0.999).train()(torch.ones(1 << 16))
    assert torch.unique(y).tolist() == [0.0, 256.0] and (y != 0).float().mean().item() == pytest.approx(1 / 256, abs=0.002)


def test_preference_loss_counts_ties_half_and_assumes_ten_percent_random_answers():
    big = torch.tensor([50.0])
    # however sure the model is, a 10% chance of a random answer bounds the loss of a wrong one
    assert atari.preference_loss(big, -big, torch.tensor([0.0])).item() == pytest.approx(-np.log(0.05), rel=1e-4)
    # a tie is half a vote each way: against a model 2 nats sure of the left, -(log p + log(1 - p)) / 2
    p_left = 0.9 / (1 + np.exp(-2.0)) + 0.05
    tie = atari.preference_loss(torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([0.5]))
    assert tie.item() == pytest.approx(-(np.log(p_left) + np.log(1 - p_left)) / 2, rel=1e-5)


def test_policy_normalization_gives_the_latest_rollouts_zero_mean_and_the_target_std_whatever_their_offset():
    rng = np.random.default_rng(0)
    rollouts = [rng.normal(0.0, 1.0, (5, 16)) for _ in range(30)]
    plain, moved = atari.RecentRewardNormalizer(10, 0.05), atari.RecentRewardNormalizer(10, 0.05)
    out_plain = [plain(r) for r in rollouts]
    out_moved = [moved(7.0 * r - 40.0) for r in rollouts]  # a policy in states the model rates far below the clips
    np.testing.assert_allclose(out_moved, out_plain, atol=1e-9)  # A2C sees the same rewards
    latest = np.concatenate(out_plain[-10:])  # each normalised with the statistics of its own time: close to 0, 0.05
    assert abs(latest.mean()) < 0.01 and 0.04 < latest.std() < 0.06
    assert np.array_equal(np.argsort(out_plain[-1], axis=None), np.argsort(rollouts[-1], axis=None))  # same order
    # only the window counts: two different pasts, then the same 10 rollouts, give the same rewards
    other = atari.RecentRewardNormalizer(10, 0.05)
    for r in rollouts[:20]:
        other(r + 100.0)
    np.testing.assert_allclose([other(r) for r in rollouts[20:]][-1], out_plain[-1], atol=1e-9)
    # a reward shifted within the window is followed: the latest rollout 3 std above the window's mean stays above 0
    assert plain(rollouts[0] + 3.0).mean() > 0.05


def block_frames(rng, count, length):
    """Frames with a bright 16x16 block at a random place; the 'true reward' of a step is 1 when the block of its
    newest frame is in the upper half."""
    frames = np.zeros((count, length + 3, 84, 84), np.uint8)
    rows = rng.integers(0, 68, (count, length + 3))
    cols = rng.integers(0, 68, (count, length + 3))
    for n in range(count):
        for k in range(length + 3):
            frames[n, k, rows[n, k] : rows[n, k] + 16, cols[n, k] : cols[n, k] + 16] = 200
    return {"frames": frames, "act": np.zeros((count, length), np.int64), "true_reward": (rows[:, 3:] < 34).astype(np.float32)}


def block_preferences(count, members):
    """`count` one-step block_frames pairs labelled by the synthetic teacher, and a fresh ensemble to fit them:
    (rng, buffer, ensemble, Adam optimizer, L2 coefficients)."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    teacher = atari.SyntheticTeacher(rng)
    buffer = atari.LabelBuffer(count, 1, members, rng)
    teacher.ask(block_frames(rng, count, 1), block_frames(rng, count, 1))
    buffer.add(*teacher.poll()[0])
    ensemble = atari.RewardEnsemble(members)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-3)
    return rng, buffer, ensemble, optimizer, torch.full((members,), 1e-4)


def test_cnn_reward_model_learns_a_reward_from_synthetic_preferences():
    # one-step segments and one member keep this test quick on a CPU
    rng, buffer, ensemble, optimizer, l2 = block_preferences(400, members=1)
    atari.train_reward_model(ensemble, optimizer, buffer, l2, 150, 32, 0.1, rng)
    train_loss, val_loss, val_accuracy = validation_pass(ensemble, buffer, 400)
    # on fresh pairs with different scores the model orders them as the teacher would
    fresh_left, fresh_right = block_frames(rng, 200, 1), block_frames(rng, 200, 1)
    diff = fresh_left["true_reward"].sum(1) - fresh_right["true_reward"].sum(1)
    predicted = (atari.segment_returns(ensemble, fresh_left) - atari.segment_returns(ensemble, fresh_right)).mean(0)
    accuracy = ((predicted.detach().numpy() > 0) == (diff > 0))[diff != 0].mean()
    assert accuracy > 0.8, (accuracy, val_accuracy, train_loss, val_loss)
    rewards = ensemble.normalized_reward(torch.as_tensor(atari.segment_stacks(fresh_left["frames"])))
    assert abs(rewards.mean().item()) < 0.03 and 0.03 < rewards.std().item() < 0.08  # C17 A.2: standard deviation 0.05


def test_pinning_keeps_the_rollouts_mean_reward_through_an_update_and_changes_nothing_else():
    rng, buffer, ensemble, optimizer, l2 = block_preferences(64, members=3)
    atari.train_reward_model(ensemble, optimizer, buffer, l2, 10, 16, 0.1, rng)
    validation_pass(ensemble, buffer, 64)
    rollout = torch.as_tensor(atari.segment_stacks(block_frames(rng, 80, 1)["frames"]))[:, 0]  # (80, 4, 84, 84)
    before = ensemble.normalized_reward(rollout)
    atari.train_reward_model(ensemble, optimizer, buffer, l2, 3, 16, 0.1, rng)  # a few updates (batch norm included)
    moved = ensemble.normalized_reward(rollout)
    assert abs(moved.mean() - before.mean()) > 0.01  # unpinned, the level moves (std 0.05)
    ensemble.pin_level(rollout, before)
    pinned = ensemble.normalized_reward(rollout)
    assert pinned.mean().item() == pytest.approx(before.mean().item(), abs=1e-6)
    torch.testing.assert_close(pinned - pinned.mean(), moved - moved.mean())  # what the update learned stays


def test_label_buffer_keeps_the_latest_labels_and_saved_batches_reload_as_they_were(tmp_path):
    rng = np.random.default_rng(0)
    buffer = atari.LabelBuffer(5, 2, 3, rng)
    for batch in range(4):  # 8 labels into room for 5
        segments = block_frames(rng, 2, 2)
        segments["act"][:] = batch
        stored = buffer.add(segments, segments, np.array([1.0, 0.0]))
        atari.save_labels(str(tmp_path / "labels"), stored | {"end": buffer.total})
    assert buffer.total == 8 and buffer.size == 5
    assert sorted(buffer.data["act"][:, 0, 0]) == [1, 2, 2, 3, 3]  # the oldest three are gone
    assert set(buffer.get(buffer.latest(2))["act"][:, 0, 0]) == {3}
    reloaded = atari.LabelBuffer(5, 2, 3, np.random.default_rng(1))
    atari.load_labels(str(tmp_path / "labels"), reloaded)
    assert reloaded.total == 8
    for key in ("frames", "act", "mu", "is_val", "weight"):
        np.testing.assert_array_equal(reloaded.data[key], buffer.data[key])


def test_a_round_whose_pairs_the_teacher_all_skips_leaves_the_saved_labels_as_they_were(tmp_path):
    """A round of pairs all below --teacher-skip-threshold gives an empty batch: saved under the same name as the batch
    before it (labels/{labels so far}.npz), it replaced that batch's labels on disk, and a resumed run lost them."""
    rng = np.random.default_rng(0)
    teacher, buffer, labels_dir = atari.SyntheticTeacher(rng, skip_threshold=0.5), atari.LabelBuffer(10, 2, 3, rng), tmp_path
    scoring, blank = block_frames(rng, 4, 2), block_frames(rng, 4, 2)
    scoring["true_reward"][:], blank["true_reward"][:] = 1.0, 0.0
    teacher.ask(scoring, blank)  # the scoring segment wins each pair
    atari.store_answers(teacher, buffer, labels_dir)
    teacher.ask(blank, blank)  # neither side scores: every pair skipped
    atari.store_answers(teacher, buffer, labels_dir)
    assert buffer.total == 4
    reloaded = atari.LabelBuffer(10, 2, 3, np.random.default_rng(1))
    atari.load_labels(labels_dir, reloaded)
    assert reloaded.total == 4 and list(reloaded.data["mu"][:4]) == [1.0] * 4


def test_each_member_trains_on_a_bootstrap_resample_and_validates_on_the_labels_it_left_out():
    # C17 2.2.3's 1/e held out is the online bootstrap's out-of-bag share: a Poisson(1) weight per label and member
    rng = np.random.default_rng(0)
    buffer = atari.LabelBuffer(100, 1, 3, rng)
    segments = block_frames(rng, 100, 1)
    stored = [buffer.add(segments, segments, np.ones(100)) for _ in range(60)]  # 6000 labels
    is_val = np.concatenate([s["is_val"] for s in stored])
    weight = np.concatenate([s["weight"] for s in stored])
    trained_on = weight > 0
    # each member trains on about 63% distinct labels, and they weigh as many as all labels (a resample of n)
    np.testing.assert_allclose(trained_on.mean(0), 1 - 1 / math.e, atol=0.02)
    np.testing.assert_allclose(weight.mean(0), 1.0, atol=0.05)
    # and validates on the other ~37%, the labels its resample left out: never a label it trains on
    np.testing.assert_array_equal(is_val, ~trained_on)
    # the members resample independently: two of them leave out the same label about 1/e^2 of the time
    assert abs((is_val[:, 0] & is_val[:, 1]).mean() - math.exp(-2)) < 0.02


def test_the_training_loss_the_l2_band_compares_is_the_bootstrap_weighted_loss_each_member_trained_on():
    rng, buffer, ensemble, optimizer, l2 = block_preferences(12, members=3)
    atari.train_reward_model(ensemble, optimizer, buffer, l2, 20, 12, 0.1, rng)  # losses that differ between labels
    labels = buffer.get(np.arange(12))
    # (labels, members): heavy and light labels; each member leaves some out
    weight = np.array(
        [3, 0, 1, 1, 2, 0, 0, 1, 1, 2, 0, 3, 1, 1, 0, 0, 4, 1, 1, 0, 2, 2, 1, 0, 0, 1, 1, 1, 0, 1, 3, 1, 0, 0, 2, 2]
    )
    weight = weight.reshape(12, 3).astype(np.float32)
    labels["weight"], labels["is_val"] = weight, weight == 0
    with torch.no_grad():
        returns = atari.segment_returns(ensemble.eval(), labels)  # (members, labels, 2)
    losses = atari.preference_loss(returns[..., 0], returns[..., 1], torch.as_tensor(labels["mu"]), 0.1).numpy()
    weighted = (losses * weight.T).sum(1) / weight.T.sum(1)
    unweighted = np.array([losses[m][weight[:, m] > 0].mean() for m in range(3)])
    assert not np.allclose(weighted, unweighted, rtol=1e-3)  # the weights matter for these labels
    before = {k: v.clone() for k, v in ensemble.state_dict().items()}
    train_loss, val_loss, _, step_rewards = atari.validate_reward_model(ensemble, labels, 0.1)
    assert step_rewards.shape == (3, 12, 2, 1)
    for key, value in ensemble.state_dict().items():  # validating changes nothing (the normalisation included)
        assert torch.equal(value, before[key]), key
    np.testing.assert_allclose(train_loss.numpy(), weighted, rtol=1e-5)
    out_of_bag = np.array([losses[m][weight[:, m] == 0].mean() for m in range(3)])
    np.testing.assert_allclose(val_loss.numpy(), out_of_bag, rtol=1e-5)


def test_label_schedule_spends_the_budget_with_500_from_the_initial_policy():
    args = checked_args(total_timesteps=10_000_000, feedback="synthetic")
    schedule = atari.label_schedule(args)
    pretrain_rounds = args.pretrain_iterations // args.iterations_per_round
    assert schedule.sum() == 3300 and schedule[:pretrain_rounds].sum() == 500
    rl = schedule[pretrain_rounds:]
    assert rl[:100].sum() > 2 * rl[-100:].sum()  # the rate falls as 5e6 / (T + 5e6)


def test_every_run_length_validate_args_accepts_spends_the_whole_label_budget_in_the_rounds_it_reaches():
    # around the first label round after pretraining (4 rounds of 16 x 400 steps = 25600), and run lengths that are
    # not whole rounds
    for total in [*range(25_680, 40_000, 80), 123_457, 1_000_001]:
        try:
            args = checked_args(total_timesteps=total)
        except SystemExit as refused:
            assert total < 32_000 and "use --total-timesteps 32000 or more" in str(refused), (total, refused)
            continue
        schedule = atari.label_schedule(args)
        # the label rounds the training loop reaches: every iteration that ends a round
        reached = sum(1 for i in range(1, args.num_iterations + 1) if i % args.iterations_per_round == 0)
        assert len(schedule) == reached and (schedule >= 0).all()
        assert schedule.sum() == 3300 and schedule[:4].sum() == 500, (total, schedule.sum())


# ---------------------------------------------------------------------------------------------------------------------
# every mode, run as a user runs it (whole training runs: slow)


@pytest.mark.slow
def test_synthetic_run_logs_saves_masked_labels_and_model_and_evaluates(tmp_path):
    result = run_atari(tmp_path, TINY + " --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("PongNoFrameskip-v4__rlhf_a2c_atari__1__")
    logged = scalars(run_dir)
    assert_tags(logged, RLHF_TAGS)
    assert min(step for step, _ in logged["losses/policy_loss"]) > 400  # A2C starts after the pretraining rounds
    assert logged["labels/total"][-1][1] == 12 and "labels 12/12" in result.stdout
    # a progress line per pretraining epoch, with the time left; the validation figures when they are computed
    epochs = [line for line in result.stdout.splitlines() if line.startswith("pretraining the reward model: epoch")]
    assert len(epochs) == 2 and "s left)" in epochs[0] and "val accuracy" not in epochs[0]
    assert re.search(r"epoch 2/2 \(\d+ s, about 0 s left\), val accuracy (0|1)\.\d\d, train loss", epochs[1])
    files = sorted((run_dir / "labels").glob("*.npz"))
    saved = [np.load(f) for f in files]
    assert sum(len(s["mu"]) for s in saved) == 12
    frames, true_reward, mu = (np.concatenate([s[k] for s in saved]) for k in ("left_frames", "left_true_reward", "mu"))
    right_reward = np.concatenate([s["right_true_reward"] for s in saved])
    assert frames.shape == (12, 8, 84, 84) and frames.dtype == np.uint8
    assert (frames[:, :, :9] == 0).all() and frames[:, :, 12:].mean() > 20  # what the reward model saw: no score
    diff = true_reward.sum(1) - right_reward.sum(1)
    np.testing.assert_array_equal(mu, np.where(diff > 0, 1.0, np.where(diff < 0, 0.0, 0.5)))  # ties are "equal"
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1200 and {"agent", "reward_ensemble"} <= set(checkpoint)
    evaluation = run_atari(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1")
    assert evaluation.returncode == 0, evaluation.stderr
    score = float(evaluation.stdout.split("eval: 1 games of PongNoFrameskip-v4: score ")[1].split()[0])
    assert -21 <= score <= -15  # a whole game of a barely trained agent
    # the same game filmed (--capture-video is the evaluating command's, as in rlhf_ppo_mujoco.py; it was refused, and
    # a run trained filming filmed no evaluation): in runs/NAME/eval/videos, in colour, the score shown
    # (with a clip of game 1 left in the folder, as an earlier evaluation of two games leaves it: filming a whole game
    # again here would double this test's time)
    (run_dir / "eval" / "videos").mkdir(parents=True)
    imageio.mimsave(run_dir / "eval" / "videos" / "episode-1.mp4", [np.zeros((210, 160, 3), np.uint8)] * 2, fps=30)
    filmed = run_atari(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1 --capture-video")
    assert filmed.returncode == 0, filmed.stderr
    assert filmed.stdout.splitlines()[-1] == evaluation.stdout.splitlines()[-1]
    clips = sorted((run_dir / "eval" / "videos").iterdir())
    assert [clip.name for clip in clips] == ["episode-0.mp4"]  # this evaluation's clip only, not the last one's
    frames = imageio.mimread(clips[0], memtest=False)
    assert len(frames) > 21 * 20 and frames[0].shape == (210, 160, 3)  # a whole game: 21 points or more
    assert np.abs(np.asarray(frames[-1][:20], float) - frames[0][:20]).mean() > 0  # the score at the top changed


@pytest.mark.slow
def test_evaluation_plays_the_saved_agent(tmp_path):
    """A game where the policy shows: in Freeway an agent that always presses UP crosses the road about 22 times in its
    2 min 16 s; one that ignored the saved weights (or never moved) scores 0 or 1."""
    agent = atari.Agent(3)  # Freeway: NOOP, UP, DOWN
    with torch.no_grad():
        agent.actor.weight.zero_()
        agent.actor.bias.copy_(torch.tensor([-20.0, 20.0, -20.0]))
    torch.save({"agent": agent.state_dict()}, tmp_path / "checkpoint.pt")
    assert atari.evaluate(tmp_path / "checkpoint.pt", "FreewayNoFrameskip-v4", 1) >= [15.0]


@pytest.mark.slow
def test_resuming_a_finished_run_trains_it_no_further(tmp_path):
    # 125 iterations of 2 x 5 steps: the last label round (20 iterations) is not whole, so the first iteration of the
    # round the checkpoint is in, where a labelled run's resume starts, lies before the run's end
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 1250") + " --save-model"
    finished = run_atari(tmp_path, args)
    assert finished.returncode == 0, finished.stderr
    run_dir = only_run_dir(tmp_path)
    before = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    after = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert before["global_step"] == after["global_step"] == 1250
    assert not re.search(r"^step ", resumed.stdout, re.M), resumed.stdout  # no iteration acted again
    for name, value in before["agent"].items():
        assert torch.equal(after["agent"][name], value), name


@pytest.mark.slow
def test_a_pretraining_that_gets_no_label_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path):
    # a skip threshold no 5-step Pong segment reaches: the teacher skips every pair of the initial policy
    result = run_atari(tmp_path, TINY + " --teacher-skip-threshold 1000 --save-model")
    assert_clear_error(result, "error: no label to pretrain the reward model on")
    assert "--teacher-skip-threshold 1000" in result.stderr  # why, and what to change
    assert "0 labels saved in" in result.stdout
    checkpoint = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] < 400  # saved when the run stopped, at the end of pretraining


@pytest.mark.slow
def test_reward_model_trains_in_its_own_thread_and_a_repeated_run_ends_the_same(tmp_path):
    checkpoints = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        # cold: a run from a fresh interpreter, the other from the zygote (warm_start.py)
        result = run_atari(tmp_path / name, TINY + " --save-model", cold=name == "first")
        assert result.returncode == 0, result.stderr
        checkpoints.append(torch.load(only_run_dir(tmp_path / name) / "checkpoint.pt", weights_only=False))
    first, second = checkpoints
    # the thread draws none of the random numbers A2C draws, and RL waits for each of its steps at fixed iterations
    for part in ("agent", "reward_ensemble", "reward_fitting", "reward_optimizer"):
        torch.testing.assert_close(second[part], first[part], rtol=0, atol=0)
    for name, state in first["random_states"].items():  # every generator ends where it ended the first time
        assert _same(second["random_states"][name], state), name
    # the reward thread's dropout stream is not the global torch one (it used to be seeded with the same seed)
    dropout = torch.Generator("cuda" if torch.cuda.is_available() else "cpu")  # the run's device (--cuda is on)
    global_torch = torch.Generator()
    dropout.set_state(first["random_states"]["reward_dropout"])
    global_torch.set_state(first["random_states"]["torch"])
    assert dropout.initial_seed() != global_torch.initial_seed()
    # A2C's copy is a step behind the one that trains: the last step was taken while A2C ran on
    members = [key for key in first["reward_fitting"] if key.startswith("members.")]
    assert any(not torch.equal(first["reward_ensemble"][key], first["reward_fitting"][key]) for key in members)


def _same(a, b):
    """Whether two saved random states (nested dicts, tuples, arrays, tensors, numbers) are equal."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return np.array_equal(a, b)


@pytest.mark.slow
def test_true_reward_mode_queries_no_labels_and_captures_video(tmp_path):
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 2400")  # 1200 steps per env: a whole game
    result = run_atari(tmp_path, args + " --feedback true-reward --capture-video --env ALE/Pong-v5 --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("ALE-Pong-v5__")
    logged = scalars(run_dir)
    assert "losses/policy_loss" in logged and not any(tag.startswith(("reward_model/", "labels/")) for tag in logged)
    assert logged["losses/policy_loss"][0][0] == 100  # A2C updates from the first iteration on (logged every 10)
    assert not (run_dir / "labels").exists()
    assert -21 <= logged["charts/episodic_return"][0][1] <= -15  # the score of a whole game of Pong played badly
    frames = imageio.mimread(run_dir / "videos" / "episode-0.mp4", memtest=False)
    assert len(frames) > 100 and frames[0].shape == (210, 160, 3)
    assert frames[5][:20].std() > 0  # the video is what people watch: in colour, score included


@pytest.mark.slow
def test_a_resumed_run_numbers_its_videos_after_the_earlier_ones_and_replaces_none(tmp_path):
    # a resumed run restarts its games: the game under way at the stop was saved as far as it went (episode 0), and
    # the restarted one is the next game, 1 (games 0, 1, 8, 27, ... are filmed)
    args = TINY + " --feedback true-reward --capture-video --save-model"
    out, err = interrupt_run(tmp_path, args, "step ", script=SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    first_game = (run_dir / "videos" / "episode-0.mp4").read_bytes()
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert (run_dir / "videos" / "episode-0.mp4").read_bytes() == first_game
    assert sorted(video.name for video in (run_dir / "videos").iterdir()) == ["episode-0.mp4", "episode-1.mp4"]


@pytest.mark.slow
def test_human_feedback_run_learns_from_a_rater_behind_the_label_server(tmp_path, label_server):
    server = label_server()
    # (also the one run with the reward normalised over the labelled clips' steps, the other normalisation)
    args = TINY + f" --feedback human --label-server {server.url} --save-model --reward-normalization judged"
    with rating_by_script(server) as answered:
        trainer = run_atari(tmp_path, args, timeout=600)
    assert trainer.returncode == 0, trainer.stdout + trainer.stderr
    assert "labels 6/6 from the initial policy" in trainer.stdout
    assert_the_finished_run_closed_its_pairs(server, only_run_dir(tmp_path), trainer.stdout)
    saved = [np.load(f) for f in sorted((only_run_dir(tmp_path) / "labels").glob("*.npz"))]
    mu = np.concatenate([s["mu"] for s in saved])
    diff = np.concatenate([s["left_true_reward"].sum(1) - s["right_true_reward"].sum(1) for s in saved])
    assert len(mu) >= 6
    np.testing.assert_array_equal(mu, np.sign(diff) / 2 + 0.5)  # the rater's answers
    status, clip = server.call("GET", f"/clips/{next(iter(answered))}-left")
    assert status == 200 and clip[:4] == b"\x1a\x45\xdf\xa3"  # WebM
    (tmp_path / "clip.webm").write_bytes(clip)
    frames = imageio.mimread(tmp_path / "clip.webm")
    assert len(frames) == 5 and frames[0].shape[:2] == (336, 336)  # one frame per step, enlarged 4x


@pytest.mark.slow
def test_a_run_killed_in_the_pretraining_label_wait_resumes_with_the_answers_given_in_it(tmp_path, label_server):
    """The checkpoint before RL came after the label wait and the reward model's pretraining (hours of people's time
    and of epochs): a run killed (-9) in between had none, could not resume, and the answers given in the wait reached
    no run. Now it has one from the wait's start: a rater answers all but one waited-for pair (against the true
    returns), the run is killed, and the resumed run takes every one of those answers."""
    server = label_server()
    args = f"{TINY} --feedback human --label-server {server.url} --save-model"
    trainer, output, reader = start_trainer(tmp_path, args, SCRIPT, cold=True)
    try:
        waited_for = answer_all_but_one_pair_the_run_waits_for(trainer, output, server)
        trainer.kill()
        assert trainer.wait(timeout=60) == -signal.SIGKILL
    finally:
        trainer.kill()
    reader.join(timeout=30)
    run_dir = only_run_dir(tmp_path)
    with rating_by_script(server):  # the one left, and the pairs of RL, by the true returns
        resumed = run_atari(tmp_path, f"--resume {run_dir}", timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    saved = [np.load(f) for f in sorted((run_dir / "labels").glob("*.npz"))]
    mu = np.concatenate([s["mu"] for s in saved])
    diff = np.concatenate([s["left_true_reward"].sum(1) - s["right_true_reward"].sum(1) for s in saved])
    assert_the_answers_given_in_the_wait_were_taken(mu, diff, waited_for)


@pytest.mark.slow
def test_a_run_killed_in_the_reward_models_pretraining_epochs_resumes_at_its_last_tenth_epoch(tmp_path):
    """The reward model's 200 pretraining epochs can take hours on a CPU. A run stopped in them (SIGTERM) resumes at
    the next epoch, but one killed (-9) went back to epoch 1: nothing was saved in the epochs. A checkpoint after every
    tenth epoch (with the validation pass) keeps them: killed after epoch 12, the resumed run trains from epoch 11."""
    args = TINY.replace("--pretrain-epochs 2", "--pretrain-epochs 30") + " --save-model"
    interrupt_run(tmp_path, args, "pretraining the reward model: epoch 12/30", SCRIPT, sig=signal.SIGKILL)
    run_dir = only_run_dir(tmp_path)
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    epochs = re.findall(r"^pretraining the reward model: epoch (\d+)/30", resumed.stdout, re.M)
    assert epochs and int(epochs[0]) in (11, 21) and epochs[-1] == "30", epochs


@pytest.mark.slow
def test_a_run_the_label_server_starts_refusing_saves_before_it_stops(tmp_path, label_server):
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 1000000") + " --feedback human --save-model"
    run_dir, _, _ = assert_a_run_the_label_server_refuses_saves_and_says_so(tmp_path, args, label_server, "step ", SCRIPT)
    saved = [np.load(f) for f in sorted((run_dir / "labels").glob("*.npz"))]
    assert sum(len(batch["mu"]) for batch in saved) >= 6  # the pretraining labels, and any since


def noisy_history(rng):
    """The frames of 20 steps of 2 environments, random pixels: every segment's clips differ."""
    history = atari.new_history(20, 2)
    history["frames"][:] = rng.integers(0, 256, history["frames"].shape, dtype=np.uint8)
    return history


def test_variance_selection_keeps_the_candidate_pairs_the_members_disagree_on_most():
    history = noisy_history(np.random.default_rng(0))
    torch.manual_seed(0)
    ensemble = atari.RewardEnsemble(3).eval()  # untrained members: they disagree, pair by pair
    # scored 16 candidate pairs at a time, 48 in all
    left, right = atari.select_pairs(np.random.default_rng(3), ensemble, history, 5, 6, 8, "variance", chunk=16)
    replay = np.random.default_rng(3)  # draws the same candidates as select_pairs did
    candidates = [atari.gather_segments(history, atari.segment_places(replay, history, 5, 6 * 8), 5) for _ in range(2)]
    kept, scores = (atari.disagreement(ensemble, *pair) for pair in ((left, right), candidates))
    assert_the_pairs_kept_are_the_most_disagreed_on(kept, scores, 6)


def test_no_pair_shows_one_segment_twice():
    """As in rlhf_ppo_mujoco.py: a pair whose two sides are the same segment gets another right side (20 x 10 pairs of
    a round with 32 starts)."""
    history = atari.new_history(20, 2)
    history["true_reward"][:] = 1 + 10 * np.arange(20)[:, None] + np.arange(2)  # each step's own code
    for seed in range(20):
        left, right = atari.select_pairs(np.random.default_rng(seed), None, history, 5, 10, 1, "random")
        assert not (left["true_reward"] == right["true_reward"]).all(1).any(), seed


def test_pairs_the_synthetic_teacher_skips_are_asked_again_at_once_until_the_labels_due_are_held(tmp_path):
    """As in rlhf_ppo_mujoco.py: a skipped pair's place is filled in the same label round, from the same steps (it was
    filled only by the next round: a run ended short of --labels, and pretraining on fewer labels than its share); a
    round whose pairs all get skipped ends the asking."""
    rng = np.random.default_rng(0)
    history, args = atari.new_history(20, 2), atari.Args(segment_len=5)
    history["true_reward"][:] = rng.random((20, 2)) < 0.1  # about half the segments score: a quarter of the pairs skipped
    buffer = atari.LabelBuffer(40, 5, 3, rng)
    teacher = atari.SyntheticTeacher(rng, skip_threshold=0.5)
    atari.query_labels(args, rng, teacher, buffer, None, history, 30, "random", tmp_path / "a")
    assert buffer.total == 30
    assert (buffer.data["true_reward"][:30].sum(-1).max(1) >= 1).all()  # every label held is one the teacher answered
    history["true_reward"][:] = 0  # every pair below the threshold
    atari.query_labels(args, rng, teacher, buffer, None, history, 40, "random", tmp_path / "b")
    assert buffer.total == 30


def test_the_label_token_stays_out_of_the_logs(tmp_path):
    assert_the_label_token_stays_out_of_the_logs(tmp_path, f"{TINY} --feedback human", SCRIPT)


def segment_pairs(rng, history):
    """`segments(n)` for the shared human-teacher helpers: n pairs of 5-step segments of `history`."""
    return lambda n: tuple(atari.sample_segments(rng, history, 5, n) for _ in range(2))


def test_answers_fetched_but_not_yet_polled_still_count_as_on_their_way(tmp_path, label_server):
    # a label round asks `schedule - buffer - pending` pairs: an answer the teacher's thread has fetched but poll() has
    # not handed to the buffer must count as pending, or the round asks for it again (more labels than the budget)
    server = label_server()
    rng = np.random.default_rng(0)
    history = noisy_history(rng)
    history["true_reward"][:] = rng.integers(-1, 2, history["true_reward"].shape)
    teacher = atari.HumanTeacher(server.url, None, "exp", "Which?", tmp_path, clip_scale=1, poll_interval=0.2)
    teacher.start()
    try:
        with rating_by_script(server):
            teacher.ask(*(atari.sample_segments(rng, history, 5, 3) for _ in range(2)))
            deadline = time.time() + 60
            while teacher.unanswered:
                assert time.time() < deadline and teacher.failure is None, teacher.failure
                time.sleep(0.1)
        assert teacher.pending == 3  # answered, not polled: not in the buffer, still on their way
        assert sum(len(mu) for _, _, mu in teacher.poll()) == 3 and teacher.pending == 0
    finally:
        teacher.close()


@pytest.mark.parametrize("assert_it, poll_interval, server_args", TEACHER_STOP_AND_END_CHECKS)
def test_a_human_teacher_keeps_its_pairs_and_answers_at_a_stop_and_at_the_end(
    tmp_path, label_server, assert_it, poll_interval, server_args
):
    server, rng = label_server(*server_args), np.random.default_rng(0)
    history = noisy_history(rng)
    assert_it(
        server,
        lambda: atari.HumanTeacher(server.url, None, "exp", "Which?", tmp_path, clip_scale=1, poll_interval=poll_interval),
        segment_pairs(rng, history),
    )


@pytest.mark.parametrize("assert_it", LABEL_SERVER_RESTART_CHECKS)
def test_a_label_server_restarted_on_another_database_stops_the_teacher(tmp_path, label_server, assert_it):
    rng = np.random.default_rng(0)
    history = noisy_history(rng)
    assert_it(
        label_server,
        lambda url: atari.HumanTeacher(
            url, None, "exp", "Which?", tmp_path, clip_scale=1, poll_interval=0.2, pair_check_interval=0.5
        ),
        segment_pairs(rng, history),
    )


def test_processes_of_a_run_never_share_a_pair_id(tmp_path):
    rng = np.random.default_rng(0)
    history = noisy_history(rng)
    assert_processes_of_a_run_never_share_a_pair_id(
        lambda: atari.HumanTeacher("http://127.0.0.1:9", None, "exp", "Which?", tmp_path),
        segment_pairs(rng, history),
    )


def test_a_run_name_the_label_server_cannot_take_is_refused_before_the_run_folder_is_made(tmp_path):
    # README: bad arguments stop the script before anything is created (this one was refused once the run folder and its
    # TensorBoard file existed)
    assert_clear_error(
        run_atari(tmp_path, f"{TINY} --feedback human --exp-name {'x' * 90}"), "too long for the label server's ids"
    )
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_name_the_label_server_cannot_take_stops_the_run_at_once(tmp_path, label_server):
    server, rng = label_server(), np.random.default_rng(0)
    history = noisy_history(rng)
    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once(
        server,
        lambda name: atari.HumanTeacher(server.url, None, name, "Which?", tmp_path, clip_scale=1, poll_interval=0.2),
        segment_pairs(rng, history),
    )


def test_a_run_folder_given_as_a_dot_keeps_its_name_as_the_experiment(tmp_path, monkeypatch):
    assert_a_run_folder_given_as_a_dot_keeps_its_name(
        tmp_path,
        monkeypatch,
        lambda run_dir: atari.make_teacher(atari.Args(feedback="human", label_server="http://127.0.0.1:9"), run_dir, None),
    )


def test_a_new_run_never_writes_into_the_folder_of_a_run_of_its_name_started_in_the_same_second(tmp_path):
    args = "--total-timesteps 40 --num-envs 2 --feedback true-reward --noop-max 2 --threads 1 --exp-name clash --seed 3"
    name = f"{atari.Args.env.replace('/', '-')}__clash__3"
    assert_a_new_run_never_writes_into_another_runs_folder(tmp_path, args, name, SCRIPT)


def test_a_kill_between_saving_the_labels_and_the_pending_pairs_adds_no_answer_twice(tmp_path, label_server, monkeypatch):
    server, rng = label_server(), np.random.default_rng(0)
    history = noisy_history(rng)
    labels_dir, buffer = tmp_path / "labels", atari.LabelBuffer(10, 5, 3, rng)

    def resume(teacher):
        resumed_buffer = atari.LabelBuffer(10, 5, 3, rng)
        atari.load_labels(labels_dir, resumed_buffer, teacher)
        return resumed_buffer.total

    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice(
        server,
        monkeypatch,
        lambda: atari.HumanTeacher(server.url, None, "exp", "Which?", tmp_path, clip_scale=1, poll_interval=0.2),
        segment_pairs(rng, history),
        lambda teacher: atari.store_answers(teacher, buffer, labels_dir),
        resume,
    )


@pytest.mark.slow
def test_predicted_scores_are_of_whole_games(tmp_path):
    # Breakout's games are short: 600 steps per env, the first 200 of them pretraining, end games begun before RL and
    # in it; a game under way when RL began gets no predicted score
    result = run_atari(tmp_path, TINY + " --env BreakoutNoFrameskip-v4")
    assert result.returncode == 0, result.stderr
    logged = scalars(only_run_dir(tmp_path))
    assert assert_predicted_returns_are_of_whole_episodes(logged, rl_start=400, num_envs=2, batch_size=10) > 0


@pytest.mark.slow
def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_the_checkpoint(tmp_path):
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 20000")
    assert_sigterm_stops_like_ctrl_c(tmp_path, args, SCRIPT)


@pytest.mark.slow
def test_interrupted_run_keeps_its_labels_and_resumes_to_the_full_budget(tmp_path):
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 2000") + " --labels 20 --save-model"
    out, err = interrupt_run(tmp_path, args, "step 800", script=SCRIPT)  # once A2C has run past a label round
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    before = {f.name: np.load(f)["left_frames"] for f in (run_dir / "labels").glob("*.npz")}
    assert 0 < sum(len(v) for v in before.values()) < 20

    # a checkpoint saved before they held the random states and the reward-fit counters resumes as it did
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    for key in ("random_states", "reward_steps", "reward_step_done", "reward_losses", "policy_rewards"):
        checkpoint.pop(key, None)
    torch.save(checkpoint, run_dir / "checkpoint.pt")

    result = run_atari(tmp_path, f"--resume {run_dir}", timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"resumed {run_dir} at step" in result.stdout
    after = {f.name: np.load(f) for f in (run_dir / "labels").glob("*.npz")}
    assert sum(len(f["mu"]) for f in after.values()) == 20  # the whole budget, nothing asked twice
    for name, frames in before.items():
        np.testing.assert_array_equal(after[name]["left_frames"], frames)  # the old labels are kept as they were
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 2000


@pytest.mark.slow
def test_a_run_stopped_while_pretraining_its_reward_model_resumes_at_the_next_epoch(tmp_path):
    # a stop ends pretraining after the epoch in progress; the resumed run trains the epochs that are left, once each
    # (pretraining takes hours on a CPU: a run stopped and requeued at a time limit must get through it)
    # (an epoch of this tiny run takes about 0.2 s here: 30 leave the stop, asked at the 2nd, time to land)
    args = TINY.replace("--pretrain-epochs 2", "--pretrain-epochs 30") + " --save-model"
    out, err = interrupt_run(tmp_path, args, "pretraining the reward model: epoch 2/30", script=SCRIPT)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    epochs = [int(e) for e in re.findall(r"pretraining the reward model: epoch (\d+)/30", "\n".join([out, resumed.stdout]))]
    assert 2 < epochs[0] < 30 and epochs == list(range(epochs[0], 31)), epochs  # epochs 1-2 were read before the stop
    assert "pretraining the reward model: epoch" in resumed.stdout  # stopped before the last epoch: some were left
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 1200


def test_a_run_killed_after_pretraining_resumes_with_its_reward_model_pretrained(tmp_path):
    """The first periodic checkpoint comes after --checkpoint-every (2000) iterations; the pretraining before it (the
    label wait, and hours of epochs on a CPU) has a checkpoint of its own, so a run killed (-9) in between resumes at
    its first RL iteration. It could not resume at all ("no checkpoint")."""
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 2000") + " --save-model"
    interrupt_run(tmp_path, args, "step ", script=SCRIPT, sig=signal.SIGKILL)  # killed in RL, before any other checkpoint
    run_dir = only_run_dir(tmp_path)
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["labels_held"] == 6  # the pretraining labels
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed {run_dir} at step 400 with 6 labels" in resumed.stdout  # 40 pretraining iterations of 10 steps
    assert "pretraining the reward model" not in resumed.stdout


def test_a_resumed_true_reward_run_goes_on_after_its_last_iteration_not_from_its_rounds_start(tmp_path):
    """A true-reward run has no label rounds to redo (a round's steps are an RLHF run's label pool): rewound to the
    start of one (here 1,000 iterations), it redid the updates since, with the learning rate and step count set back."""
    # 150 iterations in all, the stop asked at the 10th: the run is inside its first round whenever it stops
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 1500").replace("--round-steps 100", "--round-steps 5000")
    args += " --feedback true-reward --save-model"
    out, err = interrupt_run(tmp_path, args, "step ", script=SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 10 <= checkpoint["iteration"] < 150  # stopped before the end, inside the first round (1,000 iterations)
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed {run_dir} at step {checkpoint['global_step']} " in resumed.stdout, resumed.stdout[:2000]


@pytest.mark.slow
def test_tensorboard_shows_each_step_once_after_a_resume_that_redoes_a_label_round(tmp_path):
    """A labelled run stopped in the middle of a label round resumes at that round's start (its steps are the round's
    label pool) and logs its iterations again: TensorBoard hid only those the stopped run logged after the
    checkpoint, so the round's first iterations showed twice, with different values."""
    # rounds of 500 steps per env (100 iterations of 10 steps), 2 of pretraining, 2 of RL; a line every iteration
    args = TINY.replace("--total-timesteps 1200", "--total-timesteps 4000").replace("--round-steps 100", "--round-steps 500")
    args = args.replace("--pretrain-steps 400", "--pretrain-steps 2000").replace("--log-every 10", "--log-every 1")
    out, err = interrupt_run(tmp_path, args + " --save-model", "step 2100,", script=SCRIPT, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["iteration"]
    assert 210 <= stopped_at < 400 and stopped_at % 100 != 0, stopped_at  # in RL, in the middle of a round
    resumed = run_atari(tmp_path, f"--resume {run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed {run_dir} at step {stopped_at // 100 * 1000} " in resumed.stdout, resumed.stdout[:2000]
    logged = scalars(run_dir)
    for tag in ("losses/value_loss", "labels/total"):  # (labels/total is logged in pretraining too)
        assert [step for step, _ in logged[tag] if step > 2000] == list(range(2010, 4001, 10)), tag  # each RL iteration, once
    assert_the_settings_show_once_per_start(run_dir, stopped_at // 100 * 1000)


def test_an_error_in_the_reward_models_last_step_is_raised_not_lost():
    """RL waits for each step of the reward thread and so meets its error, but nothing waited for the last one: the
    run closed the thread, saved, and ended as if all was well (rlhf_ppo_mujoco.py's close raises it)."""
    args = checked_args(**dict(vars(atari.Args()), labels=12, pretrain_labels=6, round_steps=100, num_envs=2))
    training = atari.RewardModelTraining(args, "cpu")

    def failing_step():
        raise FloatingPointError("the last step's loss is nan")

    training.job = training.thread.submit(failing_step)
    with pytest.raises(FloatingPointError, match="nan"):
        training.close()


def test_a_reward_model_saved_on_another_kind_of_device_resumes(tmp_path):
    """A run trained on a GPU (CUDA is this script's default) and resumed on a machine without one died in the resume
    with a traceback: its reward model's dropout stream was saved as a CUDA generator's state (16 bytes; seen on an
    H200, benchmark/notes/device_batch.md), which a CPU generator refuses (it wants 5056), and the other way round.
    Such a stream starts again, from the run's seed and the reward model's steps so far, and the run says so."""
    args = checked_args(**dict(vars(atari.Args()), labels=12, pretrain_labels=6, round_steps=100, num_envs=2))
    saved = atari.RewardModelTraining(args, "cpu")
    saved.gradient_steps = 40
    cuda_state = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's: its seed and offset
    checkpoint = saved.state_dict() | {"random_states": {"reward_dropout": cuda_state}}
    resumed, fresh = atari.RewardModelTraining(args, "cpu"), atari.RewardModelTraining(args, "cpu")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        resumed.load_state_dict(checkpoint, "cpu")
    assert resumed.gradient_steps == 40 and "dropout" in output.getvalue() and "another kind of device" in output.getvalue()
    draws = [torch.rand(4, generator=training.dropout_generator) for training in (resumed, fresh)]
    assert not torch.equal(*draws)  # not the stream the run began with, drawn again
    again = atari.RewardModelTraining(args, "cpu")
    with contextlib.redirect_stdout(io.StringIO()):
        again.load_state_dict(checkpoint, "cpu")
    assert torch.equal(torch.rand(4, generator=again.dropout_generator), draws[0])  # reproducible
    pretrained = atari.RewardModelTraining(args, "cpu")  # stopped after pretraining epochs only: no RL step yet
    with contextlib.redirect_stdout(io.StringIO()):
        pretrained.load_state_dict(checkpoint | {"reward_steps": 0, "reward_pretrain_epochs": 3}, "cpu")
    first_draws = torch.rand(4, generator=atari.RewardModelTraining(args, "cpu").dropout_generator)
    assert not torch.equal(torch.rand(4, generator=pretrained.dropout_generator), first_draws)  # not the run's first masks
    for training in (saved, resumed, fresh, again, pretrained):
        training.close()


@pytest.mark.slow
def test_a_resumed_run_continues_every_random_stream_as_if_it_had_never_stopped(tmp_path):
    # rounds of 50 steps per env (10 iterations), 2 of pretraining, then 10 of 2 labels each; a checkpoint every round
    # and a line every iteration. Killed (-9) in round 8, the run resumes from the checkpoint that ended round 7.
    # Only the games restart (the emulators' state is not saved); 600 steps per env end no game of Pong, so both runs
    # draw the same random numbers, and the labels' validation splits and bootstrap weights must be the same.
    args = TINY.replace("--round-steps 100 --pretrain-steps 400", "--round-steps 50 --pretrain-steps 200")
    args = args.replace("--labels 12 --pretrain-labels 6", "--labels 24 --pretrain-labels 4")
    args = args.replace("--log-every 10", "--log-every 1") + " --save-model --checkpoint-every 10"
    args += " --label-buffer 10"  # the buffer holds fewer labels than the budget: it is still spent exactly
    for name in ("whole", "stopped"):
        (tmp_path / name).mkdir()
    # cold: a run from a fresh interpreter, the other from the zygote (warm_start.py)
    whole = run_atari(tmp_path / "whole", args, cold=True)
    assert whole.returncode == 0, whole.stderr
    whole_dir = only_run_dir(tmp_path / "whole")
    assert "charts/episodic_return" not in scalars(whole_dir)  # no game ended: the premise of the comparison

    interrupt_run(tmp_path / "stopped", args, "step 720,", script=SCRIPT, sig=signal.SIGKILL)
    run_dir = only_run_dir(tmp_path / "stopped")
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["iteration"]
    held = max(int(f.stem) for f in (run_dir / "labels").glob("*.npz"))
    # the kill came after round 3 and not between a round's labels and its checkpoint
    assert stopped_at in range(30, 120, 10) and held == 4 + 2 * (stopped_at // 10 - 2), (stopped_at, held)
    result = run_atari(tmp_path / "stopped", f"--resume {run_dir}")
    assert result.returncode == 0, result.stderr
    assert f"resumed {run_dir} at step {stopped_at * 10}" in result.stdout

    whole_labels = {f.name: np.load(f) for f in (whole_dir / "labels").glob("*.npz")}
    resumed_labels = {f.name: np.load(f) for f in (run_dir / "labels").glob("*.npz")}
    assert sorted(resumed_labels) == sorted(whole_labels) and sum(len(f["mu"]) for f in resumed_labels.values()) == 24
    first = whole_labels["0000002.npz"]
    for name in sorted(n for n in whole_labels if int(n[:7]) > held):  # the labels asked after the resume
        for key in ("is_val", "weight"):
            np.testing.assert_array_equal(resumed_labels[name][key], whole_labels[name][key], err_msg=f"{name} {key}")
        assert not np.array_equal(resumed_labels[name]["weight"], first["weight"])  # not the first labels' again
    # and every generator (numpy, torch, the reward thread's dropout, python) and counter ends where it did
    ends = [torch.load(d / "checkpoint.pt", weights_only=False) for d in (whole_dir, run_dir)]
    for name, state in ends[0]["random_states"].items():
        assert _same(ends[1]["random_states"][name], state), name
    assert ends[1]["reward_steps"] == ends[0]["reward_steps"] > 0
    # and TensorBoard shows the steps the uninterrupted run logged, each once: those logged between the checkpoint and
    # the kill were logged again by the resumed run
    logged = [scalars(d) for d in (whole_dir, run_dir)]
    for tag in ("losses/value_loss", "labels/total"):
        assert [step for step, _ in logged[1][tag]] == [step for step, _ in logged[0][tag]], tag


@pytest.mark.parametrize(
    "args, message",
    [
        ("--env Pongg-v5", "unknown Atari environment id 'Pongg-v5'"),
        ("--eval-only", "--eval-only needs --resume"),
        ("--resume runs/nothing-here", "no checkpoint at runs/nothing-here/checkpoint.pt"),
    ],
)
def test_bad_arguments_get_a_clear_message_not_a_traceback(tmp_path, args, message):
    assert_clear_error(run_atari(tmp_path, args, timeout=120), message)


def test_a_resumed_run_is_not_refused_its_own_settings_that_a_new_run_would_be():
    assert_a_resumed_run_is_not_refused_its_own_settings(atari)


def test_a_resume_that_cannot_be_done_as_asked_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    assert_resumes_it_cannot_do_are_refused_and_change_nothing(tmp_path, atari, "env_kwargs")  # a MuJoCo setting


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"env": "Hopper-v4"}, "Hopper-v4 is not an Atari game"),
        ({"labels": 0}, "--labels must be positive"),
        ({"pretrain_steps": 0}, "--pretrain-steps must be positive"),
        ({"pretrain_labels": 600, "labels": 500}, "--pretrain-labels must be between 1 and --labels 500"),
        ({"round_steps": 402}, "--round-steps 402 must be a positive multiple of --num-steps 5"),
        ({"segment_len": 500}, "--segment-len 500 must be between 2 and --round-steps 400"),
        ({"labels": 100000, "total_timesteps": 200000}, "--labels 100000 is too large for this run"),
        ({"labels": 100000, "total_timesteps": 200000}, "in an RL round. Use fewer labels, more --total-timesteps, or"),
        ({"labels": 20000, "pretrain_labels": 20000}, "in a pretraining round. Use fewer labels, more --pretrain-steps,"),
        ({"total_timesteps": 20000}, "leaves no RL after 25600 pretraining steps"),
        ({"total_timesteps": 25760}, "reaches no label round after the 25600 pretraining steps"),
        ({"reward_dropout": 1.0}, "--reward-dropout must be in [0, 1)"),
        ({"reward_norm_window": 0}, "--reward-norm-window and --reward-std must be positive"),
        ({"schedule_horizon": float("nan")}, "--schedule-horizon must be a number, not nan"),
        ({"gamma": float("nan"), "rmsprop_alpha": float("nan")}, "--gamma, --rmsprop-alpha must be a number, not nan"),
        ({"gamma": 1.5}, "--gamma must be in [0, 1] and --max-grad-norm positive"),
        ({"learning_rate": float("inf")}, "--reward-lr and --learning-rate must be positive finite numbers"),
        ({"threads": -1}, "--threads and --noop-max must be 0 or more and --seed in [0, 2**32 - 1] (got -1, 30, 1)"),
        ({"noop_max": -1}, "--threads and --noop-max must be 0 or more and --seed in [0, 2**32 - 1] (got 0, -1, 1)"),
        ({"seed": -1}, "--threads and --noop-max must be 0 or more and --seed in [0, 2**32 - 1] (got 0, 30, -1)"),
        ({"label_token": "s3cret"}, "error: --label-token is for --feedback human"),
        ({"clip_scale": 2, "clip_fps": 30}, "error: --clip-scale, --clip-fps are for --feedback human"),
        ({"feedback": "human", "teacher_epsilon": 0.1}, "error: --teacher-epsilon is for the synthetic teacher"),
        ({"teacher_beta": 0.0}, "--teacher-beta must be positive"),
        ({"teacher_equal_margin": -0.5}, "--teacher-equal-margin must be at least 0"),
        ({"checkpoint_every": 100}, "--checkpoint-every is for --save-model"),  # no checkpoint was written
        ({"eval_episodes": 3}, "error: --eval-episodes is for --eval-only"),  # a training run evaluates nothing
        ({"selection": "random", "candidate_multiplier": 4}, "error: --candidate-multiplier is for --selection variance"),
        ({"reward_normalization": "judged", "reward_norm_window": 50}, "error: --reward-norm-window is for"),
        ({"reward_lr": 0.0}, "--reward-lr and --learning-rate must be positive"),
        # one member has no disagreement: variance selection kept the first candidates, random selection unsaid
        ({"ensemble_size": 1}, "--selection variance needs --ensemble-size 2 or more"),
    ],
)
def test_impossible_settings_are_refused_with_a_message(settings, message):
    # the checks the script runs before creating anything; their SystemExit prints the message without a traceback
    with pytest.raises(SystemExit, match=re.escape(message)):
        checked_args(**settings)


def test_a_window_for_the_policy_normalisation_is_refused_only_where_a_new_labelled_run_would_ignore_it():
    judged = {"reward_normalization": "judged", "reward_norm_window": 50}
    with pytest.raises(SystemExit, match="--reward-norm-window is for --reward-normalization policy"):
        checked_args(**judged)
    checked_args(**judged, resume="runs/old")  # a run's own settings: it cannot change them
    checked_args(**judged, feedback="true-reward")  # reads no preference flag (sweep grids share them between modes)


def test_only_a_second_ctrl_c_stops_at_once():
    assert_only_a_second_ctrl_c_stops_at_once(atari)


def test_the_fields_computed_at_run_time_are_not_flags(capsys):
    fields = ["batch_size", "num_iterations", "iterations_per_round", "pretrain_iterations"]
    assert_the_fields_computed_at_run_time_are_not_flags(atari.Args, fields, capsys)


def test_a_resumed_run_keeps_its_own_settings_and_a_frozen_reward_run_of_an_older_version_is_refused():
    saved = vars(atari.Args(seed=7, labels=40))
    args = atari.resumed_args(atari.Args(resume="runs/a", eval_only=True, eval_episodes=2), {"args": saved})
    assert (args.seed, args.labels, args.resume, args.eval_episodes) == (7, 40, "runs/a", 2)
    with pytest.raises(SystemExit, match="--eval-episodes is for --eval-only"):  # a resumed training run: ignored
        atari.resumed_args(atari.Args(resume="runs/a", eval_episodes=2), {"args": saved})
    with pytest.raises(SystemExit, match="--seed 3 differs from the run's own 7"):  # was dropped without a word
        atari.resumed_args(atari.Args(resume="runs/a", seed=3, labels=40), {"args": saved})
    old = {"args": {**saved, "frozen_reward": None}}  # a checkpoint of a version that had --frozen-reward
    assert atari.resumed_args(atari.Args(resume="runs/a"), old).seed == 7
    frozen = {"args": {**saved, "frozen_reward": "runs/b"}}
    with pytest.raises(SystemExit, match="ran with --frozen-reward, which this version no longer has"):
        atari.resumed_args(atari.Args(resume="runs/a"), frozen)
    assert atari.resumed_args(atari.Args(resume="runs/a", eval_only=True), frozen).eval_only  # its agent still plays


def test_a_resume_without_the_labels_its_reward_model_trained_on_is_refused(tmp_path):
    """Also when only pretraining had run (a time limit during its epochs), and when the folder holds only a batch
    cut short (*.tmp.npz, which load_labels skips); a run stopped before any answer (nothing trained) resumes."""
    saved = {"args": vars(atari.Args(labels=40))}
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "0000010.npz.tmp.npz").write_bytes(b"")
    resume = atari.Args(resume=str(tmp_path))
    for counters in ({"reward_steps": 0, "reward_pretrain_epochs": 3}, {"reward_steps": 64, "reward_pretrain_epochs": 200}):
        with pytest.raises(SystemExit, match="has a checkpoint but not the labels saved with it"):
            atari.resumed_args(resume, {**saved, **counters})
    assert atari.resumed_args(resume, {**saved, "reward_steps": 0, "reward_pretrain_epochs": 0}).labels == 40


def test_a_resume_with_fewer_labels_than_its_checkpoint_held_is_refused(tmp_path):
    """A run folder copied in part (a label batch missing) resumed with fewer labels than its reward model had trained
    on, and the label budget asked for the missing ones again."""
    rng = np.random.default_rng(0)
    buffer = atari.LabelBuffer(10, 2, 3, rng)
    for count in (4, 6):
        segments = block_frames(rng, count, 2)
        stored = buffer.add(segments, segments, np.ones(count))
        atari.save_labels(str(tmp_path / "labels"), stored | {"end": buffer.total})
    saved = {"args": vars(atari.Args(labels=40)), "reward_steps": 64, "reward_pretrain_epochs": 200, "labels_held": 10}
    resume = atari.Args(resume=str(tmp_path))
    assert atari.resumed_args(resume, saved).labels == 40  # every batch there
    (tmp_path / "labels" / "0000004.npz").unlink()
    with pytest.raises(SystemExit, match=r"holds 6 labels, fewer than the 10 its checkpoint held"):
        atari.resumed_args(resume, saved)


def test_the_first_stop_request_ends_the_run_at_the_end_of_the_iteration_and_a_later_ctrl_c_at_once():
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        stop_requested = atari.stop_on_signals()
        assert not stop_requested.is_set()
        signal.raise_signal(signal.SIGTERM)  # `kill`, `timeout`, a cluster's scheduler: as Ctrl-C
        assert stop_requested.is_set()
        # the same stop again at once (a scheduler and a sweep task may both send it): no raise
        signal.raise_signal(signal.SIGTERM)
        time.sleep(1.1)
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C, later: stop at once
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
