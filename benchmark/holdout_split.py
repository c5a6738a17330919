"""Which validation split should each reward-ensemble member use? C17 2.2.3 trains each member on a resample of the
labels with replacement and holds out 1/e of the data for validation (the adaptive L2 keeps validation loss at
1.1-1.5x training loss). Three readings, fitted to the same labels of a real run and scored on labels none of them saw:
- main-before:   1/e held out at random, Poisson(1) bootstrap weights on the rest (a further ~37% get weight 0, so a
                 member trains on ~40% distinct labels); the L2 band compares with the unweighted loss on the non-held-out
                 labels (the code before issue 18);
- holdout:       the same split, but the L2 band compares with the bootstrap-weighted loss each member trained on;
- out-of-bag:    Poisson(1) weights on every label; a member validates on the labels its resample left out (weight 0,
                 probability 1/e) and trains on the other ~63% (rlhf_ppo_mujoco.py today).
Training follows the script: 50 pretraining epochs, then rounds of --reward-updates steps with a validation pass and
an L2 adaptation every --reward-eval-every rounds. Reported per scheme, mean over seeds: accuracy of the ensemble's
mean preference on the test labels' strict answers, the members' mean test loss, the final L2 coefficient.

Usage (from the repository root):
  python benchmark/holdout_split.py runs/NAME/labels.npz [--seeds 5] [--test-share 0.3] [--rounds 300]
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rlhf_ppo_mujoco as rl  # noqa: E402

SCHEMES = ("main-before", "holdout", "out-of-bag")


def fill(buffer, labels, idx, scheme, rng):
    """Put the labels at `idx` into the buffer, with the scheme's validation split and bootstrap weights."""
    left, right = ({k: labels[k][idx, side] for k in ("obs", "act", "mask", "true_reward")} for side in (0, 1))
    buffer.add(left, right, labels["mu"][idx])  # out-of-bag weights, drawn by the script itself
    if scheme != "out-of-bag":
        n, members = buffer.data["weight"][: buffer.size].shape
        is_val = rng.random((n, members)) < 1 / math.e
        buffer.data["is_val"][: buffer.size] = is_val
        buffer.data["weight"][: buffer.size] = np.where(is_val, 0, rng.poisson(1.0, (n, members)))


def unweighted_train_loss(ensemble, buffer, label_noise):
    """The training loss the L2 band used before issue 18: every non-held-out label counted once."""
    left, right, batch = buffer.get()
    with torch.no_grad():
        losses = rl.preference_loss(ensemble.segment_returns(left), ensemble.segment_returns(right), batch["mu"], label_noise)
    is_train = 1 - batch["is_val"].T.float()
    return (losses * is_train).sum(1) / is_train.sum(1).clamp(min=1)


def fit(labels, train_idx, scheme, seed, args):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    obs_dim, act_dim, segment_len = labels["obs"].shape[-1], labels["act"].shape[-1], labels["obs"].shape[2]
    buffer = rl.LabelBuffer(len(train_idx), segment_len, obs_dim, act_dim, 3, rng)
    fill(buffer, labels, train_idx, scheme, rng)
    ensemble = rl.RewardEnsemble(obs_dim, act_dim, 3)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=3e-4)
    l2_coef = torch.full((3,), 1e-4)
    steps_per_epoch = math.ceil(buffer.size / 64)
    schedule = [steps_per_epoch] * 50 + [16] * args.rounds  # pretraining epochs, then the RL-time rounds
    for fit_round, steps in enumerate(schedule, 1):
        rl.train_reward_model(ensemble, optimizer, buffer, l2_coef, steps, 64, 0.1, rng)
        if fit_round % 10 == 0 or fit_round == 50:
            train_loss, val_loss, _ = rl.validate_reward_model(ensemble, *rl.label_step_rewards(ensemble, buffer), 0.1)
            if scheme == "main-before":
                train_loss = unweighted_train_loss(ensemble, buffer, 0.1)
            l2_coef = rl.adapt_l2(l2_coef, train_loss, val_loss)
    return ensemble, l2_coef


@torch.no_grad()
def score(ensemble, labels, test_idx):
    segments = {k: torch.as_tensor(labels[k][test_idx]) for k in ("obs", "act", "mask")}
    returns = ensemble.segment_returns(segments)  # (members, n, 2)
    mu = torch.as_tensor(labels["mu"][test_idx])
    p_left = torch.sigmoid(returns[..., 0] - returns[..., 1])
    strict = mu != 0.5
    accuracy = ((p_left.mean(0) > 0.5).float() == mu)[strict].float().mean().item()
    loss = rl.preference_loss(returns[..., 0], returns[..., 1], mu, 0.1).mean().item()
    return accuracy, loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("labels")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    labels = dict(np.load(args.labels))
    n = len(labels["mu"])
    print(
        f"{n} labels from {args.labels}; {args.seeds} seeds; test share {args.test_share}; {args.rounds} rounds after pretraining"
    )
    print("| scheme | test accuracy (strict answers) | test loss | final L2 coefficient |")
    print("|---|---|---|---|")
    results = {scheme: [] for scheme in SCHEMES}
    for seed in range(args.seeds):
        order = np.random.default_rng(1000 + seed).permutation(n)  # the same split of labels for every scheme
        test_idx, train_idx = np.sort(order[: int(n * args.test_share)]), np.sort(order[int(n * args.test_share) :])
        for scheme in SCHEMES:
            ensemble, l2_coef = fit(labels, train_idx, scheme, seed, args)
            results[scheme].append((*score(ensemble, labels, test_idx), l2_coef.mean().item()))
    for scheme in SCHEMES:
        accuracy, loss, l2 = np.array(results[scheme]).T
        print(
            f"| {scheme} | {accuracy.mean():.3f} ± {accuracy.std():.3f} (per seed {', '.join(f'{a:.3f}' for a in accuracy)}) "
            f"| {loss.mean():.3f} ± {loss.std():.3f} | {np.exp(np.log(l2).mean()):.1e} |"
        )


if __name__ == "__main__":
    main()
