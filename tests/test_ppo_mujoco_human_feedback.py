"""--feedback human: rlhf_ppo_mujoco.py renders clips, posts pairs to a live label_server.py and learns from the answers
of a scripted rater who answers through the HTTP API by the true reward; a server that is down at the start is waited
for; pairs still unanswered when a run stops are saved and asked again on resume."""

import signal
import time

import numpy as np
import pytest
import rlhf_ppo_mujoco as rl
import torch
from helpers import (
    LABEL_SERVER_RESTART_CHECKS,
    TEACHER_STOP_AND_END_CHECKS,
    assert_clear_error,
    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice,
    assert_a_run_stopped_in_the_label_wait_resumes_where_it_stopped,
    assert_a_run_the_label_server_refuses_saves_and_says_so,
    assert_a_run_folder_given_as_a_dot_keeps_its_name,
    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once,
    assert_processes_of_a_run_never_share_a_pair_id,
    assert_the_finished_run_closed_its_pairs,
    assert_the_label_token_stays_out_of_the_logs,
    free_port,
    only_run_dir,
    rating_by_script,
    run_script,
    start_trainer,
)

HUMAN = (
    "--env Hopper-v4 --feedback human --total-timesteps 3072 --num-envs 8 --num-steps 64 --pretrain-steps 1024 --labels 20"
    " --pretrain-fraction 0.5 --segment-len 10 --pretrain-epochs 40 --reward-eval-every 2 --clip-size 48 --save-model"
)


@pytest.mark.slow
def test_training_from_a_rater_behind_a_server_that_starts_late(tmp_path, label_server):
    port = free_port()
    trainer, output, reader = start_trainer(tmp_path, f"{HUMAN} --label-server http://127.0.0.1:{port}")
    deadline = time.time() + 120
    while not any("unreachable" in line for line in output):  # the trainer notices the server is down, and says so
        assert time.time() < deadline and trainer.poll() is None, "".join(output)
        time.sleep(0.2)

    server = label_server(port=port)
    with rating_by_script(server) as answered:
        assert trainer.wait(timeout=600) == 0, "".join(output)
    reader.join(timeout=30)
    log = "".join(output)
    assert "is back" in log and "waiting for" in log and "labels 10/10 from the initial policy" in log

    run_dir = only_run_dir(tmp_path)
    assert_the_finished_run_closed_its_pairs(server, run_dir, log)
    labels = np.load(run_dir / "labels.npz")
    assert len(labels["mu"]) >= 10  # at least the pretraining pairs, all answered by the rater
    # the labels are the rater's answers: the segment with more true reward
    true_returns = labels["true_reward"].sum(-1)
    expected = np.where(
        true_returns[:, 0] > true_returns[:, 1], 1.0, np.where(true_returns[:, 0] < true_returns[:, 1], 0.0, 0.5)
    )
    np.testing.assert_array_equal(labels["mu"], expected)
    assert set(answered.values()) <= {"left", "right", "equal"} and len(answered) >= len(labels["mu"])

    # the clips on the server are real WebM videos
    status, clip = server.call("GET", f"/clips/{next(iter(answered))}-left")
    assert status == 200 and clip[:4] == b"\x1a\x45\xdf\xa3"

    # the reward model learned from those labels: it orders the labelled pairs as the rater did
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    ensemble = rl.RewardEnsemble(labels["obs"].shape[-1], labels["act"].shape[-1], 3)
    ensemble.load_state_dict(checkpoint["reward_ensemble"])
    segments = {k: torch.as_tensor(labels[k]) for k in ("obs", "act", "mask")}
    with torch.no_grad():
        returns = ensemble.segment_returns(segments).mean(0)  # (labels, 2)
    strict = labels["mu"] != 0.5
    agreement = ((returns[:, 0] > returns[:, 1]).numpy() == (labels["mu"] == 1))[strict].mean()
    assert agreement > 0.8, agreement


@pytest.mark.slow
def test_a_run_the_label_server_starts_refusing_saves_before_it_stops(tmp_path, label_server):
    args = HUMAN.replace("--total-timesteps 3072", "--total-timesteps 1000000")
    run_dir, checkpoint, _ = assert_a_run_the_label_server_refuses_saves_and_says_so(tmp_path, args, label_server, "step ")
    assert len(np.load(run_dir / "labels.npz")["mu"]) >= 10  # the pretraining labels, and any since


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_stopped_in_the_label_wait_resumes_where_it_stopped(tmp_path, label_server, sig):
    # HalfCheetah never falls: with 40-step episodes, every environment's episodes end at the same steps. One RL
    # rollout after the pretraining, and 5-step clips (each frame is rendered: about 15 frames/s here)
    args = HUMAN.replace("--env Hopper-v4", '--env HalfCheetah-v4 --env-kwargs {"max_episode_steps":40}')
    args = args.replace("--total-timesteps 3072", "--total-timesteps 1536").replace("--segment-len 10", "--segment-len 5")
    assert_a_run_stopped_in_the_label_wait_resumes_where_it_stopped(tmp_path, args, label_server, 40, 8, rl.__file__, sig)


@pytest.mark.slow
def test_a_human_run_whose_pretraining_pairs_all_get_cant_tell_stops_and_can_resume(tmp_path, label_server):
    """No label from the initial policy: RL cannot start. The run stops with what happened and what to do, and keeps
    its checkpoint from before the last pretraining rollout (one step count, one set of environments), to ask again."""
    server = label_server()
    with rating_by_script(server, always="cant_tell") as answered:
        result = run_script(tmp_path, f"{HUMAN} --label-server {server.url}", script=rl.__file__)
    assert_clear_error(result, "error: pretraining ended with no preference label")
    run_dir = only_run_dir(tmp_path)
    assert (
        "people answered 'can't tell' to every pair" in result.stderr and f"--resume runs/{run_dir.name} asks" in result.stderr
    )
    assert len(answered) >= 10 and set(answered.values()) == {"cant_tell"}
    assert "checkpoint of step 512 kept" in result.stdout  # 2 pretraining rollouts of 512 steps: before the second
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 512


def hopper_segments(rng, n):
    """n random 5-step Hopper segments, with the simulator states their clips are rendered from."""
    return {
        "obs": rng.normal(size=(n, 5, 11)).astype(np.float32),
        "act": rng.normal(size=(n, 5, 3)).astype(np.float32),
        "mask": np.ones((n, 5), np.float32),
        "true_reward": rng.normal(size=(n, 5)).astype(np.float32),
        "sim_state": rng.normal(size=(n, 12)),
    }


def test_unanswered_pairs_are_saved_and_asked_again(tmp_path):
    rng = np.random.default_rng(0)

    def segments(n):
        return hopper_segments(rng, n)

    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    teacher = rl.HumanTeacher(str(run_dir), "Hopper-v4", "http://127.0.0.1:9", None, "Which?")
    left, right = segments(3), segments(3)
    teacher.ask(left, right)
    assert teacher.pending == 3
    teacher.save()
    assert (run_dir / "pending_pairs.npz").exists()

    resumed = rl.HumanTeacher(str(run_dir), "Hopper-v4", "http://127.0.0.1:9", None, "Which?")
    resumed.load()
    assert resumed.pending == 3 and resumed.queued == list(teacher.waiting)  # under the ids they were posted with
    for i, pair_id in enumerate(resumed.queued):  # the same segments, ready to be rendered and posted again
        for key in left:
            np.testing.assert_array_equal(resumed.waiting[pair_id][0][key], left[key][i])
            np.testing.assert_array_equal(resumed.waiting[pair_id][1][key], right[key][i])
    resumed.ask(segments(1), segments(1))
    assert resumed.queued[-1].endswith(
        "-000003"
    )  # the index goes on (new ids: test_a_human_teacher_keeps_its_pairs_...[resumed])


@pytest.mark.parametrize("assert_it, poll_interval, server_args", TEACHER_STOP_AND_END_CHECKS)
def test_a_human_teacher_keeps_its_pairs_and_answers_at_a_stop_and_at_the_end(
    tmp_path, label_server, assert_it, poll_interval, server_args
):
    server, rng = label_server(*server_args), np.random.default_rng(0)
    (tmp_path / "exp").mkdir()
    assert_it(
        server,
        lambda: rl.HumanTeacher(
            str(tmp_path / "exp"), "Hopper-v4", server.url, None, "Which?", clip_size=48, poll_interval=poll_interval
        ),
        lambda n: (hopper_segments(rng, n), hopper_segments(rng, n)),
    )


@pytest.mark.parametrize("assert_it", LABEL_SERVER_RESTART_CHECKS)
def test_a_label_server_restarted_on_another_database_stops_the_teacher(tmp_path, label_server, assert_it):
    rng = np.random.default_rng(0)
    (tmp_path / "exp").mkdir()
    assert_it(
        label_server,
        lambda url: rl.HumanTeacher(
            str(tmp_path / "exp"), "Hopper-v4", url, None, "Which?", clip_size=48, poll_interval=0.2, pair_check_interval=0.5
        ),
        lambda n: (hopper_segments(rng, n), hopper_segments(rng, n)),
    )


def test_processes_of_a_run_never_share_a_pair_id(tmp_path):
    rng = np.random.default_rng(0)
    assert_processes_of_a_run_never_share_a_pair_id(
        lambda: rl.HumanTeacher(str(tmp_path / "exp"), "Hopper-v4", "http://127.0.0.1:9", None, "Which?"),
        lambda n: (hopper_segments(rng, n), hopper_segments(rng, n)),
    )


def test_a_run_folder_name_the_label_server_cannot_take_stops_the_run_at_once(tmp_path, label_server):
    server, rng = label_server(), np.random.default_rng(0)

    def new_teacher(name):
        (tmp_path / name).mkdir(exist_ok=True)
        return rl.HumanTeacher(str(tmp_path / name), "Hopper-v4", server.url, None, "Which?", clip_size=48, poll_interval=0.2)

    assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once(
        server, new_teacher, lambda n: (hopper_segments(rng, n), hopper_segments(rng, n))
    )


def test_a_run_folder_given_as_a_dot_keeps_its_name_as_the_experiment(tmp_path, monkeypatch):
    assert_a_run_folder_given_as_a_dot_keeps_its_name(
        tmp_path, monkeypatch, lambda run_dir: rl.HumanTeacher(run_dir, "Hopper-v4", "http://127.0.0.1:9", None, "Which?")
    )


def test_a_kill_between_saving_the_labels_and_the_pending_pairs_adds_no_answer_twice(tmp_path, label_server, monkeypatch):
    server, rng = label_server(), np.random.default_rng(0)
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    labels_path, buffer = str(run_dir / "labels.npz"), rl.LabelBuffer(10, 5, 11, 3, 3, rng)

    def store(teacher):
        rl.store_answers(teacher, buffer)
        rl.save_labels(buffer, teacher, labels_path)

    def resume(teacher):
        resumed_buffer = rl.LabelBuffer(10, 5, 11, 3, 3, rng)
        rl.load_labels(resumed_buffer, teacher, labels_path)
        return resumed_buffer.size

    assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice(
        server,
        monkeypatch,
        lambda: rl.HumanTeacher(str(run_dir), "Hopper-v4", server.url, None, "Which?", clip_size=48, poll_interval=0.2),
        lambda n: (hopper_segments(rng, n), hopper_segments(rng, n)),
        store,
        resume,
    )


def test_a_clip_shows_every_step_of_its_segment_the_last_one_too(tmp_path):
    """A segment of L steps is judged on its L actions: its clip is the saved simulator state, then the state after each
    action, L + 1 frames (it was L: the last action's outcome was not shown), a fall held over the absorbing steps."""
    length, rng = 6, np.random.default_rng(0)
    env = rl.make_render_env("Hopper-v4", 48, {})
    env.reset(seed=0)
    start = np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel])
    actions = rng.uniform(-1, 1, (length, 3)).astype(np.float32)
    expected = [env.unwrapped.render()]
    for action in actions:
        env.unwrapped.step(action)
        expected.append(env.unwrapped.render())
    teacher = rl.HumanTeacher(str(tmp_path), "Hopper-v4", "http://127.0.0.1:9", None, "Which?", clip_size=48)
    render_env = rl.make_render_env("Hopper-v4", 48, {})
    render_env.reset(seed=0)
    segment = {"sim_state": start, "act": actions, "mask": np.ones(length, np.float32)}
    frames = teacher._render(render_env, segment)
    assert len(frames) == length + 1
    for frame, frame_expected in zip(frames, expected):
        np.testing.assert_array_equal(frame, frame_expected)
    segment["mask"][3:] = 0  # the episode ended with the third action: the frame after it held
    frames = teacher._render(render_env, segment)
    assert len(frames) == length + 1
    for frame in frames[3:]:
        np.testing.assert_array_equal(frame, expected[3])


def test_the_label_token_stays_out_of_the_logs(tmp_path):
    assert_the_label_token_stays_out_of_the_logs(tmp_path, HUMAN.replace(" --save-model", ""), rl.__file__)
