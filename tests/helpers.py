"""Running the script as a user does: in a subprocess, in a fresh folder, judged by what it writes."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

import warm_start

SCRIPT = Path(__file__).resolve().parents[1] / "rlhf_ppo_mujoco.py"


def run_script(cwd, args, timeout=300, script=SCRIPT, env=None, cold=False):
    """`python SCRIPT ARGS` in `cwd`, to its end; started from the zygote (warm_start.py) unless `cold` or given an
    `env` of its own (the zygote's imports saw this process's)."""
    command = warm_start.command(script, args.split(), cold=cold or env is not None)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def interrupt_run(cwd, args, line_prefix, script=SCRIPT, wait=240, sig=signal.SIGINT, times=1, cold=False):
    """Start the script, wait for a stdout line starting with `line_prefix` (or `wait` seconds), then stop it as
    Ctrl-C would (or with `sig`, sent `times` times 10 ms apart); returns (stdout after that line, stderr). A run to be
    killed (SIGKILL) at that line starts cold: a warm one dies only when its zygote next runs (warm_start.py)."""
    process = subprocess.Popen(
        warm_start.command(script, args.split(), cold=cold or sig == signal.SIGKILL),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell starts background jobs with Ctrl-C ignored, and children inherit that: give the run a normal one
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + wait
    for line in process.stdout:
        if line.startswith(line_prefix) or time.time() > deadline:
            break
    for _ in range(times):
        process.send_signal(sig)
        time.sleep(0.01)
    return process.communicate(timeout=120)


def assert_sigterm_stops_like_ctrl_c(cwd, args, script=SCRIPT):
    """`kill`, `timeout` or a cluster's scheduler stop a run with SIGTERM: it must still write its checkpoint (the
    periodic one is kept out of the way here), at the last iteration it completed. Sent twice at once, as when Slurm
    signals every process of a job and a sweep task passes its own signal on, it is still one stop that saves."""
    args += " --save-model --checkpoint-every 100000"
    out, err = interrupt_run(cwd, args, "step ", script=script, sig=signal.SIGTERM, times=2)
    assert "interrupted at step" in out, err
    stopped_at = int(out.split("interrupted at step ")[1].split()[0])
    checkpoint = torch.load(only_run_dir(cwd) / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == stopped_at and "checkpoint saved to" in out  # not only the pretraining one


def assert_only_a_second_ctrl_c_stops_at_once(module):
    """A second SIGTERM more than a second after the first stopped the run at once, unsaved (KeyboardInterrupt), as a
    second Ctrl-C does: a cluster's scheduler signals every process of a job at its time limit, after the sweep task
    passed on its own earlier signal, and systemd or `scancel` stop a whole sweep while its tasks pass theirs on,
    seconds apart on a busy machine. A second SIGTERM is the same stop; a second Ctrl-C, a second later, stops at once."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for first in (signal.SIGTERM, signal.SIGINT):
            stop_requested = module.stop_on_signals()
            os.kill(os.getpid(), first)
            time.sleep(1.2)
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # (a handler runs in the main thread, before the next line)
                time.sleep(0.05)
            except KeyboardInterrupt:
                pytest.fail(f"a SIGTERM 1.2 s after a {signal.Signals(first).name} stopped the run at once, unsaved")
            assert stop_requested.is_set()
        stop_requested = module.stop_on_signals()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop_requested.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # within a second: the same stop
        time.sleep(1.2)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def assert_a_resumed_run_is_not_refused_its_own_settings(module):
    """A run started before a combination was refused (a human-feedback run with --teacher-beta, a synthetic one with
    --clip-fps) resumes with its own settings, which it cannot change: refusing them would leave it no way on. Where
    its label server is, the one thing a resume can change, is still checked."""

    def validated(**settings):
        args = module.Args(**settings)
        module.fill_runtime_fields(args)
        module.validate_args(args)

    saved_settings = [{"feedback": "human", "teacher_beta": 1.0}, {"clip_fps": 10, "instruction": "Which?"}]
    for saved in [*saved_settings, {"selection": "random", "candidate_multiplier": 4}]:
        validated(resume="runs/old", **saved)
        with pytest.raises(SystemExit, match="are for|is for"):  # the same settings in a new run
            validated(**saved)
    with pytest.raises(SystemExit, match=re.escape("error: --label-token is for --feedback human")):
        validated(resume="runs/old", label_token="s3cret")
    # what to do with the run comes from the command line, but --eval-episodes only means something for --eval-only
    with pytest.raises(SystemExit, match=re.escape("error: --eval-episodes is for --eval-only")):
        module.resumed_args(module.Args(resume="runs/old", eval_episodes=3), {"args": vars(module.Args())})


def assert_a_kill_after_a_checkpoint_loses_no_label(cwd, args, line_prefix, script, module):
    """kill -9 a run that checkpoints every iteration at its progress line `line_prefix` (one after the first
    checkpoint): the labels on disk hold at least every label the checkpoint counted, and --resume spends the rest of
    the budget. (labels.npz used to be written only every 30 s: a kill between the first checkpoint and the first label
    save left a checkpoint without labels, and --resume failed.)"""
    interrupt_run(cwd, args + " --save-model --checkpoint-every 1", line_prefix, script=script, sig=signal.SIGKILL)
    run_dir = only_run_dir(cwd)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    settings = module.Args(**checkpoint["args"])
    module.fill_runtime_fields(settings)
    counted = int(module.label_schedule(settings)[: checkpoint["global_step"] // settings.batch_size].sum())
    with np.load(run_dir / "labels.npz") as saved:
        assert len(saved["mu"]) >= counted > 0
    resumed = run_script(cwd, f"--resume {run_dir}", timeout=600, script=script)
    assert resumed.returncode == 0, resumed.stderr
    assert len(np.load(run_dir / "labels.npz")["mu"]) == settings.labels


def assert_a_resumed_run_keeps_its_videos(cwd, args, script=SCRIPT, resume_flags=""):
    """A run with --capture-video stopped (SIGTERM) after its first progress line and resumed (with `resume_flags`):
    the videos saved before the stop stay as they were, and the episodes after it get the numbers they get in the run
    uninterrupted."""
    (cwd / "whole").mkdir(), (cwd / "stopped").mkdir()
    # cold: a run from a fresh interpreter, the other from the zygote (warm_start.py)
    whole = run_script(cwd / "whole", args, script=script, cold=True)
    assert whole.returncode == 0, whole.stderr
    out, err = interrupt_run(cwd / "stopped", args, "step ", script, sig=signal.SIGTERM)
    assert "interrupted at step" in out, err
    run_dir = only_run_dir(cwd / "stopped")
    before = {video.name: video.read_bytes() for video in (run_dir / "videos").iterdir()}
    assert "episode-0.mp4" in before
    resumed = run_script(cwd / "stopped", f"--resume {run_dir} {resume_flags}", script=script)
    assert resumed.returncode == 0, resumed.stderr
    after = {video.name: video.read_bytes() for video in (run_dir / "videos").iterdir()}
    assert {name: after[name] for name in before} == before  # none replaced
    assert sorted(after) == sorted(video.name for video in (only_run_dir(cwd / "whole") / "videos").iterdir())


def assert_a_new_run_never_writes_into_another_runs_folder(cwd, args, name, script=SCRIPT):
    """A new run's folder is runs/NAME__SECOND, the second it started in: two runs of one NAME (task, --exp-name, seed)
    started in the same second, as a shell loop starts a true-reward run and a labelled one, took one folder, the later
    one's checkpoint, labels and TensorBoard files over the earlier one's. Here the other runs' folders are made for
    each of the next 60 seconds before the run starts: the run must take a folder of its own and touch none of theirs."""
    now = int(time.time())
    others = [cwd / "runs" / f"{name}__{second}" for second in range(now, now + 60)]
    for folder in others:
        folder.mkdir(parents=True)
        (folder / "another-run.txt").write_text("")
    result = run_script(cwd, args, script=script)
    assert result.returncode == 0, result.stderr
    written_into = [folder.name for folder in others if [path.name for path in folder.iterdir()] != ["another-run.txt"]]
    assert written_into == []
    (own,) = set((cwd / "runs").iterdir()) - set(others)
    assert own.name.startswith(f"{name}__")
    assert any(path.name.startswith("events.out.tfevents") for path in own.iterdir())


def assert_clear_error(result, message):
    """The script stopped with `message` on stderr, not with a traceback."""
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def assert_resumes_it_cannot_do_are_refused_and_change_nothing(cwd, module, foreign_setting):
    """--resume with the script of `module` as it cannot be done: a flag that differs from the run's own (was silently
    dropped: a finished run "extended" with --total-timesteps ended at once, exit 0), --eval-episodes 0 with
    --eval-only, a checkpoint of another script (the run's settings plus `foreign_setting`, which only that script has)
    and one cut short (tracebacks), and a labelled run's checkpoint without its labels (a traceback after the run had
    written a TensorBoard file; the Atari script went on with none). Each stops with a clear error, and no file is
    written or changed. A flag given at its default value counts as given (was dropped: a run of half the default steps
    "extended" with --total-timesteps at the default ended at once). The run's own settings given again (what a sweep
    sends) and what may change are taken."""
    saved = vars(module.Args(total_timesteps=1000000, save_model=True))
    runs = {"own": {"args": saved}, "other": {"args": {**saved, foreign_setting: 10}}, "cut": None}
    default_steps = module.Args().total_timesteps
    runs["short"] = {"args": vars(module.Args(total_timesteps=default_steps // 2, seed=3, save_model=True))}
    runs["unlabelled"] = {"args": saved, "reward_steps": 16}  # a reward model trained on labels that are not there
    for name, checkpoint in runs.items():
        (cwd / name).mkdir()
        if checkpoint is None:
            (cwd / name / "checkpoint.pt").write_bytes(b"PK\x03\x04" + b"\0" * 20)  # a zip's start, then nothing
        else:
            torch.save(checkpoint, cwd / name / "checkpoint.pt")
    files_before = {path: path.read_bytes() for path in cwd.rglob("*") if path.is_file()}
    for args, message in [
        ("--resume own --total-timesteps 2000000", "--total-timesteps 2000000 differs from the run's own 1000000"),
        ("--resume own --seed 7", "--seed 7 differs from the run's own 1"),
        (f"--resume short --total-timesteps {default_steps}", f"--total-timesteps {default_steps} differs from the run's own"),
        ("--resume short --seed 1", "--seed 1 differs from the run's own 3"),
        ("--resume short --no-save-model", "--save-model False differs from the run's own True"),
        ("--resume own --eval-only --eval-episodes 0", "--eval-only needs"),
        ("--resume other", f"other is not a run of this script (its settings have --{foreign_setting.replace('_', '-')})"),
        ("--resume cut", "error: cannot read cut/checkpoint.pt"),
        ("--resume unlabelled", "error: unlabelled has a checkpoint but not the labels saved with it"),
    ]:
        assert_clear_error(run_script(cwd, args, timeout=120, script=Path(module.__file__)), message)
    assert {path: path.read_bytes() for path in cwd.rglob("*") if path.is_file()} == files_before
    again = module.Args(resume="own", total_timesteps=1000000, eval_only=True, eval_episodes=3)
    resumed = module.resumed_args(again, {"args": saved})
    assert (resumed.total_timesteps, resumed.save_model, resumed.eval_only, resumed.eval_episodes) == (1000000, True, True, 3)
    # a human-feedback run whose label server has moved (restarted elsewhere, a new token): the new address when
    # given, the run's own when not
    human = {"args": vars(module.Args(feedback="human", label_server="http://127.0.0.1:8001"))}
    (cwd / "human").mkdir()
    (cwd / "human" / "labels.npz").touch()  # (only its presence is checked here)
    run = str(cwd / "human")
    moved = module.resumed_args(module.Args(resume=run, label_server="http://10.0.0.5:8000", label_token="t"), human)
    assert (moved.label_server, moved.label_token) == ("http://10.0.0.5:8000", "t")
    assert module.resumed_args(module.Args(resume=run), human).label_server == "http://127.0.0.1:8001"


def assert_answers_follow_true_returns(labels):
    """Every answer in a saved labels.npz is the synthetic teacher's at its defaults: the segment with more true reward
    (mu 1 left, 0 right), "equal" (0.5) on a tie and only then."""
    true_returns = labels["true_reward"].astype(np.float64).sum(-1)
    assert (labels["mu"] != 0.5).any()
    np.testing.assert_array_equal(labels["mu"], np.sign(true_returns[:, 0] - true_returns[:, 1]) / 2 + 0.5)


def assert_the_pairs_kept_are_the_most_disagreed_on(kept, candidates, num_pairs):
    """Variance selection (C17 2.2.4): the ensemble's disagreement on the pairs kept (`kept`, in the order kept) is the
    top `num_pairs` of its disagreement on the candidate pairs (`candidates`), most first."""
    assert len(np.unique(candidates)) > num_pairs  # the ranking is not decided by ties
    # rtol: float32 scores of one pair, computed in batches of different sizes, can differ in their last bits
    np.testing.assert_allclose(kept, np.sort(candidates)[::-1][:num_pairs], rtol=1e-5)


# what every RLHF run logs to TensorBoard, whatever the script (STYLE.md)
RLHF_TAGS = [
    "charts/SPS",
    "reward_model/loss",
    "reward_model/val_loss",
    "reward_model/val_accuracy",
    "reward_model/l2",
    "reward_model/true_correlation",
    "labels/total",
    "losses/policy_loss",
]


def assert_tags(logged, tags):
    for tag in tags:
        assert tag in logged, f"{tag} missing from {sorted(logged)}"


def assert_predicted_returns_are_of_whole_episodes(logged, rl_start, num_envs, batch_size):
    """charts/predicted_return sums the learned reward over whole episodes: one per episode that began after
    `rl_start` (the step pretraining ended; a global step counts every env's), logged at the end of the rollout it
    ended in, and none for those under way when RL began. Returns how many episodes under way when RL began
    ended during it."""
    episodes = zip(logged["charts/episodic_return"], logged["charts/episodic_length"])
    ended_in_rl = [(step, length) for (step, _), (_, length) in episodes if step > rl_start]
    begun_in_rl = [step for step, length in ended_in_rl if step - num_envs * (length - 1) > rl_start]
    assert begun_in_rl  # the premise: whole episodes to log
    rollout_ends = Counter(-(-step // batch_size) * batch_size for step in begun_in_rl)
    assert Counter(step for step, _ in logged.get("charts/predicted_return", [])) == rollout_ends
    return len(ended_in_rl) - len(begun_in_rl)


def progress_lines(stdout, after_step):
    """A run's progress lines ("step N, SPS S, true return ...") past `after_step`, without the steps/s (timing)."""
    lines = [line for line in stdout.splitlines() if re.match(r"step \d+, SPS \d+", line)]
    return [re.sub(r", SPS \d+", "", line) for line in lines if int(line.split(",")[0].split()[1]) > after_step]


def only_run_dir(cwd):
    (run_dir,) = (Path(cwd) / "runs").iterdir()
    return run_dir


def scalars(run_dir):
    """Every scalar the run logged, as TensorBoard shows it (its own reader: a resumed run's purge applied the same
    way): {tag: [(step, value), ...]}."""
    events = EventAccumulator(str(run_dir), tensor_size_guidance={"scalars": 0})
    events.Reload()
    tags = [tag for tag, content in events.PluginTagToContent("scalars").items()]
    return {tag: [(e.step, make_ndarray(e.tensor_proto).item()) for e in events.Tensors(tag)] for tag in tags}


def assert_the_settings_show_once_per_start(run_dir, resumed_at):
    """TensorBoard shows the run's settings table (the "hyperparameters" text) once per start: the new run's at its
    first step, the run resumed at step `resumed_at` at the first step it logs."""
    events = EventAccumulator(str(run_dir), tensor_size_guidance={"text": 0})
    events.Reload()
    tables = [(e.step, make_ndarray(e.tensor_proto).item().decode()) for e in events.Tensors("hyperparameters/text_summary")]
    assert [step for step, _ in tables] == [1, resumed_at + 1], tables
    assert "|resume|None|" in tables[0][1] and f"|resume|{run_dir}|" in tables[1][1], tables


# label_server.py, run as a process on a free port of 127.0.0.1
SERVER = Path(__file__).resolve().parents[1] / "label_server.py"


class LabelServer:
    """A label_server.py process; `.url`, `.call(...)` for JSON requests, `.kill()` (SIGKILL) and `.stop()`."""

    def __init__(self, db, *args, port=0, token=None):
        self.db, self.args, self.token = str(db), [str(a) for a in args], token
        command = [sys.executable, str(SERVER), "--port", str(port), "--db", self.db, *self.args]
        if "--undo-seconds" not in self.args:  # labels reach the trainer at once, unless a test is about undo
            command += ["--undo-seconds", "0"]
        if token:
            command += ["--token", token]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.process.stdout.readline()  # "label server on http://127.0.0.1:PORT/ (database ...)"
        if not first.startswith("label server on "):
            self.process.kill()
            raise RuntimeError(f"label server did not start: {first}{self.process.stderr.read()}")
        self.url = first.split()[3].rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])
        # the server logs a line per request on stderr: read it as it comes, or a full pipe would block the server
        self.log_lines = []
        self.log_reader = threading.Thread(target=self._read_log, daemon=True)
        self.log_reader.start()

    def _read_log(self):
        for line in self.process.stderr:
            self.log_lines.append(line)

    def log(self, until=None, timeout=30):
        """The server's stderr so far; with `until`, first wait (up to `timeout` seconds) for a line containing it (the
        server writes a request's line just after its reply)."""
        deadline = time.time() + timeout
        while until is not None and not any(until in line for line in list(self.log_lines)) and time.time() < deadline:
            time.sleep(0.05)
        return "".join(list(self.log_lines))

    def call(self, method, path, body=None, token=None, raw=None, headers=None):
        """(status, parsed JSON body or None) of one request; `raw` sends bytes as they are."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = dict(headers or {})
        if method == "POST":  # the JSON endpoints; a clip's PUT has its own type (urllib would send a form's)
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        if token or self.token:
            request.add_header("Authorization", f"Bearer {token or self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            payload, status = error.read(), error.code
        content = json.loads(payload) if payload and payload[:1] in b"{[" else (payload or None)
        return status, content

    def kill(self):
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log_reader.join(timeout=10)  # the pipe ends when the process does: every line is in log_lines
        self.process.stdout.close()
        self.process.stderr.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scripted_rater(server, stop, answered, always=None):
    """Answers every pair it is shown by the true returns the trainer posted in the pair's metadata (or `always` the
    same, e.g. "cant_tell")."""
    while not stop.is_set():
        status, pair = server.call("GET", "/api/pairs/next?rater=script")
        if status == 204:
            time.sleep(0.2)
            continue
        meta = server.call("GET", f"/api/pairs/{pair['pair_id']}")[1]["metadata"]
        left, right = meta["left_true_return"], meta["right_true_return"]
        choice = always or ("left" if left > right else "right" if right > left else "equal")
        status, _ = server.call("POST", "/api/labels", {"pair_id": pair["pair_id"], "rater": "script", "choice": choice})
        assert status == 201
        answered[pair["pair_id"]] = choice


@contextlib.contextmanager
def rating_by_script(server, always=None):
    """Run `scripted_rater` in a background thread while the block runs; yields its answers (pair id -> choice)."""
    stop, answered = threading.Event(), {}
    rater = threading.Thread(target=scripted_rater, args=(server, stop, answered, always), daemon=True)
    rater.start()
    try:
        yield answered
    finally:
        stop.set()
        rater.join(timeout=30)


def assert_the_finished_run_closed_its_pairs(server, run_dir, output):
    """A human-feedback run that finished tells the label server that its pairs need no more answers."""
    assert "unanswered pairs of the finished run closed" in output, output
    assert f"POST /api/experiments/{run_dir.name}/close 200" in server.log(until="/close")


def wait_for_teacher(teacher, done, deadline):
    """Wait until `done()` holds, failing if the teacher's thread stopped or `deadline` (a time.time()) passed."""
    while not done():
        assert time.time() < deadline and teacher.failure is None, teacher.failure
        time.sleep(0.05)


def assert_a_resumed_teacher_keeps_pairs_and_answers_apart(server, new_teacher, segments):
    """A human-feedback run saves its unanswered pairs with its labels (every 30 s), asks two more pairs, posts them and
    is killed (-9); raters answer two saved pairs and the first pair posted after the save meanwhile. On --resume the
    answers of the saved pairs arrive once (no crash on pairs answered before they were posted again), a new pair never
    takes the id of a pair the server already holds (whose answers were given to other clips), the saved pair nobody
    answered is still served, and the pair posted after the save that nobody answered is not (its answer would reach
    no run). `new_teacher()` makes the script's HumanTeacher for the same run folder and `server`; `segments(n)` gives
    (left, right) for n pairs."""
    teacher = new_teacher()
    teacher.ask(*segments(3))
    teacher.save()
    teacher.ask(*segments(2))
    teacher.start()
    deadline = time.time() + 120
    wait_for_teacher(teacher, lambda: not teacher.queued, deadline)  # every pair posted
    teacher.stop.set()  # the kill: the thread ends, nothing is saved after the fourth and fifth pairs were posted
    teacher.thread.join(timeout=60)
    posted, orphan = sorted(teacher.waiting)[:4], sorted(teacher.waiting)[4]
    for pair_id in (posted[0], posted[1], posted[3]):
        assert server.call("POST", "/api/labels", {"pair_id": pair_id, "rater": "r", "choice": "left"})[0] == 201

    resumed = new_teacher()
    resumed.load()
    assert sorted(resumed.waiting) == posted[:3]
    resumed.ask(*segments(1))
    new_id = resumed.queued[-1]
    assert new_id not in teacher.waiting
    resumed.start()
    try:
        deadline = time.time() + 120
        wait_for_teacher(resumed, lambda: not resumed.queued, deadline)  # every pair posted again or anew
        status, pair = server.call("GET", f"/api/pairs/{new_id}")
        assert status == 200 and pair["answers"] == []  # posted as new clips: nobody has answered them
        for wanted in (posted[2], new_id):  # oldest first: the orphan, older than the new pair, would come between
            status, served = server.call("GET", "/api/pairs/next?rater=another")
            assert status == 200 and served["pair_id"] == wanted, (served, orphan)
            assert server.call("POST", "/api/labels", {"pair_id": wanted, "rater": "another", "choice": "left"})[0] == 201
        received = []
        while len(received) < 4:
            assert time.time() < deadline, received
            for _, _, mu in resumed.poll():  # as the training loop does: it stops the run if the thread failed
                received.extend(mu.tolist())
            time.sleep(0.01)
        assert received == [1.0, 1.0, 1.0, 1.0] and resumed.pending == 0
    finally:
        resumed.close()


def assert_a_finished_run_keeps_the_answers_given_before_it_ended(server, new_teacher, segments):
    """Answers people give to a run's last pairs after its thread last fetched answers, before the run ends, are taken
    when the run finishes (close(run_finished=True): poll() hands them over, for the labels it saves); they were left on
    the server, and the run said they would be asked again on --resume, which a finished run never does. The pair nobody
    answered is closed. `new_teacher()` makes the script's HumanTeacher with a poll interval longer than the test."""
    teacher = new_teacher()
    teacher.ask(*segments(3))
    teacher.start()

    def idle_after_posting():  # every pair posted, then the thread's second fetch (the first follows the first post),
        # before it waits out its poll interval (counted: the server may log that fetch before the last post's line)
        return not teacher.queued and server.log().count("GET /api/labels") >= 2

    wait_for_teacher(teacher, idle_after_posting, time.time() + 120)
    first, second, unanswered = sorted(teacher.waiting)
    for pair_id, choice in ((first, "left"), (second, "right")):
        assert server.call("POST", "/api/labels", {"pair_id": pair_id, "rater": "r", "choice": choice})[0] == 201
    teacher.close(run_finished=True)
    received = sorted(mu for _, _, mus in teacher.poll() for mu in mus.tolist())
    assert received == [0.0, 1.0] and teacher.pending == 1, (received, teacher.pending, server.log())
    assert server.call("GET", "/api/pairs/next?rater=another")[0] == 204  # the unanswered pair: closed


def assert_a_teacher_whose_label_server_lost_its_pairs_stops(label_server, new_teacher, segments):
    """A label server restarted on another database (a fresh one: started from another folder, or its file deleted)
    holds none of the pairs the run posted, so nobody can answer them; before the run had received any label nothing
    told it so (the 409 of GET /api/labels needs a label number the database never gave) and it waited for ever.
    Restarted on its own database the teacher goes on (no false alarm: it checks a pair and finds it); on another one
    it stops (its `failure`, on which the run stops and saves), naming the pair the server has not, and
    wait_for_answers returns; the pairs nobody could answer are kept (the run saves them as it stops). `new_teacher(url)`
    makes the script's HumanTeacher, checking its posted pairs every 0.5 s; `segments(n)` gives (left, right) for n
    pairs."""
    server = label_server()
    teacher = new_teacher(server.url)
    teacher.ask(*segments(2))
    teacher.start()
    try:
        wait_for_teacher(teacher, lambda: not teacher.queued, time.time() + 120)  # both pairs posted
        first, second = sorted(teacher.waiting)
        server.stop()
        same = label_server(port=server.port, db=server.db)
        checked = f"GET /api/pairs/{first} 200"  # the teacher checked its oldest pair on the restarted server
        assert checked in same.log(until=checked)
        time.sleep(1.0)  # two more checks
        assert teacher.failure is None
        same.stop()
        label_server(port=server.port, db=Path(server.db).with_name("another.sqlite"))
        gave_up = threading.Event()
        timer = threading.Timer(60, gave_up.set)  # without the check the wait would not end
        timer.start()
        try:
            teacher.wait_for_answers(gave_up)
        finally:
            timer.cancel()
        assert not gave_up.is_set(), "the teacher waited 60 s for pairs the label server does not have"
        assert first in teacher.failure and "another database" in teacher.failure, teacher.failure
        assert sorted(teacher.waiting) == [first, second]  # still asked: the run saves them as it stops
    finally:
        teacher.close()


def assert_a_pair_posted_to_another_database_stops_the_teacher_once_the_right_one_is_back(label_server, new_teacher, segments):
    """A label server restarted by mistake on another database, then on its own again before the teacher's next check:
    the pair posted meanwhile is on the other database only, and nobody can answer it. The oldest pair waiting is on
    the server, so the check looks at the newest one too: the teacher stops, naming that pair. Arguments as in
    assert_a_teacher_whose_label_server_lost_its_pairs_stops."""
    server = label_server()
    teacher = new_teacher(server.url)
    teacher.pair_check_interval = 3600.0  # no check on the other database (it would miss the oldest pair there)
    teacher.ask(*segments(1))
    teacher.start()
    try:
        wait_for_teacher(teacher, lambda: not teacher.queued, time.time() + 120)
        (oldest,) = teacher.waiting
        server.stop()
        other = label_server(port=server.port, db=Path(server.db).with_name("other.sqlite"))
        teacher.ask(*segments(1))
        wait_for_teacher(teacher, lambda: not teacher.queued, time.time() + 120)
        (newest,) = set(teacher.waiting) - {oldest}
        assert other.call("GET", f"/api/pairs/{newest}")[0] == 200  # posted to the other database
        other.stop()
        label_server(port=server.port, db=server.db)
        teacher.pair_check_interval = 0.5
        deadline = time.time() + 30
        while teacher.failure is None and time.time() < deadline:
            time.sleep(0.05)
        assert teacher.failure is not None, "the teacher waits for a pair the label server does not have"
        assert newest in teacher.failure and oldest not in teacher.failure, teacher.failure
    finally:
        teacher.close()


def assert_a_reply_cut_short_is_retried(label_server, new_teacher, segments):
    """A label server stopped while it sends a reply (its restart) cuts the reply short: http.client's IncompleteRead,
    which is no OSError, stopped the teacher's thread, and so the run, where a server that is down is waited for. The
    request is sent again. (`label_server` and `segments` are not used: the arguments of the tests beside it.)"""
    replies = [b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"cut', None]
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():  # the first reply cut short (the connection closed), the second whole
        for reply in replies:
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                body = b'{"labels": [], "last_seq": 0}'
                whole = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                connection.sendall(reply or whole + body)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    teacher = new_teacher(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        assert teacher._request("GET", "/api/labels?experiment=exp&since=0") == {"labels": [], "last_seq": 0}
    finally:
        listener.close()
    server.join(timeout=10)


def assert_processes_of_a_run_never_share_a_pair_id(new_teacher, segments, processes=20_000):
    """Pair ids are {run}-{a part drawn at random by each process}-{index}, and a resumed process goes on from the
    saved index: a run killed after posting pairs it had not saved posts its next pairs under the same indices, and if
    both processes drew the same part, under the same ids. The new clips would replace those the earlier pairs'
    answers were given to, and the server would take each new pair for a repeat of the earlier one (answered or closed
    already, it is not served again: the run waits for it). Fresh teachers of one run model such processes: among
    20,000 no two first pairs may share an id (24 random bits: about 12 shared on average; 64 bits: a shared id about
    once in 10^11 runs of this test). `new_teacher()` makes the script's HumanTeacher for the run; `segments(1)` one
    pair."""
    left, right = segments(1)
    first_ids = []
    for _ in range(processes):
        teacher = new_teacher()
        teacher.ask(left, right)
        first_ids.append(teacher.queued[0])
    repeated = [pair_id for pair_id, count in Counter(first_ids).items() if count > 1]
    assert not repeated, f"{len(repeated)} pair ids drawn by two processes of one run, e.g. {repeated[0]}"


def assert_a_run_folder_name_the_server_cannot_take_stops_the_run_at_once(server, new_teacher, segments):
    """The label server takes ids of at most 128 characters that start with a letter or digit, and a clip's id is the
    experiment's name (the run folder's) and 30 characters more ({name}-{16 hex digits}-{index:06d}-right). With a name
    of 98 characters the pair and its clips reach the server; with 99, or a name that starts with a dot, dash or
    underscore (a folder renamed by hand, then given to --resume), the teacher stops the run when it is made, saying
    what to change, not at its first upload after the pretraining. `new_teacher(name)` makes the script's HumanTeacher
    for the experiment `name`."""
    teacher = new_teacher("r" * 98)
    teacher.ask(*segments(1))
    pair_id = teacher.queued[0]
    teacher.start()
    try:
        wait_for_teacher(teacher, lambda: not teacher.queued, time.time() + 120)
        status, pair = server.call("GET", f"/api/pairs/{pair_id}")
        assert status == 200 and pair["experiment"] == "r" * 98, pair
        assert server.call("GET", f"/clips/{pair_id}-right")[0] == 200
    finally:
        teacher.close()
    with pytest.raises(SystemExit, match=r"99 characters.*at most 98.*--exp-name"):
        new_teacher("r" * 99)
    for name in ["_run", "-run", ".run"]:
        with pytest.raises(SystemExit, match=rf"'{re.escape(name)}'.*start with a letter or a digit.*rename"):
            new_teacher(name)


def start_trainer(cwd, args, script=SCRIPT, cold=False):
    """The script started in the background: (its process, the lines of its output so far, filled by a thread, that
    thread). Start it `cold` to kill it (SIGKILL) at a chosen moment: a warm run dies when its zygote next runs."""
    command = warm_start.command(script, args.split(), cold=cold)
    trainer = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    reader = threading.Thread(target=lambda: output.extend(trainer.stdout), daemon=True)
    reader.start()
    return trainer, output, reader


def assert_the_label_token_stays_out_of_the_logs(cwd, args, script):
    """TensorBoard's settings table is what people share (a screenshot, an events file sent along): --label-token, the
    label server's password, is not in it; the run's other settings are. `args` a human-feedback run; its label
    server is down (the run waits for it, and is killed once the table is written)."""
    trainer, output, reader = start_trainer(cwd, f"{args} --label-server http://127.0.0.1:9 --label-token s3cret", script)
    try:
        deadline = time.time() + 120
        while not (events := [path.read_bytes() for path in Path(cwd).glob("runs/*/events.out.tfevents.*")]) or not any(
            b"label_token" in content for content in events
        ):
            assert time.time() < deadline and trainer.poll() is None, "".join(output)
            time.sleep(0.2)
    finally:
        trainer.kill()  # the settings are written: nothing else of the run is looked at
    reader.join(timeout=30)
    (content,) = events
    assert b"http://127.0.0.1:9" in content  # the settings table, with --label-server
    assert b"s3cret" not in content, "the label token is in the TensorBoard log"


def assert_a_run_killed_after_pretraining_resumes_pretrained(cwd, args, pretrain_steps, script=SCRIPT):
    """The first periodic checkpoint comes after --checkpoint-every iterations of RL; the pretraining before it (the
    label wait, the epochs) has a checkpoint of its own, with its labels, so a run killed (-9) in between resumes at its
    first RL iteration with its reward model pretrained. It could not resume at all ("no checkpoint")."""
    interrupt_run(cwd, args + " --save-model --checkpoint-every 1000", "step ", script=script, sig=signal.SIGKILL)
    run_dir = only_run_dir(cwd)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    figures = checkpoint.get("reward_model_figures") or checkpoint["reward_evaluation"]  # (losses, validation accuracy)
    assert checkpoint["global_step"] == pretrain_steps and 0 <= figures[2] <= 1  # validated: after the pretraining
    resumed = run_script(cwd, f"--resume {run_dir}", script=script)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed {run_dir} at step {pretrain_steps} " in resumed.stdout, resumed.stdout[:2000]
    assert "pretraining" not in resumed.stdout and "pretrained" not in resumed.stdout


def assert_a_run_the_label_server_refuses_saves_and_says_so(cwd, args, label_server, rl_line, script=SCRIPT):
    """A label server restarted with a --token the run was not given answers it 401: the human-feedback thread stops.
    The run stops at the end of its iteration as at Ctrl-C, saves its labels and checkpoint (none was due: the first
    periodic one is far off), and exits with the server's message. It stopped at once, without the end-of-run saving,
    losing every iteration since its last checkpoint. `rl_line`: the start of a progress line of RL (not pretraining)."""
    server = label_server()
    trainer, output, reader = start_trainer(cwd, f"{args} --label-server {server.url} --checkpoint-every 100000", script)
    try:
        with rating_by_script(server):
            deadline = time.time() + 300
            while not any(line.startswith(rl_line) for line in output):  # RL under way, on the rater's labels
                assert time.time() < deadline and trainer.poll() is None, "".join(output)
                time.sleep(0.2)
        server.stop()
        label_server(port=server.port, db=server.db, token="s3cret")  # the run has no token: 401
        assert trainer.wait(timeout=300) == 1, "".join(output)
    finally:
        trainer.kill()
    reader.join(timeout=30)
    log = "".join(output)
    assert "error: the human-feedback thread stopped" in log and "401" in log, log[-3000:]
    assert "checkpoint saved to" in log and "fix that, then --resume goes on" in log  # the end-of-run saving ran
    assert "Traceback" not in log
    run_dir = only_run_dir(cwd)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)  # written by the stop, at its last iteration
    last_step = int(re.findall(r"^step (\d+),", log, re.M)[-1])  # the last iteration's progress line
    assert checkpoint["global_step"] >= last_step, (checkpoint["global_step"], last_step)
    saved = int(re.search(r"^(\d+) labels saved (?:to|in) ", log, re.M)[1])
    # the stop saved them all (the Atari script keeps them in labels/, a file per batch as they arrive)
    files = [run_dir / "labels.npz"] if (run_dir / "labels.npz").exists() else sorted((run_dir / "labels").glob("*.npz"))
    assert files and sum(len(np.load(f)["mu"]) for f in files) == saved, (files, saved)
    with np.load(run_dir / "pending_pairs.npz") as pending:  # and the pairs still waiting for answers
        assert "pair_ids" in pending.files
    return run_dir, checkpoint, log


def assert_a_run_stopped_in_the_label_wait_resumes_where_it_stopped(cwd, args, label_server, episode_steps, envs, script, sig):
    """A human-feedback run stopped (SIGTERM) or killed (SIGKILL) while it waits for its pretraining labels (its last
    pretraining rollout acted, that rollout's pairs asked) resumes from the iteration before that rollout, with the
    environments as they were then. A stopped run's checkpoint held the environments a rollout further on: the resumed
    run acted that rollout again from there, and those steps were never counted; a killed one had none, or one without
    its labels. Every environment's episodes last `episode_steps` steps (a time limit, no other end), so they end at the
    run's steps that are multiples of episode_steps x `envs`, the resumed run's too. A rater answered all the pairs
    the run waits for but one before it stopped, each against the true returns: the resumed run takes every one of
    those answers (a killed run had not saved the last rollout's pairs as asked: it asked them again under new ids,
    and the answers people gave during the wait reached no run)."""
    server = label_server()
    trainer, output, reader = start_trainer(
        cwd, f"{args} --label-server {server.url} --save-model", script, cold=sig == signal.SIGKILL
    )
    try:
        waited_for = answer_all_but_one_pair_the_run_waits_for(trainer, output, server)
        trainer.send_signal(sig)
        assert trainer.wait(timeout=120) == (0 if sig == signal.SIGTERM else -sig), "".join(output)
    finally:
        trainer.kill()
    reader.join(timeout=30)
    if sig == signal.SIGTERM:
        assert any(line.startswith("interrupted at step") for line in output), "".join(output)
        assert any(line.startswith("checkpoint of step ") and " kept " in line for line in output), "".join(output)
    run_dir = only_run_dir(cwd)
    with rating_by_script(server):
        resumed = run_script(cwd, f"--resume {run_dir}", script=script)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    ends = scalars(run_dir)["charts/episodic_length"]
    assert ends and {length for _, length in ends} == {episode_steps}, ends
    assert max(step for step, _ in ends) > checkpoint_step(resumed.stdout)  # the resumed run's episodes among them
    # TensorBoard shows each episode once: every environment's at every multiple, none lost, none of the acted-again
    # rollout twice (the stopped run had logged its episodes too)
    every_end = range(episode_steps * envs, max(step for step, _ in ends) + 1, episode_steps * envs)
    assert Counter(step for step, _ in ends) == {step: envs for step in every_end}, ends
    assert_the_settings_show_once_per_start(run_dir, checkpoint_step(resumed.stdout))
    with np.load(run_dir / "labels.npz") as labels:  # the rater of the resumed run answers by the true returns
        returns = labels["true_reward"].astype(np.float64).sum(-1)
        assert_the_answers_given_in_the_wait_were_taken(labels["mu"], returns[:, 0] - returns[:, 1], waited_for)


def answer_all_but_one_pair_the_run_waits_for(trainer, output, server):
    """Once the run (`trainer`, printing into `output`) waits for its pretraining labels, a rater answers every pair
    it waits for but one, each against the true returns (the run still waits). Returns how many it waited for."""
    deadline = time.time() + 300
    while not any(line.startswith("waiting for ") for line in output):  # no rater yet: the run waits
        assert time.time() < deadline and trainer.poll() is None, "".join(output)
        time.sleep(0.2)
    waited_for = int(re.search(r"^waiting for (\d+) labels", "".join(output), re.M)[1])
    answer_against_the_true_returns(server, waited_for - 1, deadline)
    return waited_for


def assert_the_answers_given_in_the_wait_were_taken(mu, true_return_differences, waited_for):
    """The run's labels (`mu`, and left minus right true return per pair) hold every answer given against the true
    returns in the wait (answer_all_but_one_pair_the_run_waits_for), and no other answer goes against them."""
    against = (mu != np.sign(true_return_differences) / 2 + 0.5).sum()
    assert against == waited_for - 1, f"{against} of the {waited_for - 1} answers given in the wait were taken"


def answer_against_the_true_returns(server, count, deadline):
    """A rater answers `count` pairs, each the other way from the true returns in its metadata (left on a tie)."""
    while count:
        assert time.time() < deadline, f"{count} pairs still to answer"
        status, pair = server.call("GET", "/api/pairs/next?rater=contrary")
        if status == 204:  # the next pairs are still being rendered and posted
            time.sleep(0.2)
            continue
        meta = server.call("GET", f"/api/pairs/{pair['pair_id']}")[1]["metadata"]
        choice = "right" if meta["left_true_return"] > meta["right_true_return"] else "left"
        assert (
            server.call("POST", "/api/labels", {"pair_id": pair["pair_id"], "rater": "contrary", "choice": choice})[0] == 201
        )
        count -= 1


def checkpoint_step(stdout):
    return int(re.search(r"^resumed \S+ at step (\d+)", stdout, re.M)[1])


def assert_a_run_folder_given_as_a_dot_keeps_its_name(tmp_path, monkeypatch, new_teacher):
    """`--resume .` from inside a run folder: the experiment is the folder's name, as from outside it, not "." (which
    the label server's ids cannot start with). `new_teacher(run_dir)` makes the script's HumanTeacher for `run_dir` the
    way the script does."""
    run_dir = tmp_path / "Env-v0__exp__1__1700000000"
    run_dir.mkdir()
    assert new_teacher(str(run_dir)).experiment == run_dir.name
    monkeypatch.chdir(run_dir)
    assert new_teacher(".").experiment == run_dir.name


def assert_a_kill_between_the_labels_and_the_pending_pairs_adds_no_answer_twice(
    server, monkeypatch, new_teacher, segments, store, resume
):
    """A human-feedback run is killed while saving, after its labels file was written and before its unanswered pairs
    were (kill -9, a second Ctrl-C), and stopped again right after its --resume. On the next --resume the answers already
    in the saved labels are not taken again, and an answer given while the run was down still arrives. `new_teacher()` and `segments(n)` as in
    assert_a_resumed_teacher_keeps_pairs_and_answers_apart; `store(teacher)` takes the teacher's answers into the run's
    label buffer and saves the labels and the teacher's pairs, as the script does; `resume(teacher)` loads a new label
    buffer and the teacher from the run folder, as the script does on --resume, and returns the buffer's label count."""
    teacher = new_teacher()
    teacher.ask(*segments(3))
    teacher.start()
    deadline = time.time() + 120
    wait_for_teacher(teacher, lambda: not teacher.queued, deadline)  # every pair posted
    store(teacher)  # a save in step: no label, three pairs waiting
    posted = sorted(teacher.waiting)
    for pair_id in posted[:2]:
        assert server.call("POST", "/api/labels", {"pair_id": pair_id, "rater": "r", "choice": "left"})[0] == 201
    wait_for_teacher(teacher, lambda: teacher.unanswered == 1, deadline)  # both answers fetched

    real_replace = os.replace

    def replace_then_die(source, target):  # the process dies as soon as its first file is in place
        real_replace(source, target)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace_then_die)
    with contextlib.suppress(KeyboardInterrupt):
        store(teacher)
    monkeypatch.setattr(os, "replace", real_replace)
    teacher.stop.set()
    teacher.thread.join(timeout=60)
    assert server.call("POST", "/api/labels", {"pair_id": posted[2], "rater": "r", "choice": "right"})[0] == 201

    stopped_again = new_teacher()
    assert resume(stopped_again) == 2
    store(stopped_again)  # stopped again at once (a second Ctrl-C), before its thread fetched the answers it must drop
    resumed = new_teacher()
    assert resume(resumed) == 2
    resumed.start()
    try:
        received = []
        while resumed.pending:
            assert time.time() < deadline and resumed.failure is None, resumed.failure
            for _, _, mu in resumed.poll():
                received.extend(mu.tolist())
            time.sleep(0.01)
        assert received == [0.0], received  # the third pair's answer only: the first two are in the labels already
    finally:
        resumed.close()


def assert_the_fields_computed_at_run_time_are_not_flags(args_class, fields, capsys):
    """The fields of Args that fill_runtime_fields computes were flags (CleanRL's Args shows them too), and a value
    given was overwritten unseen: `--batch-size 4096` ran batches of --num-envs x --num-steps. Now refused, and not in
    --help."""
    import tyro

    for field in fields:
        flag = f"--{field.replace('_', '-')}"
        assert hasattr(args_class(), field)
        with pytest.raises(SystemExit):
            tyro.cli(args_class, args=[flag, "7"])
        assert f"Unrecognized options: {flag}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tyro.cli(args_class, args=["--help"])
    shown = capsys.readouterr().out
    assert "--num-envs" in shown and not [field for field in fields if f"--{field.replace('_', '-')}" in shown]


# a label server restarted: the checks each script's human teacher runs (each takes label_server, new_teacher, segments)
LABEL_SERVER_RESTART_CHECKS = [
    assert_a_teacher_whose_label_server_lost_its_pairs_stops,
    assert_a_pair_posted_to_another_database_stops_the_teacher_once_the_right_one_is_back,
    assert_a_reply_cut_short_is_retried,
]

# a run's stop and its end: what each script's human teacher keeps (each takes server, new_teacher(), segments), with the
# teacher's poll interval (the end's check needs one longer than the test: answers come after the thread's last fetch)
# and the label server's flags (it holds each label back for --undo-seconds, 0 unless given: a rater may take it back)
TEACHER_STOP_AND_END_CHECKS = [
    pytest.param(assert_a_resumed_teacher_keeps_pairs_and_answers_apart, 0.2, (), id="resumed"),
    pytest.param(assert_a_finished_run_keeps_the_answers_given_before_it_ended, 3600, (), id="finished"),
    pytest.param(
        assert_a_finished_run_keeps_the_answers_given_before_it_ended, 3600, ("--undo-seconds", "2"), id="finished_undo"
    ),
]
