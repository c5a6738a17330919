"""Curves and a table from the benchmark runs' committed logs: true episodic return of RLHF against true-reward PPO.

Reads the progress lines of benchmark/logs/{env}__{exp_name}__{seed}.log ("step N, SPS s, true return R, ..."), where R is
the mean true return (standard rules) of the run's last 10 finished episodes. The logs are committed, so the figures
can be rebuilt without the TensorBoard folders. The spread over seeds, in the table and as the figure's band, is the
seeds' sample std (ddof=1, as in sweep.py's report; 0 where a single seed has a value).

Usage (from the repository root): python benchmark/plot.py --env Hopper-v4 [--logs benchmark/logs] [--out benchmark]
  [--runs NAME,NAME] (only these exp_names, whatever --prefix) [--max-steps N] (compare every run up to the same step)
  [--reference R --reference-label TEXT] (a horizontal line, e.g. a random policy's score) [--bins N] (also a table of
  each run's mean return in every N steps)
"""

import argparse
import collections
import glob
import os
import re
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PROGRESS = re.compile(r"^step (\d+), SPS \d+, true return (-?[\d.]+)", re.MULTILINE)
WALL = re.compile(r"^wall_s ([\d.]+)$", re.MULTILINE)  # appended by /usr/bin/time in benchmark/run_moving_dot.sh


def progress(log_path):
    """(steps, mean true return of the last 10 episodes) of every progress line of one run, and its wall time in
    seconds (NaN when the log has none)."""
    with open(log_path) as log:
        return progress_in(log.read())


def progress_in(text):
    """progress() of a log's text."""
    kept, wall = [], WALL.findall(text)
    for step, ret in PROGRESS.findall(text):
        # a run resumed with `--resume ... >> LOG` starts again at its checkpoint's step: its lines replace the
        # stopped run's lines from that step on
        while kept and kept[-1][0] >= int(step):
            kept.pop()
        kept.append((int(step), float(ret)))
    wall_s = float(wall[-1]) if wall else np.nan
    return np.array([s for s, _ in kept], dtype=int), np.array([r for _, r in kept]), wall_s


def seeds_std(values):
    """The sample std over seeds (axis 0), NaNs left out; 0 where fewer than two seeds have a value (no spread to show,
    where ddof=1 would give NaN and a warning)."""
    values = np.asarray(values, dtype=float)
    counted = (~np.isnan(values)).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.where(counted > 1, np.nanstd(values, 0, ddof=1), 0.0)


def fmt(value):
    """A return with one decimal where it matters (Pong's -20.7 and -20.1 differ), none for Hopper's thousands."""
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Hopper-v4")
    parser.add_argument("--logs", default="benchmark/logs")
    parser.add_argument("--out", default="benchmark")
    parser.add_argument("--prefix", default="bench_", help="only runs whose exp_name starts with this (without --runs)")
    parser.add_argument("--runs", default=None, help="only these exp_names, comma-separated (whatever their prefix)")
    parser.add_argument("--name", default=None, help="output file stem (default: the env id)")
    parser.add_argument("--max-steps", type=int, default=None, help="drop progress lines after this step in every run")
    parser.add_argument("--reference", type=float, default=None, help="draw a horizontal line at this return")
    parser.add_argument("--reference-label", default="reference", help="the legend of --reference")
    parser.add_argument("--bins", type=int, default=None, help="print the mean of the progress lines in every N steps")
    args = parser.parse_args()

    groups = collections.defaultdict(list)  # exp_name -> [(seed, steps, returns)]
    walls = collections.defaultdict(dict)  # exp_name -> {seed: wall seconds}
    prefix = "" if args.runs else args.prefix  # runs named one by one are read whatever their prefix
    for log_path in sorted(glob.glob(f"{args.logs}/{args.env}__{prefix}*.log")):
        _, exp_name, seed = os.path.basename(log_path)[: -len(".log")].split("__")
        if args.runs and exp_name not in args.runs.split(","):
            continue
        steps, returns, wall_s = progress(log_path)
        if args.max_steps is not None:  # runs that went on longer are compared over the same steps
            keep = steps <= args.max_steps
            steps, returns, wall_s = steps[keep], returns[keep], np.nan  # the wall time was for the whole run
        if len(returns):
            groups[exp_name].append((int(seed), steps, returns))
            walls[exp_name][int(seed)] = wall_s
    if not groups:
        wanted = f" of the runs {args.runs}" if args.runs else ""
        raise SystemExit(f"error: no logs matching {args.logs}/{args.env}__{prefix}*.log{wanted}")

    horizon = max(steps.max() for runs in groups.values() for _, steps, _ in runs)
    grid = np.linspace(0, horizon, 101)
    plt.figure(figsize=(7, 4.5))
    timed = any(not np.isnan(w) for seeds in walls.values() for w in seeds.values())
    table = [
        "| run | seeds | steps | final true return per seed (mean of last 10 episodes) | mean ± sample std |"
        + (" wall time per seed (s) | median wall time (s) |" if timed else ""),
        "|---|---|---|---|---|" + ("---|---|" if timed else ""),
    ]
    finals = {}
    for exp_name, runs in sorted(groups.items()):
        # each seed's curve on a common step grid, up to the last step every seed reached (a run under way or stopped
        # ends the group's curve and final there: a mean past it would be of fewer seeds)
        last_step = min(steps.max() for _, steps, _ in runs)
        curves = np.array([np.interp(grid, steps, returns, left=np.nan, right=np.nan) for _, steps, returns in runs])
        curves[:, grid > last_step] = np.nan
        with warnings.catch_warnings():  # grid points before any run's first progress line are NaN for all seeds
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, std = np.nanmean(curves, 0), seeds_std(curves)
        plt.plot(grid, mean, label=f"{exp_name} ({len(runs)} seeds)")
        plt.fill_between(grid, mean - std, mean + std, alpha=0.2)
        per_seed = {}
        for seed, steps, returns in sorted(runs, key=lambda run: run[0]):
            reached = returns[steps <= last_step]
            per_seed[seed] = reached[-1] if len(reached) else np.nan
            if not len(reached):  # its first episode ended later (long episodes): left out of the final
                print(f"{exp_name}: seed {seed} has no true return by step {last_step}; left out of the final")
            elif steps.max() > last_step:
                print(f"{exp_name}: seed {seed} goes on to step {steps.max()}; its final here is at step {last_step}")
        values = [value for value in per_seed.values() if not np.isnan(value)]
        finals[exp_name] = np.mean(values)
        seeds_text = ", ".join(f"{seed}: {'-' if np.isnan(v) else fmt(v)}" for seed, v in per_seed.items())
        row = f"| {exp_name} | {len(runs)} | {last_step} | {seeds_text} | {fmt(np.mean(values))} ± {fmt(seeds_std(values))} |"
        if timed:
            wall = walls[exp_name]
            row += f" {', '.join(f'{seed}: {w:.0f}' for seed, w in sorted(wall.items()))} | {np.median(list(wall.values())):.0f} |"
        table.append(row)
    if args.reference is not None:
        plt.axhline(args.reference, color="grey", linestyle="--", label=args.reference_label)
    plt.xlabel("environment steps")
    plt.ylabel("true episodic return (mean of last 10 episodes)")
    plt.title(args.env)
    plt.legend()
    plt.grid(alpha=0.3)
    png = f"{args.out}/{(args.name or args.env).lower().replace('-', '_')}.png"
    plt.savefig(png, dpi=120, bbox_inches="tight")
    print("\n".join(table))
    if args.bins:  # a curve as numbers: the mean of each run's progress lines (seeds pooled) in every N steps
        names = sorted(groups)
        last = max(steps.max() for runs in groups.values() for _, steps, _ in runs)
        print(f"\n| steps | {' | '.join(names)} |\n|---|" + "---|" * len(names))
        for start in range(0, int(last) + 1, args.bins):
            cells = []
            for name in names:
                inside = np.concatenate([r[(s > start) & (s <= start + args.bins)] for _, s, r in groups[name]])
                cells.append(f"{inside.mean():.2f} ({len(inside)})" if len(inside) else "")
            print(f"| {start // 1000}k-{(start + args.bins) // 1000}k | {' | '.join(cells)} |")
    baseline = [name for name in finals if "true" in name]
    for name, value in finals.items():
        if baseline and name not in baseline and finals[baseline[0]] > 0:  # a ratio of negative scores means nothing
            print(f"{name} / {baseline[0]}: {value / finals[baseline[0]]:.2f}")
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
