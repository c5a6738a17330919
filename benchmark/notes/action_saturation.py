"""Is a finished rlhf_ppo_mujoco.py agent stuck against its action bounds? Loads saved runs (--save-model), plays an
episode with each agent as it acts in training (sampled actions, clipped to the bounds by the env wrapper's rule) and
prints per run:
- the true reward per block of --block steps (Swimmer-v4 with no control cost: the forward velocity, here in mm/s per
  step x 1000): a swimmer that lunges at the start and then glides to a stop shows a large first block and blocks
  falling towards 0, a swimming one level blocks;
- over the second half of the episode, per action dimension: the policy's mean action (before clipping), averaged and
  as its size (|mean|, which a mean that flips sign step by step keeps), its std, and the share of executed actions
  at a bound. A mean beyond a bound with a std too narrow to reach back inside executes
  the bound on every sample: every sample's advantage is then alike and PPO has no gradient out (a dead zone);
- with a reward ensemble (labelled runs): the learned step reward, as PPO sees it (normalised), per block.

Usage (from the repository root):
  python benchmark/notes/action_saturation.py benchmark/sweeps/swimmer_c17_rl/Swimmer-v4__labels1400__5 ... [--block 100]
Each argument is a sweep run folder (its runs/NAME inside) or a runs/NAME folder itself.
"""

import argparse
import glob
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_stall  # noqa: E402
import rlhf_ppo_mujoco as ppo  # noqa: E402


def run_folder(path):
    """The runs/NAME folder that holds checkpoint.pt."""
    if os.path.exists(os.path.join(path, "checkpoint.pt")):
        return path
    found = glob.glob(os.path.join(path, "runs", "*", "checkpoint.pt"))
    if len(found) != 1:
        raise SystemExit(f"error: {path}: expected one runs/*/checkpoint.pt, found {len(found)}")
    return os.path.dirname(found[0])


def blocks(values, block):
    return " ".join(f"{values[i : i + block].mean():.2f}" for i in range(0, len(values), block))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    for path in cli.runs:
        _, env, agent, obs_rms, ensemble = hopper_stall.load_run(run_folder(path))
        torch.manual_seed(cli.seed)
        ((obs, act, rewards, _, _, _),) = hopper_stall.play(env, agent, obs_rms, 1, cli.seed)
        with torch.no_grad():
            mean = agent.actor_mean(torch.as_tensor(ppo.normalize_obs(obs_rms, obs), dtype=torch.float32)).numpy()
        std = agent.actor_logstd.exp().detach().numpy().ravel()
        half = len(rewards) // 2
        at_bound = np.isclose(np.abs(act[half:]), env.unwrapped.action_space.high).mean(0)  # act: executed, clipped
        print(f"{os.path.basename(os.path.normpath(path))}: true return {rewards.sum():.1f}")
        print(f"  true reward x 1000 per block of {cli.block}: {blocks(rewards * 1000, cli.block)}")
        print(
            f"  second half, per action: mean {np.round(mean[half:].mean(0), 2)}, mean's size {np.round(abs(mean[half:]).mean(0), 2)}, std {np.round(std, 2)}, "
            f"share at a bound {np.round(at_bound, 2)}"
        )
        if ensemble is not None:
            learned = ensemble.normalized_reward(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(act)).numpy()
            print(f"  learned reward per block: {blocks(learned, cli.block)}")


if __name__ == "__main__":
    main()
