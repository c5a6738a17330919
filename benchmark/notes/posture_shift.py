"""How much of a locomotion task's segment return is posture shift rather than locomotion, under a random policy?

The MuJoCo locomotion rewards pay the forward velocity of the root body (qpos[0], Swimmer's front segment), so a
segment's true return is the root's displacement over the segment over dt (plus any other reward terms). The root
moves when the body changes its posture even if the whole body goes nowhere. This tool steps the environment with
uniformly random actions (the policy the pretraining labels come from, C17 A.1) and compares, over every segment of
--segment-len steps (starts --stride apart, inside one episode), the root's x displacement with the displacement of the
whole body's centre of mass (MuJoCo's subtree_com of body 1, the root's subtree: the whole robot). The share of the
root displacement's variance that the centre of mass explains (r squared) is the share that is locomotion; the rest
is posture shift, which telescopes: a posture reached is paid once, and a per-step reward that pays the posture itself
can be collected by holding it.

Usage (from the repository root):
  python benchmark/notes/posture_shift.py --env Swimmer-v4 --segment-len 60
  python benchmark/notes/posture_shift.py --env Hopper-v4 --segment-len 60 --env-kwargs '{"terminate_when_unhealthy": false}'
"""

import argparse
import json

import gymnasium as gym
import numpy as np


def episode_positions(env, seed, steps):
    """The root's x position and the centre of mass's x position after each step of one random-action episode."""
    env.reset(seed=seed)
    env.action_space.seed(seed)
    data = env.unwrapped.data
    root_x, com_x = [], []
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        root_x.append(data.qpos[0])
        com_x.append(data.subtree_com[1][0])
        if terminated or truncated:
            break
    return np.array(root_x), np.array(com_x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Swimmer-v4")
    parser.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments for gym.make")
    parser.add_argument("--segment-len", type=int, default=60)
    parser.add_argument("--stride", type=int, default=10, help="steps between the starts of two segments")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1000, help="most steps per episode")
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i")
    args = parser.parse_args()
    env = gym.make(args.env, **json.loads(args.env_kwargs))
    root_moves, com_moves = [], []
    for episode in range(args.episodes):
        root_x, com_x = episode_positions(env, args.seed + episode, args.steps)
        starts = np.arange(0, len(root_x) - args.segment_len, args.stride)
        root_moves.append(root_x[starts + args.segment_len] - root_x[starts])
        com_moves.append(com_x[starts + args.segment_len] - com_x[starts])
    root_moves, com_moves = np.concatenate(root_moves), np.concatenate(com_moves)
    if len(root_moves) < 2:
        raise SystemExit(f"too few segments of {args.segment_len} steps: episodes end sooner (see --env-kwargs)")
    r = np.corrcoef(root_moves, com_moves)[0, 1]
    print(
        f"{args.env} {args.env_kwargs}, random actions, {args.episodes} episodes (seeds {args.seed}-"
        f"{args.seed + args.episodes - 1}), {len(root_moves)} segments of {args.segment_len} steps"
    )
    print(
        f"root x displacement: std {root_moves.std():.4f} m; centre of mass: std {com_moves.std():.4f} m; correlation {r:.3f}"
    )
    print(
        f"share of the root displacement's variance explained by the centre of mass (locomotion): {r**2:.3f}; "
        f"the rest, posture shift: {1 - r**2:.3f}"
    )


if __name__ == "__main__":
    main()
