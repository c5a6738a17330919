"""What does a stalled Hopper (or Walker2d, Ant: the same reward, 1 per step alive plus the forward velocity) RLHF agent
do, and what does its learned reward pay for it? Loads a checkpoint of
rlhf_ppo_mujoco.py (a run saved with --save-model), plays episodes with the agent as it acts in training (sampled
actions), scores every step with the checkpoint's reward ensemble as PPO sees it (normalised, shifted so the fallen
state earns 0 when the run anchors it) and prints:
- per episode: length, whether it fell, true return, mean forward velocity, the share of steps on its back (torso
  upside down: HalfCheetah's known local optimum is running on its back), the learned return;
- a least-squares fit of the learned step reward on the true reward's parts, learned ~ a + b * x_velocity: under the
  true reward (torque penalty removed) a step alive is worth 1 and each m/s of forward velocity 1, so a / b is 1
  (Ant's too: Ant-v4 leaves contact forces out of its reward by default); a learned reward with a / b far below 1
  pays little for staying up, and an agent that trades falls for speed loses little by it (HalfCheetah's true reward
  is the forward velocity alone: a / b is 0 there);
- where some steps are on the agent's back: what the learned reward pays there beyond the fit (the true reward pays
  those steps as it pays upright ones), against upright steps, in m/s of forward velocity;
- the learned value of the fallen state, in the same units (0 when anchored).
A true-reward run's checkpoint has no reward ensemble: then only the episodes are printed.

Usage (from the repository root):
  python benchmark/notes/hopper_stall.py runs/NAME [--episodes 20] [--seed 100]
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
import rlhf_ppo_mujoco as ppo  # noqa: E402


def upside_down(qpos, env_id):
    """Whether the torso is upside down: in the 2D walkers (qpos: x, z, pitch, ...) its pitch is beyond 90 degrees;
    Ant's torso is a free body (qpos: x, y, z, then its orientation as a quaternion w, x, y, z) whose own up axis
    then points below the horizon."""
    if env_id.startswith("Ant"):
        _, qx, qy, _ = qpos[3:7]
        return 1 - 2 * (qx * qx + qy * qy) < 0  # world z component of the torso's z axis
    return abs(qpos[2]) > np.pi / 2


def checkpoint_ensemble(state, obs_dim, act_dim):
    """A run's reward ensemble from its checkpoint's state (its "reward_ensemble"), with the potential of
    --reward-potential where the run had one; older checkpoints' missing buffers keep their defaults."""
    ensemble = ppo.RewardEnsemble(obs_dim, act_dim, len(state["absorbing_reward"]), potential="potential_weights.0" in state)
    ensemble.load_state_dict(ensemble.state_dict() | state)
    return ensemble


def load_run(run_dir):
    """A saved run (rlhf_ppo_mujoco.py --save-model): its checkpoint, a fresh env as the run made it, the agent, its
    observation statistics, and its reward ensemble (None for a true-reward run, whose checkpoint has none)."""
    checkpoint = ppo.load_checkpoint(run_dir)
    args = checkpoint["args"]
    env = ppo.make_env(args["env"], 0, False, None, json.loads(args["env_kwargs"]))()
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    agent = ppo.Agent(obs_dim, act_dim)
    agent.load_state_dict(checkpoint["agent"])
    obs_rms = ppo.RunningMeanStd()
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    ensemble = None
    if checkpoint["reward_ensemble"] is not None:
        ensemble = checkpoint_ensemble(checkpoint["reward_ensemble"], obs_dim, act_dim)
    return checkpoint, env, agent, obs_rms, ensemble


def play(env, agent, obs_rms, episodes, seed):
    """Episodes of the agent sampling its actions: per episode (observations, the executed (clipped) actions, true
    rewards, x velocities, whether it fell)."""
    played = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        observations, actions, rewards, velocities, on_back, fell, done = [], [], [], [], [], False, False
        while not done:
            with torch.no_grad():
                action, _, _, _ = agent.get_action_and_value(torch.as_tensor(ppo.normalize_obs(obs_rms, obs[None])))
            # as executed and as the reward model judges it (ClipAction's own space is unbounded in gymnasium 1.x)
            action = np.clip(action.numpy()[0], env.unwrapped.action_space.low, env.unwrapped.action_space.high)
            observations.append(obs)
            actions.append(action)
            obs, reward, fell, truncated, info = env.step(action)
            rewards.append(reward)
            velocities.append(info["x_velocity"])
            on_back.append(upside_down(env.unwrapped.data.qpos, env.spec.id))
            done = fell or truncated
        played.append(
            (np.array(observations), np.array(actions), np.array(rewards), np.array(velocities), np.array(on_back), fell)
        )
    return played


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=100)
    cli = parser.parse_args()
    checkpoint, env, agent, obs_rms, ensemble = load_run(cli.run_dir)
    args = checkpoint["args"]
    torch.manual_seed(cli.seed)
    played = play(env, agent, obs_rms, cli.episodes, cli.seed)
    with_reward_model = ensemble is not None
    if with_reward_model:
        absorbing = ensemble.normalized_absorbing_reward()
        shift = absorbing if args.get("anchor_absorbing", False) else 0.0
        print(
            f"{cli.run_dir}: step {checkpoint['global_step']}, fallen state's learned reward {absorbing - shift:+.3f} "
            f"(unanchored {absorbing:+.3f})"
        )
    else:
        print(f"{cli.run_dir}: step {checkpoint['global_step']}, true reward")
    print(
        "| episode | length | fell | true return | mean x velocity | on its back |" + " learned return |" * with_reward_model
    )
    print("|---|---|---|---|---|---|" + "---|" * with_reward_model)
    learned_all, velocity_all, on_back_all = [], [], []
    for i, (obs, act, rewards, velocities, on_back, fell) in enumerate(played):
        row = f"| {i} | {len(rewards)} | {'yes' if fell else 'no'} | {rewards.sum():.1f} | {velocities.mean():.2f} "
        row += f"| {on_back.mean():.2f} |"
        if with_reward_model:
            with torch.no_grad():
                learned = (
                    ensemble.normalized_reward(
                        torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(act, dtype=torch.float32)
                    ).numpy()
                    - shift
                )
            learned_all.append(learned)
            velocity_all.append(velocities)
            on_back_all.append(on_back)
            row += f" {learned.sum():.1f} |"
        print(row)
    if not with_reward_model:
        return
    learned, velocity = np.concatenate(learned_all), np.concatenate(velocity_all)
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(velocity), velocity], 1), learned, rcond=None)
    fitted = a + b * velocity
    r2 = 1 - np.var(learned - fitted) / np.var(learned)
    print(
        f"learned step reward ~ {a:+.3f} + {b:+.3f} * x_velocity (R^2 {r2:.2f}); a / b = {a / b:.2f} "
        f"(the true reward without torque penalty: 1.00 on Hopper, Walker2d and Ant, 0 on HalfCheetah); correlation with "
        f"x velocity {np.corrcoef(learned, velocity)[0, 1]:.2f}"
    )
    print(f"mean learned step reward {learned.mean():+.3f}, std {learned.std():.3f}; steps {len(learned)}")
    on_back = np.concatenate(on_back_all)
    if on_back.any() and not on_back.all():  # what the fit misses on the back, where the true reward pays as upright
        residual = (learned - fitted) / b  # in m/s of forward velocity: the true reward's alive bonus is 1 of them
        print(
            f"learned minus fitted reward, over b: {residual[on_back].mean():+.3f} on its back "
            f"({on_back.sum()} steps), {residual[~on_back].mean():+.3f} upright"
        )


if __name__ == "__main__":
    main()
