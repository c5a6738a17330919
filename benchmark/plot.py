"""Curves and a table from the benchmark runs' TensorBoard logs: true episodic return of RLHF against true-reward PPO.

Usage (from the repository root): python benchmark/plot.py --env Hopper-v4 [--runs runs] [--out benchmark]
"""

import argparse
import collections
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def episodic_returns(run_dir):
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars("charts/episodic_return")
    return np.array([p.step for p in points]), np.array([p.value for p in points])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Hopper-v4")
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--out", default="benchmark")
    parser.add_argument("--prefix", default="bench_", help="only runs whose exp_name starts with this")
    args = parser.parse_args()

    groups = collections.defaultdict(list)  # exp_name -> [(seed, steps, returns)]
    for run_dir in sorted(glob.glob(f"{args.runs}/{args.env}__{args.prefix}*")):
        _, exp_name, seed, _ = os.path.basename(run_dir).split("__")
        steps, returns = episodic_returns(run_dir)
        if len(returns):
            groups[exp_name].append((int(seed), steps, returns))

    horizon = max(steps.max() for runs in groups.values() for _, steps, _ in runs)
    grid = np.linspace(0, horizon, 101)
    plt.figure(figsize=(7, 4.5))
    table = [
        "| run | seeds | steps | final true return per seed (mean of last 10 episodes) | mean ± std |",
        "|---|---|---|---|---|",
    ]
    finals = {}
    for exp_name, runs in sorted(groups.items()):
        curves = []
        for _, steps, returns in runs:
            # mean true return of the episodes that ended in each bin of the step axis, carried forward over empty bins
            idx = np.searchsorted(grid, steps, side="right") - 1
            binned = np.array([returns[idx == i].mean() if np.any(idx == i) else np.nan for i in range(len(grid) - 1)])
            for i in range(
                1, min(idx.max() + 1, len(binned))
            ):  # not past the run's last episode (an unfinished run stops there)
                if np.isnan(binned[i]):
                    binned[i] = binned[i - 1]
            curves.append(binned)
        curves = np.array(curves)
        mean, std = np.nanmean(curves, 0), np.nanstd(curves, 0)
        centers = (grid[:-1] + grid[1:]) / 2
        plt.plot(centers, mean, label=f"{exp_name} ({len(runs)} seeds)")
        plt.fill_between(centers, mean - std, mean + std, alpha=0.2)
        per_seed = {seed: returns[-10:].mean() for seed, _, returns in runs}
        finals[exp_name] = np.mean(list(per_seed.values()))
        seeds_text = ", ".join(f"{seed}: {value:.0f}" for seed, value in sorted(per_seed.items()))
        last_step = max(steps.max() for _, steps, _ in runs)
        table.append(
            f"| {exp_name} | {len(runs)} | {last_step} | {seeds_text} | "
            f"{np.mean(list(per_seed.values())):.0f} ± {np.std(list(per_seed.values())):.0f} |"
        )
    plt.xlabel("environment steps")
    plt.ylabel("true episodic return (standard rules)")
    plt.title(args.env)
    plt.legend()
    plt.grid(alpha=0.3)
    png = f"{args.out}/{args.env.lower().replace('-', '_')}.png"
    plt.savefig(png, dpi=120, bbox_inches="tight")
    print("\n".join(table))
    baseline = [name for name in finals if "true" in name]
    for name, value in finals.items():
        if baseline and name not in baseline:
            print(f"{name} / {baseline[0]}: {value / finals[baseline[0]]:.2f}")
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
