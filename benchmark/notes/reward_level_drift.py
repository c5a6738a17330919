"""How much does one reward-model update move the learned reward's level, compared with what it ranks? Loads a saved
Atari RLHF run (its reward ensemble, Adam state, L2 coefficients and saved labels), plays a fixed set of steps with
uniformly random actions, then takes reward-model updates exactly as the run does between rollouts (one Adam step on
16 labels each) and after each prints, on those fixed steps:
- each member's mean raw reward, shifted from before the first update, in that member's standard deviation;
- the ensemble's normalised reward's mean shift, in its standard deviation (the level A2C sees moves by this);
- the correlation of the normalised rewards with those before the first update (what the model ranks).
The preference loss does not depend on a reward's level, so nothing holds it in place; batch norm's running
statistics and the weights move it. (rlhf_a2c_atari.py --pin-reward-level undoes each move in training.)

Usage (from the repository root):
  python benchmark/notes/reward_level_drift.py runs/NAME [--updates 12] [--steps 200] [--seed 0]
"""

import argparse
import os
import sys

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
import rlhf_a2c_atari as atari  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200, help="random-play steps in each of 4 games (fixed set)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = os.path.join(args.run_dir, "checkpoint.pt")
    if not os.path.isfile(path):
        raise SystemExit(f"error: no checkpoint at {path}")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if checkpoint.get("reward_ensemble") is None:
        raise SystemExit(f"error: {path} has no reward model (a --feedback true-reward run)")
    run = checkpoint["args"]
    rng = np.random.default_rng(args.seed)
    ensemble = atari.RewardEnsemble(run["ensemble_size"], run["reward_dropout"]).eval()  # as in training: no dropout
    # the copy that trains, whose Adam state this is (checkpoints before it was kept apart have only the one)
    ensemble.load_state_dict(checkpoint.get("reward_fitting") or checkpoint["reward_ensemble"])
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=run["reward_lr"])
    optimizer.load_state_dict(checkpoint["reward_optimizer"])
    buffer = atari.LabelBuffer(run["label_buffer"], run["segment_len"], run["ensemble_size"], rng)
    atari.load_labels(os.path.join(args.run_dir, "labels"), buffer)
    print(f"{args.run_dir}: step {checkpoint['global_step']}, {buffer.size} labels")

    envs = gym.vector.SyncVectorEnv(
        [atari.make_env(run["env"], i, False, "", run["noop_max"], run["mask_score"]) for i in range(4)]
    )
    obs, _ = envs.reset(seed=args.seed)
    stacks = []
    for _ in range(args.steps):
        obs, *_ = envs.step(envs.action_space.sample())
        stacks.append(obs)
    envs.close()
    stacks = torch.as_tensor(np.stack(stacks)).reshape(-1, 4, 84, 84)

    with torch.no_grad():
        raw0, reward0 = ensemble(stacks), ensemble.normalized_reward(stacks)
    member_std, reward_std = raw0.std(1), reward0.std()
    print(f"fixed set: {len(stacks)} random-play steps; member raw std {[round(float(s), 4) for s in member_std]}")
    for update in range(1, args.updates + 1):
        atari.train_reward_model(
            ensemble, optimizer, buffer, checkpoint["l2_coef"], 1, run["reward_batch_size"], run["label_noise"], rng
        )
        with torch.no_grad():
            raw, reward = ensemble(stacks), ensemble.normalized_reward(stacks)
        member_shift = ((raw.mean(1) - raw0.mean(1)) / member_std).numpy()
        level_shift = ((reward.mean() - reward0.mean()) / reward_std).item()
        ranking = np.corrcoef(reward.numpy(), reward0.numpy())[0, 1]
        print(
            f"after {update:2d} updates: member shift {[round(float(s), 2) for s in member_shift]} (member std), "
            f"normalised reward shift {level_shift:+.2f} std, correlation with before {ranking:.4f}"
        )


if __name__ == "__main__":
    main()
