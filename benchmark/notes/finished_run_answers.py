"""A moving-dot human run with a scripted rater answering every pair at once: the labels the run saved against the
labels the server made for its experiment (README, "Human feedback": a finished run keeps the answers given until its
end). Usage: python benchmark/notes/finished_run_answers.py CLONE [UNDO_SECONDS] (a clone of the repository: its runs/
is replaced; the server's --undo-seconds, 0 by default here). The server's labels are counted UNDO_SECONDS + 1 s after
the run's end (a run waits for the labels the server holds back for UNDO_SECONDS; before 2026-12-04 it did not).
"""

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np


def main():
    os.chdir(sys.argv[1])
    undo_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    shutil.rmtree("runs", ignore_errors=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    database = os.path.join(tempfile.mkdtemp(), "labels.sqlite")
    command = [sys.executable, "label_server.py", "--port", str(port), "--db", database, "--undo-seconds", str(undo_seconds)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    server.stdout.readline()  # "label server on ..."
    url = f"http://127.0.0.1:{port}"

    def call(method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None

    stop = threading.Event()

    def rater():  # every pair answered as soon as it is served, by the true returns in its metadata
        while not stop.is_set():
            status, pair = call("GET", "/api/pairs/next?rater=bot")
            if status != 200:
                time.sleep(0.1)
                continue
            meta = call("GET", f"/api/pairs/{pair['pair_id']}")[1]["metadata"]
            choice = "left" if meta["left_true_return"] > meta["right_true_return"] else "right"
            call("POST", "/api/labels", {"pair_id": pair["pair_id"], "rater": "bot", "choice": choice})

    threading.Thread(target=rater, daemon=True).start()
    run_args = ["--feedback", "human", "--segment-len", "25", "--clip-fps", "15", "--label-server", url]
    run_args += ["--total-timesteps", "40960", "--labels", "40", "--exp-name", "answers", "--threads", "1"]
    output = subprocess.run([sys.executable, "rlhf_moving_dot.py", *run_args], capture_output=True, text=True).stdout
    stop.set()
    run_dir = glob.glob("runs/*answers*")[0]

    def count(output):
        saved = len(np.load(f"{run_dir}/labels.npz")["mu"])
        time.sleep(undo_seconds + 1)  # every answer given is a label by now
        made = len(call("GET", f"/api/labels?experiment={os.path.basename(run_dir)}&since=0")[1]["labels"])
        print("\n".join(line for line in output.splitlines() if "labels saved" in line or "pairs" in line))
        print(f"labels the run saved: {saved}; labels the server made for its experiment: {made}")

    count(output)
    server.terminate()


if __name__ == "__main__":
    main()
