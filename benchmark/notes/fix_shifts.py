"""How far the action-clipping fix moved each labelled cell of the C17 grid, in standard errors: the final true returns
of grids/c17_clipfix.json (with the fix) against grids/c17_mujoco.json (before it), unpaired (Welch) and paired by seed.

    python benchmark/notes/fix_shifts.py
"""

import sys
from pathlib import Path

import numpy as np

BENCHMARK = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARK))
from plot import progress  # noqa: E402


def final_returns(grid):
    """{(env, mode): {seed: final true return}} of a grid's finished runs."""
    finals = {}
    for run in (BENCHMARK / "sweeps" / grid).iterdir():
        if (run / "done.json").exists():
            env, mode, seed = run.name.split("__")
            finals.setdefault((env, mode), {})[int(seed)] = progress(run / "run.log")[1][-1]
    return finals


after, before = final_returns("c17_clipfix"), final_returns("c17_mujoco")
for cell in sorted(cell for cell in after if cell[1] != "true" and cell in before):
    a, b = np.array(list(after[cell].values())), np.array(list(before[cell].values()))
    welch = np.hypot(a.std(ddof=1) / np.sqrt(len(a)), b.std(ddof=1) / np.sqrt(len(b)))
    seeds = sorted(set(after[cell]) & set(before[cell]))
    paired = np.array([after[cell][s] - before[cell][s] for s in seeds])
    shift = f"{(a.mean() - b.mean()) / welch:+.2f}" if welch > 0 else "no spread"
    paired_se = paired.std(ddof=1) / np.sqrt(len(paired)) if len(paired) > 1 else 0
    paired_shift = f"{paired.mean() / paired_se:+.2f}" if paired_se > 0 else "no spread"
    print(f"{cell[0]} {cell[1]}: seeds {len(a)} against {len(b)}, unpaired {shift}, paired over {len(seeds)} {paired_shift}")
