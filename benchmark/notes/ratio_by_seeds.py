"""How a cell's ratio to the true reward moved as seeds were added: for each labelled mode of an env in a sweep, the
ratio of the first k seeds' mean final true return (seeds in number order) to the mean of all the true-reward runs,
for k = 3, 6, 8 and all, with the ratio's standard error over all seeds and whether C17's claim is met at 3, 6 and all.
The ratio and its standard error are the sweep report's (benchmark/sweep.py: ratio_to_true, ratio_standard_error;
on an env with negative returns, Reacher, counted from the mean first logged return of the env's runs).

Usage (from the repository root):
  python benchmark/notes/ratio_by_seeds.py benchmark/sweeps/c17_clipfix Walker2d-v4 HalfCheetah-v4 ...
A run counts once its folder has done.json; its final return is the mean true return of its last 10 episodes on its
last progress line, as in final_returns.py.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from final_returns import finals  # noqa: E402
from plot import progress  # noqa: E402
from sweep import C17_CLAIM, mode_order, ratio_standard_error, ratio_to_true  # noqa: E402


def main():
    sweep_dir, envs = sys.argv[1], sys.argv[2:]
    print(f"{sweep_dir}: ratio to the true-reward runs of the first k labelled seeds")
    print(
        "| env | budget | C17's claim | first 3 seeds | first 6 | first 8 | all (seeds) | standard error, all | met at 3 / 6 / all |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for env in envs:
        runs = finals(sweep_dir, env)
        first_returns = [progress(log)[1][0] for log in Path(sweep_dir).glob(f"{env}__*__*/run.log")]
        start = float(np.mean(first_returns))
        true_finals = np.array(list(runs["true"].values()))
        for mode in sorted(set(runs) - {"true"}, key=mode_order):
            budget = mode_order(mode)
            claim = C17_CLAIM[budget]
            labelled = np.array([runs[mode][seed] for seed in sorted(runs[mode])])
            ratios = {k: ratio_to_true(labelled[:k].mean(), true_finals.mean(), start) for k in (3, 6, 8, len(labelled))}
            error = ratio_standard_error(ratios[len(labelled)], labelled, true_finals, start)
            shown = [f"{ratios[k]:.2f}" if k < len(labelled) else "" for k in (3, 6, 8)]
            met = " / ".join("yes" if ratios[k] >= claim else "no" for k in (3, 6, len(labelled)))
            print(
                f"| {env} | {budget} | {claim} | {' | '.join(shown)} | {ratios[len(labelled)]:.2f} ({len(labelled)}) | "
                f"{error:.2f} | {met} |"
            )


if __name__ == "__main__":
    main()
