"""rlhf_ppo_mujoco.py run as a user runs it: in a subprocess, judged by what it writes (TensorBoard, labels, checkpoint)."""

import imageio
import numpy as np
import pytest
import torch
from helpers import (
    assert_sigterm_stops_like_ctrl_c,
    RLHF_TAGS,
    assert_tags,
    assert_answers_follow_true_returns,
    assert_clear_error,
    interrupt_run,
    only_run_dir,
    run_script,
    scalars,
)

# a tiny Hopper run: 2 pretraining rollouts, 4 RL iterations of 512 steps, 40 labels of 20-step segments
TINY = "--env Hopper-v4 --total-timesteps 3072 --num-steps 512 --pretrain-steps 1024 --labels 40 --segment-len 20"
TINY += " --pretrain-epochs 5 --reward-eval-every 2"


def test_tiny_run_logs_the_rlhf_tags_and_saves_labels_and_model(tmp_path):
    result = run_script(tmp_path, TINY + " --save-model")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    assert_tags(logged, RLHF_TAGS + ["charts/episodic_return", "charts/predicted_return"])
    assert logged["labels/total"][-1][1] == 40
    assert "step 3072" in result.stdout and "labels 40/40" in result.stdout  # the progress line

    labels = np.load(run_dir / "labels.npz")
    assert labels["obs"].shape == (40, 2, 20, 11) and labels["act"].shape == (40, 2, 20, 3)
    assert set(np.unique(labels["mu"])) <= {0.0, 0.5, 1.0}
    # the answers are the synthetic teacher's: the segment with more true reward is preferred
    assert_answers_follow_true_returns(labels)

    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 3072
    assert {"agent", "obs_rms", "reward_ensemble"} <= set(checkpoint)
    assert checkpoint["obs_rms"]["count"] > 3000  # the observation statistics the agent was trained with

    evaluation = run_script(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 2")
    assert evaluation.returncode == 0, evaluation.stderr
    assert "eval: 2 episodes of Hopper-v4: true return" in evaluation.stdout


def test_true_reward_mode_queries_no_labels(tmp_path):
    result = run_script(tmp_path, TINY + " --feedback true-reward")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir)
    assert "charts/episodic_return" in logged and "losses/policy_loss" in logged
    assert not any(tag.startswith(("reward_model/", "labels/")) for tag in logged)
    assert not (run_dir / "labels.npz").exists()
    # no pretraining rollouts: PPO updates from the first rollout on
    assert logged["losses/policy_loss"][0][0] == 512


def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_the_checkpoint(tmp_path):
    assert_sigterm_stops_like_ctrl_c(tmp_path, TINY.replace("--total-timesteps 3072", "--total-timesteps 16384"))


def test_interrupted_run_keeps_its_labels_and_resumes_to_the_full_budget(tmp_path):
    args = TINY.replace("--total-timesteps 3072", "--total-timesteps 8192") + " --labels 100 --save-model"
    out, err = interrupt_run(tmp_path, args, "step ")  # wait until RL has started, then stop the run as Ctrl-C would
    assert "labels saved to" in out, err
    run_dir = only_run_dir(tmp_path)
    saved = np.load(run_dir / "labels.npz")
    assert 0 < len(saved["mu"]) < 100

    result = run_script(tmp_path, f"--resume {run_dir}", timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"resumed {run_dir} at step" in result.stdout
    final = np.load(run_dir / "labels.npz")
    assert len(final["mu"]) == 100  # the whole budget, nothing asked twice
    np.testing.assert_array_equal(final["obs"][: len(saved["mu"])], saved["obs"])  # the old labels are kept as they were
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 8192


@pytest.mark.parametrize(
    "args, message",
    [
        ("--env Hoper-v4", "unknown environment id 'Hoper-v4'. Did you mean: Hopper-v4"),
        ("--labels 0", "--labels must be positive"),
        ("--segment-len 4096 --num-steps 2048", "--segment-len 4096 must be between 2 and the rollout length"),
        ("--labels 100000 --total-timesteps 100000", "--labels 100000 is too large for this run"),
        ("--total-timesteps 4096", "leaves no RL after 5 pretraining rollouts"),
        ("--num-minibatches 3", "must divide into --num-minibatches 3"),
        ("--eval-only", "--eval-only needs --resume"),
        ("--resume runs/nothing-here", "no checkpoint at runs/nothing-here/checkpoint.pt"),
        ("--env CartPole-v1", "is not a MuJoCo-style task"),
    ],
)
def test_bad_arguments_get_a_clear_message_not_a_traceback(tmp_path, args, message):
    assert_clear_error(run_script(tmp_path, args, timeout=120), message)


def test_capture_video_writes_playable_clips(tmp_path):
    result = run_script(tmp_path, TINY.replace("Hopper-v4", "InvertedPendulum-v4") + " --capture-video")
    assert result.returncode == 0, result.stderr
    videos = sorted((only_run_dir(tmp_path) / "videos").glob("*.mp4"))
    assert len(videos) >= 2  # episodes 0 and 1
    frames = imageio.mimread(videos[0])
    assert frames[0].shape == (160, 160, 3) and len(frames) >= 2
    assert np.std(frames[0]) > 1  # a rendered scene, not a blank frame
