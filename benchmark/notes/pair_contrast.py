"""How different the two segments of each labelled pair are, in true return, over a run's label budget.

For every finished run of the sweeps given (each run's runs/*/labels.npz, kept on the machine that ran it: labels are
not committed), the labels in the order they were asked, cut into quarters; per quarter the median true return of each
pair's better and worse segment and the median gap between them. A pair whose segments have the same return teaches the
reward model nothing about which behaviour is better.

    python benchmark/notes/pair_contrast.py benchmark/sweeps/swimmer_c17_horizon benchmark/sweeps/swimmer_pair_pool
"""

import glob
import os
import sys

import numpy as np


def quarters(labels_path):
    returns = np.load(labels_path)["true_reward"].sum(-1)  # (labels, 2): each segment's true return
    cells = []
    for part in np.array_split(returns, 4):
        better, worse = part.max(1), part.min(1)
        cells.append(f"{np.median(better):5.1f} {np.median(worse):5.1f} {np.median(better - worse):4.1f}")
    return cells


if __name__ == "__main__":
    print("per quarter of the labels, in the order asked: median true return of the better and the worse segment, gap")
    for sweep in sys.argv[1:]:
        for labels_path in sorted(glob.glob(os.path.join(sweep, "*", "runs", "*", "labels.npz"))):
            run = os.path.relpath(labels_path, sweep).split(os.sep)[0]
            if not os.path.exists(os.path.join(sweep, run, "done.json")):
                continue  # still running
            final = open(os.path.join(sweep, run, "run.log")).read().rsplit("true return ", 1)[-1].split(",")[0]
            print(f"{os.path.basename(sweep)} {run} (last logged true return {final}): " + " | ".join(quarters(labels_path)))
