"""Time one reward-model gradient step of rlhf_a2c_atari.py (the default 16 pairs of 25-step segments, 3 CNN
members, forward and backward, one torch thread) for the working tree and for an earlier commit, alternating the
two so both see the same load. Prints the median seconds per step of each and their ratio.

    python benchmark/notes/atari_reward_step.py --before 3f6c7fe --repeats 5
    python benchmark/notes/atari_reward_step.py --before 3f6c7fe --profile   # where one step of each spends its time
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root


def load_script(source: str, name: str):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_step(script, pairs, segment_len, size=3):
    torch.manual_seed(0)
    ensemble = script.RewardEnsemble(size).train()
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=3e-4)
    stacks = torch.randint(0, 256, (pairs, 2, segment_len, 4, 84, 84), dtype=torch.uint8)
    mu = torch.ones(pairs)

    def step():
        returns = ensemble(stacks).sum(-1)  # (members, pairs, 2)
        loss = script.preference_loss(returns[..., 0], returns[..., 1], mu).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--segment-len", type=int, default=25)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operators of one step of each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    old_source = subprocess.run(
        ["git", "show", f"{args.before}:rlhf_a2c_atari.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    steps = {
        args.before: make_step(load_script(old_source, "atari_before"), args.pairs, args.segment_len),
        "working tree": make_step(
            load_script((ROOT / "rlhf_a2c_atari.py").read_text(), "atari_now"), args.pairs, args.segment_len
        ),
    }
    times = {name: [] for name in steps}
    for name, step in steps.items():  # warm-up
        step()
    if args.profile:
        for name, step in steps.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                step()
            print(f"{name}:\n{profile.key_averages().table(sort_by='self_cpu_time_total', row_limit=8)}")
        return
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name}: median {medians[name]:.2f} s per step ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"speed-up: {medians[args.before] / medians['working tree']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
