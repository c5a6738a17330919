"""How close is a finished run's learned reward to the oracle on the steps the teacher judged? Loads a saved run of
rlhf_ppo_mujoco.py (--save-model: its final reward ensemble and labels.npz, every labelled pair's steps with their true
reward), scores every judged step with the ensemble as PPO sees it (normalised), and prints per run:
- the step-level fit of the learned reward on the true one: correlation, and the slope in learned units per unit of
  true reward against the oracle's (the true reward z-scored over the same steps, notes/oracle_reward_clipfix.patch:
  1 / its standard deviation, times --reward-std 1): a slope near the oracle's and a high correlation mean PPO gets
  nearly what the oracle gives it on these steps;
- the segment-level correlation (sums over each clip, what the teacher compares) and the share of strict labels the
  ensemble orders as the teacher did (training and validation labels together);
- what was judged: the mean forward velocity of the judged steps (Swimmer-v4 with no control cost: the true reward is
  the forward velocity), the share of clips faster than --fast m/s on average, and the run's final true return (the last progress line of a sweep run's run.log, as benchmark/plot.py
  reads it).

Usage (from the repository root):
  python benchmark/notes/reward_on_judged.py benchmark/sweeps/swimmer_c17_rl/Swimmer-v4__labels1400__5 ... [--fast 0.09]
Each argument is a sweep run folder (its runs/NAME inside) or a runs/NAME folder itself.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlhf_ppo_mujoco as ppo  # noqa: E402
from action_saturation import run_folder  # noqa: E402
from hopper_stall import checkpoint_ensemble  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmark/
from plot import progress  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--fast", type=float, default=0.09, help="a clip faster than this mean velocity (m/s) counts as fast")
    cli = parser.parse_args()
    print(
        "run | final true return | step corr | slope / oracle's | segment corr | labels ordered | judged mean velocity | fast clips"
    )
    for path in cli.runs:
        folder = run_folder(path, None)
        checkpoint = ppo.load_checkpoint(folder)
        labels = np.load(os.path.join(folder, "labels.npz"))
        obs, act, mask, true_reward, mu = (labels[k] for k in ("obs", "act", "mask", "true_reward", "mu"))
        ensemble = checkpoint_ensemble(checkpoint["reward_ensemble"], obs.shape[-1], act.shape[-1])
        learned = ensemble.normalized_reward(torch.as_tensor(obs), torch.as_tensor(act)).numpy()
        judged = mask > 0
        true_steps, learned_steps = true_reward[judged], learned[judged]
        step_corr = np.corrcoef(true_steps, learned_steps)[0, 1]
        slope = np.polyfit(true_steps, learned_steps, 1)[0]
        oracle_slope = checkpoint["args"]["reward_std"] / true_steps.std()
        true_sums, learned_sums = (true_reward * mask).sum(-1), (learned * mask).sum(-1)
        segment_corr = np.corrcoef(true_sums.ravel(), learned_sums.ravel())[0, 1]
        strict = mu != 0.5
        ordered = ((learned_sums[:, 0] > learned_sums[:, 1]) == (mu > 0.5))[strict].mean()
        clip_velocity = true_sums / np.maximum(mask.sum(-1), 1)
        log = os.path.join(path, "run.log")  # a sweep run folder's; a runs/NAME folder has none
        final = f"{progress(log)[1][-1]:.1f}" if os.path.exists(log) else "-"
        print(
            f"{os.path.basename(os.path.normpath(path))} | {final} | {step_corr:.2f} | "
            f"{slope:.2f} / {oracle_slope:.2f} = {slope / oracle_slope:.2f} | {segment_corr:.2f} | {ordered:.2f} | "
            f"{true_steps.mean():.3f} | {(clip_velocity > cli.fast).mean():.2f}"
        )


if __name__ == "__main__":
    main()
