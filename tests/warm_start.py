"""The tests start the scripts a few hundred times, and each start spends about 3 s of CPU importing torch, gymnasium
and MuJoCo before the script's first line of its own runs (a 2-core AMD EPYC): a quarter of the suite's time. This starts
them from a process that has imported those once (a "zygote": `python warm_start.py serve`, one per pytest worker),
forked for each run, so that a run skips those imports.

A run started this way is still a process of its own that runs the script as `python SCRIPT ARGS` would, from its
first line: with the arguments, folder, environment and stdin/stdout/stderr of the command the test started, its
signals and its exit status. What it shares with the other runs is the libraries' import-time state and Python's hash
seed; tests that compare two runs start one of them cold (`python SCRIPT`), and RLHF_TESTS_COLD=1 starts every run cold.

The command a test starts is a small stand-in (`python -I -S warm_start.py SOCKET SCRIPT ARGS`, no site packages, a
few ms): it hands its stdin, stdout and stderr to the zygote, which forks the run; it passes on every signal it gets
and exits as the run did (with its code, or killed by its signal). If the stand-in itself is killed (SIGKILL, which it
cannot pass on), the zygote kills the run when it next runs: milliseconds later, more on a busy machine, so a test
that kills a run at a chosen moment starts it cold. The run holds the test's pipes, so a test that reads the run's output to
its end has waited for the run itself to end.
"""

import contextlib
import json
import os
import signal
import socket
import sys

ZYGOTE = {}  # this process's zygote: its process and socket, started at the first warm command


def command(script, args, cold=False):
    """The command line that runs `script` with `args` (a list): through this process's zygote, or `cold` as
    `python SCRIPT ARGS` (also when RLHF_TESTS_COLD=1)."""
    if cold or os.environ.get("RLHF_TESTS_COLD") == "1":
        return [sys.executable, str(script), *args]
    if not ZYGOTE:
        import subprocess
        import tempfile

        socket_path = os.path.join(tempfile.mkdtemp(prefix="zygote-"), "socket")
        zygote = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", socket_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        if zygote.stdout.readline() != b"ready\n":
            raise RuntimeError("the zygote did not start: see its stderr above")
        ZYGOTE.update(process=zygote, socket=socket_path)
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), ZYGOTE["socket"], str(script), *args]


FORWARDED = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2]


def stand_in(socket_path, argv):
    """Run `argv` (script and arguments) in a fork of the zygote at `socket_path`; exit as it did."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # held until the run's pid is known
    for fd in (0, 1, 2):  # started with one closed: /dev/null there, not the socket below (sent on as a stream)
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # takes the lowest free descriptor: fd
    zygote = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote.connect(socket_path)
    ignored = [int(sig) for sig in FORWARDED if signal.getsignal(sig) == signal.SIG_IGN]  # (a shell's background job)
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": ignored}).encode()
    socket.send_fds(zygote, [request], [0, 1, 2])
    null = os.open(os.devnull, os.O_RDWR)  # the run holds the pipes now: the test sees their end when the run ends
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    run_pid = int(zygote.recv(64).split()[1])  # b"pid N"
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, frame: os.kill(run_pid, sig))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    reply = zygote.recv(64)  # b"exit STATUS" when the run has ended
    if not reply:  # the zygote has gone (its pytest worker ended): so does the run
        os.kill(run_pid, signal.SIGKILL)
        os._exit(1)
    code = os.waitstatus_to_exitcode(int(reply.split()[1]))
    if code < 0:  # killed by a signal: so is the stand-in
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def serve(socket_path):
    """The zygote: import what the scripts import, then fork a run for each stand-in that connects."""
    import selectors

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment = dict(os.environ)
    import rlhf_a2c_atari  # noqa: F401 (each script's imports, with the environment each sets for them)
    import rlhf_moving_dot  # noqa: F401
    import rlhf_ppo_mujoco  # noqa: F401
    import torch._dynamo  # noqa: F401 (what a script's first optimizer imports)

    for name in ("rlhf_a2c_atari", "rlhf_moving_dot", "rlhf_ppo_mujoco"):
        del sys.modules[name]  # a script that imports one of them gets it fresh, as a cold start would
    os.environ.clear()
    os.environ.update(environment)
    sys.path.pop(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on pytest: its runs stop, the zygote ends with pytest
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()  # SIGCHLD wakes the select below
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda sig, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)  # the pytest worker's pipe: its end is the zygote's
    runs = {}  # pid -> the stand-in's connection
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                request, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
                sys.stdout.flush(), sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    try:
                        run(
                            json.loads(request), fds, [selector, listener, connection, *runs.values()], (wake_read, wake_write)
                        )
                    finally:
                        os._exit(1)  # never back into this loop as a second zygote
                for fd in fds:
                    os.close(fd)
                runs[pid] = connection
                selector.register(connection, selectors.EVENT_READ)
                with contextlib.suppress(OSError):  # (a stand-in killed already: the close below kills the run)
                    connection.send(b"pid %d" % pid)
            elif key.fileobj is wake_read:
                os.read(wake_read, 4096)
            elif key.fileobj is sys.stdin:
                if not sys.stdin.buffer.read1(4096):  # the pytest worker has ended: so do its runs
                    for pid in runs:
                        os.kill(pid, signal.SIGKILL)
                    return
            else:  # a stand-in's connection closed (it was killed): kill its run
                selector.unregister(key.fileobj)
                pid = next(pid for pid, connection in runs.items() if connection is key.fileobj)
                os.kill(pid, signal.SIGKILL)
        while runs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = runs.pop(pid)
            with contextlib.suppress(KeyError, OSError):  # (a killed stand-in's connection: gone)
                selector.unregister(connection)
                connection.send(b"exit %d" % status)
            connection.close()


def run(request, fds, closing, wake):
    """In the forked child: become `python SCRIPT ARGS` as the stand-in was started, and run the script as Python runs
    a main script (its exit status as the interpreter sets it, non-daemon threads waited for, atexit functions run)."""
    import atexit
    import runpy
    import threading

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in FORWARDED:  # as Python starts: a signal ignored by the command stays ignored, Ctrl-C raises
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if sig in request["ignored"] else default)
    for each in closing:
        each.close()
    for fd in wake:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code & 0xFF
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    threading._shutdown()  # what the interpreter does at exit: wait for the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        stand_in(sys.argv[1], sys.argv[2:])
