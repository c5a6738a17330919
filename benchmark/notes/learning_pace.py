"""How fast each run learns, from its TensorBoard log: at each checkpoint step, the mean true return and episode length
of the episodes that ended in the 50k steps before it, and (RLHF runs) the labels held and the reward model's
correlation with the true reward on the latest rollout. Tells a run that is slow from one that is stuck, and whether
the learned reward was still wrong when the run fell behind.

Usage (from the repository root):
  python benchmark/notes/learning_pace.py "benchmark/sweeps/c17_mujoco/Hopper-v4__labels350__*/runs/*" [--steps 100000 200000]
"""

import argparse
import glob

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def mean_between(points, low, high):
    values = [p.value for p in points if low <= p.step < high]
    return np.mean(values) if values else float("nan")


def latest_at(points, step):
    earlier = [p.value for p in points if p.step <= step]
    return earlier[-1] if earlier else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern", help="glob of run folders (runs/NAME)")
    parser.add_argument("--steps", type=int, nargs="+", default=[100000, 150000, 200000, 300000, 500000, 700000, 1000000])
    parser.add_argument("--window", type=int, default=50000, help="episodes that ended this many steps before each step")
    args = parser.parse_args()
    print(f"at each step: mean true return / mean episode length of the episodes that ended in the {args.window} steps "
          "before it; RLHF runs also: labels held, reward model's correlation with the true reward")
    print("| run | " + " | ".join(f"{step // 1000}k" for step in args.steps) + " |")
    print("|---|" + "---|" * len(args.steps))
    for run_dir in sorted(glob.glob(args.pattern)):
        events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        returns, lengths = events.Scalars("charts/episodic_return"), events.Scalars("charts/episodic_length")
        cells = []
        for step in args.steps:
            cell = f"{mean_between(returns, step - args.window, step):.0f} / {mean_between(lengths, step - args.window, step):.0f}"
            if "labels/total" in tags:
                labels = latest_at(events.Scalars("labels/total"), step)
                correlation = latest_at(events.Scalars("reward_model/true_correlation"), step)
                cell += f" ({labels:.0f}, {correlation:.2f})"
            cells.append(cell)
        name = run_dir.rstrip("/").split("/")[-3] if "/runs/" in run_dir else run_dir
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
