"""Which way does a reward push a saved rlhf_ppo_mujoco.py policy's mean action and its spread: outwards, towards the
action bounds, or inwards; wider or narrower? The learned reward of the checkpoint's ensemble against the true reward,
on the same episodes of the policy acting as in training (sampled actions).

The policy gradient of a Gaussian policy is E[advantage x score]. For the mean of action entry j the score is
(a_j - mu_j) / sigma_j^2; taken along sign(mu_j) (outwards, away from 0 towards the nearer bound) and in units of
sigma_j it is u_j = sign(mu_j) (a_j - mu_j) / sigma_j. For log sigma_j it is v_j = ((a_j - mu_j) / sigma_j)^2 - 1.
With a reward's return over the next H steps R_H(t), minus its mean over the episodes at the same step t (a baseline;
it includes the episode's own return, which scales every estimate by (episodes - 1) / episodes and leaves its
direction as it is), and divided by its std (PPO normalises its advantages, so only the direction and the share of
the signal count), the tool prints
mean(R_H x u_j) and mean(R_H x v_j) per joint, over steps 0-99 (the start-up lunge on Swimmer) and 100-999, with the
standard error over episodes. Positive push on the mean: outwards; negative push on log sigma: the spread narrows.
H = 1 is the reward's own pull on the action at that step; larger H add what the action does to later steps.
On Swimmer two more directions for the mean: with the joint's motion (the sign of its angular velocity: pumping the
stroke) and with its bend (the sign of its angle: holding the joint bent further).

Usage (from the repository root): python benchmark/notes/policy_push.py CHECKPOINT_OR_RUN ... [--episodes 16]
(each argument as for notes/action_saturation.py: a sweep run folder, a runs/NAME folder or a checkpoint file).
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import action_saturation  # noqa: E402
import hopper_stall  # noqa: E402
import rlhf_ppo_mujoco as ppo  # noqa: E402


def play_scored(env, agent, obs_rms, episodes, seed):
    """Episodes of fixed length (Swimmer's 1000 steps) with the sampled actions: arrays (episodes, steps, ...) of the
    observations, the sampled actions, the policy's means, the executed (clipped) actions and the true rewards."""
    low, high = env.unwrapped.action_space.low, env.unwrapped.action_space.high
    played = {"obs": [], "sampled": [], "mean": [], "executed": [], "true": []}
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        steps = {name: [] for name in played}
        done = False
        while not done:
            x = torch.as_tensor(ppo.normalize_obs(obs_rms, obs[None]), dtype=torch.float32)
            with torch.no_grad():
                mean = agent.actor_mean(x).numpy()[0]
            sampled = mean + np.exp(agent.actor_logstd.detach().numpy()[0]) * np.random.standard_normal(mean.shape)
            executed = np.clip(sampled, low, high)
            steps["obs"].append(obs)
            obs, reward, terminated, truncated, _ = env.step(executed)
            for name, value in (("sampled", sampled), ("mean", mean), ("executed", executed), ("true", reward)):
                steps[name].append(value)
            done = terminated or truncated
        for name in played:
            played[name].append(np.array(steps[name], dtype=np.float32))
    lengths = {len(r) for r in played["true"]}
    if len(lengths) != 1:
        raise SystemExit(f"error: episodes of different lengths {sorted(lengths)}: the per-step baseline needs one length")
    return {name: np.stack(values) for name, values in played.items()}


def returns_ahead(rewards, horizon, gamma):
    """R(t) = sum over k < horizon of gamma^k r(t + k), within each episode: (episodes, steps)."""
    ahead = np.zeros_like(rewards)
    for k in range(min(horizon, rewards.shape[1])):
        ahead[:, : rewards.shape[1] - k] += gamma**k * rewards[:, k:]
    return ahead


def pushes(advantage, scores, phase):
    """mean(advantage x score) over the phase's steps, per episode, then its mean and standard error over episodes:
    (mean, se), each per action entry."""
    per_episode = (advantage[:, phase, None] * scores[:, phase]).mean(1)
    return per_episode.mean(0), per_episode.std(0, ddof=1) / np.sqrt(len(per_episode))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--lunge", type=int, default=100, help="steps of the first phase")
    parser.add_argument(
        "--spread-weights",
        type=float,
        nargs="*",
        default=[],
        help="also the push of the learned reward plus each weight times the members' spread (0: the spread alone)",
    )
    cli = parser.parse_args()
    scratch = tempfile.mkdtemp()
    horizons = ((1, 1.0), (2, 1.0), (5, 1.0), (10, 1.0), (100, 1.0), (1000, 0.995))
    for path in cli.runs:
        checkpoint, env, agent, obs_rms, ensemble = hopper_stall.load_run(action_saturation.run_folder(path, scratch))
        np.random.seed(cli.seed)
        played = play_scored(env, agent, obs_rms, cli.episodes, cli.seed)
        std = np.exp(agent.actor_logstd.detach().numpy()[0])
        standardised = (played["sampled"] - played["mean"]) / std
        scores = {"mean outwards": np.sign(played["mean"]) * standardised}
        # Swimmer's observation: the body's and 2 joints' angles, then the x, y, body and 2 joints' velocities
        if checkpoint["args"]["env"].startswith("Swimmer"):
            scores["mean with the joint's motion"] = np.sign(played["obs"][..., 6:8]) * standardised
            scores["mean with the joint's bend"] = np.sign(played["obs"][..., 1:3]) * standardised
        scores["log std"] = standardised**2 - 1
        rewards = {"true": played["true"]}
        if ensemble is not None:
            obs, executed = torch.as_tensor(played["obs"]), torch.as_tensor(played["executed"])
            rewards["learned"] = ensemble.normalized_reward(obs, executed).numpy()
            if cli.spread_weights:  # the members' spread, in the normalised reward's units, added with each weight
                with torch.no_grad():
                    raw = ensemble(obs, executed)
                shape = (ensemble.size,) + (1,) * (raw.dim() - 1)
                members = (raw - ensemble.member_mean.view(shape)) / ensemble.member_std.view(shape)
                spread = (members.std(0) / ensemble.ensemble_std).numpy()
                spread_line = f"members' spread: mean {spread.mean():.3f}, std over steps {spread.std():.3f}"
                for weight in cli.spread_weights:
                    rewards[f"learned {weight:+g} x spread" if weight != 0 else "spread"] = (
                        rewards["learned"] + weight * spread if weight != 0 else spread
                    )
        steps = played["true"].shape[1]
        phases = {f"0-{cli.lunge - 1}": slice(0, cli.lunge), f"{cli.lunge}-{steps - 1}": slice(cli.lunge, steps)}
        print(
            f"{os.path.basename(os.path.normpath(path))} step {checkpoint['global_step']}: {cli.episodes} episodes, true "
            f"return {played['true'].sum(1).mean():.1f}, std {np.round(std, 2)}, mean's size over steps "
            f"{cli.lunge}+ {np.round(np.abs(played['mean'][:, cli.lunge :]).mean((0, 1)), 2)}"
        )
        if cli.spread_weights and ensemble is not None:
            print(spread_line)
        print("| reward | H (gamma) | steps | " + " | ".join(f"push on the {name}" for name in scores) + " |")
        print("|---|---|---|" + "---|" * len(scores))
        for name, reward in rewards.items():
            for horizon, gamma in horizons:
                ahead = returns_ahead(reward, horizon, gamma)
                advantage = ahead - ahead.mean(0, keepdims=True)
                advantage /= advantage.std() + 1e-8
                for phase_name, phase in phases.items():
                    cells = []
                    for score in scores.values():
                        push, se = pushes(advantage, score, phase)
                        cells.append(", ".join(f"{p:+.3f} ± {s:.3f}" for p, s in zip(push, se)))
                    print(f"| {name} | {horizon} ({gamma}) | {phase_name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
