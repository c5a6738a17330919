"""Several simulated raters labelling at once against label_server.py: how many of their answers become labels?

Starts the server on a free port of 127.0.0.1 with a fresh database, posts N pairs, and runs K raters in threads.
Each asks for its next pair, takes about --seconds-per-answer to watch it (uniform within +-20%: 2-3 s by default,
as people did in the issue's trial), and answers. When every pair has its label, it prints the answers given, the
labels produced and the share of answers that became labels (answers to a pair that was already final, or that
went beyond the --overlap answers it needed, are wasted).

    python benchmark/label_server_raters.py --pairs 30 --raters 3 --seconds-per-answer 0.2
    python benchmark/label_server_raters.py --server /tmp/label_server_before.py ...   # another version of the server
    python benchmark/label_server_raters.py --pairs 600 --raters 8 --seconds-per-answer 0 --upload-mb 4
        # and a trainer uploading a 4 MiB clip again and again meanwhile (the database busy while each is written)
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

CLIP = b"\x1a\x45\xdf\xa3" + bytes(64)  # a WebM signature is all the server needs to accept a clip


def call(url, method, path, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data=data, method=method)
    if method == "POST":
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            payload, status = response.read(), response.status
    except urllib.error.HTTPError as error:
        payload, status = error.read(), error.code
    return status, json.loads(payload) if payload else None


def rater(url, name, seconds, done, answers, lock):
    rng = random.Random(name)
    while not done.is_set():
        status, pair = call(url, "GET", f"/api/pairs/next?rater={name}")
        if status == 204:
            time.sleep(0.05)  # nothing for this rater now (the page checks again every few seconds)
            continue
        time.sleep(seconds * rng.uniform(0.8, 1.2))  # watching the two clips
        status, reply = call(url, "POST", "/api/labels", {"pair_id": pair["pair_id"], "rater": name, "choice": "left"})
        assert status in (200, 201), reply
        with lock:
            answers.append(pair["pair_id"])


def uploader(url, megabytes, done):
    """A trainer's clip uploads, one after another until `done`: each holds the server's database while it is written."""
    clip = CLIP + bytes(megabytes << 20)
    while not done.is_set():
        assert call(url, "PUT", "/api/clips/big", raw=clip)[0] in (200, 201)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=str(Path(__file__).resolve().parents[1] / "label_server.py"))
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--raters", type=int, default=3)
    parser.add_argument("--overlap", type=int, default=1)
    parser.add_argument("--seconds-per-answer", type=float, default=2.5)
    parser.add_argument("--upload-mb", type=int, default=0, help="with N > 0: a clip of N MiB uploaded again and again")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, args.server, "--port", "0", "--db", f"{tmp}/labels.sqlite", "--quiet"]
        server = subprocess.Popen(command + ["--overlap", str(args.overlap)], stdout=subprocess.PIPE, text=True)
        try:
            url = server.stdout.readline().split()[3].rstrip("/")  # "label server on http://127.0.0.1:PORT/ ..."
            for i in range(args.pairs):
                for side in "lr":
                    assert call(url, "PUT", f"/api/clips/c{i}{side}", raw=CLIP)[0] == 201
                pair = {"experiment": "bench", "pair_id": f"p{i}", "left_clip": f"c{i}l", "right_clip": f"c{i}r"}
                assert call(url, "POST", "/api/pairs", pair)[0] == 201

            done, answers, lock = threading.Event(), [], threading.Lock()
            threads = [
                threading.Thread(target=rater, args=(url, f"rater{k}", args.seconds_per_answer, done, answers, lock))
                for k in range(args.raters)
            ]
            if args.upload_mb > 0:
                threads.append(threading.Thread(target=uploader, args=(url, args.upload_mb, done)))
            started = time.monotonic()
            for thread in threads:
                thread.start()
            while call(url, "GET", "/healthz")[1]["labels"] < args.pairs:
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            done.set()
            for thread in threads:
                thread.join()
            counts = call(url, "GET", "/healthz")[1]
        finally:
            server.terminate()
            server.wait(timeout=30)

    given, labels = len(answers), counts["labels"]
    assert given == counts["answers"]  # every answer given was recorded (none was a repeat)
    print(
        f"{args.raters} raters, {args.pairs} pairs, overlap {args.overlap}, {args.seconds_per_answer} s per answer: "
        f"{given} answers recorded for {labels} labels, {args.overlap * labels / given:.0%} of answers needed "
        f"({given - args.overlap * labels} wasted), all labelled after {elapsed:.1f} s"
        + (f", a {args.upload_mb} MiB clip uploaded again and again meanwhile" if args.upload_mb > 0 else "")
    )


if __name__ == "__main__":
    main()
