"""When did a HalfCheetah-v4 RLHF run turn onto its back? The labelled segments say: a run saves every labelled pair
(labels.npz, in the order the labels arrived), and the segments show the policy of their time (a sample picked by
the ensemble's disagreement, not a uniform one). For each run folder
this prints, per block of labels, the share of the labelled steps with the torso upside down (cos of the torso pitch
below 0: HalfCheetah's pitch, observation 1, is a hinge angle that can wind past a full turn), their mean forward
velocity (observation 8), and the step at which the block's first label had arrived (from the run's run.log: its
progress lines, every 2048 steps, count the labels so far; "by" the first line, at 12k steps, for a block whose
first label had arrived by then: the labels asked of the untrained initial policy's clips before RL, and RL's first).

Usage (from the repository root):
  python benchmark/notes/labels_on_back.py benchmark/sweeps/SWEEP/HalfCheetah-v4__labels1400__* [--blocks 8]
"""

import argparse
import re
from pathlib import Path

import numpy as np


def label_steps(run_log):
    """(step, labels so far) on each progress line of a sweep run's log."""
    found = re.findall(r"^step (\d+),.* labels (\d+)/\d+", run_log.read_text(), re.M)
    return np.array([(int(step), int(labels)) for step, labels in found])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", help="sweep run folders (each holds run.log and runs/*/labels.npz)")
    parser.add_argument("--blocks", type=int, default=8)
    options = parser.parse_args()
    print("| run | labels | " + " | ".join(f"block {i + 1}" for i in range(options.blocks)) + " |")
    print("|---" * (options.blocks + 2) + "|")
    for folder in map(Path, options.runs):
        saved = sorted(folder.glob("runs/*/labels.npz"))
        if not saved:
            print(f"| {folder.name} | no labels.npz (the run folder's runs/ is not in git: only where the run ran) |")
            continue
        labels = np.load(saved[-1])
        mask = labels["mask"]
        on_back = (np.cos(labels["obs"][..., 1]) < 0) * mask
        velocity = labels["obs"][..., 8] * mask
        progress = label_steps(folder / "run.log")
        cells = []
        for block in np.array_split(np.arange(len(mask)), options.blocks):
            arrived = progress[progress[:, 1] > block[0]]
            if not len(arrived):
                step = "?"
            else:  # a label that had arrived by the first progress line: asked before RL, or in its first steps
                step = f"{'by ' if arrived[0, 0] == progress[0, 0] else ''}{arrived[0, 0] // 1000}k"
            share, speed = on_back[block].sum() / mask[block].sum(), velocity[block].sum() / mask[block].sum()
            cells.append(f"{share:.2f}, {speed:+.1f} m/s, {step}")
        print(f"| {folder.name} | {len(mask)} | " + " | ".join(cells) + " |")
    print("each block: share of labelled steps on its back, their mean forward velocity, step of the block's first label")


if __name__ == "__main__":
    main()
