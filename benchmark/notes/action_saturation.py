"""Is a finished rlhf_ppo_mujoco.py agent stuck against its action bounds? Loads saved runs (--save-model), plays an
episode with each agent as it acts in training (sampled actions, clipped to the bounds by the env wrapper's rule) and
prints per run:
- the true reward per block of --block steps, times 1000 (Swimmer-v4 with no control cost: the forward velocity in
  mm/s): a swimmer that lunges at the start and then glides to a stop shows a large first block and blocks
  falling towards 0, a swimming one level blocks;
- over the second half of the episode, per action dimension: the policy's mean action (before clipping), averaged and
  as its size (|mean|, which a mean that flips sign step by step keeps), its std, and the share of executed actions
  at a bound. A mean beyond a bound with a std too narrow to reach back inside executes the bound on every sample: every sample's advantage is then alike and PPO has no gradient out (a dead zone);
- with a reward ensemble (labelled runs): the learned step reward, as PPO sees it (normalised), per block.

With --summary, one line per run instead: its step, true return, the mean true reward of the second half, the
mean's size, std and share at a bound, and the learned reward of steps 0-100, 100-300 and 500-1000 with its slope on
the true step reward (learned units per unit; the oracle's is 1 / the judged steps' std, see notes/reward_on_judged.py):
for a run's checkpoint copies over time (notes/checkpoint_copies.sh), when it froze.

Usage (from the repository root):
  python benchmark/notes/action_saturation.py benchmark/sweeps/swimmer_c17_rl/Swimmer-v4__labels1400__5 ... [--block 100]
  python benchmark/notes/action_saturation.py --summary OUT/ckpt_{0..24}.pt
Each argument is a sweep run folder (its runs/NAME inside), a runs/NAME folder itself, or a checkpoint file.
"""

import argparse
import glob
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_stall  # noqa: E402
import rlhf_ppo_mujoco as ppo  # noqa: E402


def run_folder(path, scratch):
    """The runs/NAME folder that holds checkpoint.pt; a checkpoint file gets a folder of its own in `scratch` (a
    folder; None where only run folders are wanted)."""
    if os.path.isfile(path) and scratch is not None:
        folder = os.path.join(scratch, str(len(os.listdir(scratch))))
        os.makedirs(folder)
        os.symlink(os.path.abspath(path), os.path.join(folder, "checkpoint.pt"))
        return folder
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
    parser.add_argument("--summary", action="store_true", help="one line per run")
    cli = parser.parse_args()
    scratch = tempfile.mkdtemp()
    for path in cli.runs:
        checkpoint, env, agent, obs_rms, ensemble = hopper_stall.load_run(run_folder(path, scratch))
        torch.manual_seed(cli.seed)
        ((obs, act, rewards, _, _, _),) = hopper_stall.play(env, agent, obs_rms, 1, cli.seed)
        with torch.no_grad():
            mean = agent.actor_mean(torch.as_tensor(ppo.normalize_obs(obs_rms, obs), dtype=torch.float32)).numpy()
        std = agent.actor_logstd.exp().detach().numpy().ravel()
        half = len(rewards) // 2
        at_bound = np.isclose(np.abs(act[half:]), env.unwrapped.action_space.high).mean(0)  # act: executed, clipped
        learned = None
        if ensemble is not None:
            learned = ensemble.normalized_reward(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(act)).numpy()
        if cli.summary:
            line = (
                f"{os.path.basename(os.path.normpath(path))} step {checkpoint['global_step']}: true return "
                f"{rewards.sum():.1f}, second half {rewards[half:].mean() * 1000:.1f} x 1000 | mean's size "
                f"{np.round(abs(mean[half:]).mean(0), 2)}, std {np.round(std, 2)}, at a bound {np.round(at_bound, 2)}"
            )
            if learned is not None:
                slope = np.polyfit(rewards, learned, 1)[0]
                line += (
                    f" | learned 0-100 {learned[:100].mean():+.2f}, 100-300 {learned[100:300].mean():+.2f}, "
                    f"500-1000 {learned[500:].mean():+.2f}, slope {slope:.1f}"
                )
            print(line)
            continue
        print(f"{os.path.basename(os.path.normpath(path))}: true return {rewards.sum():.1f}")
        print(f"  true reward x 1000 per block of {cli.block}: {blocks(rewards * 1000, cli.block)}")
        print(
            f"  second half, per action: mean {np.round(mean[half:].mean(0), 2)}, mean's size "
            f"{np.round(abs(mean[half:]).mean(0), 2)}, std {np.round(std, 2)}, share at a bound {np.round(at_bound, 2)}"
        )
        if learned is not None:
            print(f"  learned reward per block: {blocks(learned, cli.block)}")


if __name__ == "__main__":
    main()
