"""The tests start the scripts from a zygote (warm_start.py): a run started so must be what `python SCRIPT ARGS` is,
seen from the test: its output, folder, arguments, environment, exit status, signals, threads and atexit functions."""

import os
import select
import signal
import subprocess
import sys
import time

import pytest
import warm_start

PROBE = """
import atexit, os, signal, sys, threading, time
print("name", __name__, "argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0] == os.path.dirname(__file__))
print("env", os.environ.get("PROBE_SETTING"), "stdin", sys.stdin.read())
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
# not a daemon: the interpreter waits for it at exit (it waits for the main thread's end)
threading.Thread(target=lambda: (threading.main_thread().join(), print("thread finished"))).start()
mode = sys.argv[1]
if mode == "raise":
    raise ValueError("broken")
if mode == "wait":
    try:  # (entered before the test, which signals on "waiting", can send its signal)
        print("waiting", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("Ctrl-C seen")
        raise
    signal.pause()
sys.exit({"exit": 3, "message": "stopped by message"}.get(mode))
"""


@pytest.fixture(autouse=True)
def warm_by_default(monkeypatch):
    """These tests are about warm runs: RLHF_TESTS_COLD=1 (the whole suite cold) does not make them cold."""
    monkeypatch.delenv("RLHF_TESTS_COLD", raising=False)


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


@pytest.mark.parametrize("mode", ["exit", "message", "raise", "none"])
def test_a_warm_run_ends_as_a_cold_one(probe, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("PROBE_SETTING", "from the test")
    ends = []
    for cold in (True, False):
        done = subprocess.run(
            warm_start.command(probe, [mode, "x y"], cold=cold),
            cwd=tmp_path,
            input="typed",
            capture_output=True,
            text=True,
            timeout=60,
        )
        stderr = done.stderr.splitlines()
        ends.append((done.returncode, done.stdout, stderr[0], stderr[-1]))
    assert ends[0] == ends[1]
    returncode, stdout, first_error, last_error = ends[1]
    assert returncode == {"exit": 3, "message": 1, "raise": 1, "none": 0}[mode]
    assert f"name __main__ argv ['{mode}', 'x y'] cwd {tmp_path} path0 True" in stdout
    assert "env from the test stdin typed" in stdout
    assert stdout.endswith("thread finished\natexit ran\n")
    assert first_error == "to stderr"
    assert last_error == {"message": "stopped by message", "raise": "ValueError: broken"}.get(mode, "to stderr")


def start_waiting(probe, cwd, cold, sigint):
    """The probe started (warm or `cold`) with SIGINT's disposition `sigint`, once it waits for a signal; and its first
    line."""
    run = subprocess.Popen(
        warm_start.command(probe, ["wait"], cold=cold),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    first_line = run.stdout.readline()
    run.stdout.readline(), run.stdout.readline()  # "env ...", "waiting"
    return run, first_line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_a_warm_run_reaches_it_and_ends_it_as_a_cold_one(probe, tmp_path, sig):
    ends = []
    for cold in (True, False):
        run, first_line = start_waiting(probe, tmp_path, cold, signal.SIG_DFL)  # (pytest may run as a background job)
        assert first_line.startswith("name __main__")
        run.send_signal(sig)
        stdout, stderr = run.communicate(timeout=60)  # to the pipes' end: every holder of them has ended
        ends.append((run.returncode, stdout, stderr.splitlines()[-1]))
    assert ends[0] == ends[1]
    assert ends[1][0] == -sig
    if sig == signal.SIGINT:  # KeyboardInterrupt, the threads waited for; then the run dies of the signal
        assert ends[1][1] == "Ctrl-C seen\nthread finished\natexit ran\n" and ends[1][2] == "KeyboardInterrupt"


def test_a_signal_the_starting_command_ignores_is_ignored_by_the_warm_run_as_by_a_cold_one(probe, tmp_path):
    """A shell starts a background job with Ctrl-C ignored, and Python keeps it so: SIGINT does not stop the run."""
    ends = []
    for cold in (True, False):
        run, first_line = start_waiting(probe, tmp_path, cold, signal.SIG_IGN)
        assert first_line.startswith("name __main__")
        run.send_signal(signal.SIGINT)
        time.sleep(1)
        alive = run.poll() is None
        run.terminate()
        stdout, _ = run.communicate(timeout=60)
        ends.append((alive, run.returncode, stdout))
    assert ends[0] == ends[1] == (True, -signal.SIGTERM, "")


@pytest.mark.parametrize("stdin", ["devnull", "closed"])
def test_a_warm_run_whose_starting_command_is_killed_dies_with_it(probe, tmp_path, stdin):
    """SIGKILL cannot be passed on: the zygote kills the run when the command the test started dies. Started with its
    stdin closed, the run reads an empty one (a cold run has none); it did not get the stand-in's socket there."""
    run = subprocess.Popen(
        warm_start.command(probe, ["wait"]),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL if stdin == "devnull" else None,
        stdout=subprocess.PIPE,
        preexec_fn=(lambda: os.close(0)) if stdin == "closed" else None,
    )
    seen = b""
    while seen.count(b"\n") < 3:  # "name ...", "env ... stdin", "waiting"
        assert select.select([run.stdout], [], [], 30)[0], seen
        chunk = os.read(run.stdout.fileno(), 4096)
        assert chunk, seen  # (the pipe's end: the run ended before waiting)
        seen += chunk
    run.kill()
    started = time.time()
    assert select.select([run.stdout], [], [], 10)[0] and run.stdout.read() == b""  # the pipe's end: the run's end
    assert run.wait(timeout=10) == -signal.SIGKILL and time.time() - started < 10


def test_every_run_starts_cold_when_rlhf_tests_cold_is_set(monkeypatch):
    monkeypatch.setenv("RLHF_TESTS_COLD", "1")
    assert warm_start.command("s.py", ["--a"]) == [sys.executable, "s.py", "--a"]
