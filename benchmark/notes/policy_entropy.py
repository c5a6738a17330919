"""The policy's entropy (TensorBoard's losses/entropy, logged every PPO iteration) at a few steps, for every run of one
or more sweeps: how fast each run's policy stops exploring. Reads runs/ (kept on the machine that ran the sweep, not
committed).

Usage (from the repository root):
  python benchmark/notes/policy_entropy.py benchmark/sweeps/swimmer_c17_rl [SWEEP ...] [--env Swimmer-v4] [--steps 100000 ...]
"""

import argparse
import glob
import os

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument("--env", default="", help="only the runs of this env id")
    parser.add_argument("--steps", type=int, nargs="+", default=[100_000, 200_000, 300_000, 400_000, 600_000, 1_000_000])
    cli = parser.parse_args()
    print("| run | final true return | " + " | ".join(f"entropy at {step // 1000}k" for step in cli.steps) + " |")
    print("|---|---|" + "---|" * len(cli.steps))
    for sweep in cli.sweeps:
        for run_dir in sorted(glob.glob(os.path.join(sweep, f"{cli.env}*", "runs", "*", ""))):
            events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
            events.Reload()
            entropy = events.Scalars("losses/entropy")
            steps, values = np.array([e.step for e in entropy]), np.array([e.value for e in entropy])
            returns = [e.value for e in events.Scalars("charts/episodic_return")]
            nearest = [values[np.abs(steps - step).argmin()] for step in cli.steps]
            name = os.path.relpath(run_dir, sweep).split(os.sep)[0]
            print(
                f"| {os.path.basename(os.path.normpath(sweep))}/{name} | {np.mean(returns[-10:]):.0f} | "
                + " | ".join(f"{value:.2f}" for value in nearest)
                + " |"
            )


if __name__ == "__main__":
    main()
