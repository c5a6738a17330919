"""Does the code of another commit run the same as a reference run? Runs a script as it was at COMMIT (in a temporary
git worktree) with the reference run's arguments until its progress line of --until-step, stops it, and compares its
progress lines with the reference log's (steps/s left out): "identical over N lines", the first line that differs, or
that the run ended before that step (its last lines shown).

Give the reference run's arguments exactly, --total-timesteps included: --anneal-lr scales the learning rate by the
run's length, so a shorter run differs from a 1M-step run's log after its first update even on the same code.

Usage (from the repository root):
  python benchmark/notes/pairing_check.py 0a1737f --until-step 40960 \
    --reference benchmark/sweeps/hopper_defaults/Hopper-v4__labels1400__1/run.log -- \
    --env Hopper-v4 --seed 1 --total-timesteps 1000000 --threads 1 --labels 1400
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(r"^(step \d+,|reward model |pretraining: )")


def progress_lines(text):
    """The log's progress and reward-model lines, without the steps/s figure (it is the machine's, not the run's)."""
    return [re.sub(r"SPS \d+, ", "", line) for line in text.splitlines() if PROGRESS.match(line)]


def run_until(script, script_args, until_step, folder):
    """Run `script` in `folder` until it prints the progress line of `until_step` (or ends); its whole output."""
    log_path = Path(folder) / "pairing_check.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, script, *script_args], cwd=folder, stdout=log, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                if any(line.startswith(f"step {until_step},") for line in log_path.read_text(errors="replace").splitlines()):
                    break
                time.sleep(2)
        finally:
            process.kill()
            process.wait()
    return log_path.read_text(errors="replace")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="then --, then the reference run's arguments"
    )
    parser.add_argument("commit", help="the commit whose code runs")
    parser.add_argument("--reference", required=True, type=Path, help="the log of the run to compare with")
    parser.add_argument(
        "--until-step",
        required=True,
        type=int,
        help="stop after the RL progress line of this step (a line `step N, ...`; pretraining lines do not count)",
    )
    parser.add_argument("--script", default="rlhf_ppo_mujoco.py")
    ours_end = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    args = parser.parse_args(sys.argv[1:ours_end])
    script_args = sys.argv[ours_end + 1 :]
    reference = progress_lines(args.reference.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix="pairing_check_") as scratch:
        worktree = Path(scratch) / "code"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach", str(worktree), args.commit], check=True
        )
        try:
            output = run_until(args.script, script_args, args.until_step, worktree)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=True)
    ours = progress_lines(output)
    if not any(line.startswith(f"step {args.until_step},") for line in ours):
        print(
            f"{args.commit}: the run ended before step {args.until_step}; its last lines:",
            *output.splitlines()[-5:],
            sep="\n  ",
        )
        return 1
    for number, (line, reference_line) in enumerate(zip(ours, reference), start=1):
        if line != reference_line:
            print(f"{args.commit} differs at line {number}:\n  {args.commit}: {line}\n  reference: {reference_line}")
            return 1
    print(f"{args.commit}: identical over {min(len(ours), len(reference))} lines, to {ours[-1] if ours else 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
