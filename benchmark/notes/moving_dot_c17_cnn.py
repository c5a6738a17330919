"""Offline check for issue 24: would C17 A.2's reward CNN (batch norm, dropout 0.5, leaky ReLU, L2) fit the moving
dot's frames from a few hundred labels, where the script reads them as keypoints?

The labels, teacher, walk and fresh pairs are those of moving_dot_reward_fit.py (250 labels of random-walk segments,
the synthetic teacher; accuracy on 2000 fresh pairs' strict preferences). The CNN is C17's Atari model made small for
42x32 frames: 3x3 convolutions with strides 2, 1, 1 and 16 filters, each followed by batch norm, dropout and leaky
ReLU, then 64 leaky-ReLU units and the script's head. Members are scored in eval mode (no dropout, running batch-norm
statistics).

    python benchmark/notes/moving_dot_c17_cnn.py --form action --member cnn
    python benchmark/notes/moving_dot_c17_cnn.py --form progress --member keypoints
"""

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import rlhf_moving_dot as dot  # noqa: E402
from moving_dot_reward_fit import random_walk  # noqa: E402


class C17Features(nn.Module):
    """C17 A.2's reward CNN for 42x32 frames, up to its 64 hidden units."""

    def __init__(self, obs_shape, dropout=0.5):
        super().__init__()
        layers, channels = [], obs_shape[0]
        for stride in (2, 1, 1):
            layers += [nn.Conv2d(channels, 16, 3, stride), nn.BatchNorm2d(16), nn.Dropout(dropout), nn.LeakyReLU(0.01)]
            channels = 16
        self.net = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            size = self.net(torch.zeros(2, *obs_shape)).shape[1]
        self.net.append(nn.Linear(size, 64))
        self.net.append(nn.LeakyReLU(0.01))
        self.size = 64

    def forward(self, frames):
        return self.net(frames)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=["action", "progress"], default="action")
    parser.add_argument("--member", choices=["cnn", "keypoints"], default="cnn")
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--labels", type=int, default=250)
    parser.add_argument("--steps", type=int, default=300, help="Adam steps of 64 labels")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    torch.set_num_threads(1)
    rng, _ = np.random.default_rng(options.seed), torch.manual_seed(options.seed)
    env = gym.make("MovingDot-v0").unwrapped
    env.reset(seed=options.seed)
    rollout = random_walk(env, rng, 8192)
    left, right = (dot.sample_segments(rng, rollout, 10, options.labels) for _ in range(2))
    buffer = dot.LabelBuffer(options.labels, 10, 3, rng)
    buffer.add(left, right, dot.SyntheticTeacher(rng).preferences(left["true_reward"], right["true_reward"]))
    obs_shape = dot.observe(np.zeros(2, int), "pixels").shape
    ensemble = dot.RewardEnsemble(obs_shape, len(dot.MOVES), 3, options.form == "progress")
    if options.member == "cnn":
        for member in ensemble.members:
            member.features = C17Features(obs_shape, options.dropout)
            size = member.features.size + (0 if options.form == "progress" else len(dot.MOVES))
            member.head = nn.Sequential(nn.Linear(size, 64), nn.LeakyReLU(0.01), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=1e-3)
    started = time.time()
    ensemble.train()
    dot.train_reward_model(ensemble, optimizer, buffer, "pixels", torch.full((3,), 1e-4), options.steps, 64, 0.1, rng)
    fit_seconds = time.time() - started
    ensemble.eval()
    step_rewards = dot.label_step_rewards(ensemble, buffer.get(), "pixels")
    train_loss, val_loss, val_accuracy = dot.validate_reward_model(step_rewards, buffer.get(), 0.1)
    fresh = random_walk(env, rng, 8192)
    fresh_left, fresh_right = (dot.sample_segments(rng, fresh, 10, 2000) for _ in range(2))
    with torch.no_grad():
        predicted_left = dot.segment_returns(ensemble, fresh_left, "pixels").mean(0).numpy()
        predicted_right = dot.segment_returns(ensemble, fresh_right, "pixels").mean(0).numpy()
    true_left, true_right = fresh_left["true_reward"].sum(1), fresh_right["true_reward"].sum(1)
    strict = true_left != true_right
    accuracy = ((predicted_left > predicted_right) == (true_left > true_right))[strict].mean()
    print(
        f"{vars(options)}: held-out accuracy {val_accuracy:.3f}, train loss {train_loss.nanmean():.3f}, val loss"
        f" {val_loss.nanmean():.3f}, accuracy on {strict.sum()} fresh strict pairs {accuracy:.3f} ({fit_seconds:.0f} s)"
    )


if __name__ == "__main__":
    main()
