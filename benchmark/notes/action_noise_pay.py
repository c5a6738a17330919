"""Does the learned reward pay for the policy's action noise? On Hopper the RLHF runs end with a policy entropy well
above the true-reward runs' (logs/c17_hopper_seeds6_10/entropy.txt), and their training returns come from sampled
actions. Loads a checkpoint of rlhf_ppo_mujoco.py (--save-model), plays episodes sampling actions as in training, and
at every visited state s compares the reward of the policy's mean action mu(s) with the mean reward of K actions
sampled from the policy there (clipped as the environment clips them):
- true: one simulator step from s (the state restored) with each action, the environment's reward (torque penalty as
  the run had it); the action reaches it only through the step's forward velocity;
- learned: the checkpoint's reward ensemble as PPO sees it (normalised; a constant shift cancels in the difference).
Each gain, E[r(s, a ~ pi)] - r(s, mu), is printed in units of that reward's own std over the visited steps, so the two
compare. Then the agent's true return over the same episodes' seeds acting with mu (deterministic) against sampling.

Usage (from the repository root):
  python benchmark/notes/action_noise_pay.py runs/NAME [--episodes 5] [--samples 8] [--seed 100]
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
import rlhf_ppo_mujoco as ppo  # noqa: E402
from hopper_stall import load_run  # noqa: E402  (this folder: a saved run's checkpoint, env, agent, reward model)


def play(env, agent, obs_rms, episodes, seed, deterministic):
    """Episodes of the agent: per episode (observations, simulator states, mean actions, action stds, true returns)."""
    played = []
    low, high = env.action_space.low, env.action_space.high
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        states, observations, means, stds, total, done = [], [], [], [], 0.0, False
        while not done:
            x = torch.as_tensor(ppo.normalize_obs(obs_rms, obs[None]))
            with torch.no_grad():
                mean, std = agent.actor_mean(x)[0].numpy(), agent.actor_logstd.exp()[0].numpy()
            action = mean if deterministic else mean + std * np.random.standard_normal(mean.shape)
            states.append(np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel]))
            observations.append(obs)
            means.append(mean)
            stds.append(std)
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            total += reward
            done = terminated or truncated
        played.append((np.array(observations), np.array(states), np.array(means), np.array(stds), total))
    return played


def true_step_reward(env, state, action):
    """The environment's reward of one step from `state` (qpos, qvel) with `action`."""
    model = env.unwrapped.model
    env.unwrapped.set_state(state[: model.nq], state[model.nq :])
    _, reward, _, _, _ = env.unwrapped.step(np.clip(action, env.action_space.low, env.action_space.high))
    return reward


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    checkpoint, env, agent, obs_rms, ensemble = load_run(cli.run_dir)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    np.random.seed(cli.seed)
    torch.manual_seed(cli.seed)
    sampled = play(env, agent, obs_rms, cli.episodes, cli.seed, deterministic=False)
    greedy = play(env, agent, obs_rms, cli.episodes, cli.seed, deterministic=True)
    std_mean = np.concatenate([s for _, _, _, s, _ in sampled]).mean()
    line = (
        f"{cli.run_dir}: step {checkpoint['global_step']}, action std {std_mean:.3f}; true return sampling "
        f"{np.mean([r for *_, r in sampled]):.0f}, with the mean action {np.mean([r for *_, r in greedy]):.0f}"
    )
    obs = np.concatenate([o for o, *_ in sampled])
    states = np.concatenate([s for _, s, *_ in sampled])
    means = np.concatenate([m for _, _, m, _, _ in sampled])
    stds = np.concatenate([s for _, _, _, s, _ in sampled])
    actions = means[:, None] + stds[:, None] * np.random.standard_normal((len(means), cli.samples, act_dim))
    actions = np.clip(actions, env.action_space.low, env.action_space.high)
    true_mean = np.array([true_step_reward(env, s, m) for s, m in zip(states, means)])
    true_noisy = np.array([[true_step_reward(env, s, a) for a in acts] for s, acts in zip(states, actions)]).mean(1)
    line += f"; true reward's gain from noise {(true_noisy - true_mean).mean() / true_mean.std():+.3f} std"
    if ensemble is not None:  # a true-reward run has none
        with torch.no_grad():
            o = torch.as_tensor(obs, dtype=torch.float32)
            learned_mean = ensemble.normalized_reward(o, torch.as_tensor(means, dtype=torch.float32)).numpy()
            repeated = o[:, None].expand(-1, cli.samples, -1).reshape(-1, obs_dim)
            flat = torch.as_tensor(actions.reshape(-1, act_dim), dtype=torch.float32)
            learned_noisy = ensemble.normalized_reward(repeated, flat).numpy().reshape(len(obs), cli.samples).mean(1)
        line += f", learned reward's {(learned_noisy - learned_mean).mean() / learned_mean.std():+.3f} std"
    print(line + f" ({len(states)} states x {cli.samples} actions)")


if __name__ == "__main__":
    main()
