"""Final true returns of two sweeps, every finished seed of each (not paired by seed: seeds are independent draws, and
runs of one seed do not stay alike across code versions or machines): per mode, the mean and sample standard
deviation, the difference of the means with its standard error (Welch), and each mean's ratio to the true-reward
runs of the first sweep (counted from the runs' first logged return where the true reward's is negative, as
sweep.py's table does: Reacher); then every run's final return.

Usage (from the repository root):
  python benchmark/notes/final_returns.py --sweep benchmark/sweeps/hopper_clipfix --against benchmark/sweeps/c17_mujoco \
    --env Hopper-v4
A run counts once its folder has done.json; its final return is the true return of the last 10 episodes on its last
progress line (benchmark/plot.py's reader of run.log). With --own-baselines (for a change to PPO itself, where both
sweeps ran their own true-reward runs) the true-reward runs get a row too, and each sweep's ratio is to its own
true-reward runs.
"""

import argparse
import collections
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plot import progress  # noqa: E402
from sweep import ratio_to_true  # noqa: E402


def finals(sweep_dir, env):
    """mode -> {seed: final true return} of the finished runs."""
    by_mode = collections.defaultdict(dict)
    for log in sorted(Path(sweep_dir).glob(f"{env}__*__*/run.log")):
        if not (log.parent / "done.json").exists():
            continue
        mode, seed = re.match(rf"{re.escape(env)}__(\w+?)__(\d+)$", log.parent.name).groups()
        by_mode[mode][int(seed)] = progress(log)[1][-1]
    return {mode: dict(sorted(runs.items())) for mode, runs in by_mode.items()}


def start(sweep_dir, env):
    """The mean first logged true return of the sweep's finished runs of env (the untrained policy's), from which
    ratio_to_true counts where the true reward's return is negative."""
    logs = [log for log in Path(sweep_dir).glob(f"{env}__*__*/run.log") if (log.parent / "done.json").exists()]
    return float(np.mean([progress(log)[1][0] for log in logs]))


def ratio_text(ratio):
    return "n/a" if ratio is None else f"{ratio:.2f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", required=True)
    parser.add_argument("--against", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument(
        "--own-baselines", action="store_true", help="a row for the true reward; each sweep's ratios to its own"
    )
    options = parser.parse_args()
    change, baseline = finals(options.sweep, options.env), finals(options.against, options.env)
    true_mean = np.mean(list(change["true"].values()))
    if options.own_baselines and "true" not in baseline:
        raise SystemExit(f"error: --own-baselines needs finished true-reward runs in {options.against}")
    baseline_true_mean = np.mean(list(baseline["true"].values())) if options.own_baselines else true_mean
    change_start = start(options.sweep, options.env)
    baseline_start = start(options.against, options.env) if options.own_baselines else change_start
    shown = set(change) & set(baseline)
    if not options.own_baselines:
        shown.discard("true")
    modes = sorted(shown, key=lambda mode: (mode != "true", len(mode), mode))
    print(f"{options.env}: {options.sweep} against {options.against}, final true returns of the finished runs")
    print(f"ratios to the true-reward runs of {options.sweep} ({len(change['true'])} seeds, mean {true_mean:.0f})")
    if true_mean <= 0:
        print(f"(a negative return: the ratios count from the runs' first logged return, {change_start:.1f})")
    if options.own_baselines:
        print(
            f"baseline ratios to the true-reward runs of {options.against} ({len(baseline['true'])} seeds, mean {baseline_true_mean:.0f})"
        )
    print(
        "| mode | seeds, change | change, mean ± std | seeds, baseline | baseline, mean ± std | difference ± SE | ratio, change / baseline |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        a, b = np.array(list(change[mode].values())), np.array(list(baseline[mode].values()))
        se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        print(
            f"| {mode} | {', '.join(map(str, change[mode]))} | {a.mean():.0f} ± {a.std(ddof=1):.0f} | "
            f"{', '.join(map(str, baseline[mode]))} | {b.mean():.0f} ± {b.std(ddof=1):.0f} | "
            f"{a.mean() - b.mean():+.0f} ± {se:.0f} | {ratio_text(ratio_to_true(a.mean(), true_mean, change_start))} / "
            f"{ratio_text(ratio_to_true(b.mean(), baseline_true_mean, baseline_start))} |"
        )
    print("per seed (seed: final true return):")
    for mode in modes:
        for name, runs in (("change", change[mode]), ("baseline", baseline[mode])):
            print(f"- {mode}, {name}: " + ", ".join(f"{seed}: {final:.0f}" for seed, final in runs.items()))


if __name__ == "__main__":
    main()
