"""How long a new client waits for GET /healthz while label_server.py holds many idle or slow connections, and how
much CPU the server uses meanwhile (issue 20: "about 1,000 idle connections made /healthz time out with the server
at 100% CPU").

Each case starts the server on a free port of 127.0.0.1 with a database in a temporary folder (default options
unless --server-args), opens its connections and holds them:
  half-sent heads   the request line and a header, never the blank line that ends the head
  half-sent bodies  a whole head promising a JSON body, and half of that body
  silent            connected, nothing sent (a browser's preconnect, a port scanner)
  keep-alive        one GET /healthz each, answered, then nothing (the connections a browser keeps open)
then reads the server's CPU time over --idle-seconds, and opens --probes fresh connections at once, each timing its
GET /healthz (a probe gives up after --give-up seconds). Linux only (CPU time and threads are read from /proc).

    python benchmark/label_server_idle.py
    python benchmark/label_server_idle.py --server /tmp/label_server_before.py --give-up 150   # another version
"""

import argparse
import os
import resource
import selectors
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
HALF_BODY = (
    b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n"
    b'{"pair_id": "p1", "rater'
)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CASES = {  # name: (connections, what each sends once connected)
    "half-sent heads": (300, HALF_HEAD),
    "half-sent bodies": (300, HALF_BODY),
    "silent": (1000, b""),
    "keep-alive": (1000, HEALTHZ),
}


def start_server(server, db, extra_args):
    command = [sys.executable, server, "--port", "0", "--db", db, "--quiet", *extra_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = process.stdout.readline()  # "label server on http://127.0.0.1:PORT/ (database ...)"
    if not first.startswith("label server on "):
        process.kill()
        raise SystemExit(f"the server did not start: {first}")
    return process, int(first.split()[3].rstrip("/").rsplit(":", 1)[1])


def cpu_seconds(pid):
    """User + system CPU time the process has used so far (/proc/PID/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after "(name)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def wait_for_replies(connections, seconds):
    """How many of the connections received a reply (any bytes) within `seconds`."""
    selector = selectors.DefaultSelector()
    for sock in connections:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    answered, deadline = 0, time.monotonic() + seconds
    while answered < len(connections) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            selector.unregister(key.fileobj)
            if key.fileobj.recv(65536):  # the whole small reply; b"" would mean the server closed it
                answered += 1
    selector.close()
    return answered


def probe(port, give_up, times):
    """Time one GET /healthz from a fresh connection, until its reply has been read; `give_up` if none came."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=give_up) as sock:
            sock.sendall(HEALTHZ)
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):  # the JSON body ends the reply
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        ok = reply.startswith(b"HTTP/1.1 200")
    except OSError:  # socket.timeout included
        ok = False
    times.append((time.perf_counter() - started, ok))


def run_case(args, name):
    count, sent = CASES[name]
    with tempfile.TemporaryDirectory() as folder:
        process, port = start_server(args.server, str(Path(folder) / "labels.sqlite"), shlex.split(args.server_args))
        held = []
        try:
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(sent)
                held.append(sock)
            note = ""
            if sent == HEALTHZ:  # wait a moment for the replies: the connections then sit idle
                note = f"{wait_for_replies(held, args.setup_seconds)}/{count} answered within {args.setup_seconds:g} s"
            time.sleep(0.5)  # let the server take in the last connections
            cpu_before = cpu_seconds(process.pid)
            time.sleep(args.idle_seconds)
            cpu = (cpu_seconds(process.pid) - cpu_before) / args.idle_seconds
            server_threads = threads(process.pid)
            times = []
            probes = [threading.Thread(target=probe, args=(port, args.give_up, times)) for _ in range(args.probes)]
            for thread in probes:
                thread.start()
            for thread in probes:
                thread.join()
        finally:
            for sock in held:
                sock.close()
            process.terminate()
            process.wait(timeout=30)
    seconds = [s for s, _ in times]
    failed = sum(not ok for _, ok in times)
    if failed:
        note += ("; " if note else "") + f"{failed} of {args.probes} probes got no reply within {args.give_up:g} s"
    return count, cpu, server_threads, statistics.median(seconds), max(seconds), note


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=str(Path(__file__).resolve().parents[1] / "label_server.py"))
    parser.add_argument("--server-args", default="", help='more options for the server, e.g. "--max-workers 64"')
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--probes", type=int, default=5, help="fresh connections timing GET /healthz (at once)")
    parser.add_argument("--give-up", type=float, default=150.0, help="seconds a probe waits for its reply")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="how long the server's CPU use is measured")
    parser.add_argument("--setup-seconds", type=float, default=5.0, help="keep-alive: how long to wait for replies")
    args = parser.parse_args()
    # a socket is a file descriptor: holding 1,000 connections needs more than the usual soft limit of 1,024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    print(f"{args.server} {args.server_args}".strip() + f"; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(
        f"{'case':18s} {'connections':>11s} {'server CPU while idle':>22s} {'threads':>8s} "
        f"{'/healthz median':>16s} {'slowest':>9s}  notes"
    )
    for name in args.cases:
        count, cpu, server_threads, median, slowest, note = run_case(args, name)
        print(f"{name:18s} {count:11d} {cpu:21.0%} {server_threads:8d} {median:14.3f} s {slowest:7.3f} s  {note}", flush=True)


if __name__ == "__main__":
    main()
