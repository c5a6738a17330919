"""benchmark/log_bins.py: the mean true return of a log's progress lines per step bin, and RLHF runs against the
true-reward run of the same seed (the moving dot's pixel table is made with it)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOG_BINS = ROOT / "benchmark" / "log_bins.py"


def write_log(path, steps, true_returns, rlhf):
    """A log in the scripts' format: pretraining lines, then progress lines (the first few before any episode ended)."""
    lines = ["pretraining: step 1024, labels 31/250 from the initial policy"]
    for step, value in zip(steps, true_returns):
        extra = ", predicted return 3.0, labels 400/1000, val acc 0.88, corr 0.90" if rlhf else ""
        lines.append(f"step {step}, SPS 200" + ("" if value is None else f", true return {value:.1f}") + extra)
    path.write_text("\n".join(lines + ["1000 labels saved to runs/x/labels.npz"]) + "\n")


def run(*args):
    return subprocess.run([sys.executable, str(LOG_BINS), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_bin_means_and_ratios_follow_the_progress_lines(tmp_path):
    rng = np.random.default_rng(0)
    steps = np.arange(1024, 400_001, 1024)
    true_run = rng.normal(80, 20, len(steps)).round(1)
    rlhf_run = rng.normal(60, 20, len(steps)).round(1)
    rlhf_run[:5] = np.nan  # no episode finished yet: the line has no true return
    write_log(tmp_path / "Dot__true__7.log", steps, list(true_run), rlhf=False)
    write_log(tmp_path / "Dot__rlhf__7.log", steps, [None if np.isnan(v) else v for v in rlhf_run], rlhf=True)
    result = run("--rlhf", tmp_path / "Dot__rlhf__*.log", "--true", tmp_path / "Dot__true__*.log", "--bin-steps", 100_000)
    assert result.returncode == 0, result.stderr
    lines = {Path(line.split(":")[0]).name: line for line in result.stdout.splitlines() if line.startswith(str(tmp_path))}
    for name, values in (("Dot__true__7.log", true_run), ("Dot__rlhf__7.log", rlhf_run)):
        printed = [float(v) for v in re.findall(r"k +(-?[\d.]+)", lines[name])]
        expected = [np.nanmean(values[(steps - 1) // 100_000 == b]) for b in range(4)]
        np.testing.assert_allclose(printed, expected, atol=0.051)
    last_true, last_rlhf = (np.nanmean(v[(steps - 1) // 100_000 == 3]) for v in (true_run, rlhf_run))
    assert float(re.search(r"ratio ([\d.]+)", lines["Dot__rlhf__7.log"]).group(1)) == round(last_rlhf / last_true, 2)
    assert f"= {last_rlhf / last_true:.2f}" in result.stdout


def test_an_rlhf_log_without_the_true_reward_run_of_its_seed_is_an_error(tmp_path):
    steps = np.arange(1024, 10_001, 1024)
    write_log(tmp_path / "Dot__true__1.log", steps, [50.0] * len(steps), rlhf=False)
    write_log(tmp_path / "Dot__rlhf__2.log", steps, [40.0] * len(steps), rlhf=True)
    result = run("--rlhf", tmp_path / "Dot__rlhf__*.log", "--true", tmp_path / "Dot__true__*.log")
    assert result.returncode != 0
    assert "no true-reward log for seed 2" in result.stderr


def test_a_resumed_runs_lines_from_its_checkpoint_on_replace_the_stopped_runs(tmp_path):
    # a run stopped after step 10240 and resumed from its checkpoint at 5120 (`--resume ... >> LOG`): its lines from
    # 6144 on are written twice; the second ones are the run's
    steps = np.arange(1024, 10_241, 1024)
    stopped, resumed = [0.0] * len(steps), [100.0] * 5
    write_log(tmp_path / "Dot__true__1.log", steps, [80.0] * len(steps), rlhf=False)
    path = tmp_path / "Dot__rlhf__1.log"
    write_log(path, steps, stopped, rlhf=True)
    with path.open("a") as log:
        log.writelines(f"step {step}, SPS 200, true return 100.0, labels 400/1000\n" for step in steps[5:])
    result = run("--rlhf", tmp_path / "Dot__rlhf__*.log", "--true", tmp_path / "Dot__true__*.log", "--bin-steps", 100_000)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith(str(path)))
    expected = np.mean(stopped[:5] + resumed)  # 50: the stopped run's first five lines, then the resumed run's five
    assert [float(v) for v in re.findall(r"k +(-?[\d.]+)", line)] == [expected], line
