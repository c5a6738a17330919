"""Final true returns of one mode in several sweeps, paired by seed: per sweep the seeds' returns, mean ± sample std and
runs over --fast; then the first sweep against each other one, over the seeds both finished: the mean of the per-seed
differences ± their standard error (sample std / sqrt(n)), and on how many seeds the first was ahead. (final_returns.py
compares two sweeps' means unpaired, with Welch's standard error.)

Usage (from the repository root):
  python benchmark/notes/paired_finals.py benchmark/sweeps/swimmer_c17_ent_decay benchmark/sweeps/swimmer_c17_ent \
    benchmark/sweeps/swimmer_c17_rl --env Swimmer-v4 --mode labels1400 --fast 100
A run counts once its folder has done.json; its final return is the true return of the last 10 episodes on its last
progress line (final_returns.py's reader).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from final_returns import finals  # noqa: E402 (mode -> {seed: final true return} of a sweep's finished runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", help="sweep folders; the first is compared with each of the others")
    parser.add_argument("--env", required=True)
    parser.add_argument("--mode", required=True, help='"true" or "labelsN", as in the run folders\' names')
    parser.add_argument("--fast", type=float, help="count the runs whose final return is over this")
    args = parser.parse_args()
    by_sweep = {sweep: finals(sweep, args.env).get(args.mode, {}) for sweep in args.sweeps}
    for sweep, returns in by_sweep.items():
        values = np.array(list(returns.values()))
        if not len(values):
            print(f"{sweep}: no finished {args.mode} run")
            continue
        line = f"{sweep}: " + ", ".join(f"{seed}: {value:.0f}" for seed, value in returns.items())
        line += f"; {values.mean():.1f} ± {values.std(ddof=1) if len(values) > 1 else 0:.1f}"
        if args.fast is not None:
            line += f", over {args.fast:g}: {(values > args.fast).sum()} of {len(values)}"
        print(line)
    first = by_sweep[args.sweeps[0]]
    for other in args.sweeps[1:]:
        seeds = sorted(set(first) & set(by_sweep[other]))
        diff = np.array([first[seed] - by_sweep[other][seed] for seed in seeds])
        if len(diff) < 2:
            print(f"against {other}: fewer than two seeds in common")
            continue
        print(
            f"{args.sweeps[0]} minus {other}, paired over seeds {', '.join(map(str, seeds))}: {diff.mean():+.1f} ± "
            f"{diff.std(ddof=1) / np.sqrt(len(diff)):.1f}, ahead on {(diff > 0).sum()} of {len(diff)}"
        )


if __name__ == "__main__":
    main()
