"""How fast each run learns, from its TensorBoard log: at each of the given steps (--steps), the mean true return and episode length
of the episodes that ended in the 50k steps before it, and (RLHF runs) the labels held and the reward model's
correlation with the true reward on the latest rollout. Tells a run that is slow from one that is stuck, and whether
the learned reward was still wrong when the run fell behind.

Usage (from the repository root):
  python benchmark/notes/learning_pace.py "benchmark/sweeps/c17_mujoco/Hopper-v4__labels350__*/runs/*" [--steps 100000 200000]
  python benchmark/notes/learning_pace.py "PATTERN" --tag losses/entropy     # any logged scalar instead, its window mean
  python benchmark/notes/learning_pace.py --sweep benchmark/sweeps/c17_mujoco --env Hopper-v4
The second form needs no TensorBoard logs: from the committed run.log files, per mode, the mean over seeds of the
progress lines' true return (the last 10 episodes) at each step.
"""

import argparse
import collections
import glob
import re
import sys
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def mean_between(points, low, high):
    values = [p.value for p in points if low <= p.step < high]
    return np.mean(values) if values else float("nan")


def latest_at(points, step):
    earlier = [p.value for p in points if p.step <= step]
    return earlier[-1] if earlier else float("nan")


def modes_from_logs(sweep_dir, env, steps):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from plot import progress

    by_mode = collections.defaultdict(list)
    for log in sorted(Path(sweep_dir).glob(f"{env}__*__*/run.log")):
        mode = re.match(rf"{re.escape(env)}__(\w+?)__\d+$", log.parent.name).group(1)
        logged_steps, returns, _ = progress(log)
        by_mode[mode].append([returns[logged_steps <= step][-1] if logged_steps[-1] >= step else np.nan for step in steps])
    print(f"{env} in {sweep_dir}: mean over seeds of the true return of the last 10 episodes at each step")
    print("| mode | seeds | " + " | ".join(f"{step // 1000}k" for step in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for mode, rows in sorted(by_mode.items(), key=lambda item: (item[0] != "true", len(item[0]), item[0])):
        means = np.nanmean(np.array(rows), axis=0)
        print(f"| {mode} | {len(rows)} | " + " | ".join(f"{mean:.0f}" for mean in means) + " |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern", nargs="?", help="glob of run folders (runs/NAME)")
    parser.add_argument("--sweep", help="a sweep's folder: read its run.log files instead (with --env)")
    parser.add_argument("--env", default="Hopper-v4")
    parser.add_argument("--steps", type=int, nargs="+", default=[100000, 150000, 200000, 300000, 500000, 700000, 1000000])
    parser.add_argument("--window", type=int, default=50000, help="episodes that ended this many steps before each step")
    parser.add_argument("--tag", help="instead: this logged scalar's mean over the window (e.g. losses/entropy)")
    args = parser.parse_args()
    if args.sweep:
        return modes_from_logs(args.sweep, args.env, args.steps)
    if args.tag:
        print(f"at each step: the mean of {args.tag} over the {args.window} steps before it")
    else:
        print(
            f"at each step: mean true return / mean episode length of the episodes that ended in the {args.window} "
            "steps before it; RLHF runs also: labels held, reward model's correlation with the true reward"
        )
    print("| run | " + " | ".join(f"{step // 1000}k" for step in args.steps) + " |")
    print("|---|" + "---|" * len(args.steps))
    for run_dir in sorted(glob.glob(args.pattern)):
        events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        returns, lengths = events.Scalars("charts/episodic_return"), events.Scalars("charts/episodic_length")
        cells = []
        for step in args.steps:
            if args.tag:
                cells.append(f"{mean_between(events.Scalars(args.tag), step - args.window, step):.2f}")
                continue
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
