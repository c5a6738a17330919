"""Does --reward-potential take a Hopper fall's cost out of the step reward PPO is paid? (issue 22)

A clip that ends in a fall earns the absorbing state's reward for its remaining steps; PPO, paid the step reward
anchored so that the absorbing state earns 0 (--anchor-absorbing), is kept on its feet only by the step reward of the
live steps being above it. With the potential, a clip's predicted return also gains f(last real step) - f(first):
the model can explain a fall by a low potential of the last live step instead, which PPO is never paid.

For a run's labels (its labels.npz), this fits two ensembles offline the same way (the script's own training, input
standardisation and normalisation; --steps Adam steps in rounds of 16 with a validation pass every 10th), one with
and one without the potential, and also reads the run's own final ensemble from its checkpoint. For each it prints,
over the labels' live steps: the survival margin (mean of the normalised, anchored step reward; the true reward's
own: its mean over its std, the absorbing state earning 0), the correlation of the anchored step reward with the
true reward over all steps (absorbing ones at 0 in both), and the cost of a fall: the mean predicted return of the
clips that stay up less that of the clips that fall, over the returns' std (the true returns' beside it), and the
part of it that is the potential's change.

    python benchmark/notes/potential_survival.py benchmark/sweeps/potential_tasks/Hopper-v4__labels1400__{1,2,3}
"""

import argparse
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_ppo_mujoco as script  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hopper_stall import checkpoint_ensemble  # noqa: E402

TRAINING = SimpleNamespace(reward_eval_every=10, reward_batch_size=64, label_noise=0.1, reward_std=1.0)


def load_labels(run_dir):
    """The run's labels.npz (its newest runs/ folder) as a LabelBuffer."""
    labels_file = sorted(Path(run_dir).glob("runs/*/labels.npz"))[-1]
    with np.load(labels_file) as saved:
        _, _, segment_len, obs_dim = saved["obs"].shape
        act_dim, members = saved["act"].shape[-1], saved["weight"].shape[-1]
    buffer = script.LabelBuffer(1, segment_len, obs_dim, act_dim, members, np.random.default_rng(0))
    buffer.load(str(labels_file))
    return buffer, labels_file.parent


def fit_offline(buffer, potential, steps, seed):
    """An ensemble fitted to all the labels as the script fits it: inputs standardised, Adam rounds of 16 steps."""
    torch.manual_seed(seed)
    _, _, labels = buffer.get()
    obs_dim, act_dim = labels["obs"].shape[-1], labels["act"].shape[-1]
    training = script.RewardModelTraining(script.RewardEnsemble(obs_dim, act_dim, potential=potential), 3e-4, seed)
    training.training_ensemble.fit_input_normalization(labels["obs"][labels["mask"] > 0])
    training.train(buffer, math.ceil(steps / 16), 16, TRAINING, np.random.default_rng(seed), validate_at_end=True)
    training.close()
    return training.ensemble, training.val_accuracy


def run_ensemble(checkpoint_dir, buffer):
    """The run's final ensemble, from its checkpoint."""
    state = torch.load(checkpoint_dir / "checkpoint.pt", weights_only=False)["reward_ensemble"]
    _, _, labels = buffer.get()
    return checkpoint_ensemble(state, labels["obs"].shape[-1], labels["act"].shape[-1])


@torch.no_grad()
def survival_figures(ensemble, buffer):
    _, _, labels = buffer.get()
    obs, act, mask = labels["obs"], labels["act"], labels["mask"]
    live = mask > 0
    anchored = ensemble.normalized_reward(obs, act) - ensemble.normalized_absorbing_reward()
    anchored = torch.where(live, anchored, torch.zeros(()))
    true = torch.where(live, labels["true_reward"], torch.zeros(()))
    margin = anchored[live].mean().item()  # the normalised reward has std 1 over the live steps
    correlation = np.corrcoef(anchored.numpy().ravel(), true.numpy().ravel())[0, 1]
    # the clips that fall against those that stay up: the predicted returns' difference of means, the potential's part
    falls = (mask.min(-1).values == 0).reshape(-1).numpy()
    returns = ensemble.segment_returns(labels).mean(0).reshape(-1).numpy()  # the members' raw scales averaged
    fall_cost = returns[~falls].mean() - returns[falls].mean()
    potential_part = 0.0
    if ensemble.has_potential:
        change = ensemble.potential_change(obs, mask).mean(0).reshape(-1).numpy()
        potential_part = change[~falls].mean() - change[falls].mean()
    true_returns = true.sum(-1).reshape(-1).numpy()
    true_cost = true_returns[~falls].mean() - true_returns[falls].mean()
    return (
        margin,
        correlation,
        int(falls.sum()),
        fall_cost / returns.std(),
        potential_part / fall_cost,
        true_cost / true_returns.std(),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", help="sweep run folders (each with runs/*/labels.npz and checkpoint.pt)")
    parser.add_argument("--steps", type=int, default=2000, help="Adam steps of each offline fit")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    torch.set_num_threads(1)
    for run in options.runs:
        buffer, checkpoint_dir = load_labels(run)
        _, _, labels = buffer.get()
        live = labels["mask"] > 0
        true = labels["true_reward"][live]
        print(f"{run}: {buffer.size} labels; true reward: survival margin {(true.mean() / true.std()).item():.2f}")
        fits = {"the run's final ensemble": (run_ensemble(checkpoint_dir, buffer), math.nan)}
        for potential in (False, True):
            fits[f"offline fit, potential {potential}"] = fit_offline(buffer, potential, options.steps, options.seed)
        for name, (ensemble, accuracy) in fits.items():
            margin, correlation, clips, cost, share, true_cost = survival_figures(ensemble, buffer)
            print(
                f"  {name:32s} survival margin {margin:5.2f}  corr with true (absorbing 0) {correlation:.3f}  "
                f"{clips} clips fall: cost {cost:5.2f} (true {true_cost:5.2f}), potential's part {share:5.2f}  "
                f"val acc {accuracy:.3f}"
            )


if __name__ == "__main__":
    main()
