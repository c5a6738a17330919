"""How much the reward model of a run made before the action-clipping fix depended on action values the environment
never executed: on a finished run's labels and on its final policy's own steps, the learned reward of the sampled
action against that of the same action clipped to the env's bounds (what Hopper executed).

    python benchmark/notes/unclipped_actions.py RUN_DIR [RUN_DIR ...] [--steps 2000]

RUN_DIR holds checkpoint.pt and labels.npz (a sweep run's runs/<name>/). Rewards are in the ensemble's normalised
units (standard deviation 1 on the labelled steps).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_ppo_mujoco as rl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hopper_stall import checkpoint_ensemble  # noqa: E402


def learned(ensemble, obs, act):
    with torch.no_grad():
        return ensemble.normalized_reward(torch.as_tensor(obs), torch.as_tensor(act)).numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--steps", type=int, default=2000, help="steps of the final policy (sampled actions)")
    options = parser.parse_args()
    for run in options.runs:
        checkpoint = torch.load(Path(run) / "checkpoint.pt", weights_only=False)
        args = checkpoint["args"]
        env = rl.make_env(args["env"], 0, False, None, json.loads(args["env_kwargs"] or "{}"))()
        low, high = env.unwrapped.action_space.low, env.unwrapped.action_space.high
        obs_dim, act_dim = env.observation_space.shape[0], env.unwrapped.action_space.shape[0]
        ensemble = checkpoint_ensemble(checkpoint["reward_ensemble"], obs_dim, act_dim)
        labels = np.load(Path(run) / "labels.npz")
        real = labels["mask"] > 0
        act = labels["act"][real]
        outside = (act < low) | (act > high)
        last_quarter = outside[-len(outside) // 4 :]
        print(f"{run}: step {checkpoint['global_step']}, {len(labels['mu'])} labels")
        print(
            f"  labelled steps: action entries outside the bounds {outside.mean():.2f} (last quarter of the steps "
            f"{last_quarter.mean():.2f}), largest |a| {np.abs(act).max():.2f}"
        )
        # the final policy acting as in training (sampled actions), the env executing their clipped form
        agent = rl.Agent(obs_dim, act_dim)
        agent.load_state_dict(checkpoint["agent"])
        obs_rms = rl.RunningMeanStd((obs_dim,))
        obs_rms.load_state_dict(checkpoint["obs_rms"])
        torch.manual_seed(0)
        observation, _ = env.reset(seed=0)
        steps_obs, steps_act = [], []
        for _ in range(options.steps):
            with torch.no_grad():
                normalized = torch.as_tensor(rl.normalize_obs(obs_rms, observation[None]), dtype=torch.float32)
                action = agent.get_action_and_value(normalized)[0].numpy()[0]
            steps_obs.append(observation)
            steps_act.append(action)
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                observation, _ = env.reset()
        steps_obs, steps_act = np.array(steps_obs, np.float32), np.array(steps_act, np.float32)
        gap = learned(ensemble, steps_obs, steps_act) - learned(ensemble, steps_obs, np.clip(steps_act, low, high))
        print(
            f"  final policy, {options.steps} sampled steps: entries outside {((steps_act < low) | (steps_act > high)).mean():.2f}, "
            f"mean |a| {np.abs(steps_act).mean():.2f}; learned reward of the sampled action minus that of its clipped "
            f"form: mean {gap.mean():+.3f}, mean |.| {np.abs(gap).mean():.3f}, per episode of 1000 steps {1000 * gap.mean():+.1f}"
        )


if __name__ == "__main__":
    main()
