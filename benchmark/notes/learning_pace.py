"""How fast each run learns, from its TensorBoard log: at each of the given steps (--steps), the mean true return and episode length
of the episodes that ended in the 50k steps before it, and (RLHF runs) the labels held and the reward model's
correlation with the true reward on the latest rollout. Tells a run that is slow from one that is stuck, and whether
the learned reward was still wrong when the run fell behind.

Usage (from the repository root):
  python benchmark/notes/learning_pace.py "benchmark/sweeps/c17_mujoco/Hopper-v4__labels350__*/runs/*" [--steps 100000 200000]
  python benchmark/notes/learning_pace.py "PATTERN" --tag losses/entropy     # any logged scalar instead, its window mean
  python benchmark/notes/learning_pace.py --sweep benchmark/sweeps/c17_mujoco --env Hopper-v4
  python benchmark/notes/learning_pace.py --sweep VARIANT_SWEEP --against benchmark/sweeps/c17_mujoco --env Hopper-v4
  python benchmark/notes/learning_pace.py --predicts-final "benchmark/sweeps/*/Hopper-v4__labels350__*/run.log"
The last three forms need no TensorBoard logs: from the committed run.log files, per mode, the mean over seeds of the
progress lines' true return (the last 10 episodes) at each step; with --against, run by run against the runs of the same
mode and seed in another sweep (a change against the default): the mean difference, its standard error, on how many
seeds the change was ahead, and the same for the reward model's correlation with the true reward (RLHF runs). The
last form says how well a run's pace at each step predicts its final return (the correlation over the finished runs
matched), i.e. what a screen stopped at that step can tell.
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


def run_log_progress():
    """benchmark/plot.py's reader of a run.log: (steps, true return of the last 10 episodes, wall time)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from plot import progress

    return progress


def modes_from_logs(sweep_dir, env, steps):
    progress = run_log_progress()
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


def paired_with(sweep_dir, baseline_dir, env, steps):
    progress = run_log_progress()

    def at_steps(log):  # true return of the last 10 episodes and the reward correlation of the latest line at each step
        logged_steps, returns, _ = progress(log)
        correlations = {
            int(step): float(corr) for step, corr in re.findall(r"^step (\d+),.* corr ([-\d.]+)", log.read_text(), re.M)
        }
        cells = []
        for step in steps:
            if logged_steps[-1] < step:
                cells.append((np.nan, np.nan))
                continue
            last = logged_steps[logged_steps <= step][-1]
            cells.append((returns[logged_steps <= step][-1], correlations.get(int(last), np.nan)))
        return np.array(cells)

    print(f"{env}: {sweep_dir} against {baseline_dir}, seed by seed (change - baseline)")
    print(
        "| mode | step | seeds | true return, change / baseline | difference ± SE (ahead on) | correlation, change / baseline | difference ± SE |"
    )
    print("|---|---|---|---|---|---|---|")
    for log in sorted(Path(sweep_dir).glob(f"{env}__*__1/run.log")):
        mode = re.match(rf"{re.escape(env)}__(\w+?)__1$", log.parent.name).group(1)
        pairs = []
        for changed in sorted(Path(sweep_dir).glob(f"{env}__{mode}__*/run.log")):
            baseline = Path(baseline_dir) / changed.parent.name / "run.log"
            if baseline.exists():
                pairs.append((at_steps(changed), at_steps(baseline)))
        for i, step in enumerate(steps):
            both = [(a[i], b[i]) for a, b in pairs if not np.isnan(a[i][0]) and not np.isnan(b[i][0])]
            if len(both) < 2:
                continue
            change, base = np.array([a for a, _ in both]), np.array([b for _, b in both])
            diff = change - base
            se = diff.std(axis=0, ddof=1) / np.sqrt(len(diff))
            print(
                f"| {mode} | {step // 1000}k | {len(diff)} | {change[:, 0].mean():.0f} / {base[:, 0].mean():.0f} | "
                f"{diff[:, 0].mean():+.0f} ± {se[0]:.0f} ({(diff[:, 0] > 0).sum()} of {len(diff)}) | "
                f"{change[:, 1].mean():.2f} / {base[:, 1].mean():.2f} | {diff[:, 1].mean():+.2f} ± {se[1]:.2f} |"
            )


def predicts_final(pattern, steps):
    progress = run_log_progress()
    rows = []
    for log in sorted(glob.glob(pattern)):
        if (Path(log).parent / "done.json").exists():
            logged_steps, returns, _ = progress(log)
            rows.append(
                [returns[min(np.searchsorted(logged_steps, step), len(returns) - 1)] for step in steps] + [returns[-1]]
            )
    rows = np.array(rows)
    print(f"{len(rows)} finished runs ({pattern}): correlation of the true return at each step with the final one")
    for i, step in enumerate(steps):
        print(f"{step // 1000}k: {np.corrcoef(rows[:, i], rows[:, -1])[0, 1]:.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern", nargs="?", help="glob of run folders (runs/NAME)")
    parser.add_argument("--sweep", help="a sweep's folder: read its run.log files instead (with --env)")
    parser.add_argument("--against", help="with --sweep: another sweep's folder, compared run by run (same mode and seed)")
    parser.add_argument("--predicts-final", metavar="GLOB", help="run.log files: how well the pace predicts the final return")
    parser.add_argument("--env", default="Hopper-v4")
    parser.add_argument("--steps", type=int, nargs="+", default=[100000, 150000, 200000, 300000, 500000, 700000, 1000000])
    parser.add_argument("--window", type=int, default=50000, help="episodes that ended this many steps before each step")
    parser.add_argument("--tag", help="instead: this logged scalar's mean over the window (e.g. losses/entropy)")
    args = parser.parse_args()
    if args.predicts_final:
        return predicts_final(args.predicts_final, args.steps)
    if args.sweep and args.against:
        return paired_with(args.sweep, args.against, args.env, args.steps)
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
