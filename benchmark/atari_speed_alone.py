"""Steps/s of RLHF over steps/s of true-reward A2C, each run alone on the machine, one after the other.

run_atari.sh's side-by-side protocol gives each of the pair a core of its own (--threads 1). A run alone can also
use what A2C leaves idle (a true-reward run alone used 127% of this 2-core machine), and that is where the reward
model's thread works, so that protocol cannot show what the thread gains. Here each repeat runs, one after the
other with the default threads: A2C on the game score, RLHF, and (with --before COMMIT) RLHF of an older commit, each
for --steps steps of RL. RLHF's pretraining is not timed: each rate runs from a run's first progress line of RL to its
last (progress lines give the steps and the steps/s since the start, hence the time).

Usage (from the repository root):
  python benchmark/atari_speed_alone.py [--steps 40000] [--repeats 2] [--before COMMIT] [--train-every 16,64]
    [--logs DIR] [-- FLAGS...]
FLAGS are added to the RLHF runs' (e.g. -- --reward-train-every 16). The pretraining is short (one 6400-step round, 100 labels, one epoch: it is
not what is measured) and 3 labels are asked per 6400-step round of RL, the rate at the start of a default 10M-step
run (3300 labels).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

PROGRESS = re.compile(r"^step (\d+), SPS (\d+)", re.MULTILINE)


def rl_rate(log):
    """Steps/s from the first progress line of RL to the last (the steps/s on a line count from the run's start)."""
    points = [(int(step) / max(int(sps), 1), int(step)) for step, sps in PROGRESS.findall(open(log).read())]
    if len(points) < 2:
        raise SystemExit(f"error: fewer than two progress lines in {log}")
    (t0, s0), (t1, s1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0)


def run(script, flags, log):
    with open(log, "w") as out:
        subprocess.run([sys.executable, script] + flags.split(), stdout=out, stderr=subprocess.STDOUT, check=True)
    return rl_rate(log)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--steps", type=int, default=40000, help="steps of RL per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", help="a commit whose RLHF run is timed too (checked out in a temporary folder)")
    parser.add_argument("--logs", default="benchmark/logs/pong_speed_alone")
    parser.add_argument(
        "--train-every",
        default="",
        help="e.g. 16,64: an RLHF run with each --reward-train-every instead of one with the default",
    )
    parser.add_argument("rlhf_flags", nargs="*", help="after --: flags added to the RLHF runs'")
    args = parser.parse_args()
    os.makedirs(args.logs, exist_ok=True)
    scripts = {} if args.train_every else {"rlhf": ("rlhf_a2c_atari.py", "")}  # name: (script, flags of its own)
    for every in filter(None, args.train_every.split(",")):
        scripts[f"rlhf_every{every}"] = ("rlhf_a2c_atari.py", f"--reward-train-every {every}")
    if args.before:
        folder = tempfile.mkdtemp()
        subprocess.run(f"git archive {args.before} rlhf_a2c_atari.py | tar -x -C {folder}", shell=True, check=True)
        scripts[f"rlhf_{args.before}"] = (os.path.join(folder, "rlhf_a2c_atari.py"), "")
    pretrain, rounds = 6400, -(-args.steps // 6400)
    rlhf_flags = f"--pretrain-steps {pretrain} --pretrain-labels 100 --pretrain-epochs 1 --labels {100 + 3 * rounds} "
    rlhf_flags += " ".join(args.rlhf_flags)
    common = f"--env {args.env} --seed 1 --log-every 10"
    rates = {name: [] for name in ["true"] + list(scripts)}
    for repeat in range(1, args.repeats + 1):
        log = f"{args.logs}/true_{repeat}.log"
        rates["true"].append(run("rlhf_a2c_atari.py", f"{common} --feedback true-reward --total-timesteps {args.steps}", log))
        for name, (script, own) in scripts.items():
            flags = f"{common} --total-timesteps {args.steps + pretrain} {rlhf_flags} {own}"
            rates[name].append(run(script, flags, f"{args.logs}/{name}_{repeat}.log"))
        print(f"repeat {repeat}: " + ", ".join(f"{name} {r[-1]:.0f} steps/s" for name, r in rates.items()), flush=True)
    print("\n| run | steps/s, each repeat | median | median ratio to true reward |\n|---|---|---|---|")
    for name, values in rates.items():
        ratios = [value / true for value, true in zip(values, rates["true"])]
        print(
            f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} | "
            f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) |"
        )


if __name__ == "__main__":
    main()
