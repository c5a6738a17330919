"""What the policy does and what the learned reward pays for, checkpoint by checkpoint, in a pair of runs of the same
seed: one made before the action-clipping fix (its reward model read the sampled actions, unclipped) and one after it
(clipped actions). Each checkpoint's policy acts as in training (sampled actions) for --steps steps; the env executes
their clipped form.

    python benchmark/notes/early_reward.py --old DIR --fix DIR [--steps 2000]

DIR holds ckpt_0.pt, ckpt_1.pt, ... (copies of a run's checkpoint.pt taken as it was rewritten, e.g. with
--checkpoint-every 12). Learned rewards are in the ensemble's normalised units (standard deviation 1 on the labelled
steps); "true" is the env's reward with the run's --env-kwargs (Ant-v4 in the C17 grid: no control cost).
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


def load(path):
    checkpoint = torch.load(path, weights_only=False)
    args = checkpoint["args"]
    env = rl.make_env(args["env"], 0, False, None, json.loads(args["env_kwargs"] or "{}"))()
    obs_dim, act_dim = env.observation_space.shape[0], env.unwrapped.action_space.shape[0]
    agent = rl.Agent(obs_dim, act_dim)
    agent.load_state_dict(checkpoint["agent"])
    obs_rms = rl.RunningMeanStd((obs_dim,))
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    ensemble = checkpoint_ensemble(checkpoint["reward_ensemble"], obs_dim, act_dim)
    return checkpoint["global_step"], env, agent, obs_rms, ensemble


def rollout(env, agent, obs_rms, steps):
    """The policy's sampled actions on `steps` steps (seed 0): observations, actions, true rewards, x velocities."""
    torch.manual_seed(0)
    observation, _ = env.reset(seed=0)
    record = {"obs": [], "act": [], "true": [], "velocity": []}
    episodes = 0
    for _ in range(steps):
        with torch.no_grad():
            normalized = torch.as_tensor(rl.normalize_obs(obs_rms, observation[None]), dtype=torch.float32)
            action = agent.get_action_and_value(normalized)[0].numpy()[0]
        record["obs"].append(observation)
        record["act"].append(action)
        observation, reward, terminated, truncated, info = env.step(action)
        record["true"].append(reward)
        record["velocity"].append(info["x_velocity"])
        if terminated or truncated:
            episodes += 1
            observation, _ = env.reset()
    record = {k: np.array(v, np.float32) for k, v in record.items()}
    record["episodes"] = episodes
    return record


def learned(ensemble, obs, act):
    with torch.no_grad():
        return ensemble.normalized_reward(torch.as_tensor(obs), torch.as_tensor(act)).numpy()


def describe(tag, path, reads_unclipped, steps):
    global_step, env, agent, obs_rms, ensemble = load(path)
    low, high = env.unwrapped.action_space.low, env.unwrapped.action_space.high
    run = rollout(env, agent, obs_rms, steps)
    act, clipped = run["act"], np.clip(run["act"], low, high)
    overshoot = np.maximum(np.abs(act) - high, 0).sum(axis=1)  # how far the sampled action left the bounds, summed
    reward = learned(ensemble, run["obs"], act if reads_unclipped else clipped)
    # least squares: learned reward ~ a + b * velocity + c * overshoot (what the reward pays per m/s, per unit outside)
    design = np.stack([np.ones_like(overshoot), run["velocity"], overshoot], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, reward, rcond=None)
    gap = reward - learned(ensemble, run["obs"], clipped)  # 0 for the fixed code
    std = torch.exp(agent.actor_logstd).mean().item()
    print(
        f"{tag} step {global_step:7d}: std {std:.2f}, outside {((act < low) | (act > high)).mean():.2f}, "
        f"velocity {run['velocity'].mean():+.2f} m/s, true/1000 {1000 * run['true'].mean():7.1f}, "
        f"episodes ended {run['episodes']}; learned: corr with true {np.corrcoef(reward, run['true'])[0, 1]:.2f}, "
        f"per m/s {b:+.2f}, per unit outside {c:+.3f}, unclipped minus clipped per 1000 {1000 * gap.mean():+.1f}"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="checkpoints of the run before the fix (reward read unclipped)")
    parser.add_argument("--fix", required=True, help="checkpoints of the run with the fix (reward read clipped)")
    parser.add_argument("--steps", type=int, default=2000)
    options = parser.parse_args()
    old = sorted(Path(options.old).glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    fix = sorted(Path(options.fix).glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    for old_path, fix_path in zip(old, fix):
        describe("old", old_path, True, options.steps)
        describe("fix", fix_path, False, options.steps)


if __name__ == "__main__":
    main()
