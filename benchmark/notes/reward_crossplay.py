"""Does a run's learned reward rank other runs' behaviour as the true reward does? On Swimmer-v4 the runs of every
feedback end in one of two strokes (a slow one near 35-65 true return, a fast one near 105-130), and the labelled runs
with the action-clipping fix end slow more often than PPO on the true reward. Here the reward ensembles of finished
labelled runs score the episodes of other runs' final policies, the fast ones included, which the labelled run's own
clips never showed: if a reward model that ended slow still pays more per episode for the fast stroke, the learned
reward was not what held its run back (its agent did not find the stroke); if it pays less, the reward was wrong
where the run never went.

Each policy (a checkpoint of rlhf_ppo_mujoco.py, any feedback) plays --episodes episodes sampling its actions as in
training (the env executes them clipped); every step is scored by each reward ensemble as PPO sees it (normalised by
that run's statistics; the fallen-state anchor does not arise on tasks without terminations). Prints the true and
learned returns (means over the episodes), then per reward model the Spearman correlation of the two over the
policies and how many pairs of policies it orders as the true return does.

Usage (from the repository root; RUN: a run folder with checkpoint.pt):
  python benchmark/notes/reward_crossplay.py --rewards RUN [RUN ...] --policies RUN [RUN ...] [--episodes 3]
"""

import argparse
import itertools
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_stall import load_run, play  # noqa: E402


def ranks(values):
    return np.argsort(np.argsort(values))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rewards", nargs="+", required=True, help="labelled runs whose reward ensembles score")
    parser.add_argument("--policies", nargs="+", required=True, help="runs whose final policies play")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    ensembles = []
    for run_dir in cli.rewards:
        ensemble = load_run(run_dir)[4]
        if ensemble is None:
            sys.exit(f"{run_dir} is a true-reward run: it has no reward ensemble to score with")
        ensembles.append(ensemble)
    true_returns, velocities, learned_returns = [], [], []  # learned_returns[policy][reward model]
    for run_dir in cli.policies:
        _, env, agent, obs_rms, _ = load_run(run_dir)
        torch.manual_seed(cli.seed)
        played = play(env, agent, obs_rms, cli.episodes, cli.seed)
        true_returns.append(np.mean([rewards.sum() for _, _, rewards, *_ in played]))
        velocities.append(np.mean([x_velocity.mean() for _, _, _, x_velocity, *_ in played]))
        with torch.no_grad():
            learned_returns.append(
                [
                    np.mean(
                        [
                            ensemble.normalized_reward(
                                torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(act, dtype=torch.float32)
                            )
                            .sum()
                            .item()
                            for obs, act, *_ in played
                        ]
                    )
                    for ensemble in ensembles
                ]
            )
    true_returns, learned_returns = np.array(true_returns), np.array(learned_returns)
    print(f"policies ({cli.episodes} episodes each, sampled actions):")
    print("| policy | run | true return | mean x velocity |")
    print("|---|---|---|---|")
    for p, run_dir in enumerate(cli.policies):
        print(f"| P{p} | {run_dir} | {true_returns[p]:.1f} | {velocities[p]:.3f} |")
    print("learned returns (rows: reward models; columns: policies, by their true return above):")
    print("| reward model | " + " | ".join(f"P{p} ({true_returns[p]:.0f})" for p in range(len(cli.policies))) + " |")
    print("|---|" + "---|" * len(cli.policies))
    for r, run_dir in enumerate(cli.rewards):
        print(f"| R{r} {run_dir} | " + " | ".join(f"{x:.0f}" for x in learned_returns[:, r]) + " |")
    print(
        "per reward model: its own run's policy (if among the policies), the policy it pays most, and whether it"
        " orders the policies as the true return does"
    )
    print(
        "| reward model | own policy: true / learned return | paid most: true / learned return | Spearman |"
        " pairs ordered as the true return |"
    )
    print("|---|---|---|---|---|")
    pairs = list(itertools.combinations(range(len(cli.policies)), 2))
    for r, run_dir in enumerate(cli.rewards):
        learned = learned_returns[:, r]
        own = [p for p, policy_dir in enumerate(cli.policies) if os.path.realpath(policy_dir) == os.path.realpath(run_dir)]
        own_cell = f"{true_returns[own[0]]:.0f} / {learned[own[0]]:.0f}" if own else "not played"
        best = int(np.argmax(learned))
        spearman = np.corrcoef(ranks(true_returns), ranks(learned))[0, 1]
        agree = sum((true_returns[a] - true_returns[b]) * (learned[a] - learned[b]) > 0 for a, b in pairs)
        print(
            f"| R{r} | {own_cell} | P{best}: {true_returns[best]:.0f} / {learned[best]:.0f} | {spearman:+.2f} |"
            f" {agree} of {len(pairs)} |"
        )


if __name__ == "__main__":
    main()
