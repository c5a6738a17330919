"""How well the reward ensemble of rlhf_ppo_mujoco.py fits a task's preferences, offline: labels from the synthetic
teacher on segments of a random policy, fitted as in pretraining (the script's own functions), then scored on fresh
pairs from another random rollout. `--inputs raw` feeds the model raw observations (the script's
--no-reward-input-norm); `--inputs standardized` standardises them by the training rollout's mean and std (the script,
by default, uses the pretraining labels' steps, and clips to +-10).

    python benchmark/notes/reward_fit.py --env Reacher-v5 --env-kwargs '{"reward_control_weight": 0}' --segment-len 15
"""

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_ppo_mujoco as script  # noqa: E402


def random_rollout(env_id, env_kwargs, num_envs, num_steps, seed):
    """A random policy's rollout, arrays shaped (steps, envs, ...) as the script's sample_segments reads them."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **env_kwargs) for _ in range(num_envs)])
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    keys = ("obs", "act", "true_reward", "terminated", "truncated")
    rollout = {k: [] for k in keys}
    for _ in range(num_steps):
        act = envs.action_space.sample()
        next_obs, reward, terminated, truncated, _ = envs.step(act)
        for k, v in zip(keys, (obs, act, reward, terminated, truncated)):
            rollout[k].append(v)
        obs = next_obs
    envs.close()
    return {k: np.array(v, np.float32 if k in ("obs", "act", "true_reward") else bool) for k, v in rollout.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Reacher-v5")
    parser.add_argument("--env-kwargs", default="{}")
    parser.add_argument("--segment-len", type=int, default=50)
    parser.add_argument("--labels", type=int, default=350)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--inputs", choices=("raw", "standardized"), default="raw")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    kwargs = json.loads(options.env_kwargs)
    train = random_rollout(options.env, kwargs, 4, 2048, options.seed)
    test = random_rollout(options.env, kwargs, 4, 2048, options.seed + 1000)
    train_steps = train["obs"].reshape(-1, train["obs"].shape[-1])
    mean, std = train_steps.mean(0), train_steps.std(0)
    if options.inputs == "standardized":
        for rollout in (train, test):
            rollout["obs"] = (rollout["obs"] - mean) / (std + 1e-8)
    print("observation std per dimension:", np.array2string(std, precision=3, max_line_width=200))

    teacher = script.SyntheticTeacher(rng)
    obs_dim, act_dim = train["obs"].shape[-1], train["act"].shape[-1]
    buffer = script.LabelBuffer(options.labels, options.segment_len, obs_dim, act_dim, 3, rng)
    while buffer.size < options.labels:
        left = script.sample_segments(rng, train, options.segment_len, options.labels - buffer.size)
        right = script.sample_segments(rng, train, options.segment_len, options.labels - buffer.size)
        teacher.ask(left, right)
        for answered in teacher.answered:
            buffer.add(*answered)
        teacher.answered.clear()

    ensemble = script.RewardEnsemble(obs_dim, act_dim)
    training = script.RewardModelTraining(ensemble, learning_rate=3e-4)
    args = SimpleNamespace(reward_eval_every=1, reward_batch_size=64, label_noise=0.1, reward_std=1.0)
    epoch_steps = math.ceil(buffer.size / 64)
    training.train(buffer, options.epochs, epoch_steps, args, rng, validate_at_end=True)

    left = script.sample_segments(rng, test, options.segment_len, 4000)
    right = script.sample_segments(rng, test, options.segment_len, 4000)
    true_diff = left["true_reward"].sum(1) - right["true_reward"].sum(1)
    with torch.no_grad():
        predicted = ensemble.segment_returns(script.to_torch(left)) - ensemble.segment_returns(script.to_torch(right))
    strict = true_diff != 0
    accuracy = ((predicted.mean(0).numpy() > 0) == (true_diff > 0))[strict].mean()
    steps_true = test["true_reward"].reshape(-1)
    with torch.no_grad():
        steps_pred = ensemble(torch.as_tensor(test["obs"]), torch.as_tensor(test["act"])).mean(0).reshape(-1).numpy()
    print(
        f"{options.env} {options.inputs} inputs, {buffer.size} labels, segment {options.segment_len}: "
        f"val acc (held-out labels) {training.val_accuracy:.2f}, fresh pairs acc {accuracy:.2f}, "
        f"step-reward corr {np.corrcoef(steps_true, steps_pred)[0, 1]:.2f}, L2 {training.l2_coef.mean():.1e}"
    )
    training.close()


if __name__ == "__main__":
    main()
