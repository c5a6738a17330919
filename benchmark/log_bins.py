"""Mean true return of a run's progress lines in step bins, and RLHF runs against true-reward runs seed by seed.

A progress line's "true return" is the mean of the run's last 10 episodes; on the moving dot an episode's return is
about its random start's distance to the centre, so one line swings by +-25 even on the true reward. Averaging the
lines of a 100k-step bin (about 50 episodes at 8 environments x 2000 steps) gives a figure that says how the agent
does. This is how the pixel tables in benchmark/README.md are made.

    python benchmark/log_bins.py --rlhf 'benchmark/logs/MovingDot-v0-pixels__bench_rlhf_progress_500k__*.log' \\
        --true 'benchmark/logs/MovingDot-v0-pixels__bench_true_500k__*.log'

The seed is read from the log's file name (`...__SEED.log`, as the scripts' run names end). Ratios are taken on the
last bin: each RLHF run against the true-reward run of its seed, and the RLHF runs' mean against the mean of those
seeds' true-reward runs (a true-reward run has bad stretches too).
"""

import argparse
import glob
import re
import statistics


def bin_means(path, bin_steps):
    """{bin index: mean true return of the progress lines whose step falls in it} for one log. A run resumed with
    `--resume ... >> LOG` starts again at its checkpoint's step: its lines replace the stopped run's from that step on
    (as in plot.py)."""
    kept = []  # (step, true return or None) of the run's progress lines
    with open(path) as log:
        for line in log:
            found = re.match(r"step (\d+),(?:.*?true return (-?[\d.]+))?", line)
            if found:
                step = int(found.group(1))
                while kept and kept[-1][0] >= step:
                    kept.pop()
                kept.append((step, None if found.group(2) is None else float(found.group(2))))
    sums, counts = {}, {}
    for step, value in kept:
        if value is not None:  # (before the first episode ends, a line has no true return)
            index = (step - 1) // bin_steps
            sums[index], counts[index] = sums.get(index, 0.0) + value, counts.get(index, 0) + 1
    return {index: sums[index] / counts[index] for index in sorted(sums)}


def seed_of(path):
    found = re.search(r"__(\d+)(?:_[^/]*)?\.log$", path)
    if not found:
        raise SystemExit(f"error: no seed in the log name {path} (expected ...__SEED.log)")
    return int(found.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rlhf", required=True, help="glob of the RLHF runs' logs")
    parser.add_argument("--true", required=True, help="glob of the true-reward runs' logs (one per seed)")
    parser.add_argument("--bin-steps", type=int, default=100_000)
    options = parser.parse_args()
    true_logs = {seed_of(path): path for path in sorted(glob.glob(options.true))}
    rlhf_logs = sorted(glob.glob(options.rlhf), key=lambda path: (seed_of(path), path))
    if not rlhf_logs or not true_logs:
        raise SystemExit(f"error: no logs match {options.rlhf if not rlhf_logs else options.true}")
    ratios, rlhf_last, true_last = [], [], {}
    for path in list(true_logs.values()) + rlhf_logs:
        bins = bin_means(path, options.bin_steps)
        if not bins:
            raise SystemExit(f"error: {path} has no progress line with a true return")
        cells = "  ".join(
            f"{i * options.bin_steps // 1000}-{(i + 1) * options.bin_steps // 1000}k {v:6.1f}" for i, v in bins.items()
        )
        line = f"{path}: {cells}"
        if path in rlhf_logs:
            seed = seed_of(path)
            if seed not in true_logs:
                raise SystemExit(f"error: no true-reward log for seed {seed} (of {path})")
            true_bins = bin_means(true_logs[seed], options.bin_steps)
            last = max(bins)
            if last not in true_bins:
                raise SystemExit(f"error: {true_logs[seed]} has no lines in the bin of {path}'s last")
            ratios.append(bins[last] / true_bins[last])
            rlhf_last.append(bins[last])
            true_last[seed] = true_bins[last]
            line += f"  ratio {ratios[-1]:.2f}"
        print(line)
    print(
        f"last bin: {len(ratios)} RLHF runs, ratio to their seed's true-reward run: mean {statistics.mean(ratios):.2f},"
        f" lowest {min(ratios):.2f}; RLHF mean {statistics.mean(rlhf_last):.1f} / mean of those seeds' true-reward runs"
        f" {statistics.mean(true_last.values()):.1f} = {statistics.mean(rlhf_last) / statistics.mean(true_last.values()):.2f}"
    )


if __name__ == "__main__":
    main()
