"""rlhf_ppo_mujoco.py run as a user runs it: in a subprocess, judged by what it writes (TensorBoard, labels, checkpoint)."""

import os
import re
import signal

import imageio
import numpy as np
import pytest
import rlhf_ppo_mujoco as rl
import torch
import tyro
from helpers import (
    assert_only_a_second_ctrl_c_stops_at_once,
    assert_the_fields_computed_at_run_time_are_not_flags,
    assert_a_new_run_never_writes_into_another_runs_folder,
    assert_a_resumed_run_is_not_refused_its_own_settings,
    assert_a_run_killed_after_pretraining_resumes_pretrained,
    assert_a_kill_after_a_checkpoint_loses_no_label,
    assert_a_resumed_run_keeps_its_videos,
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
)

# a tiny Hopper run: 2 pretraining rollouts, 4 RL iterations of 8 envs x 64 steps, 40 labels of 20-step segments
TINY = "--env Hopper-v4 --total-timesteps 3072 --num-envs 8 --num-steps 64 --pretrain-steps 1024 --labels 40 --segment-len 20"
TINY += " --pretrain-epochs 5 --reward-eval-every 2"
# one epoch of 4 minibatches per update, not CleanRL's 10 of 32: these runs check what a run does and saves, not what
# PPO learns (tests/test_ppo_mujoco_learning.py runs the defaults)
TINY += " --update-epochs 1 --num-minibatches 4"
# a run to stop in RL and resume: 5 iterations of 512 steps after the first "step" line, 100 labels
STOPPABLE = TINY.replace("--total-timesteps 3072", "--total-timesteps 4096") + " --labels 100 --save-model"


@pytest.mark.slow
def test_tiny_run_logs_the_rlhf_tags_and_saves_labels_and_model(tmp_path):
    result = run_script(tmp_path, TINY + " --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    assert_tags(logged, RLHF_TAGS + ["charts/episodic_return", "charts/predicted_return"])
    assert logged["labels/total"][-1][1] == 40
    assert "step 3072" in result.stdout and "labels 40/40" in result.stdout  # the progress line
    # not short ones from the episodes under way when pretraining (2 rollouts of 8 envs x 64 steps) ended
    assert assert_predicted_returns_are_of_whole_episodes(logged, rl_start=1024, num_envs=8, batch_size=512) > 0

    labels = np.load(run_dir / "labels.npz")
    assert labels["obs"].shape == (40, 2, 20, 11) and labels["act"].shape == (40, 2, 20, 3)
    assert set(np.unique(labels["mu"])) <= {0.0, 0.5, 1.0}
    # the actions judged are the ones Hopper executed, clipped to its bounds [-1, 1] (the policy's samples go beyond)
    assert np.abs(labels["act"]).max() <= 1.0 and np.abs(labels["act"]).max() > 0.9
    # the answers are the synthetic teacher's: the segment with more true reward is preferred
    assert_answers_follow_true_returns(labels)

    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 3072
    assert {"agent", "obs_rms", "reward_ensemble"} <= set(checkpoint)
    assert checkpoint["obs_rms"]["count"] > 3000  # the observation statistics the agent was trained with

    evaluation = run_script(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 2")
    assert evaluation.returncode == 0, evaluation.stderr
    assert "eval: 2 episodes of Hopper-v4: true return" in evaluation.stdout

    # the same evaluation filmed as looping GIFs for a web page (README's gallery): the same episodes, cut at 0.16 s
    filming = " --capture-video --video-format gif --video-seconds 0.16"
    # where MuJoCo cannot render, filming is refused with what to install, before an episode is played
    unfilmed = run_script(tmp_path, f"--resume {run_dir} --eval-only" + filming, env=without_egl(tmp_path))
    assert unfilmed.returncode != 0 and "cannot render" in unfilmed.stderr and "Traceback" not in unfilmed.stderr
    assert not (run_dir / "eval").exists()
    filmed = run_script(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 2" + filming)
    assert filmed.returncode == 0, filmed.stderr
    assert filmed.stdout.splitlines()[-1] == evaluation.stdout.splitlines()[-1]
    clips = sorted((run_dir / "eval" / "videos").iterdir())
    assert [clip.name for clip in clips] == ["episode-0.gif", "episode-1.gif"]
    frames = imageio.mimread(clips[0])
    assert len(frames) == 3  # 0.16 s at Hopper's 125 frames/s is 21 frames, every 10th kept: 12.5 frames/s
    assert np.abs(np.asarray(frames[-1], float) - frames[0]).mean() > 0.5  # the hopper moved between first and last
    metadata = imageio.v3.immeta(clips[0])
    assert metadata["loop"] == 0 and metadata["duration"] == 80  # ms: 10 frames of 8 ms, real time
    # filmed again, one episode as MP4: the folder holds this evaluation's clip only, none of the one before (a run
    # trained further in between would show two agents side by side)
    refilmed = run_script(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1 --capture-video --video-seconds 0.16")
    assert refilmed.returncode == 0, refilmed.stderr
    assert sorted(clip.name for clip in (run_dir / "eval" / "videos").iterdir()) == ["episode-0.mp4"]


@pytest.mark.slow
def test_true_reward_mode_queries_no_labels(tmp_path):
    result = run_script(tmp_path, TINY + " --feedback true-reward")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    assert "charts/episodic_return" in logged and "losses/policy_loss" in logged
    assert not any(tag.startswith(("reward_model/", "labels/")) for tag in logged)
    assert not (run_dir / "labels.npz").exists()
    # no pretraining rollouts: PPO updates from the first rollout on (TINY's 8 envs x 64 steps)
    assert logged["losses/policy_loss"][0][0] == 8 * 64


@pytest.mark.slow
def test_ent_coef_final_lowers_the_entropy_bonus_that_each_update_uses(tmp_path):
    """--ent-coef-final: the coefficient logged each iteration lies on the line from --ent-coef at the first iteration
    towards the final value after the last, and PPO's loss uses it: against a constant bonus, the first update (the
    same coefficient) is identical and the later ones (a smaller bonus) leave a narrower policy."""
    logged = {}
    tiny = TINY.replace(" --update-epochs 1 --num-minibatches 4", "")  # PPO's default update: TINY's short one would
    # leave the two runs' entropies little apart
    for name, flags in (("constant", "--ent-coef 0.5"), ("falling", "--ent-coef 0.5 --ent-coef-final 0")):
        (tmp_path / name).mkdir()
        result = run_script(tmp_path / name, f"{tiny} --feedback true-reward --threads 1 {flags}")
        assert result.returncode == 0, result.stderr
        logged[name] = {tag: [value for _, value in values] for tag, values in scalars(only_run_dir(tmp_path / name)).items()}
    iterations = 3072 // (8 * 64)
    assert logged["constant"]["charts/ent_coef"] == pytest.approx([0.5] * iterations)
    falling = [0.5 * (1 - i / iterations) for i in range(iterations)]
    assert logged["falling"]["charts/ent_coef"] == pytest.approx(falling)
    entropy = {name: logged[name]["losses/entropy"] for name in logged}
    assert entropy["falling"][0] == entropy["constant"][0]
    assert all(lower < higher for lower, higher in zip(entropy["falling"][1:], entropy["constant"][1:]))


# a machine without an EGL library (a cluster node, macOS): ctypes finds and loads no libEGL
NO_EGL = """
import ctypes, ctypes.util
find_library, load = ctypes.util.find_library, ctypes.CDLL.__init__
ctypes.util.find_library = lambda name: None if "EGL" in name else find_library(name)
def load_all_but_egl(self, name, *args, **kwargs):
    if name and "libEGL" in str(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    load(self, name, *args, **kwargs)
ctypes.CDLL.__init__ = load_all_but_egl
"""


def test_a_new_run_never_writes_into_the_folder_of_a_run_of_its_name_started_in_the_same_second(tmp_path):
    args = "--env Hopper-v4 --total-timesteps 512 --num-envs 8 --num-steps 64 --feedback true-reward --exp-name clash --seed 3"
    assert_a_new_run_never_writes_into_another_runs_folder(tmp_path, args, "Hopper-v4__clash__3")


def test_a_machine_without_egl_runs_the_script_when_nothing_is_rendered(tmp_path):
    env = without_egl(tmp_path)
    args = "--env InvertedPendulum-v4 --feedback true-reward --total-timesteps 1024 --num-steps 512 --threads 1"
    result = run_script(tmp_path, args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 1024" in result.stdout
    # the machine is simulated faithfully: asking for EGL there fails when MuJoCo loads
    asked = run_script(tmp_path, args, env=env | {"MUJOCO_GL": "egl"})
    assert asked.returncode != 0 and "import mujoco" in asked.stderr


def without_egl(tmp_path):
    """This process's environment as on a machine without an EGL library or a display, MUJOCO_GL unset."""
    (tmp_path / "no_egl").mkdir(exist_ok=True)
    (tmp_path / "no_egl" / "sitecustomize.py").write_text(NO_EGL)
    unset = ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")
    return {k: v for k, v in os.environ.items() if k not in unset} | {"PYTHONPATH": str(tmp_path / "no_egl")}


@pytest.mark.parametrize(
    "asks_for_frames",
    ["--feedback human --label-server http://127.0.0.1:9", "--feedback true-reward --capture-video"],
)
def test_a_machine_that_cannot_render_refuses_a_run_that_needs_frames_before_it_starts(tmp_path, asks_for_frames):
    # clips for people (and --capture-video) are rendered offscreen by MuJoCo. Where it cannot render, the run must say
    # so and how to fix it before it starts: not crash inside MuJoCo at the first frame, or, with people labelling, stop
    # only after its pretraining rollouts and once the label server answers (here none does: it would wait for ever)
    result = run_script(tmp_path, f"{TINY} --threads 1 {asks_for_frames}", env=without_egl(tmp_path), timeout=120)
    assert result.returncode != 0
    assert "cannot render" in result.stderr and "MUJOCO_GL=osmesa" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "pretraining" not in result.stdout and not (tmp_path / "runs").exists()  # refused before anything ran


@pytest.mark.slow
def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_the_checkpoint(tmp_path):
    assert_sigterm_stops_like_ctrl_c(tmp_path, TINY.replace("--total-timesteps 3072", "--total-timesteps 16384"))


@pytest.mark.slow
# Hopper's episodes end early (the absorbing state); Pusher-v5's last 100 steps, about 5 ending per iteration, so the
# progress line's mean over the last 10 episodes spans the stop
# and with --cuda the policy samples its actions from the GPU's random stream (run only where there is a GPU)
@pytest.mark.parametrize(
    "env_id, device_flag",
    [
        ("Hopper-v4", ""),
        ("Pusher-v5", ""),
        pytest.param("Hopper-v4", " --cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
    ],
)
def test_a_stopped_and_resumed_run_ends_exactly_as_the_same_run_uninterrupted(tmp_path, env_id, device_flag):
    args = STOPPABLE.replace("Hopper-v4", env_id) + device_flag + " --reward-dropout 0.5"  # the dropout stream too
    args += " --pair-pool-rollouts 3"  # and the pair pool, with rollouts from before the stop
    if env_id == "Pusher-v5":  # and the reward model's potential, trained before and after it (Hopper: the default)
        args += " --reward-potential"
    (tmp_path / "whole").mkdir(), (tmp_path / "stopped").mkdir()
    # cold: a run from a fresh interpreter, the other from the zygote (warm_start.py)
    whole = run_script(tmp_path / "whole", args, timeout=600, cold=True)
    assert whole.returncode == 0, whole.stderr
    out, err = interrupt_run(tmp_path / "stopped", args, "step ", sig=signal.SIGTERM)  # stopped once RL has started
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path / "stopped")
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"]
    assert 1536 <= stopped_at < 4096  # stopped in RL (the first "step" line is at 1536), before the end
    assert 0 < len(np.load(run_dir / "labels.npz")["mu"]) < 100

    resumed = run_script(tmp_path / "stopped", f"--resume {run_dir}", timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed {run_dir} at step {stopped_at}" in resumed.stdout
    # environments, random streams, statistics, counters: all continue where they were, so nothing differs
    whole_dir = only_run_dir(tmp_path / "whole")
    expected, actual = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (whole_dir, run_dir))
    for part in ("agent", "reward_ensemble"):
        for name, tensor in expected[part].items():
            assert torch.equal(tensor, actual[part][name]), f"{part}.{name} differs after the resume"
    assert [iteration for iteration, _ in actual["pair_pool"]] == [6, 7, 8]  # the last 3 of the run's 8 rollouts
    # the episodes under way at the stop too: each learned return sums the whole episode, as without the stop
    predicted = [[value for _, value in scalars(d)["charts/predicted_return"]] for d in (whole_dir, run_dir)]
    np.testing.assert_array_equal(predicted[1], predicted[0])
    expected_labels, labels = np.load(whole_dir / "labels.npz"), np.load(run_dir / "labels.npz")
    for key in expected_labels:
        np.testing.assert_array_equal(labels[key], expected_labels[key], err_msg=key)
    # and the progress lines: their true and learned returns are means over the last 10 episodes, the stop's included
    assert progress_lines(resumed.stdout, stopped_at) == progress_lines(whole.stdout, stopped_at)


@pytest.mark.slow
def test_a_pair_pool_draws_pairs_from_earlier_rollouts_too(tmp_path):
    args = TINY + " --pair-pool-rollouts 6 --save-model"
    result = run_script(tmp_path, args)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    pair_pool = torch.load(run_dir / "checkpoint.pt", weights_only=False)["pair_pool"]
    assert [iteration for iteration, _ in pair_pool] == [1, 2, 3, 4, 5, 6]  # all the run's rollouts
    settings = tyro.cli(rl.Args, args=args.split())
    rl.fill_runtime_fields(settings)
    labels = np.load(run_dir / "labels.npz")
    asked_at = 1 + np.searchsorted(np.cumsum(rl.label_schedule(settings)), np.arange(len(labels["mu"])), side="right")
    drawn_from = []
    for first_steps, asked in zip(labels["obs"][:, :, 0], asked_at):  # each segment's first observation
        for first_obs in first_steps:
            found = [i for i, rollout in pair_pool if (rollout["obs"] == first_obs).all(-1).any()]
            assert len(found) == 1 and found[0] <= asked  # from one rollout in the pool when the pair was asked
            drawn_from.append((found[0], asked))
    assert sum(source < asked for source, asked in drawn_from) > len(drawn_from) / 4  # not only the rollout of its iteration


@pytest.mark.slow
def test_a_resumed_run_asks_only_the_labels_missing_from_its_schedule(tmp_path):
    """A run killed after a label save and before the next checkpoint resumes with more labels than its checkpoint
    knew of: it must ask only what the schedule still lacks, never a label twice, and never drop one."""
    args = STOPPABLE
    out, err = interrupt_run(tmp_path, args, "step ")
    assert "labels saved to" in out, err
    run_dir = only_run_dir(tmp_path)
    saved = dict(np.load(run_dir / "labels.npz"))
    held = len(saved["mu"])
    assert 0 < held < 93
    # 7 answers saved after the checkpoint (consumed_seq, a scalar, stays)
    ahead = {k: np.concatenate([v, v[:7]]) if v.ndim else v for k, v in saved.items()}
    np.savez_compressed(run_dir / "labels.npz", **ahead)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)

    result = run_script(tmp_path, f"--resume {run_dir}", timeout=600)
    assert result.returncode == 0, result.stderr
    final = np.load(run_dir / "labels.npz")
    assert len(final["mu"]) == 100  # the whole budget, nothing dropped
    np.testing.assert_array_equal(final["obs"][: held + 7], ahead["obs"])  # the labels held are kept as they were
    run_args = rl.Args(**checkpoint["args"])
    rl.fill_runtime_fields(run_args)
    scheduled_so_far = np.cumsum(rl.label_schedule(run_args))
    after_resume = [(s, v) for s, v in scalars(run_dir)["labels/total"] if s > checkpoint["global_step"]]
    assert after_resume
    for step, total in after_resume:  # nothing asked until the schedule passes what is held, then its pace
        assert total == max(held + 7, scheduled_so_far[step // run_args.batch_size - 1]), step


def test_a_run_killed_after_pretraining_resumes_with_its_reward_model_pretrained(tmp_path):
    assert_a_run_killed_after_pretraining_resumes_pretrained(tmp_path, TINY, 1024)


@pytest.mark.slow
def test_a_run_killed_right_after_a_checkpoint_resumes_with_every_label_the_checkpoint_counted(tmp_path):
    assert_a_kill_after_a_checkpoint_loses_no_label(tmp_path, TINY, "step 2048,", rl.__file__, rl)  # 1536: the first


@pytest.mark.slow
def test_pretraining_pairs_are_drawn_at_random_whatever_the_selection(tmp_path):
    """Before RL the ensemble is untrained and its disagreement is noise (rlhf_a2c_atari.py does the same)."""
    for selection in ("variance", "random"):
        (tmp_path / selection).mkdir()
        result = run_script(tmp_path / selection, TINY + f" --selection {selection}")
        assert result.returncode == 0, result.stderr
    variance, random = (np.load(only_run_dir(tmp_path / s) / "labels.npz") for s in ("variance", "random"))
    np.testing.assert_array_equal(variance["obs"][:10], random["obs"][:10])  # the 10 pretraining labels
    assert not np.array_equal(variance["obs"][10:], random["obs"][10:])  # then variance selection chooses


@pytest.mark.slow
def test_a_budget_of_one_or_two_labels_still_pretrains_on_one(tmp_path):
    result = run_script(tmp_path, TINY.replace("--labels 40", "--labels 2"))
    assert result.returncode == 0, result.stderr
    assert "reward model pretrained on 1 labels" in result.stdout and "labels 2/2" in result.stdout
    logged = scalars(only_run_dir(tmp_path))
    assert np.isfinite([v for _, v in logged["charts/predicted_return"]]).all()
    assert np.isfinite([v for _, v in logged["losses/value_loss"]]).all()


@pytest.mark.slow
def test_a_teacher_that_answers_no_pretraining_pair_stops_the_run_with_a_message(tmp_path):
    # HalfCheetah never falls: with 40-step episodes every environment is 64 % 40 = 24 steps into one after a rollout
    args = TINY.replace("--env Hopper-v4", '--env HalfCheetah-v4 --env-kwargs {"max_episode_steps":40}')
    result = run_script(tmp_path, args + " --teacher-skip-threshold 1e9 --save-model")
    assert_clear_error(result, "error: pretraining ended with no preference label")
    assert "the synthetic teacher skipped every pair" in result.stderr and "a lower --teacher-skip-threshold" in result.stderr
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "labels.npz").exists()
    # the checkpoint is kept from before the last pretraining rollout (2 of 512 steps), the environments as they were
    # then: it held them a rollout further on (128 % 40 = 8 steps in)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert (checkpoint["iteration"], checkpoint["global_step"]) == (1, 512)
    assert [state["_elapsed_steps"] for state in checkpoint["environments"]] == [24] * 8


BAD_SETTINGS = [
    ("--env Hoper-v4", "unknown environment id 'Hoper-v4'. Did you mean: Hopper-v4"),
    ("--labels 0", "--labels must be positive"),
    ("--segment-len 4096 --num-steps 2048", "--segment-len 4096 must be between 2 and the rollout length"),
    ("--labels 100000 --total-timesteps 100000", "--labels 100000 is too large for this run"),
    # Reacher's episodes end after 50 steps, and a segment never crosses an episode's end: a segment longer than an
    # episode failed at the first rollout; at the default 50 steps, one start per episode: the 70 pairs of a pretraining
    # rollout were drawn from 39-40 segments, reused
    ("--env Reacher-v5 --segment-len 60", "--segment-len 60 is longer than an episode of Reacher-v5 (50 steps)"),
    ("--env Reacher-v5", "a rollout can hold as few as 19 pairs of 50-step segments (episodes of at most 50 steps)"),
    # which run length to change: the pretraining rollouts' (more steps never helped those), or RL's
    ("--env Reacher-v5", "asks for 70 in a pretraining rollout. Use fewer labels, a shorter --segment-len, more --pre"),
    ("--labels 20000 --pretrain-fraction 0.01 --total-timesteps 40960", "in an RL rollout. Use fewer labels, a shorter --s"),
    ("--labels 20000 --pretrain-fraction 0.01 --total-timesteps 40960", "segment-len, more --total-timesteps, or a longer"),
    # and a rollout that begins inside an episode holds fewer than the first: here none, and a crash at the second
    ("--env Reacher-v5 --num-steps 64 --num-envs 8 --segment-len 50 --labels 20", "can hold as few as 0 pairs"),
    ("--total-timesteps 4096", "leaves no RL after 5 pretraining rollouts"),
    ("--num-minibatches 3", "must divide into --num-minibatches 3"),
    ("--num-minibatches 0", "--num-minibatches must be positive"),  # was a ZeroDivisionError
    # a one-step minibatch's advantages have no standard deviation: the update was NaN, and the next rollout crashed
    ("--num-minibatches 2048", "minibatches of 1 step: --norm-adv needs 2 or more"),
    ("--num-minibatches -4", "--num-minibatches must be positive"),  # was a run that never updated its policy
    ("--update-epochs 0", "--update-epochs must be positive"),  # the same
    ("--env CartPole-v1", "is not a MuJoCo-style task"),
    ("--env-kwargs ctrl_cost_weight=0", "--env-kwargs must be a JSON object"),
    ('--env-kwargs {"no_such_keyword":1}', "cannot create Hopper-v4 with --env-kwargs"),
    ('--env-kwargs {"ctrl_cost_weight":"abc"}', "cannot create Hopper-v4 with --env-kwargs"),  # failed at the first step
    ("--env Pendulum-v1", "Pendulum-v1 is not a MuJoCo task"),  # vectors and continuous actions, no simulator to render
    ("--env PongNoFrameskip-v4", "an Atari game: rlhf_a2c_atari.py trains on those"),
]


# numbers that were accepted and then crashed a run or silently changed it (a flipped or flat reward, no labels after
# pretraining); checked in this process only
BAD_NUMBERS = [
    ("--pretrain-steps 0", "--pretrain-steps must be positive"),  # was a run with no pretraining and no input norm
    ("--pair-pool-rollouts 0", "--pretrain-epochs and --pair-pool-rollouts must be positive"),  # else a crash at the 1st draw
    ("--schedule-horizon 0", "--schedule-horizon must be a positive number of steps"),
    ("--schedule-horizon nan", "--schedule-horizon must be a number, not nan"),
    ("--teacher-beta 0", "--teacher-beta must be positive"),
    ("--reward-dropout 1", "--reward-dropout must be in [0, 1)"),
    ("--teacher-equal-margin -0.5", "--teacher-equal-margin must be at least 0"),
    ("--reward-std -1", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward-eval"),
    ("--reward-lr inf", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward-eval"),
    ("--reward-updates 0", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward"),
    ("--reward-eval-every 0", "--reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and"),
    ("--checkpoint-every 0", "--learning-rate (finite), --checkpoint-every and --eval-episodes must be positive"),
    ("--checkpoint-every 5", "--checkpoint-every is for --save-model"),  # no checkpoint was written
    ("--eval-episodes 3", "error: --eval-episodes is for --eval-only"),  # a training run evaluates nothing
    ("--selection random --candidate-multiplier 4", "error: --candidate-multiplier is for --selection variance"),
    ("--video-seconds 5 --video-format gif", "error: --video-format, --video-seconds are for --capture-video"),
    ("--learning-rate -1", "--learning-rate (finite), --checkpoint-every and --eval-episodes must be positive"),
    ("--learning-rate inf", "--learning-rate (finite), --checkpoint-every and --eval-episodes must be positive"),
    ("--feedback true-reward --ent-coef-final inf", "--ent-coef and --ent-coef-final must be finite numbers"),
    # a nan passes every comparison it is not written against; torch or gymnasium stopped these with a traceback
    ("--feedback true-reward --gamma nan", "--gamma must be a number, not nan"),
    ("--vf-coef nan --target-kl nan", "--vf-coef, --target-kl must be a number, not nan"),
    ("--threads 0", "--threads must be positive and --seed in [0, 2**32 - 1] (got 0, 1)"),
    ("--seed -1", "--threads must be positive and --seed in [0, 2**32 - 1] (got 1, -1)"),
    ("--gamma 1.5", "--gamma must be in [0, 1), --gae-lambda in [0, 1], --clip-coef and --max-grad-norm positive"),
    ("--clip-coef -1", "--gamma must be in [0, 1), --gae-lambda in [0, 1], --clip-coef and --max-grad-norm positive"),
    # a fall's absorbing value is its reward / (1 - gamma): 0/0, every reward NaN, the policy NaN after one update
    ("--feedback true-reward --gamma 1", "--gamma must be in [0, 1)"),
    # the synthetic teacher would answer, and the server named never see a pair
    ("--label-token s3cret", "error: --label-token is for --feedback human"),
    ("--feedback true-reward --label-server http://10.0.0.5:8000", "error: --label-server is for --feedback human"),
    # settings of the clips people watch, or of the simulated teachers, that the run's teacher would silently ignore
    ("--instruction Which --clip-fps 10", "error: --instruction, --clip-fps are for --feedback human"),
    ("--feedback scripted --behaviour backflip --clip-size 64", "error: --clip-size is for --feedback human"),
    (
        "--feedback human --teacher-beta 2 --teacher-epsilon 0.1",
        "error: --teacher-beta, --teacher-epsilon are for the synthetic",
    ),
    ("--feedback human --teacher-skip-threshold 0", "error: --teacher-skip-threshold is for the synthetic and scripted"),
    # one member has no disagreement: variance selection kept the first candidates, random selection unsaid
    ("--ensemble-size 1", "--selection variance needs --ensemble-size 2 or more"),
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # validate_args probes Hopper-v4 (gymnasium prefers v5)
@pytest.mark.parametrize("args, message", BAD_SETTINGS + BAD_NUMBERS)
def test_impossible_settings_are_refused_with_a_message(args, message):
    settings = tyro.cli(rl.Args, args=args.split())
    with pytest.raises(SystemExit, match=re.escape(message)):
        rl.fill_runtime_fields(settings)
        rl.validate_args(settings)


# each bad command line run as a user runs it, in a subprocess (two in the fast subset: the others are checked above)
@pytest.mark.parametrize(
    "args, message",
    [pytest.param(*case, marks=pytest.mark.slow) for case in BAD_SETTINGS[1:]]
    + [
        BAD_SETTINGS[0],
        ("--eval-only", "--eval-only needs --resume"),
        ("--resume runs/nothing-here", "no checkpoint at runs/nothing-here/checkpoint.pt"),
    ],
)
def test_bad_arguments_get_a_clear_message_not_a_traceback(tmp_path, args, message):
    assert_clear_error(run_script(tmp_path, args, timeout=120), message)


def test_only_a_second_ctrl_c_stops_at_once():
    assert_only_a_second_ctrl_c_stops_at_once(rl)


def test_the_fields_computed_at_run_time_are_not_flags(capsys):
    fields = ["batch_size", "minibatch_size", "num_iterations", "pretrain_iterations"]
    assert_the_fields_computed_at_run_time_are_not_flags(rl.Args, fields, capsys)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # validate_args probes Hopper-v4 (gymnasium prefers v5)
def test_a_resumed_run_is_not_refused_its_own_settings_that_a_new_run_would_be():
    assert_a_resumed_run_is_not_refused_its_own_settings(rl)


def test_settings_refused_at_the_start_leave_no_run_folder(tmp_path):
    # README: bad arguments stop the script before anything is created. These two were refused only once the run
    # folder and its TensorBoard file existed: a negative --video-seconds, and a run name too long for the label
    # server's ids (a clip's id is the run folder's name and 30 characters more, at most 128)
    for args, message in [
        (f"{TINY} --capture-video --video-seconds -1", "--video-seconds must be 0 (whole episodes) or positive"),
        (f"{TINY} --feedback human --exp-name {'x' * 90}", "is too long for the label server's ids"),
    ]:
        assert_clear_error(run_script(tmp_path, args, timeout=120), message)
        assert not (tmp_path / "runs").exists(), args


def test_a_resume_that_cannot_be_done_as_asked_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    assert_resumes_it_cannot_do_are_refused_and_change_nothing(tmp_path, rl, "log_every")  # an Atari setting


@pytest.mark.slow
def test_env_kwargs_give_c17s_reward_without_torque_penalties(tmp_path):
    """C17 A.1 removed the torque penalty from the reward: with ctrl_cost_weight 0, the same actions (the first
    rollout, before any update) earn exactly the standard return plus the penalties the standard reward takes off."""
    returns = {}
    for name, kwargs in (("standard", "{}"), ("c17", '{"ctrl_cost_weight":0}')):
        (tmp_path / name).mkdir()
        first_rollout = TINY.replace("--total-timesteps 3072", "--total-timesteps 512")
        result = run_script(tmp_path / name, first_rollout + f" --feedback true-reward --env-kwargs {kwargs}")
        assert result.returncode == 0, result.stderr
        logged = scalars(only_run_dir(tmp_path / name))
        returns[name] = [
            (v, length)
            for (s, v), (_, length) in zip(logged["charts/episodic_return"], logged["charts/episodic_length"])
            if s <= 512
        ]
    assert len(returns["standard"]) >= 3
    for (standard, length), (c17, same_length) in zip(returns["standard"], returns["c17"]):
        assert length == same_length  # the same episodes
        assert 0 < c17 - standard < 1e-3 * 3 * length + 1e-4  # each step's penalty is 1e-3 x |action|^2, actions clipped to 1


@pytest.mark.slow
def test_capture_video_writes_playable_clips(tmp_path):
    result = run_script(tmp_path, TINY.replace("Hopper-v4", "InvertedPendulum-v4") + " --capture-video")
    assert result.returncode == 0, result.stderr
    videos = sorted((only_run_dir(tmp_path) / "videos").glob("*.mp4"))
    assert len(videos) >= 2  # episodes 0 and 1
    frames = imageio.mimread(videos[0])
    assert frames[0].shape == (160, 160, 3) and len(frames) >= 2
    assert np.std(frames[0]) > 1  # a rendered scene, not a blank frame


@pytest.mark.slow
def test_a_resumed_run_numbers_its_videos_after_the_earlier_ones_and_replaces_none(tmp_path):
    # environment 0 films episodes 0, 1 and 8 (Hopper's falls end them within 20-60 steps of a new policy): the stop
    # comes after episodes 0 and 1 were saved, in the run's first RL iterations
    # (7 frames a clip: software rendering is slow, and what is checked is which episodes are saved, not their length)
    filming = " --capture-video --video-seconds 0.05"
    args = TINY.replace("--total-timesteps 3072", "--total-timesteps 4096") + " --feedback true-reward" + filming
    # (the video flags are the resuming command's own)
    assert_a_resumed_run_keeps_its_videos(tmp_path, args + " --save-model", resume_flags=filming)


@pytest.mark.slow
def test_videos_number_on_across_a_resume_without_capture_video(tmp_path):
    # filmed, stopped; resumed without --capture-video (this script takes the video flags from the resuming command),
    # stopped; resumed filming again: the third part's videos follow the first part's instead of replacing them
    # (16384 steps: environment 0, the one filmed, reaches episode 27 in the third part)
    args = TINY.replace("--total-timesteps 3072", "--total-timesteps 16384") + " --feedback true-reward --save-model"
    filming = " --capture-video --video-seconds 0.05"  # 7 frames a clip: which episodes are saved is what is checked
    out, err = interrupt_run(tmp_path, args + filming, "step ", sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(tmp_path)
    filmed = {video.name: video.read_bytes() for video in (run_dir / "videos").iterdir()}
    assert "episode-0.mp4" in filmed
    out, err = interrupt_run(tmp_path, f"--resume {run_dir}", "step ", sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    assert {video.name for video in (run_dir / "videos").iterdir()} == set(filmed)  # nothing filmed meanwhile
    resumed = run_script(tmp_path, f"--resume {run_dir}{filming}")
    assert resumed.returncode == 0, resumed.stderr
    after = {video.name: video.read_bytes() for video in (run_dir / "videos").iterdir()}
    assert {name: after[name] for name in filmed} == filmed  # (the code before restarted at episode 0 here)
    number = lambda name: int(re.fullmatch(r"episode-(\d+)\.mp4", name)[1])  # noqa: E731
    new = set(after) - set(filmed)
    assert new and min(map(number, new)) > max(map(number, filmed)), sorted(after)  # filmed again, numbered on


def test_a_checkpoint_from_before_reward_input_norm_resumes_with_raw_reward_inputs(tmp_path):
    # checkpoints written before --reward-input-norm have neither the flag nor the input statistics: such a run goes
    # on reading raw observations, and says so in its settings
    args = TINY.replace("--total-timesteps 3072", "--total-timesteps 4096") + " --save-model"
    out, err = interrupt_run(tmp_path, args, "step ")
    run_dir = only_run_dir(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    del checkpoint["args"]["reward_input_norm"]
    for key in ("input_mean", "input_std", "input_clip"):
        del checkpoint["reward_ensemble"][key]
    torch.save(checkpoint, run_dir / "checkpoint.pt")

    result = run_script(tmp_path, f"--resume {run_dir}", timeout=600)
    assert result.returncode == 0, result.stderr
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert resumed["global_step"] == 4096 and resumed["args"]["reward_input_norm"] is False
    assert torch.equal(resumed["reward_ensemble"]["input_mean"], torch.zeros(11))
    assert torch.equal(resumed["reward_ensemble"]["input_std"], torch.ones(11))
