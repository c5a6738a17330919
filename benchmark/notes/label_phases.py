"""What the teacher was shown, label by label, in a saved rlhf_ppo_mujoco.py run on Swimmer-v4 (labels.npz).

Labels are stored in the order they were asked: the first 25% (--pretrain-fraction) from the random policy, then from
the policy as it learns. For each block of --block labels this prints the clips' mean forward velocity (Swimmer-v4
with no control cost: the true reward per step is the front body's forward velocity), the median and 90th percentile
of the faster clip's velocity in each pair, the median gap between the two clips of a pair (how much the label
says), and the mean size of the actions and of the observation's first three entries (the front body's heading and
the two joint angles, whose bounds are 1.75 rad: a body bent and held in a glide shows as a larger mean).

Usage (from the repository root):
  python benchmark/notes/label_phases.py RUN_FOLDER/labels.npz ... [--block 100]
"""

import argparse

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels", nargs="+", help="labels.npz files")
    parser.add_argument("--block", type=int, default=100)
    args = parser.parse_args()
    for path in args.labels:
        with np.load(path) as saved:
            obs, act, mask, true_reward = saved["obs"], saved["act"], saved["mask"], saved["true_reward"]
        velocity = (true_reward * mask).sum(-1) / np.maximum(mask.sum(-1), 1)  # (labels, 2): each clip's mean
        print(f"{path}: {len(velocity)} labels")
        print("labels | mean velocity | faster clip: median, p90 | gap: median | |action| | |angles|")
        for start in range(0, len(velocity), args.block):
            block = slice(start, min(len(velocity), start + args.block))
            faster = velocity[block].max(1)
            gap = np.abs(velocity[block, 0] - velocity[block, 1])
            print(
                f"{start}-{block.stop} | {velocity[block].mean():+.3f} | {np.median(faster):.3f}, "
                f"{np.quantile(faster, 0.9):.3f} | {np.median(gap):.3f} | {np.abs(act[block]).mean():.2f} | "
                f"{np.abs(obs[block][..., :3]).mean():.2f}"
            )


if __name__ == "__main__":
    main()
