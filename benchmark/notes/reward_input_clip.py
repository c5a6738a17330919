"""Does the reward model see a trained agent's observations, or their clip? rlhf_ppo_mujoco.py standardises the
reward model's input observations by the mean and std of the pretraining labels' steps (the initial, near-random
policy's), fixed from then on, and clips them at +-10 std. A trained gait may leave that band (a random Hopper's torso
height has a std of about 0.03 m): every observation beyond it looks alike to the reward model.

Plays episodes with each given run's final agent (sampled actions, as in training) and prints, per observation entry,
the share of steps at the clip and the largest |standardised value|, under the input statistics of the labelled run
given by --stats (a true-reward run has none of its own: pass the labelled run of the same task and flags).

Usage (from the repository root):
  python benchmark/notes/reward_input_clip.py RUN [RUN ...] --stats LABELLED_RUN [--episodes 3]
Each RUN is a runs/NAME folder of a run saved with --save-model (or a sweep run folder holding one).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_stall  # noqa: E402
from action_saturation import run_folder  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--stats", required=True, help="the labelled run whose reward model's input statistics apply")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    _, _, _, _, ensemble = hopper_stall.load_run(run_folder(cli.stats, None))
    if ensemble is None:
        raise SystemExit(f"error: {cli.stats} is a true-reward run: it has no reward model")
    mean, std, clip = ensemble.input_mean.numpy(), ensemble.input_std.numpy(), float(ensemble.input_clip)
    print(f"input statistics of {cli.stats}: clip at {clip:g} std; per entry, the band mean +- clip * std:")
    print("  " + " ".join(f"[{m - clip * s:.2f}, {m + clip * s:.2f}]" for m, s in zip(mean, std)))
    for path in cli.runs:
        checkpoint, env, agent, obs_rms, _ = hopper_stall.load_run(run_folder(path, None))
        torch.manual_seed(cli.seed)
        played = hopper_stall.play(env, agent, obs_rms, cli.episodes, cli.seed)
        obs = np.concatenate([episode[0] for episode in played])
        returns = [episode[2].sum() for episode in played]
        z = np.abs((obs - mean) / std)
        x_velocity = obs.shape[1] - env.unwrapped.model.nv  # the first qvel entry (no contact forces observed)
        print(
            f"{path} (step {checkpoint['global_step']}): {len(obs)} steps, true returns "
            f"{' '.join(f'{r:.0f}' for r in returns)}; steps with any entry at the clip {(z > clip).any(1).mean():.3f}"
        )
        print("  entry:        " + " ".join(f"{i:>6d}" for i in range(obs.shape[1])) + f"   (x velocity: {x_velocity})")
        print("  share clipped:" + " ".join(f"{share:6.3f}" for share in (z > clip).mean(0)))
        print("  largest |z|:  " + " ".join(f"{largest:6.1f}" for largest in z.max(0)))


if __name__ == "__main__":
    main()
