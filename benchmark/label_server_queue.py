"""How long label_server.py takes to hand out a pair, record an answer and count a rater's queue when the database is
large: --labelled pairs already labelled and --open pairs waiting, in --experiments experiments of runs that ended,
plus a live run whose trainer posts its pairs (the newest) during the measurement.

The database is filled directly through SQLite (a trainer posting 100k pairs over HTTP would take minutes), with the
schema the server under test creates itself. Then the server runs on a free port of 127.0.0.1 and --raters raters in
turn ask for their next pair, answer it and read their stats; each request's time is measured by the client
(median and 90th percentile, milliseconds).

    python benchmark/label_server_queue.py --open 100000 --labelled 100000
    python benchmark/label_server_queue.py --server /tmp/label_server_before.py ...   # another version of the server
"""

import argparse
import importlib.util
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from label_server_raters import CLIP, call  # the same simulated client, in the same folder


def timed_call(url, method, path, body=None):
    """(status, parsed JSON or None, milliseconds) of one request."""
    started = time.perf_counter()
    status, payload = call(url, method, path, body)
    return status, payload, 1000 * (time.perf_counter() - started)


def fill(server_path, db, open_pairs, labelled, experiments):
    spec = importlib.util.spec_from_file_location("server_under_test", server_path)
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    server.LabelStore(str(db)).db.close()  # the schema, as this version of the server makes it
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO clips VALUES ('c', 'video/webm', ?, 0)", (CLIP,))
        now = time.time() - 86400
        rows = [
            (f"p{i}", f"ended{i % experiments}", "c", "c", "Which is better?", "{}", None, now + i)
            for i in range(labelled + open_pairs)
        ]
        connection.executemany(
            "INSERT INTO pairs (pair_id, experiment, left_clip, right_clip, instruction, metadata, golden, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        connection.executemany(
            "INSERT INTO answers VALUES (?, 'past', 'left', ?)", [(f"p{i}", now + i) for i in range(labelled)]
        )
        connection.executemany(
            "INSERT INTO labels (pair_id, experiment, choice, votes, created) VALUES (?, ?, 'left', '[\"left\"]', ?)",
            [(f"p{i}", f"ended{i % experiments}", now + i) for i in range(labelled)],
        )
        columns = [row[1] for row in connection.execute("PRAGMA table_info(pairs)")]
        if "open" in columns:  # a server that keeps an open flag: labelled pairs are closed
            connection.execute("UPDATE pairs SET open = 0 WHERE pair_id IN (SELECT pair_id FROM labels)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=str(Path(__file__).resolve().parents[1] / "label_server.py"))
    parser.add_argument("--open", type=int, default=100_000, help="pairs waiting for an answer")
    parser.add_argument("--labelled", type=int, default=100_000, help="pairs already labelled")
    parser.add_argument("--experiments", type=int, default=10, help="ended experiments the pairs belong to")
    parser.add_argument("--raters", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=60, help="next, answer and stats requests per rater")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "queue.sqlite"
        started = time.perf_counter()
        fill(args.server, db, args.open, args.labelled, args.experiments)
        fill_s = time.perf_counter() - started
        command = [sys.executable, args.server, "--port", "0", "--db", str(db), "--quiet"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            first = process.stdout.readline()
            if not first.startswith("label server on "):
                raise SystemExit(f"the server did not start: {first}")
            url = first.split()[3].rstrip("/")
            times = {"next": [], "answer": [], "stats": []}
            for round_index in range(args.rounds):
                # the live run posts a new pair now and then: its pairs are the newest and come first
                if round_index % 10 == 0:
                    pair = {"experiment": "live", "pair_id": f"live{round_index}", "left_clip": "c", "right_clip": "c"}
                    assert timed_call(url, "POST", "/api/pairs", pair)[0] == 201
                for rater_index in range(args.raters):
                    rater = f"rater{rater_index}"
                    status, pair, ms = timed_call(url, "GET", f"/api/pairs/next?rater={rater}")
                    assert status == 200, (status, pair)
                    times["next"].append(ms)
                    vote = {"pair_id": pair["pair_id"], "rater": rater, "choice": "left"}
                    status, _, ms = timed_call(url, "POST", "/api/labels", vote)
                    assert status in (200, 201), status
                    times["answer"].append(ms)
                    status, _, ms = timed_call(url, "GET", f"/api/stats?rater={rater}")
                    times["stats"].append(ms)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        f"{args.server}: {args.open} open + {args.labelled} labelled pairs in {args.experiments} ended experiments "
        f"(filled in {fill_s:.1f} s), {args.raters} raters x {args.rounds} rounds"
    )
    for name, values in times.items():
        values = sorted(values)
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"  {name:6s} median {statistics.median(values):7.1f} ms, 90th percentile {p90:7.1f} ms")


if __name__ == "__main__":
    main()
