"""How much CPU label_server.py's main thread spends on requests whose head trickles in a byte at a time (issue 20: the
main thread searched all that a connection had sent for the end of its head on every recv, so a head of n bytes sent
in n pieces cost time in n squared), and how long a new client waits for GET /healthz meanwhile.

Starts the server on a free port of 127.0.0.1 with a database in a temporary folder, then --clients connections each
send `GET /healthz HTTP/1.1`, a header of --head-bytes bytes one byte per send (TCP_NODELAY, --pause seconds between
sends, so that most bytes arrive in a recv of their own) and the blank line; the server's CPU time is read from /proc
before and after, and a probe times GET /healthz on a fresh connection halfway through. Linux only.

    python benchmark/label_server_trickle.py
    python benchmark/label_server_trickle.py --server /tmp/label_server_before.py   # another version
"""

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from label_server_idle import cpu_seconds, start_server  # noqa: E402


def trickle(port, head_bytes, pause, replies, index):
    """Sends a GET /healthz whose head is `head_bytes` long, one byte per send; notes whether it was answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: ")
        for _ in range(head_bytes):
            sock.send(b"a")
            time.sleep(pause)
        sock.sendall(b"\r\n\r\n")
        replies[index] = sock.recv(100).split(b"\r\n")[0].decode()


def probe(port):
    """Seconds a fresh connection waits for GET /healthz to be answered."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        sock.recv(100)
    return time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=str(Path(__file__).resolve().parents[1] / "label_server.py"))
    parser.add_argument("--clients", type=int, default=1, help="connections trickling a head at once")
    parser.add_argument("--head-bytes", type=int, default=60000, help="bytes of the header sent a byte at a time")
    parser.add_argument("--pause", type=float, default=0.0001, help="seconds between two sends of one client")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        process, port = start_server(args.server, str(Path(folder) / "labels.sqlite"), [])
        try:
            replies = [None] * args.clients
            clients = [
                threading.Thread(target=trickle, args=(port, args.head_bytes, args.pause, replies, i))
                for i in range(args.clients)
            ]
            cpu_before, started = cpu_seconds(process.pid), time.monotonic()
            for client in clients:
                client.start()
            while time.monotonic() - started < 1 and any(client.is_alive() for client in clients):
                time.sleep(0.05)  # a probe while the heads are arriving
            waited = probe(port)
            for client in clients:
                client.join()
            wall, cpu = time.monotonic() - started, cpu_seconds(process.pid) - cpu_before
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"server: {args.server}")
    print(f"{args.clients} client(s), each a {args.head_bytes:,}-byte header in 1-byte sends: {wall:.1f} s")
    print(f"server CPU: {cpu:.2f} s ({1e6 * cpu / (args.clients * args.head_bytes):.1f} us per byte)")
    print(f"GET /healthz from a new client meanwhile: {waited * 1000:.0f} ms; the trickled requests got: {set(replies)}")


if __name__ == "__main__":
    main()
