"""How much of a step's reward does the action decide, for the learned reward and for the true one? On Swimmer-v4 the
labelled runs' policies lose entropy faster than the true reward's (notes/c17_grid.md, twenty-eighth session); one
explanation would be a reward model that pays for the action itself at a state, a signal PPO can follow at once,
where the true reward (no control cost in the C17 grid) pays for the motion the action makes over one step.

The run's policy plays --episodes episodes sampling its actions; at --states states spread over them, the env is set to
that state and stepped with --actions actions sampled from the policy there (as PPO samples them), each scored by the
true reward and by the run's reward ensemble (normalised as PPO sees it). Printed per run: the spread of each reward
across the actions at a state (the mean over states of the standard deviation over actions) as a share of its spread
over states (the standard deviation over states of the mean over actions), and the correlation of the two rewards
across the actions at a state (the mean over states), i.e. whether the learned reward prefers the actions that move
the swimmer more in that step.

Usage (from the repository root; RUN: a labelled run's folder with checkpoint.pt):
  python benchmark/notes/reward_action_share.py RUN [RUN ...] [--episodes 1] [--states 200] [--actions 16]
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_stall import load_run, ppo  # noqa: E402


def states_of_episodes(env, agent, obs_rms, episodes, seed):
    """(qpos, qvel, observation) at every step of the policy's episodes, actions sampled; and their mean true return."""
    visited, total = [], 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            data = env.unwrapped.data
            visited.append((data.qpos.copy(), data.qvel.copy(), obs))
            with torch.no_grad():
                action = agent.get_action_and_value(torch.as_tensor(ppo.normalize_obs(obs_rms, obs[None])))[0]
            action = np.clip(action.numpy()[0], env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
    return visited, total / episodes


def rewards_of_actions(env, agent, obs_rms, ensemble, state, num_actions):
    """True and learned rewards of num_actions policy actions taken at one state."""
    qpos, qvel, obs = state
    with torch.no_grad():
        normalized = torch.as_tensor(ppo.normalize_obs(obs_rms, np.repeat(obs[None], num_actions, 0)))
        actions = agent.get_action_and_value(normalized)[0].numpy()
    actions = np.clip(actions, env.action_space.low, env.action_space.high)
    true_rewards = []
    for action in actions:
        env.unwrapped.set_state(qpos, qvel)
        true_rewards.append(env.step(action)[1])
    with torch.no_grad():
        learned = ensemble.normalized_reward(
            torch.as_tensor(np.repeat(obs[None], num_actions, 0), dtype=torch.float32),
            torch.as_tensor(actions, dtype=torch.float32),
        )
    return np.array(true_rewards), learned.numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--actions", type=int, default=16)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    torch.manual_seed(cli.seed)
    print(
        "| run | step | true return (episodes) | true: spread over actions / over states | learned: spread over actions /"
        " over states | correlation of the two over the actions at a state |"
    )
    print("|---|---|---|---|---|---|")
    for run_dir in cli.runs:
        checkpoint, env, agent, obs_rms, ensemble = load_run(run_dir)
        if ensemble is None:
            sys.exit(f"{run_dir} is a true-reward run: it has no reward ensemble")
        visited, true_return = states_of_episodes(env, agent, obs_rms, cli.episodes, cli.seed)
        picked = np.linspace(0, len(visited) - 1, cli.states).round().astype(int)
        true_by_state, learned_by_state = [], []
        for index in picked:
            true_rewards, learned_rewards = rewards_of_actions(env, agent, obs_rms, ensemble, visited[index], cli.actions)
            true_by_state.append(true_rewards)
            learned_by_state.append(learned_rewards)
        true_by_state, learned_by_state = np.array(true_by_state), np.array(learned_by_state)

        def share(rewards):
            return rewards.std(axis=1).mean() / rewards.mean(axis=1).std()

        correlations = [
            np.corrcoef(t, learned)[0, 1]
            for t, learned in zip(true_by_state, learned_by_state)
            if t.std() > 0 and learned.std() > 0
        ]
        print(
            f"| {run_dir} | {checkpoint['global_step']} | {true_return:.0f} | {share(true_by_state):.2f} |"
            f" {share(learned_by_state):.2f} | {np.mean(correlations):+.2f} |"
        )


if __name__ == "__main__":
    main()
