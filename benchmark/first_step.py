"""Start-up time: seconds from launching a training script to its first environment step (the whole process: Python,
imports, argument parsing, environment creation), the median of --repeats launches.

    python benchmark/first_step.py [--repeats 5] -- SCRIPT [SCRIPT'S ARGS...]

Each launch runs SCRIPT in a fresh Python whose gymnasium vector env ends the process at its first step().
"""

import argparse
import statistics
import subprocess
import sys
import time

STOP_AT_FIRST_STEP = """
import os, runpy, sys, time
import gymnasium as gym

def first_step(self, actions):
    print(f"FIRST_STEP {time.time():.6f}", flush=True)
    os._exit(0)

gym.vector.SyncVectorEnv.step = first_step
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def seconds_to_first_step(command, cwd=None):
    start = time.time()
    result = subprocess.run([sys.executable, "-c", STOP_AT_FIRST_STEP, *command], capture_output=True, text=True, cwd=cwd)
    stamps = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("FIRST_STEP ")]
    if not stamps:
        raise SystemExit(f"error: {' '.join(command)} never stepped its environments:\n{result.stderr[-2000:]}")
    return float(stamps[0]) - start


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cwd", default=None, help="folder to run the script in")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("give the script to time after --")
    times = [seconds_to_first_step(command, options.cwd) for _ in range(options.repeats)]
    print(
        f"first step after {statistics.median(times):.2f} s (median of {len(times)}: {', '.join(f'{t:.2f}' for t in times)})"
    )
