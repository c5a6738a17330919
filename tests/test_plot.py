"""benchmark/plot.py: the table from the committed logs gives each run's final true return per seed and, after their
mean, the seeds' sample std (as sweep.py's report and the other tables do); a single seed's spread is 0."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PLOT = ROOT / "benchmark" / "plot.py"


def write_log(path, returns):
    """A log in the scripts' format: a progress line per 1000 steps with these true returns (the last is the final)."""
    lines = [f"step {1000 * (i + 1)}, SPS 100, true return {value:.1f}" for i, value in enumerate(returns)]
    path.write_text("\n".join(lines) + "\n")


def run_plot(tmp_path, *extra):
    """benchmark/plot.py on the logs in tmp_path, its figure written there."""
    command = [sys.executable, str(PLOT), "--env", "Dot-v0", "--logs", tmp_path, "--out", tmp_path, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def table_row(stdout, exp_name):
    return next(line for line in stdout.splitlines() if line.startswith(f"| {exp_name} |"))


def test_the_table_gives_the_seeds_sample_std_and_0_for_one_seed(tmp_path):
    finals = {1: 10.0, 2: 20.0, 3: 36.0}
    for seed, final in finals.items():
        write_log(tmp_path / f"Dot-v0__bench_true__{seed}.log", [5.0, final / 2, final])
    write_log(tmp_path / "Dot-v0__bench_rlhf__1.log", [4.0, 8.0, 12.0])  # one seed: no spread to show
    result = run_plot(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr

    values = list(finals.values())
    expected = f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"
    assert table_row(result.stdout, "bench_true").endswith(f"| {expected} |"), result.stdout
    assert re.search(r"\| 12\.0 ± 0\.0 \|$", table_row(result.stdout, "bench_rlhf")), result.stdout
    assert "sample std" in result.stdout
    assert (tmp_path / "dot_v0.png").stat().st_size > 10_000  # a drawn figure, not an empty file


def test_seeds_that_end_at_different_steps_are_compared_at_the_last_step_all_reached(tmp_path):
    # seed 2 stopped early (a run under way, or killed): its last line is at step 2000, seed 1 went on to step 4000
    write_log(tmp_path / "Dot-v0__bench_true__1.log", [10.0, 20.0, 30.0, 50.0])
    write_log(tmp_path / "Dot-v0__bench_true__2.log", [5.0, 10.0])
    result = run_plot(tmp_path)
    assert result.returncode == 0, result.stderr
    # the row's step is the last one both seeds reached, and each seed's return is the one at that step
    expected = f"| bench_true | 2 | 2000 | 1: 20.0, 2: 10.0 | 15.0 ± {np.std([20.0, 10.0], ddof=1):.1f} |"
    assert table_row(result.stdout, "bench_true") == expected, result.stdout
    assert "seed 1 goes on to step 4000" in result.stdout, result.stdout


def test_runs_named_with_runs_are_read_whatever_their_prefix(tmp_path):
    write_log(tmp_path / "Dot-v0__full__1.log", [1.0, 2.0])
    write_log(tmp_path / "Dot-v0__bench_true__1.log", [3.0, 4.0])
    result = run_plot(tmp_path, "--runs", "full,bench_true")
    assert result.returncode == 0, result.stderr
    assert table_row(result.stdout, "full").endswith("| 2.0 ± 0.0 |") and table_row(result.stdout, "bench_true")


def test_a_seed_without_a_true_return_by_the_common_step_is_left_out_of_the_final(tmp_path):
    # seed 2 is under way: its first episode ended by step 1000, seed 1's only by step 2000 (long episodes)
    (tmp_path / "Dot-v0__bench_true__1.log").write_text(
        "step 1000, SPS 100\n" + "".join(f"step {s}, SPS 100, true return {s / 100:.1f}\n" for s in (2000, 3000))
    )
    write_log(tmp_path / "Dot-v0__bench_true__2.log", [7.0])
    result = run_plot(tmp_path)
    assert result.returncode == 0, result.stderr
    assert table_row(result.stdout, "bench_true") == "| bench_true | 2 | 1000 | 1: -, 2: 7.0 | 7.0 ± 0.0 |", result.stdout
    assert "seed 1 has no true return by step 1000" in result.stdout, result.stdout
