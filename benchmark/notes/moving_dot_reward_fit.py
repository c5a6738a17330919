"""Offline check of the moving dot's reward model (issue 24): fit it on labels of random-walk segments from the
synthetic teacher, then count how often it orders fresh segment pairs the way the true reward does.

It compares the default r(o, a) ("action") with `--reward-form progress`, f(o') - f(o) ("progress"); on frames the
first reads soft-argmax keypoints (dot.Keypoints), the second squared-map centroids (dot.CentroidKeypoints), unless
--keypoints says.

    python benchmark/notes/moving_dot_reward_fit.py --form action --observation pixels
    python benchmark/notes/moving_dot_reward_fit.py --form progress --observation pixels
    python benchmark/notes/moving_dot_reward_fit.py --form progress --observation pixels --keypoints softmax --temperature 50
"""

import argparse
import math
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_moving_dot as dot  # noqa: E402


def random_walk(env, rng, steps, num_envs=8, reset_chance=0.005):
    """A rollout (steps // num_envs, num_envs) of uniformly random actions, restarting now and then: each column one
    stretch of the walk in order, as a vector env's (a restart ends an episode there)."""
    position, act, reward, restarted = [], [], [], []
    for _ in range(steps):
        position.append(env.position.copy())
        act.append(int(rng.integers(len(dot.MOVES))))
        reward.append(env.step(act[-1])[1])
        restarted.append(rng.random() < reset_chance)
        if restarted[-1]:
            env.reset(seed=int(rng.integers(1 << 30)))
    flat = {
        "position": np.array(position, np.int16),
        "act": np.array(act),
        "true_reward": np.array(reward, np.float32),
        "truncated": np.array(restarted),
    }
    return {k: v.reshape(num_envs, steps // num_envs, *v.shape[1:]).swapaxes(0, 1) for k, v in flat.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=["action", "progress"], default="action")
    parser.add_argument("--observation", choices=["position", "pixels"], default="pixels")
    parser.add_argument("--temperature", type=float, default=10.0, help="the keypoints' initial softmax temperature")
    parser.add_argument(
        "--keypoints", choices=["softmax", "centroid"], default=None, help="the frame features (default: the form's)"
    )
    parser.add_argument("--labels", type=int, default=250)
    parser.add_argument("--steps", type=int, default=800, help="Adam steps of 64 labels")
    options = parser.parse_args()
    torch.set_num_threads(1)
    rng, _ = np.random.default_rng(0), torch.manual_seed(0)
    env = gym.make("MovingDot-v0").unwrapped
    env.reset(seed=0)
    rollout = random_walk(env, rng, 8192)
    left, right = (dot.sample_segments(rng, rollout, 10, options.labels) for _ in range(2))
    buffer = dot.LabelBuffer(options.labels, 10, 3, rng)
    buffer.add(left, right, dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"]))
    obs_shape = dot.observe(np.zeros(2, int), options.observation).shape
    ensemble = dot.RewardEnsemble(obs_shape, len(dot.MOVES), 3, options.form == "progress")
    if options.observation == "pixels":
        for member in ensemble.members:
            if options.keypoints:
                member.features = {"softmax": dot.Keypoints, "centroid": dot.CentroidKeypoints}[options.keypoints](obs_shape)
            if isinstance(member.features, dot.Keypoints):
                member.features.log_temperature.data.fill_(math.log(options.temperature))
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-3)
    started = time.time()
    dot.train_reward_model(
        ensemble, optimizer, buffer, options.observation, torch.full((3,), 1e-4), options.steps, 64, 0.1, rng
    )
    fresh = random_walk(env, rng, 8192)
    fresh_left, fresh_right = (dot.sample_segments(rng, fresh, 10, 2000) for _ in range(2))
    with torch.no_grad():
        predicted_left = dot.segment_returns(ensemble, fresh_left, options.observation).mean(0).numpy()
        predicted_right = dot.segment_returns(ensemble, fresh_right, options.observation).mean(0).numpy()
    true_left, true_right = fresh_left["true_reward"].sum(1), fresh_right["true_reward"].sum(1)
    strict = true_left != true_right
    accuracy = ((predicted_left > predicted_right) == (true_left > true_right))[strict].mean()
    print(f"{vars(options)}: accuracy on {strict.sum()} fresh strict pairs {accuracy:.3f} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
