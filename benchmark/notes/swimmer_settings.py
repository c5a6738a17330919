"""Every Swimmer-v4 setting tried for issue 22, in one markdown table: per grid, what it changes from the C17 grid's
flags (its own Swimmer-v4 flags past them, and the patch a diagnostic ran with), the true reward's and one label
budget's final returns over the finished seeds (mean ± sample std, runs over --fast), and the budget's ratio to the
true reward of the same settings ± its standard error (sweep.py's). A grid whose runs of the true reward would be
the same code as another's takes that one's (the oracle patch, the label schedule's horizon, the pair pool and the
pretraining share change only labelled runs: swimmer_c17_rl's).

Usage (from the repository root):
  python benchmark/notes/swimmer_settings.py --mode labels1400 --fast 100
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from final_returns import finals  # noqa: E402 (mode -> {seed: final true return} of a sweep's finished runs)
from sweep import ratio_standard_error, ratio_to_true  # noqa: E402

ENV = "Swimmer-v4"
# (grid, the patch in benchmark/notes/ its runs were made with, the sweep whose true-reward runs it is measured against)
SETTINGS = [
    ("c17_clipfix", None, None),
    ("swimmer_ent", None, None),
    ("swimmer_gamma_ent", None, None),
    ("swimmer_lambda_ent", None, None),
    ("swimmer_c17_rl", None, None),
    ("swimmer_c17_ent", None, None),
    ("swimmer_c17_ent_decay", None, None),
    ("swimmer_c17_horizon", None, "swimmer_c17_rl"),  # the label schedule only: its true-reward runs would be these
    ("swimmer_pair_pool", None, "swimmer_c17_rl"),  # where pairs are drawn only: the same
    ("swimmer_pretrain", None, "swimmer_c17_rl"),  # the labels before RL only: the same
    ("swimmer_early_labels", None, "swimmer_c17_rl"),  # the label schedule only: the same
    ("swimmer_random_selection", None, None),
    ("swimmer_reward_dropout", None, None),
    ("swimmer_bound_penalty", "action_bound_penalty.patch", None),
    ("swimmer_obs_reward", "reward_without_action.patch", None),
    ("swimmer_no_angle_reward", "reward_without_angles.patch", None),
    ("swimmer_learned_potential", "learned_potential.patch", None),
    ("swimmer_oracle", "oracle_reward_clipfix.patch", "swimmer_c17_rl"),
]


def grid_flags(grid):
    return shlex.split(json.loads((HERE.parent / "grids" / f"{grid}.json").read_text())["envs"][ENV]["flags"])


def summary(returns, fast):
    values = np.array(list(returns.values()))
    if not len(values):
        return "not run", values
    spread = f" ± {values.std(ddof=1):.0f}" if len(values) > 1 else ""
    return f"{values.mean():.0f}{spread} ({(values > fast).sum()} of {len(values)})", values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="labels1400", help='"labelsN", as in the run folders\' names')
    parser.add_argument("--fast", type=float, default=100, help="count the runs whose final return is over this")
    args = parser.parse_args()
    grid_base = grid_flags("c17_clipfix")
    print(
        f"| changes from the C17 grid's flags | grid | true reward: mean ± std (runs over {args.fast:g}) "
        f"| {args.mode[len('labels') :]} labels: mean ± std (over {args.fast:g}) | ratio ± standard error |"
    )
    print("|---|---|---|---|---|")
    for grid, patch, true_sweep in SETTINGS:
        flags = grid_flags(grid)
        assert flags[: len(grid_base)] == grid_base, f"{grid}'s {ENV} flags do not start with the C17 grid's"
        changes = [" ".join(flags[len(grid_base) :]) or "none (the defaults)"] + [f"patch `{patch}`"] * bool(patch)
        sweep = HERE.parent / "sweeps" / grid
        true_text, true_values = summary(finals(HERE.parent / "sweeps" / (true_sweep or grid), ENV).get("true", {}), args.fast)
        labels_text, label_values = summary(finals(sweep, ENV).get(args.mode, {}), args.fast)
        ratio_text = ""
        if len(true_values) and len(label_values):
            ratio = ratio_to_true(label_values.mean(), true_values.mean(), 0.0)
            error = ratio_standard_error(ratio, label_values, true_values, 0.0)
            ratio_text = f"{ratio:.2f}" + (f" ± {error:.2f}" if error is not None else "")
        if true_sweep:
            true_text += f", {true_sweep}'s"
        print(f"| {', '.join(changes)} | `{grid}` | {true_text} | {labels_text} | {ratio_text} |")


if __name__ == "__main__":
    main()
