"""benchmark/sweep.py: a grid of runs on this machine (skipping finished runs, resuming stopped ones), its report from
the logs, and the same grid as a Slurm job array on a one-node cluster that the test starts and stops."""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmark" / "sweep.py"
sys.path.insert(0, str(ROOT / "benchmark"))
from plot import progress  # noqa: E402

# the moving dot at its smallest: 2 pretraining rollouts of 4 envs x 64 steps, then 4 RL iterations (a few seconds)
TINY_FLAGS = "--num-envs 4 --num-steps 64 --pretrain-steps 512 --segment-len 5 --episode-steps 100"
TINY_FLAGS += " --pretrain-epochs 5 --reward-eval-every 2"
# 16 iterations of 256 steps: with a checkpoint every iteration, a stop lands in the middle
STOPPABLE_STEPS = 4096


def write_grid(folder, steps=1536, **changes):
    grid = {
        "script": "rlhf_moving_dot.py",
        "env_flag": "--observation",
        "envs": {"position": {}},
        "feedback": ["true", 30],
        "seeds": [1],
        "steps": steps,
        "flags": TINY_FLAGS,
    } | changes
    path = folder / "grid.json"
    path.write_text(json.dumps(grid))
    return path


def sweep(*args, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, str(SWEEP), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def start_sweep(*args, stderr=subprocess.PIPE):
    """`sweep.py ARGS` as a process in the background, its output read as text."""
    command = [sys.executable, str(SWEEP), *map(str, args)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)


def write_run_log(out, name, returns, done=True):
    """A run's folder as the runner leaves it: a progress line per 1000 steps with these true returns (and done.json)."""
    (out / name).mkdir(parents=True, exist_ok=True)
    lines = [f"step {1000 * (i + 1)}, SPS 100, true return {value:.1f}" for i, value in enumerate(returns)]
    (out / name / "run.log").write_text("\n".join(lines) + "\n")
    if done:
        (out / name / "done.json").write_text("{}\n")


def final_step(log):
    steps, _, _ = progress(log)
    return steps[-1]


def test_a_local_sweep_runs_each_run_once_and_reports_from_the_logs(tmp_path):
    grid, out = write_grid(tmp_path), tmp_path / "out"
    result = sweep("local", grid, "--out", out, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 of 2 runs done; running 2" in result.stdout
    for name in ("position__true__1", "position__labels30__1"):
        assert json.loads((out / name / "done.json").read_text())["attempts"] == 1
        assert final_step(out / name / "run.log") == 1536
    assert "--feedback true-reward" in (out / "position__true__1" / "run.log").read_text().splitlines()[0]
    assert "--labels 30" in (out / "position__labels30__1" / "run.log").read_text().splitlines()[0]

    # the table holds each run's last logged return, and the RLHF run's ratio to the true-reward run
    last = {name: progress(out / name / "run.log")[1][-1] for name in ("position__true__1", "position__labels30__1")}
    table = (out / "table.md").read_text()
    assert f"| {last['position__true__1']:.1f} ± 0.0 |" in table
    ratio = last["position__labels30__1"] / last["position__true__1"]
    assert re.search(rf"\| 30 labels \| 1 \(1\) \| {last['position__labels30__1']:.1f} ± 0.0 \| {ratio:.2f} \|", table)
    assert (out / "figure.png").stat().st_size > 10_000

    # the same command again: nothing left to run, no run started again
    logs_before = {name: (out / name / "run.log").read_text() for name in last}
    again = sweep("local", grid, "--out", out)
    assert again.returncode == 0 and "2 of 2 runs done; running 0" in again.stdout, again.stderr
    assert {name: (out / name / "run.log").read_text() for name in last} == logs_before


def wait_until(condition, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and not condition():
        time.sleep(0.2)
    return condition()


def alive(pid):
    """Whether the process runs (a zombie, exited but not reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def processes(matching):
    """The processes (but this one) for which `matching(their /proc folder)` holds."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            matched = matching(proc)
        except OSError:  # gone meanwhile
            continue
        if matched and int(proc.name) != os.getpid() and alive(proc.name):
            found.append(int(proc.name))
    return found


def processes_under(folder):
    """The processes that name `folder` or run in it: sweeps and tasks name it, the scripts run in a run folder in it."""
    return processes(
        lambda proc: str(folder) in proc.joinpath("cmdline").read_text() or str(folder) in os.readlink(proc / "cwd")
    )


def kill(pids):
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop_processes_under(folder):
    """Kill what a test left running in `folder`."""
    kill(processes_under(folder))


def logged_steps(log):
    return log.exists() and re.search(r"^step [1-9]\d{3},", log.read_text(), re.M) is not None


def stop_the_labelled_run_midway(grid, out, index=1, name="position__labels30__1"):
    """Start the grid's run `index` as a task and stop it as Slurm does at a time limit; its log so far."""
    log = out / name / "run.log"
    task = subprocess.Popen(
        [sys.executable, str(SWEEP), "task", str(grid), "--index", str(index), "--out", str(out)], cwd=ROOT
    )
    wait_until(lambda: logged_steps(log), 120)
    task.send_signal(signal.SIGTERM)  # the run saves at the end of its iteration
    assert task.wait(timeout=60) == 0
    first = log.read_text()
    assert "interrupted at step" in first
    return first


GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def staged_by_git_add(folder):
    """The files `git add .` in `folder` (a fresh repository, runs/ and run.lock ignored as in ours) would stage."""
    if not (folder / ".git").exists():
        subprocess.run([*GIT, "init", "-q", str(folder)], check=True)
        (folder / ".gitignore").write_text("runs/\nrun.lock\n")
    subprocess.run([*GIT, "add", "."], cwd=folder, check=True)
    listed = subprocess.run([*GIT, "diff", "--cached", "--name-only"], cwd=folder, capture_output=True, text=True, check=True)
    return set(listed.stdout.split()) - {".gitignore"}  # the repository's own


def test_a_stopped_run_goes_on_from_its_checkpoint_when_run_again(tmp_path):
    """...and until it is done, `git add` of the sweep's folder leaves it out: a partial run.log is not committed (a
    later checkout of that folder would replace the files under a running script)."""
    grid, out = write_grid(tmp_path, steps=STOPPABLE_STEPS, flags=TINY_FLAGS + " --checkpoint-every 1"), tmp_path / "out"
    log = out / "position__labels30__1" / "run.log"
    first = stop_the_labelled_run_midway(grid, out)
    stopped_at = int(re.search(r"interrupted at step (\d+)", first)[1])
    assert 1024 <= stopped_at < STOPPABLE_STEPS
    status = sweep("status", grid, "--out", out)
    assert "stopped: 1\n  position__labels30__1" in status.stdout
    assert not any(name.startswith("position__labels30__1/") for name in staged_by_git_add(out))

    again = sweep("task", grid, "--index", 1, "--out", out)
    assert again.returncode == 0, again.stderr
    second = log.read_text()[len(first) :]
    # the code each attempt ran (a resumed run goes on with the code of its resumption)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert commit and f"\n# code: commit {commit}" in first and f"\n# code: commit {commit}" in second, (first, second)
    assert "resumed: " in second.splitlines()[0] and " --resume runs/MovingDot-v0-position__sweep__1__" in second
    assert "resumed runs/MovingDot-v0-position__sweep__1__" in second
    first_step_after = int(re.search(r"^step (\d+),", second, re.M)[1])
    assert first_step_after == stopped_at + 256  # on from where it stopped, not from the start
    assert final_step(log) == STOPPABLE_STEPS
    assert json.loads((log.parent / "done.json").read_text())["attempts"] == 2
    assert len(list((log.parent / "runs").iterdir())) == 1  # the same run folder, resumed
    done_files = {name for name in staged_by_git_add(out) if name.startswith("position__labels30__1/")}
    assert done_files == {"position__labels30__1/run.log", "position__labels30__1/done.json"}
    # a task killed between done.json and removing the .gitignore: the next sweep finds the run done and removes it
    (log.parent / ".gitignore").write_text("*\n")
    assert sweep("task", grid, "--index", 1, "--out", out).returncode == 0
    assert not (log.parent / ".gitignore").exists()


def memory_of(pid):
    """A process's resident memory (MiB) and whether it has torch's library loaded."""
    resident = int(re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)[1]) / 1024
    return resident, "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_a_runs_task_keeps_none_of_its_scripts_imports_while_the_run_goes_on(tmp_path):
    """A run's task (a local worker's, a Slurm task's) waits beside its run for hours. To log the run's settings as it
    started, and to compare them as it resumed, it imported the run's script: torch and the simulator, about 220 MB
    held for nothing (within a Slurm task's --mem). It reads them in a short-lived process instead."""
    grid, out = write_grid(tmp_path, steps=STOPPABLE_STEPS, flags=TINY_FLAGS + " --checkpoint-every 1"), tmp_path / "out"
    log = out / "position__labels30__1" / "run.log"

    def steps_logged_since(attempt):  # a progress line after the task's "started:" or "resumed:" line
        text = log.read_text() if log.exists() else ""
        return f"{attempt}: " in text and re.search(r"^step \d+,", text.rsplit(f"{attempt}: ")[-1], re.M)

    for attempt in ("started", "resumed"):
        task = subprocess.Popen([sys.executable, str(SWEEP), "task", grid, "--index", "1", "--out", out], cwd=ROOT)
        try:
            assert wait_until(lambda: steps_logged_since(attempt), 120), log.read_text()
            resident, torch = memory_of(task.pid)
        finally:
            task.send_signal(signal.SIGTERM)
            assert task.wait(timeout=60) == 0
        assert not torch and resident < 100, f"the task {attempt} holds {resident:.0f} MiB, torch loaded: {torch}"
    assert "settings: " in log.read_text()  # logged as the run started


def test_the_code_a_run_starts_with_names_the_commit_and_a_script_changed_since(tmp_path, monkeypatch):
    import sweep as runner  # noqa: PLC0415 (benchmark/, on the path above)

    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "rlhf_script.py").write_text("print(1)\n")
    subprocess.run([*GIT, "init", "-q", str(repository)], check=True)
    subprocess.run([*GIT, "add", "."], cwd=repository, check=True)
    subprocess.run([*GIT, "commit", "-qm", "first"], cwd=repository, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(runner, "ROOT", repository)
    assert runner.code_version(str(repository / "rlhf_script.py")) == f"commit {head}"
    (repository / "rlhf_script.py").write_text("print(2)\n")
    assert runner.code_version(str(repository / "rlhf_script.py")) == f"commit {head}, rlhf_script.py changed since"
    monkeypatch.setattr(runner, "ROOT", tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    assert runner.code_version(str(tmp_path / "elsewhere" / "rlhf_script.py")).startswith("unknown")


def test_a_run_whose_partial_log_git_tracks_is_refused_until_it_is_untracked(tmp_path):
    """The .gitignore that keeps a run under way out of `git add` cannot untrack a file git already tracks (a partial
    run.log committed by hand): running it would put a partial log in the next commit, so the sweep says how to untrack
    it and starts nothing; untracked, the run goes on and is committed when done."""
    grid, out = write_grid(tmp_path, feedback=["true"]), tmp_path / "out"
    folder = out / "position__true__1"
    write_run_log(out, "position__true__1", [-50.0, -40.0], done=False)
    partial = (folder / "run.log").read_text()
    assert staged_by_git_add(out) == {"position__true__1/run.log"}
    subprocess.run([*GIT, "commit", "-qm", "a partial run"], cwd=out, check=True)

    refused = sweep("local", grid, "--out", out, "--workers", 1)
    assert refused.returncode == 1
    assert f"git tracks run.log in {folder}" in refused.stderr
    assert f"git rm -r --cached {folder}" in refused.stderr
    assert (folder / "run.log").read_text() == partial  # nothing ran
    assert not (folder / "runs").exists() and not (folder / ".gitignore").exists()

    subprocess.run([*GIT, "rm", "-rq", "--cached", str(folder)], cwd=out, check=True)
    subprocess.run([*GIT, "commit", "-qm", "untracked"], cwd=out, check=True)
    again = sweep("local", grid, "--out", out, "--workers", 1)
    assert again.returncode == 0, again.stderr
    assert final_step(folder / "run.log") == 1536
    assert staged_by_git_add(out) >= {"position__true__1/run.log", "position__true__1/done.json"}


def test_done_json_counts_the_runs_attempts_since_its_last_start_and_their_logged_time(tmp_path):
    """A run is resumed after its script died after a checkpoint (killed; or SIGTERMed while it shut down, exit -15)
    and after its task was killed outright (no exit line): done.json counts those attempts, and the time of those that
    logged it, beside the one that finished; not a start that failed before its first checkpoint (started again)."""
    grid, out = write_grid(tmp_path, steps=STOPPABLE_STEPS, flags=TINY_FLAGS + " --checkpoint-every 1"), tmp_path / "out"
    folder = out / "position__labels30__1"
    folder.mkdir(parents=True)  # a first start that failed before any checkpoint: the run starts again
    (folder / "run.log").write_text("# 2026-01-01 00:00:00 UTC, started: python script\nerror\n# exit 1, wall_s 1.5\n")
    (folder / "runs" / "Env__exp__1__2").mkdir(parents=True)  # what it left: no checkpoint (put aside now)
    (folder / "runs" / "Env__exp__1__1.failed-1700000000").mkdir()  # and a start before it, put aside then
    task = subprocess.Popen([sys.executable, str(SWEEP), "task", str(grid), "--index", "1", "--out", str(out)], cwd=ROOT)
    try:
        assert wait_until(lambda: logged_steps(folder / "run.log") and any(folder.glob("runs/*/checkpoint.pt")), 120)
        set_aside = sorted(p.name for p in (folder / "runs").iterdir() if ".failed-" in p.name)
        assert set_aside[0] == "Env__exp__1__1.failed-1700000000" and re.fullmatch(r"Env__exp__1__2\.failed-\d+", set_aside[1])
        assert len(set_aside) == 2, set_aside  # each start's folder put aside once, under its own name
        script = processes(
            lambda proc: (
                "rlhf_moving_dot.py" in proc.joinpath("cmdline").read_text() and os.readlink(proc / "cwd") == str(folder)
            )
        )
        assert script, "the run's script was not found"
        kill(script)
        assert task.wait(timeout=60) == 1  # the task reports the run failed; its checkpoint is kept
    finally:
        stop_processes_under(tmp_path)
    first_wall = float(re.search(r"^# exit -9, wall_s ([\d.]+)$", (folder / "run.log").read_text(), re.M)[1])
    with open(folder / "run.log", "a") as log:  # what a task killed with its script leaves: a resume with no exit line
        log.write("# 2026-01-01 00:10:00 UTC, resumed: python script --resume runs/x\nstep 2048, SPS 1\n")

    again = sweep("task", grid, "--index", 1, "--out", out)
    assert again.returncode == 0, again.stderr
    log = (folder / "run.log").read_text()
    assert final_step(folder / "run.log") == STOPPABLE_STEPS
    second_wall = float(re.findall(r"^# exit 0, wall_s ([\d.]+)$", log, re.M)[-1])
    done = json.loads((folder / "done.json").read_text())
    assert (done["attempts"], done["untimed_attempts"]) == (3, 1)
    assert done["wall_s"] == pytest.approx(first_wall + second_wall, abs=0.05)


def test_a_local_sweep_in_the_background_stops_its_runs_when_killed(tmp_path):
    """`nohup python benchmark/sweep.py local GRID &` in a script, then `kill PID`: a shell starts a background job with
    Ctrl-C ignored, so SIGTERM must stop the runs (each saves) by itself, not through Ctrl-C's handler. The sweep
    then exits as a killed program does (128 + 15), so `sweep.py local A && sweep.py local B` does not go on to B."""
    grid = write_grid(tmp_path, steps=50_000_000, flags=TINY_FLAGS + " --checkpoint-every 1")
    out, sweep_log = tmp_path / "out", tmp_path / "sweep.log"
    logs = [out / name / "run.log" for name in ("position__true__1", "position__labels30__1")]
    command = f"nohup {shlex.quote(sys.executable)} {SWEEP} local {grid} --out {out} --workers 2 > {sweep_log} 2>&1 &"
    command += " echo $!; wait $!; echo $?"  # the shell waits for its background job, and says how it ended
    shell = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pid = int(shell.stdout.readline())
    try:
        assert wait_until(lambda: all(logged_steps(log) for log in logs), 180), sweep_log.read_text()
        os.kill(pid, signal.SIGTERM)
        assert wait_until(lambda: not alive(pid), 90), "the sweep went on after SIGTERM: " + sweep_log.read_text()
        assert int(shell.communicate(timeout=30)[0]) == 128 + signal.SIGTERM
        assert "stopping: each run saves at the end of its iteration" in sweep_log.read_text()
        for log in logs:
            text = log.read_text()
            assert "interrupted at step" in text and re.search(r"^# exit 0, wall_s", text, re.M), text[-2000:]
        sizes = [log.stat().st_size for log in logs]
        time.sleep(3)
        assert [log.stat().st_size for log in logs] == sizes  # no run goes on without its sweep
    finally:
        stop_processes_under(tmp_path)


def script_of(run_folder):
    """The pid of the training script running in `run_folder` (the runner starts it there), once it runs."""

    def running_there():
        return processes(lambda proc: os.readlink(proc / "cwd") == str(run_folder))

    assert wait_until(running_there, 60) and len(running_there()) == 1, running_there()
    return running_there()[0]


def test_a_run_stopped_by_something_else_than_the_sweep_is_named_as_not_done(tmp_path):
    """`kill` of a training script (by hand, by a system's stop): the run saves and exits 0 like a finished one. The
    sweep wrote its report and exited 0, as if the grid were complete."""
    grid = write_grid(tmp_path, steps=50_000_000, feedback=["true"], flags=TINY_FLAGS + " --checkpoint-every 1")
    out = tmp_path / "out"
    log = out / "position__true__1" / "run.log"
    local = start_sweep("local", grid, "--out", out)
    try:
        assert wait_until(lambda: logged_steps(log), 180)
        os.kill(script_of(out / "position__true__1"), signal.SIGTERM)
        stdout, stderr = local.communicate(timeout=120)
        assert local.returncode == 1 and "interrupted at step" in log.read_text(), stdout + stderr
        assert "1 run(s) not done: position__true__1" in stderr, stderr
        assert "| true reward | 1 (0) |" in (out / "table.md").read_text()  # its report counts the run as not done
    finally:
        stop_processes_under(tmp_path)


def test_a_sweep_stopped_after_a_run_failed_exits_as_stopped_and_names_the_failed_run(tmp_path):
    """A failed run, then the sweep stopped (`kill`): it exited 1, and a wrapper could not tell "stopped: resume" from
    "failed". It exits 128 + 15 as a killed program, after naming the run that failed."""
    grid = write_grid(tmp_path, steps=50_000_000, flags=TINY_FLAGS + " --checkpoint-every 1")
    out = tmp_path / "out"
    logs = [out / name / "run.log" for name in ("position__true__1", "position__labels30__1")]
    local = start_sweep("local", grid, "--out", out, "--workers", 2)
    try:
        assert wait_until(lambda: all(logged_steps(log) for log in logs), 180)
        os.kill(script_of(out / "position__true__1"), signal.SIGKILL)  # the run fails: no checkpoint of its end
        assert wait_until(lambda: re.search(r"^# exit -9,", logs[0].read_text(), re.M), 60)
        local.send_signal(signal.SIGTERM)  # before or after the sweep has seen its task end: the same
        stdout, stderr = local.communicate(timeout=120)
        assert local.returncode == 128 + signal.SIGTERM, stdout + stderr
        assert "1 run(s) not done: position__true__1" in stderr and "interrupted at step" in logs[1].read_text(), stderr
    finally:
        stop_processes_under(tmp_path)


def test_a_run_under_way_is_not_started_a_second_time(tmp_path):
    """A second sweep over the same folder (another terminal; a sweep started again while a killed one's runs go on)
    must leave a running run alone: two processes of one run would write one log and one checkpoint."""
    grid = write_grid(tmp_path, steps=50_000_000, feedback=["true"], flags=TINY_FLAGS + " --checkpoint-every 1")
    out = tmp_path / "out"
    log = out / "position__true__1" / "run.log"
    task = subprocess.Popen([sys.executable, str(SWEEP), "task", str(grid), "--index", "0", "--out", str(out)], cwd=ROOT)
    try:
        assert wait_until(lambda: logged_steps(log), 180)
        assert not staged_by_git_add(out)  # nothing of a run under way for `git add` to commit
        second = sweep("task", grid, "--index", 0, "--out", out, timeout=60)
        assert second.returncode == 1
        assert "position__true__1 is running already" in second.stderr and f"process {task.pid}" in second.stderr
        assert "running: 1\n  position__true__1" in sweep("status", grid, "--out", out).stdout

        task.kill()  # the task dies without a word (kill -9); its run goes on, and is still not started twice
        task.wait()
        local = sweep("local", grid, "--out", out, timeout=60)
        assert "position__true__1 is running already" in local.stderr
        assert len(re.findall(r"^# .* UTC, (?:started|resumed): ", log.read_text(), re.M)) == 1
    finally:
        stop_processes_under(tmp_path)


def test_a_file_system_without_locks_runs_the_run_unguarded_with_a_warning(tmp_path):
    """Some cluster file systems refuse flock (Lustre without its flock option): the run must go on, not crash."""
    grid, out = write_grid(tmp_path, feedback=["true"]), tmp_path / "out"
    without_locks = (
        "import errno, fcntl, runpy, sys\n"
        "def refuse(*args): raise OSError(errno.ENOSYS, 'Function not implemented')\n"
        "fcntl.flock = refuse\n"
        f"sys.argv = [{str(SWEEP)!r}, 'task', {str(grid)!r}, '--index', '0', '--out', {str(out)!r}]\n"
        f"runpy.run_path({str(SWEEP)!r}, run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", without_locks], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "warning: cannot lock" in result.stderr and "Function not implemented" in result.stderr
    assert "Traceback" not in result.stderr
    assert final_step(out / "position__true__1" / "run.log") == 1536
    assert (out / "position__true__1" / "done.json").exists()


def test_a_stopped_run_whose_settings_the_grid_changed_is_refused_and_kept(tmp_path):
    """A checkpoint resumes with the settings it was started with: a grid whose steps (or flags) changed since would
    silently finish the run at the old ones, so the sweep says so and leaves the run as it is."""
    grid, out = write_grid(tmp_path, steps=STOPPABLE_STEPS, flags=TINY_FLAGS + " --checkpoint-every 1"), tmp_path / "out"
    folder = out / "position__labels30__1"
    first = stop_the_labelled_run_midway(grid, out)
    checkpoints = sorted(p.stat().st_mtime for p in folder.glob("runs/*/checkpoint.pt"))
    write_grid(tmp_path, steps=2 * STOPPABLE_STEPS, flags=TINY_FLAGS + " --checkpoint-every 1")

    again = sweep("task", grid, "--index", 1, "--out", out)
    assert again.returncode == 1
    assert "position__labels30__1 was started with other settings than the grid's" in again.stderr
    assert f"--total-timesteps {STOPPABLE_STEPS} (the grid: {2 * STOPPABLE_STEPS})" in again.stderr
    assert f"delete {folder}" in again.stderr
    assert (folder / "run.log").read_text() == first  # nothing ran
    assert sorted(p.stat().st_mtime for p in folder.glob("runs/*/checkpoint.pt")) == checkpoints
    assert not (folder / "done.json").exists()


def test_a_finished_run_whose_settings_the_grid_changed_is_refused_not_reported_as_the_grids(tmp_path):
    """A grid edited after its runs finished (steps, flags), or another grid's runs in the same --out: the runs done at
    the old settings would be skipped as done and reported as the grid's. The sweep names them and runs nothing."""
    grid, out = write_grid(tmp_path), tmp_path / "out"
    assert sweep("local", grid, "--out", out, "--workers", 2).returncode == 0
    logs = {name: (out / name / "run.log").read_text() for name in ("position__true__1", "position__labels30__1")}
    table = (out / "table.md").read_text()
    write_grid(tmp_path, steps=3072)

    for command in (["report"], ["local"], ["slurm", "--dry-run"]):
        result = sweep(*command, grid, "--out", out)
        assert result.returncode != 0 and "Traceback" not in result.stderr, command
        assert "2 finished runs of the grid" in result.stderr, result.stderr
        for name in logs:
            assert f"{name}: --total-timesteps 1536 (the grid: 3072)" in result.stderr
        assert f"delete their folders in {out}" in result.stderr
    assert {name: (out / name / "run.log").read_text() for name in logs} == logs  # nothing ran
    assert (out / "table.md").read_text() == table and not (out / "slurm_array.sh").exists()
    status = sweep("status", grid, "--out", out)  # shows them apart from the grid's finished runs
    assert status.returncode == 0 and "done: 0\n" in status.stdout, status.stdout
    assert "done with other settings than the grid's (local, slurm and report refuse them): 2\n" in status.stdout
    for name in logs:
        assert f"\n  {name}: --total-timesteps 1536 (the grid: 3072)" in status.stdout


def test_a_finished_run_whose_script_changed_a_default_since_is_not_reported_as_the_grids(tmp_path):
    """The grid's command line can stay the same while its script's defaults change (a later version of it): the
    command lines, read with today's defaults, were the same, and the runs done at the old default were skipped as
    done and reported as the grid's. The sweep logs every setting as a run starts and compares those."""
    script = tmp_path / "rlhf_moving_dot.py"  # a copy of the script that the test can change
    shutil.copy(ROOT / "rlhf_moving_dot.py", script)
    grid, out = write_grid(tmp_path, script=str(script), feedback=[30]), tmp_path / "out"
    assert sweep("local", grid, "--out", out, "--workers", 1).returncode == 0
    assert sweep("report", grid, "--out", out).returncode == 0  # the same script: the grid's
    source = script.read_text()
    assert source.count("    learning_rate: float = 2.5e-4\n") == 1
    script.write_text(source.replace("    learning_rate: float = 2.5e-4\n", "    learning_rate: float = 3e-4\n"))
    report = sweep("report", grid, "--out", out)
    assert report.returncode != 0 and "Traceback" not in report.stderr, report.stderr
    assert "position__labels30__1: --learning-rate 0.00025 (the grid: 0.0003)" in report.stderr, report.stderr
    # a flag the script gains after the run, which the grid then sets: the run read no such flag, as at its default
    added = '    learning_rate: float = 2.5e-4\n    new_setting: int = 0\n    """a flag added after the run"""\n'
    script.write_text(source.replace("    learning_rate: float = 2.5e-4\n", added))
    write_grid(tmp_path, script=str(script), feedback=[30], flags=TINY_FLAGS + " --new-setting 1")
    report = sweep("report", grid, "--out", out)
    assert report.returncode != 0 and "Traceback" not in report.stderr, report.stderr
    assert "position__labels30__1: --new-setting 0 (the grid: 1)" in report.stderr, report.stderr


def test_a_finished_true_reward_run_is_the_grids_whatever_the_flags_only_labelled_runs_read(tmp_path):
    """Grids that differ only in flags of the preference learning (the label schedule, the reward model) share their
    true-reward runs: those never read them. A flag the true reward run does read is a different run, and a value
    written another way (2e5, 200000) or a flag at its default the same run."""
    grid, out = write_grid(tmp_path, feedback=["true"]), tmp_path / "out"
    assert sweep("local", grid, "--out", out).returncode == 0
    log = (out / "position__true__1" / "run.log").read_text()

    write_grid(tmp_path, feedback=["true"], flags=TINY_FLAGS + " --schedule-horizon 5e4 --selection random --gamma 0.99")
    again = sweep("local", grid, "--out", out)
    assert again.returncode == 0, again.stderr
    assert "1 of 1 runs done; running 0" in again.stdout
    assert (out / "position__true__1" / "run.log").read_text() == log

    write_grid(tmp_path, feedback=["true"], flags=TINY_FLAGS + " --gamma 0.95")
    refused = sweep("report", grid, "--out", out)
    assert refused.returncode != 0 and "position__true__1: --gamma 0.99 (the grid: 0.95)" in refused.stderr


def test_a_stopped_true_reward_run_resumes_whatever_the_flags_only_labelled_runs_read(tmp_path):
    """As for finished runs: a stopped true-reward run is compared with the grid without the preference-learning flags,
    so a grid that differs only there resumes it rather than refusing it."""
    flags = TINY_FLAGS + " --checkpoint-every 1"
    grid, out = write_grid(tmp_path, steps=STOPPABLE_STEPS, feedback=["true"], flags=flags), tmp_path / "out"
    stop_the_labelled_run_midway(grid, out, index=0, name="position__true__1")
    write_grid(tmp_path, steps=STOPPABLE_STEPS, feedback=["true"], flags=flags + " --schedule-horizon 5e4")
    again = sweep("task", grid, "--index", 0, "--out", out)
    assert again.returncode == 0, again.stderr
    assert "resumed: " in (out / "position__true__1" / "run.log").read_text()
    assert (out / "position__true__1" / "done.json").exists()


def test_a_grid_with_a_flag_its_script_does_not_take_says_so_not_that_its_finished_runs_differ(tmp_path):
    grid, out = write_grid(tmp_path, feedback=["true"]), tmp_path / "out"
    assert sweep("local", grid, "--out", out).returncode == 0
    write_grid(tmp_path, feedback=["true"], flags=TINY_FLAGS + " --gama 0.95")
    result = sweep("report", grid, "--out", out)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "run position__true__1 of the grid" in result.stderr and "cannot start" in result.stderr, result.stderr
    assert "--gama" in result.stderr and "delete" not in result.stderr


# one value for each flag sweep.py takes as unread by a true-reward run, other than the script's default (not
# --label-server or --label-token: the scripts refuse them without --feedback human)
UNREAD_BY_TRUE_REWARD_RUNS = {
    "labels": "--labels 70",
    "segment_len": "--segment-len 7",
    "pretrain_fraction": "--pretrain-fraction 0.5",
    "pretrain_steps": "--pretrain-steps 640",
    "pretrain_epochs": "--pretrain-epochs 3",
    "schedule_horizon": "--schedule-horizon 5e4",
    "selection": "--selection random",
    "candidate_multiplier": "--candidate-multiplier 4",
    "pair_pool_rollouts": "--pair-pool-rollouts 3",
    "ensemble_size": "--ensemble-size 2",
    "reward_form": "--reward-form progress",
    "reward_lr": "--reward-lr 0.002",
    "reward_dropout": "--reward-dropout 0.5",
    "reward_input_norm": "--no-reward-input-norm",
    "reward_potential": "--reward-potential",
    "reward_batch_size": "--reward-batch-size 16",
    "reward_updates": "--reward-updates 4",
    "reward_eval_every": "--reward-eval-every 3",
    "reward_std": "--reward-std 2",
    "anchor_absorbing": "--no-anchor-absorbing",
    "label_noise": "--label-noise 0.2",
    "teacher_beta": "--teacher-beta 1",
    "teacher_gamma": "--teacher-gamma 0.9",
    "teacher_epsilon": "--teacher-epsilon 0.1",
    "teacher_skip_threshold": "--teacher-skip-threshold -5",
    "teacher_equal_margin": "--teacher-equal-margin 0.5",
}


@pytest.mark.parametrize(
    "script, tiny",
    [
        ("rlhf_ppo_mujoco.py", "--env Hopper-v4 --total-timesteps 1536 --num-envs 4 --num-steps 128"),
        ("rlhf_moving_dot.py", "--total-timesteps 1536 --num-envs 4 --num-steps 64 --episode-steps 100"),
    ],
)
def test_the_flags_the_sweep_takes_as_unread_by_true_reward_runs_change_nothing_in_them(tmp_path, script, tiny):
    """sweep.py counts a finished true-reward run as the grid's whatever these flags say: a true-reward run with every
    one of them changed ends exactly as one with the script's defaults (the same progress lines, the same policy)."""
    import sweep as runner  # noqa: PLC0415 (benchmark/, on the path above)
    import torch  # noqa: PLC0415
    import tyro  # noqa: PLC0415
    from helpers import only_run_dir, progress_lines, run_script  # noqa: PLC0415

    unread = runner.TRUE_REWARD_RUNS_IGNORE[script]
    changes = [UNREAD_BY_TRUE_REWARD_RUNS[name] for name in unread]
    base = f"{tiny} --feedback true-reward --seed 3 --threads 1 --save-model"
    module = runner.imported_script({"script": script})
    defaults, changed = (vars(tyro.cli(module.Args, args=shlex.split(a))) for a in (base, f"{base} {' '.join(changes)}"))
    assert [name for name in defaults if defaults[name] != changed[name]] == list(unread)  # each flag took a new value

    outputs, agents = [], []
    for folder, args in (("defaults", base), ("changed", f"{base} {' '.join(changes)}")):
        (tmp_path / folder).mkdir()
        result = run_script(tmp_path / folder, args, script=ROOT / script)
        assert result.returncode == 0, result.stderr
        outputs.append(progress_lines(result.stdout, 0))
        agents.append(torch.load(only_run_dir(tmp_path / folder) / "checkpoint.pt", weights_only=False)["agent"])
    assert len(outputs[0]) >= 2 and outputs[1] == outputs[0]
    for name, tensor in agents[0].items():
        assert torch.equal(tensor, agents[1][name]), name


def test_the_report_of_a_batch_under_way_judges_only_the_runs_that_have_finished(tmp_path):
    """A stopped run's log ends early: cutting the finished seeds' curves to its last step would report every seed at
    that step and judge C17's claim on returns from early in training."""
    grid = write_grid(tmp_path, steps=STOPPABLE_STEPS, seeds=[1, 2], flags=TINY_FLAGS + " --checkpoint-every 1")
    out = tmp_path / "out"
    for index in (0, 2):  # position__true__1, position__labels30__1 run to the end
        assert sweep("task", grid, "--index", index, "--out", out).returncode == 0
    stop_the_labelled_run_midway(grid, out, index=3, name="position__labels30__2")

    report = sweep("report", grid, "--out", out)
    assert report.returncode == 0, report.stderr
    table = (out / "table.md").read_text()
    final = {name: progress(out / name / "run.log")[1][-1] for name in ("position__true__1", "position__labels30__1")}
    steps = f"{STOPPABLE_STEPS} (at {STOPPABLE_STEPS})"
    assert f"| position | {steps} | true reward | 2 (1) | {final['position__true__1']:.1f} ± 0.0 |" in table
    assert f"| position | {steps} | 30 labels | 2 (1) | {final['position__labels30__1']:.1f} ± 0.0 |" in table


@pytest.mark.parametrize(
    "change, message",
    [
        ({"script": "rlhf_nothing.py"}, "names a script that is not in"),
        ({"script": 5}, "'script' must be the path of a script in the repository, e.g. \"rlhf_ppo_mujoco.py\", not 5"),
        ({"feedback": ["true", "lots"]}, "feedback must be \"true\" or a positive number of labels, not 'lots'"),
        ({"envs": None}, "has no 'envs'"),  # (taken out below)
        ({"seeds": 3}, "seeds must be a list of whole numbers, not 3"),
        ({"seeds_by_feedback": [1, 2]}, 'seeds_by_feedback must map feedback ("true", "350", ...) to lists of seeds'),
        ({"seeds_by_feedback": {"30": ["1"]}}, "seeds must be a list of whole numbers, not ['1']"),
        # each a traceback, or runs with flags no script takes ("--labels True", "--total-timesteps 1000000.0")
        ({"envs": ["position"]}, "'envs' must map each env id to its settings (an object), not ['position']"),
        ({"envs": {"position": [1]}}, "'envs' must map each env id to its settings (an object)"),
        ({"feedback": 30}, "'feedback' must be a list"),
        ({"feedback": ["true", True]}, 'feedback must be "true" or a positive number of labels, not True'),
        ({"steps": 1e6}, "'steps' must be a positive whole number, not 1000000.0"),
        ({"flags": ["--x"]}, "flags must be a string of command-line flags, not ['--x']"),
        ({"flags": "--instruction 'unclosed"}, "flags cannot be split into arguments (No closing quotation)"),
        ({"envs": {"position": {"flags": "--a 'b"}}}, "flags cannot be split into arguments (No closing quotation)"),
        # each accepted silently: runs sharing a folder, one run counted as several seeds, settings ignored or replaced
        ({"seeds": [1, 2, 1]}, "lists seed 1 twice"),
        ({"envs": {"position": {"seeds_by_feedback": {"30": [2, 2]}}}}, "lists seed 2 twice"),
        ({"feedback": ["true", 30, 30]}, "lists feedback 30 twice"),
        (  # an env's own seeds, or the grid's seeds of one feedback? (the latter went unseen)
            {"seeds_by_feedback": {"true": [1, 2]}, "envs": {"position": {"seeds": [3]}}},
            "position sets its own seeds and the grid's seeds_by_feedback those of true",
        ),
        ({"seedz": [1, 2]}, "has an unknown key 'seedz' (known: "),
        ({"envs": {"position": {"step": 99}}}, "position has an unknown key 'step' (known: "),
        ({"flags": TINY_FLAGS + " --seed 3"}, "flags set --seed, which the grid sets for each run"),
        ({"envs": {"position": {"flags": "--labels 700"}}}, "position flags set --labels, which the grid sets for each run"),
        ({"flags": "--total_timesteps=500"}, "flags set --total-timesteps, which the grid sets for each run"),
        ({"flags": "--observation pixels"}, "flags set --observation, which the grid sets for each run"),
        ({"flags": TINY_FLAGS + " --no-save-model"}, "flags set --no-save-model"),  # a stop would leave nothing to resume
        ({"env_flag": 3}, "env_flag must be a flag of its script"),
        ({"feedback": ["true", 1, True]}, 'feedback must be "true" or a positive number of labels, not True'),
    ],
)
def test_a_grid_that_cannot_run_is_refused_with_a_message(tmp_path, change, message):
    grid = write_grid(tmp_path, **change)
    if change.get("envs", 0) is None:
        data = json.loads(grid.read_text())
        del data["envs"]
        grid.write_text(json.dumps(data))
    result = sweep("local", grid, "--out", tmp_path / "out")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_grid_that_names_an_env_twice_is_refused_not_read_as_its_last(tmp_path):
    grid = write_grid(tmp_path)
    text = grid.read_text().replace('"envs": {"position": {}}', '"envs": {"position": {"seeds": [1]}, "position": {}}')
    grid.write_text(text)
    result = sweep("local", grid, "--out", tmp_path / "out")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "names 'position' twice in one object" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command, change, message",
    [
        (
            "local",
            {"script": "rlhf_ppo_mujoco.py", "env_flag": "--env", "envs": {"Hoper-v4": {}}, "flags": ""},
            "unknown environment id 'Hoper-v4'",
        ),
        ("slurm", {"flags": TINY_FLAGS + " --pretrain-epoch 5"}, "--pretrain-epoch"),  # a misspelt flag (tyro's message)
        ("local", {"envs": {"position": {"flags": "--gamma 2"}}}, "--gamma and --gae-lambda must be in [0, 1]"),
        ("slurm", {"envs": {"position": {"flags": "--gamma 2"}}}, "--gamma and --gae-lambda must be in [0, 1]"),
    ],
)
def test_a_grid_whose_runs_their_script_refuses_is_refused_before_any_run_starts(tmp_path, command, change, message):
    """Each run's command line goes through its script's own checks first: one message, not a failed run and a
    folder for every run of the grid (before, each run failed on its own; on Slurm, after waiting in the queue)."""
    grid, out = write_grid(tmp_path, **change), tmp_path / "out"
    result = sweep(command, grid, "--out", out, *(["--dry-run"] if command == "slurm" else []))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert re.search(r"error: run \S+__true__1 of the grid \S+grid.json cannot start", result.stderr), result.stderr
    assert not out.exists()


def test_a_warning_its_script_gives_each_run_of_the_grid_is_shown_once(tmp_path):
    # an Atari game without a known score layout: validate_args warns, the same words for every run checked
    envs = {"AsterixNoFrameskip-v4": {}}
    grid = write_grid(
        tmp_path, script="rlhf_a2c_atari.py", env_flag="--env", envs=envs, seeds=[1, 2, 3], feedback=["true"], flags=""
    )
    result = sweep("slurm", grid, "--out", tmp_path / "out", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("warning: no score layout known for 'asterix'") == 1, result.stdout


def test_checking_the_runs_leaves_the_environment_they_inherit_alone(tmp_path, monkeypatch):
    """The check imports each script, and rlhf_ppo_mujoco.py sets MUJOCO_GL=egl at import where EGL loads: the sweep's
    tasks (and sbatch, which hands the submitting shell's environment to the jobs) inherited it, and a compute node
    without EGL could no longer render."""
    import sweep

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delitem(sys.modules, "checked_rlhf_ppo_mujoco", raising=False)  # imported here, not cached earlier
    grid_args = {
        "script": "rlhf_ppo_mujoco.py",
        "env_flag": "--env",
        "envs": {"Hopper-v4": {}},
        "feedback": ["true"],
        "flags": "",
    }
    path = write_grid(tmp_path, 4096, **grid_args)
    grid = sweep.load_grid(path) | {"path": str(path)}
    environment = dict(os.environ)
    sweep.check_runs(grid, range(len(grid["runs"])), tmp_path / "out")
    assert dict(os.environ) == environment
    assert not (tmp_path / "out").exists()
    monkeypatch.delitem(sys.modules, "checked_rlhf_ppo_mujoco")
    sweep.imported_script(grid)  # as settings_changed imports it, with no check_runs around it
    assert dict(os.environ) == environment


def test_a_relative_path_in_a_grid_is_checked_from_the_run_folder_where_the_run_reads_it(tmp_path):
    """Runs start in their own folder: a database shared by the grid's runs, ../pool/prefs.sqlite, is there."""
    out = tmp_path / "out"
    (out / "pool").mkdir(parents=True)
    grid = write_grid(tmp_path, feedback=[30], flags=TINY_FLAGS + " --offline --preference-db ../pool/prefs.sqlite")
    result = sweep("slurm", grid, "--out", out, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in out.iterdir() if path.is_dir()) == ["pool"]  # no run folder made by the check


@pytest.mark.parametrize(
    "option, message",
    [
        (("--cpus-per-task", 0), "--cpus-per-task must be at least 1"),
        (("--signal-seconds", -5), "--signal-seconds must be 0-65535"),  # (sbatch's --signal range)
        (("--signal-seconds", 70000), "--signal-seconds must be 0-65535"),
    ],
)
def test_slurm_options_sbatch_cannot_take_are_refused_before_a_batch_script_is_written(tmp_path, option, message):
    grid, out = write_grid(tmp_path), tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--dry-run", *option)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert not out.exists()


def test_a_slurm_dry_run_writes_an_array_of_the_runs_not_done(tmp_path):
    grid, out = write_grid(tmp_path, seeds=[1, 2, 3]), tmp_path / "out"
    (out / "position__true__2").mkdir(parents=True)
    (out / "position__true__2" / "done.json").write_text("{}")
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--time", "01:30:00", "--mem", "2G", "--partition", "cpu")
    assert result.returncode == 0, result.stderr
    batch = (out / "slurm_array.sh").read_text()
    # grid order: true 1-3, then labels30 1-3; true 2 is done
    assert "#SBATCH --array=0,2-5\n" in batch
    for line in ("--time=01:30:00", "--mem=2G", "--partition=cpu", "--cpus-per-task=1", "--requeue", "--signal=B:USR1@120"):
        assert f"#SBATCH {line}\n" in batch
    assert batch.rstrip().splitlines()[-1].startswith("exec ")
    assert batch.rstrip().endswith('--requeue-on-signal --index "$SLURM_ARRAY_TASK_ID"')
    # the tasks read a copy of the grid taken at submission, so an edit of the grid meanwhile moves no index
    frozen = re.search(r"task (\S+/grid_[0-9a-f]{12}\.json) ", batch)[1]
    assert Path(frozen).parent == out and json.loads(Path(frozen).read_text()) == json.loads(grid.read_text())


def test_an_array_still_queued_runs_its_own_grid_after_a_later_submission_changes_the_grid(tmp_path):
    """Each submission's tasks read the grid as it was at that submission: a later submission to the same folder, of a
    grid that gained a seed in the middle (which shifts the runs' indices), must not change what a queued task runs."""
    grid, out = write_grid(tmp_path, seeds=[1, 3]), tmp_path / "out"
    assert sweep("slurm", grid, "--out", out, "--dry-run").returncode == 0
    first_array = (out / "slurm_array.sh").read_text()
    write_grid(tmp_path, seeds=[1, 2, 3])  # runs: true 1, 2, 3, then 30 labels 1, 2, 3
    assert sweep("slurm", grid, "--out", out, "--dry-run").returncode == 0
    assert (out / "slurm_array.sh").read_text() != first_array
    # index 1 of the first array is the true-reward run of seed 3; of the second, seed 2
    task = shlex.split(first_array.rstrip().splitlines()[-1].removeprefix("exec ").replace('"$SLURM_ARRAY_TASK_ID"', "1"))
    result = subprocess.run(task, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(path.name for path in out.glob("position__*")) == ["position__true__3"]
    assert "--seed 3" in (out / "position__true__3" / "run.log").read_text().splitlines()[0]


def test_a_local_sweep_runs_the_grid_it_started_with_when_the_grid_file_changes_meanwhile(tmp_path):
    """A local sweep runs its runs one after another, each as a task process: a grid file edited while it runs (a seed
    added in the middle, which shifts the runs' indices) must not change what its later tasks run."""
    grid, out = write_grid(tmp_path, feedback=["true"], seeds=[1, 3]), tmp_path / "out"
    local = start_sweep("local", grid, "--out", out, "--workers", 1, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: (out / "position__true__1" / "run.log").exists(), 120)
        write_grid(tmp_path, feedback=["true"], seeds=[1, 2, 3])  # index 1 was seed 3; now it is seed 2
        output = local.communicate(timeout=300)[0]
    finally:
        stop_processes_under(tmp_path)
    assert local.returncode == 0, output
    assert sorted(path.name for path in out.glob("position__*")) == ["position__true__1", "position__true__3"], output
    assert "--seed 3" in (out / "position__true__3" / "run.log").read_text().splitlines()[0]


# --- a one-node Slurm cluster of the test's own: munge, slurmctld and slurmd on free ports, files in tmp_path -------
# The tests that use it share the xdist_group "slurm", so that under `pytest -n 3` they run one after the other: two
# such clusters on one host at once were never tried.
SLURM_PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue")


def skip_without_slurm():
    missing = [program for program in SLURM_PROGRAMS if shutil.which(program) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd munge "
            "slurm-client, as .ci/run does"
        )
    if os.geteuid() != 0:
        pytest.skip("starting slurmd needs root (it starts jobs as their user)")


@pytest.fixture
def slurm_cluster(tmp_path):
    skip_without_slurm()
    with one_node_cluster(tmp_path / "slurm") as env:
        yield env


@contextlib.contextmanager
def one_node_cluster(folder):
    """The cluster's daemons, started with their files in `folder`; yields the environment its commands need."""
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True)
    subprocess.run(["mungekey", "--create", "--keyfile", str(folder / "munge.key")], check=True, capture_output=True)
    os.chmod(folder / "munge.key", 0o600)
    socket_path = folder / "munge.socket"
    host = socket.gethostname().split(".")[0]
    config = folder / "slurm.conf"
    # cred_expire: Slurm holds a requeued job this long before starting it again (120 s by default)
    # KillWait: how long a cancelled job's processes have between SIGTERM and SIGKILL (30 s by default)
    config.write_text(
        f"""ClusterName=sweeptest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=10
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=/dev/null
MailProg=/bin/true
NodeName=testnode NodeAddr=127.0.0.1 NodeHostname={host} CPUs={os.cpu_count()} RealMemory=2000 State=UNKNOWN
PartitionName=test Nodes=testnode Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = os.environ | {"SLURM_CONF": str(config)}
    munge = [f"--socket={socket_path}", f"--key-file={folder / 'munge.key'}", f"--pid-file={folder / 'munged.pid'}"]
    munge += [f"--log-file={folder / 'log' / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # they log to folder/log
    daemons = [subprocess.Popen(["munged", "--foreground", "--force", *munge], **quiet)]
    for _ in range(50):
        if socket_path.exists():
            break
        time.sleep(0.1)
    daemons.append(subprocess.Popen(["slurmctld", "-D", "-f", str(config)], env=env, **quiet))
    daemons.append(subprocess.Popen(["slurmd", "-D", "-f", str(config), "-N", "testnode"], env=env, **quiet))
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "\n".join(path.read_text()[-2000:] for path in (folder / "log").glob("*.log"))
            pytest.fail(f"the test cluster did not come up (sinfo: {state!r}):\n{logs}")
        yield env
    finally:
        # Slurm ends a cancelled job's processes in its own time (SIGTERM; SIGKILL after KillWait): the daemons stay up
        # until the queue is empty, and whatever a job of this cluster still runs after them is killed here
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
        wait_until(lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip(), 60)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        job_environment = f"SLURM_CONF={config}".encode()  # a job's processes inherit the submitter's environment
        kill(processes(lambda proc: job_environment in proc.joinpath("environ").read_bytes().split(b"\0")))


@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_stopping_the_test_cluster_ends_the_jobs_it_still_runs(tmp_path):
    # a test ends with its job cancelled, and a run takes its time to stop (it saves first). Were the daemons stopped
    # before Slurm had ended the job's processes, nothing would end them: a task of a test once kept its run stepping
    # for 17 minutes after the test suite had finished. The job here does not stop on SIGTERM at all.
    skip_without_slurm()
    job_folder = tmp_path / "job"
    job_folder.mkdir()
    with one_node_cluster(tmp_path / "slurm") as env:
        deaf_to_sigterm = ["sbatch", "--chdir", str(job_folder), "--wrap", "trap '' TERM; sleep 600"]
        submitted = subprocess.run(deaf_to_sigterm, env=env, capture_output=True, text=True)
        assert submitted.returncode == 0, submitted.stderr
        assert wait_until(lambda: processes_under(job_folder), 60), "the job did not start"
    try:
        assert processes_under(job_folder) == []
    finally:
        stop_processes_under(job_folder)


@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_a_grid_runs_as_a_slurm_job_array_one_task_per_run(tmp_path, slurm_cluster):
    grid, out = write_grid(tmp_path), tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--time", "00:10:00", "--mem", "500M", env=slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    job = re.search(r"submitted job array (\d+): 2 runs", result.stdout)[1]
    names = ("position__true__1", "position__labels30__1")
    deadline = time.time() + 240

    def queued():
        return subprocess.run(["squeue", "-h", "-j", job], env=slurm_cluster, capture_output=True, text=True).stdout.strip()

    while time.time() < deadline and queued():  # both tasks ran and left the queue
        time.sleep(1)
    slurm_outputs = sorted(path.name for path in out.glob("slurm-*.out"))
    assert slurm_outputs == [f"slurm-{job}_0.out", f"slurm-{job}_1.out"], slurm_outputs
    for name in names:
        assert (out / name / "done.json").exists(), (out / name / "run.log").read_text()[-3000:]
        assert final_step(out / name / "run.log") == 1536

    # a second submission finds nothing to do; the report reads the runs' logs
    again = sweep("slurm", grid, "--out", out, env=slurm_cluster)
    assert "every run is done: nothing to submit" in again.stdout
    report = sweep("report", grid, "--out", out)
    assert "| position | 1536 (at 1536) | 30 labels | 1 (1) |" in report.stdout
    assert np.isfinite(progress(out / names[1] / "run.log")[1][-1])


@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_a_task_stopped_before_its_time_limit_requeues_itself_and_resumes(tmp_path, slurm_cluster):
    # a run far longer than its limit of two minutes (a checkpoint every iteration); Slurm signals the task up to a
    # minute before the limit (--signal-seconds 50): the run saves, the task requeues itself, and the run goes on. (A
    # limit of one minute left the run 10 s before the signal: on a loaded machine it was still importing, twice.)
    grid = write_grid(tmp_path, steps=50_000_000, feedback=["true"], flags="--checkpoint-every 1")
    out = tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--time", "2", "--signal-seconds", 50, "--mem", "500M", env=slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    log = out / "position__true__1" / "run.log"
    resumed_and_stepping = re.compile(r"^# .* UTC, resumed: .*\n(.*\n)*step \d+,", re.M)
    deadline = time.time() + 420
    while time.time() < deadline and not (log.exists() and resumed_and_stepping.search(log.read_text())):
        time.sleep(2)
    subprocess.run(["scancel", "--full", re.search(r"job array (\d+)", result.stdout)[1]], env=slurm_cluster)
    text = log.read_text()
    first, _, second = text.partition("resumed: ")
    assert second, text[-3000:]
    stopped_at = int(re.search(r"interrupted at step (\d+)", first)[1])
    assert "resumed runs/MovingDot-v0-position__sweep__1__" in second
    assert int(re.search(r"^step (\d+),", second, re.M)[1]) == stopped_at + 1024  # 8 envs x 128 steps on from there


def test_a_task_whose_requeue_slurm_refuses_says_so_and_fails(tmp_path):
    """Signalled before its time limit, a task saves its run and asks Slurm to requeue it. Where Slurm refuses (a job
    not requeueable, a cluster that forbids it), nothing would resume the run: the task says so in its output
    (slurm-%A_%a.out) with how to resume it, and fails, so that sacct shows the task FAILED, not COMPLETED."""
    grid = write_grid(tmp_path, steps=50_000_000, feedback=["true"], flags=TINY_FLAGS + " --checkpoint-every 1")
    out, bin_dir = tmp_path / "out", tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # Slurm's scontrol as a refusing cluster answers, and a record of what it was asked
    scontrol.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/asked\necho "scontrol: error: Job is not requeueable" >&2\nexit 1\n'
    )
    scontrol.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0"}
    command = [sys.executable, str(SWEEP), "task", str(grid), "--index", "0", "--out", str(out), "--requeue-on-signal"]
    task = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    log = out / "position__true__1" / "run.log"
    try:
        assert wait_until(lambda: logged_steps(log), 120)
        task.send_signal(signal.SIGUSR1)  # Slurm's signal before the time limit (--signal=B:USR1@...)
        _, stderr = task.communicate(timeout=60)
    finally:
        stop_processes_under(tmp_path)
    assert (tmp_path / "asked").read_text().split() == ["requeue", "77_0"]
    assert "interrupted at step" in log.read_text()  # the run saved
    assert task.returncode != 0
    assert "Slurm did not requeue position__true__1 (scontrol: error: Job is not requeueable)" in stderr, stderr
    assert f"python benchmark/sweep.py slurm GRID --out {out}" in stderr  # how to resume it


def test_a_batch_of_the_grid_keeps_each_runs_place_in_it(tmp_path):
    grid, out = write_grid(tmp_path, envs={"position": {}, "pixels": {}}), tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--envs", "pixels")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=2-3\n" in (out / "slurm_array.sh").read_text()  # position: runs 0-1, pixels: 2-3
    wrong = sweep("local", grid, "--out", out, "--envs", "Hopper-v4")
    assert wrong.returncode != 0 and "--envs Hopper-v4: not in the grid (position, pixels)" in wrong.stderr
    # a batch of one feedback setting (e.g. the budget C17's claim is about first), alone or within envs
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--feedback", "30")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=1,3\n" in (out / "slurm_array.sh").read_text()  # each env: true reward, then 30 labels
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--envs", "pixels", "--feedback", "true")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=2\n" in (out / "slurm_array.sh").read_text()
    wrong = sweep("local", grid, "--out", out, "--feedback", "700")
    assert wrong.returncode != 0 and "--feedback 700: not in the grid (true, 30)" in wrong.stderr


def test_a_batch_can_be_some_seeds_of_the_grid(tmp_path):
    # e.g. seeds 1-4 of a task on a borrowed 16-core machine, seed 5 here
    grid, out = write_grid(tmp_path, envs={"position": {}, "pixels": {}}, seeds=[1, 2]), tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--seeds", "2")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=1,3,5,7\n" in (out / "slurm_array.sh").read_text()  # each env: true 1, 2, then 30 labels 1, 2
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--envs", "pixels", "--feedback", "30", "--seeds", "1")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=6\n" in (out / "slurm_array.sh").read_text()
    wrong = sweep("local", grid, "--out", out, "--seeds", "2", "9")
    assert wrong.returncode != 0 and "--seeds 9: not in the grid (1, 2)" in wrong.stderr


def test_the_ratio_of_a_task_with_negative_returns_measures_the_progress_from_the_start(tmp_path):
    # Reacher's returns are negative: an RLHF run at -8 against a true-reward run at -4 is worse, not 2x better. The
    # ratio then counts from where the runs started (the first logged returns): (-8 - -40) / (-4 - -40) = 0.89
    grid = write_grid(tmp_path, envs={"Reacher-v5": {}}, feedback=["true", 350], script="rlhf_ppo_mujoco.py")
    out = tmp_path / "out"
    for name, returns in (("Reacher-v5__true__1", (-40, -10, -4)), ("Reacher-v5__labels350__1", (-40, -20, -8))):
        write_run_log(out, name, returns, done=False)
    under_way = sweep("report", grid, "--out", out)  # no run finished: the rows are shown, not judged
    assert re.search(r"\| 350 labels \| 1 \(0\) \| -8\.0 ± 0\.0 \| 0\.89 \|  \|", under_way.stdout), under_way.stdout
    for name in ("Reacher-v5__true__1", "Reacher-v5__labels350__1"):
        (out / name / "done.json").write_text("{}\n")
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0, result.stderr
    table = (out / "table.md").read_text()
    assert re.search(r"\| 350 labels \| 1 \(1\) \| -8\.0 ± 0\.0 \| 0\.89 \| 0\.90: not met \|", table), table


def test_a_run_started_again_is_reported_from_its_new_start_not_from_the_attempt_it_replaced(tmp_path):
    """A run killed before its first checkpoint starts again from step 0. Until the new start logged returns at the
    old steps, the report showed the abandoned attempt's last step and return (and a restart with another iteration
    size kept its steps for good)."""
    grid, out = write_grid(tmp_path, feedback=["true"]), tmp_path / "out"
    (out / "position__true__1").mkdir(parents=True)
    start = "# 2026-12-04 10:00:00 UTC, started: python rlhf_moving_dot.py\n"
    first = "".join(f"step {1024 * i}, SPS 100, true return {i / 10:.1f}\n" for i in range(16, 41))
    second = "".join(f"step {1024 * i}, SPS 100, learned return 0.5\n" for i in range(1, 11))  # no true return yet
    log = out / "position__true__1" / "run.log"
    log.write_text(start + first + "# exit -9\n" + start + second)
    report = sweep("report", grid, "--out", out)
    assert "no run has logged progress yet" in report.stdout + report.stderr, report.stdout + report.stderr
    log.write_text(start + first + "# exit -9\n" + start + second + "step 11264, SPS 100, true return 0.7\n")
    report = sweep("report", grid, "--out", out)
    assert "| position | 1536 (at 11264) | true reward | 1 (0) | 0.7 ± 0.0 |" in report.stdout, report.stdout


def test_a_run_another_grid_finished_in_the_same_folder_is_not_counted_as_this_grids(tmp_path):
    """The check for finished runs with other settings ran only as a sweep started: a run that a second sweep (another
    grid, the same --out) finished meanwhile counted as done, and was reported as this grid's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    grid_a = write_grid(tmp_path / "a", feedback=["true"])  # 1536 steps
    grid_b, out = write_grid(tmp_path / "b", steps=2048, feedback=["true"]), tmp_path / "out"
    assert sweep("task", grid_a, "--index", 0, "--out", out).returncode == 0
    result = sweep("task", grid_b, "--index", 0, "--out", out)
    assert result.returncode != 0 and "--total-timesteps 1536 (the grid: 2048)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_local_sweep_does_not_report_a_run_another_grid_finished_while_it_ran(tmp_path):
    """A local sweep checks for finished runs with other settings as it starts and again before its report: a run of
    the grid outside this batch (here --feedback true) that another grid's sweep finished in the same --out meanwhile
    would be reported as this grid's."""
    import sweep as runner  # noqa: PLC0415 (benchmark/, on the path above)

    grid, out = write_grid(tmp_path, steps=2048), tmp_path / "out"
    labelled = next(run for run in runner.load_grid(grid)["runs"] if run["mode"] != "true")
    other_grids = [arg.replace("2048", "1536") for arg in labelled["args"]]  # its run of 1536 steps
    local = start_sweep("local", grid, "--out", out, "--feedback", "true", "--workers", 1)
    assert wait_until(lambda: (out / "position__true__1" / "run.log").exists(), 60)  # past the check at the start
    write_run_log(out, labelled["name"], [-50.0, -40.0])
    log = out / labelled["name"] / "run.log"
    start = f"# 2026-12-04 10:00:00 UTC, started: python {runner.ROOT / 'rlhf_moving_dot.py'} {shlex.join(other_grids)}"
    log.write_text(f"{start}\n{log.read_text()}")
    _, stderr = local.communicate(timeout=120)
    assert local.returncode != 0 and "position__labels30__1: --total-timesteps 1536 (the grid: 2048)" in stderr, stderr
    assert not (out / "table.md").exists()


def test_the_report_command_printed_after_a_slurm_submission_reads_the_sweeps_folder(tmp_path):
    """It named the grid only: run as printed, the report read benchmark/sweeps/{grid}, not the sweep's --out."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho '4242;cluster'\n")  # a submission, without a cluster
    (fake / "sbatch").chmod(0o755)
    grid, out = write_grid(tmp_path), tmp_path / "my sweep"
    result = sweep("slurm", grid, "--out", out, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    command = shlex.split(result.stdout.split("when it is done: ")[1])
    assert command[-4:] == ["report", str(grid), "--out", str(out)], command


def test_no_ratio_is_given_where_the_true_reward_runs_ended_below_their_start():
    # counted from the start, a baseline that got worse would turn a still worse run into a ratio above 1
    sys.path.insert(0, str(ROOT / "benchmark"))
    from sweep import ratio_to_true

    assert ratio_to_true(-40.0, -20.0, -10.0) is None
    assert ratio_to_true(-8.0, -4.0, -40.0) == pytest.approx(32 / 36)
    assert ratio_to_true(900.0, 1000.0, -50.0) == pytest.approx(0.9)


def report_of_finals(tmp_path, finals, under_way=()):
    """The table of a Hopper-v4 grid whose runs (a mode's seeds 1, 2, ...) ended at these true returns (the modes in
    `under_way`: are at them so far, without done.json)."""
    feedback = ["true"] + [int(mode[len("labels") :]) for mode in finals if mode != "true"]
    grid = write_grid(tmp_path, envs={"Hopper-v4": {}}, feedback=feedback, seeds=[1, 2, 3], script="rlhf_ppo_mujoco.py")
    out = tmp_path / "out"
    for mode, values in finals.items():
        for seed, value in enumerate(values, 1):
            write_run_log(out, f"Hopper-v4__{mode}__{seed}", (10.0, value), done=mode not in under_way)
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0, result.stderr
    return (out / "table.md").read_text()


def test_seeds_under_way_that_share_no_logged_step_get_a_row_that_says_so(tmp_path):
    """Seeds under way that logged at different steps (one started under other settings, which `report` does not
    check, only `local` does): the report crashed (IndexError) with no table."""
    report_of_finals(tmp_path, {"true": [100.0, 120.0], "labels350": [90.0, 95.0]}, under_way=["labels350"])
    out = tmp_path / "out"
    (out / "Hopper-v4__labels350__2" / "run.log").write_text(
        "step 1500, SPS 100, true return 10.0\nstep 2500, SPS 100, true return 95.0\n"
    )
    grid = tmp_path / "grid.json"
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    table = (out / "table.md").read_text()
    assert "| Hopper-v4 | 1536 (at 2000) | true reward | 3 (2) | 110 ± 14.1 |" in table, table
    assert "| Hopper-v4 | 1536 | 350 labels | 3 (0) | its 2 seeds under way logged no step in common |" in table, table


def ratio_and_standard_error(labelled, true):
    """The mean ratio and its standard error: each mean's standard error is the seeds' sample std over the square root
    of their number, and the ratio's relative error the two means' relative errors added in quadrature."""
    labelled, true = np.array(labelled), np.array(true)
    ratio = labelled.mean() / true.mean()
    relative = [values.std(ddof=1) / np.sqrt(len(values)) / values.mean() for values in (labelled, true)]
    return ratio, ratio * np.hypot(*relative)


def test_the_table_gives_each_ratio_its_standard_error_over_seeds(tmp_path):
    # with a few seeds a shortfall can be noise: the table says how far the ratio's own spread reaches (three seeds a
    # mode, first-order propagation)
    finals = {"true": (1000.0, 1100.0, 900.0), "labels350": (800.0, 1000.0, 900.0)}
    table = report_of_finals(tmp_path, finals)
    ratio, error = ratio_and_standard_error(finals["labels350"], finals["true"])
    # the ± after the mean: the seeds' sample std (800, 1000, 900: 100), as the ratio's error and final_returns.py use
    assert f"| 350 labels | 3 (3) | 900 ± 100 | {ratio:.2f} ± {error:.2f} | 0.90: met |" in table, table
    assert "standard error" in table.split("|---|")[-1]  # the note under the table says what the ± is
    assert "sample std" in table.split("|---|")[-1]


def test_a_cell_short_of_the_claim_says_by_how_many_standard_errors(tmp_path):
    # a ratio a little under its threshold over a few noisy seeds is not the same finding as one far under it: the
    # verdict says how far, in the ratio's own standard errors (one seed a mode: no standard error, no distance)
    finals = {"true": (1000.0, 1100.0, 900.0), "labels350": (700.0, 800.0, 600.0), "labels700": (500.0,)}
    table = report_of_finals(tmp_path, finals)
    ratio, error = ratio_and_standard_error(finals["labels350"], finals["true"])
    short = (0.9 - ratio) / error
    assert 2 < short < 4  # the numbers above put the cell clearly short
    assert f"| {ratio:.2f} ± {error:.2f} | 0.90: not met, {short:.1f} standard errors short |" in table, table
    assert "| 500 ± 0.0 | 0.50 | 0.95: not met |" in table, table
    assert "standard errors short" in table.split("|---|")[-1]  # the note under the table says what the distance is


@pytest.mark.parametrize("under_way", ["labels350", "true"])
def test_a_cell_is_judged_only_when_its_runs_and_the_true_reward_runs_have_finished(tmp_path, under_way):
    # a run under way shows its return so far, early in training: judged, it would read as a shortfall (or, for the
    # true-reward runs, make every cell look better than it is)
    finals = {"true": (1000.0, 1100.0, 900.0), "labels350": (500.0, 600.0, 400.0), "labels700": (990.0, 1000.0, 1010.0)}
    table = report_of_finals(tmp_path, finals, under_way=(under_way,))
    ratio, error = ratio_and_standard_error(finals["labels350"], finals["true"])
    seeds = "3 (0)" if under_way == "labels350" else "3 (3)"
    assert f"| 350 labels | {seeds} | 500 ± 100 | {ratio:.2f} ± {error:.2f} |  |" in table, table
    assert ("| 700 labels | 3 (3) | 1000 ± 10.0 | 1.00 ± 0.06 | 0.95: met |" in table) == (under_way != "true"), table


def test_a_ratio_of_negative_returns_takes_its_standard_error_from_the_progress_made(tmp_path):
    # Reacher's returns are negative: the ratio counts from the return the runs began with (start), so must its
    # standard error. Runs that began at -40 and reached -8 +- 2 (labels) against -4 +- 1 (true reward)
    sys.path.insert(0, str(ROOT / "benchmark"))
    from sweep import ratio_standard_error, ratio_to_true

    start = -40.0
    finals, true_finals = np.array([-10.0, -8.0, -6.0]), np.array([-5.0, -4.0, -3.0])
    ratio = ratio_to_true(finals.mean(), true_finals.mean(), start)  # 32 / 36
    # each mean's standard error over the progress it made: 2/sqrt(3) over 32, 1/sqrt(3) over 36
    expected = ratio * np.hypot(2 / np.sqrt(3) / 32, 1 / np.sqrt(3) / 36)
    assert ratio_standard_error(ratio, finals, true_finals, start) == pytest.approx(expected)
    # returns above 0 are taken as they are, whatever start was
    assert ratio_standard_error(0.9, finals + 50, true_finals + 50, start) == pytest.approx(
        0.9 * np.hypot(2 / np.sqrt(3) / 42, 1 / np.sqrt(3) / 46)
    )


def test_the_table_counts_the_seeds_the_grid_plans_beside_those_done(tmp_path):
    # a grid being extended (seeds 1-3 planned, one run so far) must not read as complete
    grid = write_grid(tmp_path, envs={"Hopper-v4": {}}, feedback=["true"], seeds=[1, 2, 3], script="rlhf_ppo_mujoco.py")
    out = tmp_path / "out"
    write_run_log(out, "Hopper-v4__true__1", (10.0, 20.0))
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0, result.stderr
    assert "| true reward | 3 (1) | 20.0 ± 0.0 |" in (out / "table.md").read_text()


def test_the_grid_says_above_its_table_what_its_runs_are(tmp_path):
    # a diagnostic grid (a patched script, a changed flag) reports its budgets as "N labels" like any other: its note
    # says what they are, where a reader of the table sees it
    note = "Diagnostic: the 30-label runs optimise the true reward, z-scored (benchmark/notes/some.patch)."
    grid = write_grid(tmp_path, note=note)
    out = tmp_path / "out"
    for name in ("position__true__1", "position__labels30__1"):
        write_run_log(out, name, (10.0, 20.0))
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0, result.stderr
    assert (out / "table.md").read_text().startswith(note + "\n\n| env |")
    refused = sweep("report", write_grid(tmp_path, note=["not", "text"]), "--out", out)
    assert refused.returncode != 0 and "note must be a string" in refused.stderr


def test_a_finished_budget_is_not_judged_against_true_reward_runs_still_under_way(tmp_path):
    # the true-reward run has logged only its early steps (it is still running); the finished 350-label run's return
    # over that early one would read as far better than it is: the row shows the ratio, and judges nothing yet
    grid = write_grid(tmp_path, envs={"Hopper-v4": {}}, feedback=["true", 350], script="rlhf_ppo_mujoco.py")
    out = tmp_path / "out"
    write_run_log(out, "Hopper-v4__true__1", (10.0, 500.0), done=False)
    write_run_log(out, "Hopper-v4__labels350__1", (10.0, 900.0, 1000.0, 1100.0))
    result = sweep("report", grid, "--out", out)
    assert result.returncode == 0, result.stderr
    table = (out / "table.md").read_text()
    assert "| 350 labels | 1 (1) | 1100 ± 0.0 | 2.20 |  |" in table, table
    (out / "Hopper-v4__true__1" / "done.json").write_text("{}\n")  # once it has finished, the claim is judged
    assert "| 350 labels | 1 (1) | 1100 ± 0.0 | 2.20 | 0.90: met |" in sweep("report", grid, "--out", out).stdout


def test_a_feedback_setting_can_have_more_seeds_than_the_others(tmp_path):
    # e.g. the setting that falls short of C17's claim and its true-reward runs get seeds 11-15, the others keep 1-10
    grid = write_grid(tmp_path, seeds=[1], envs={"position": {"seeds_by_feedback": {"30": [1, 2, 3]}}})
    out = tmp_path / "out"
    result = sweep("slurm", grid, "--out", out, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=0-3\n" in (out / "slurm_array.sh").read_text()  # true reward seed 1, 30 labels seeds 1-3
    result = sweep("slurm", grid, "--out", out, "--dry-run", "--seeds", "3")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=3\n" in (out / "slurm_array.sh").read_text()
    write_run_log(out, "position__true__1", (10.0, 20.0))
    write_run_log(out, "position__labels30__1", (10.0, 15.0))
    assert sweep("report", grid, "--out", out).returncode == 0
    assert "| 30 labels | 3 (1) |" in (out / "table.md").read_text()
    none = sweep("local", grid, "--out", out, "--feedback", "true", "--seeds", "3")  # true reward has seed 1 only
    assert none.returncode != 0 and "no run of the grid is --feedback true --seeds 3" in none.stderr
    wrong = write_grid(tmp_path, envs={"position": {"seeds_by_feedback": {"700": [1, 2]}}})
    result = sweep("local", wrong, "--out", tmp_path / "wrong")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "seeds_by_feedback names feedback that is not in the grid: 700" in result.stderr
