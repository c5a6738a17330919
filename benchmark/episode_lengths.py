"""How long episodes last and how much true reward each step earns, per run, late in training: tells an agent that falls
early from one that moves slowly. Reads the TensorBoard logs under runs/.

Usage (from the repository root): python benchmark/episode_lengths.py "runs/Hopper-v4__bench_*" [--after 800000]
"""

import argparse
import glob
import os

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern", help="glob of run folders")
    parser.add_argument("--after", type=int, default=800000, help="only episodes that ended after this step")
    args = parser.parse_args()
    print(f"episodes that ended after step {args.after}:")
    print("| run | episodes | mean true return | mean length | true reward per step | share under 1000 steps (fell) |")
    print("|---|---|---|---|---|---|")
    for run_dir in sorted(glob.glob(args.pattern)):
        events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        events.Reload()
        returns = events.Scalars("charts/episodic_return")
        steps = np.array([p.step for p in returns])
        late = steps > args.after
        returns = np.array([p.value for p in returns])[late]
        lengths = np.array([p.value for p in events.Scalars("charts/episodic_length")])[late]
        if not late.any():
            continue
        print(
            f"| {os.path.basename(run_dir)} | {late.sum()} | {returns.mean():.0f} | {lengths.mean():.0f} | "
            f"{returns.sum() / lengths.sum():.2f} | {(lengths < 1000).mean():.2f} |"
        )


if __name__ == "__main__":
    main()
