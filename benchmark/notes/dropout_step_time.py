"""How much longer a reward-model gradient step of rlhf_ppo_mujoco.py takes with --reward-dropout than without: the
same 20 minibatches (64 pairs of 60-step segments, Swimmer-v4's sizes: 8 observation and 2 action entries, 3 members),
stepped with dropout 0 and with dropout P in turn, REPEATS times each, one thread; prints the median ms per step of
each and their ratio. Usage (from the repository root): python benchmark/notes/dropout_step_time.py [P] [REPEATS]"""

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
import rlhf_ppo_mujoco as ppo  # noqa: E402


def random_minibatches(rng, count, pairs=64, length=60, obs_dim=8, act_dim=2, members=3):
    """`count` minibatches as LabelBuffer.get returns them, of random segments and answers."""
    buffer = ppo.LabelBuffer(pairs * count, length, obs_dim, act_dim, members, rng)
    segments = [
        {
            "obs": rng.normal(size=(pairs * count, length, obs_dim)).astype(np.float32),
            "act": rng.uniform(-1, 1, size=(pairs * count, length, act_dim)).astype(np.float32),
            "mask": np.ones((pairs * count, length), np.float32),
            "true_reward": rng.normal(size=(pairs * count, length)).astype(np.float32),
        }
        for _ in range(2)
    ]
    buffer.add(*segments, rng.integers(0, 2, pairs * count).astype(np.float32))
    return [buffer.get(np.arange(i * pairs, (i + 1) * pairs)) for i in range(count)]


def main():
    dropout = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    minibatches = random_minibatches(np.random.default_rng(0), 20)
    times = {0.0: [], dropout: []}
    for _ in range(repeats):
        for p in times:  # alternating
            torch.manual_seed(0)
            ensemble = ppo.RewardEnsemble(8, 2, 3, dropout=p)
            ensemble.dropout_generator = torch.Generator().manual_seed(0)
            optimizer = torch.optim.Adam(ensemble.parameters(), 3e-4)
            start = time.perf_counter()
            for minibatch in minibatches:
                ppo.reward_gradient_step(ensemble, optimizer, minibatch, torch.full((3,), 1e-4), 0.1)
            times[p].append((time.perf_counter() - start) / len(minibatches) * 1000)
    medians = {p: float(np.median(t)) for p, t in times.items()}
    print(f"ms per reward-model step, median of {repeats}: " + ", ".join(f"dropout {p}: {m:.1f}" for p, m in medians.items()))
    print(f"ratio: {medians[dropout] / medians[0.0]:.2f}")


if __name__ == "__main__":
    main()
