"""Does a saved Atari reward model see the points? Plays fresh games with the checkpoint's agent (sampling its actions,
score area masked as in training), scores every step with the checkpoint's reward ensemble, and prints the learned
reward around the steps where the game score changed: a reward model that learned the game rates the steps before
a point won above the rest and the steps before a point lost below them. With --random it also plays as many steps
with uniformly random actions and compares: has the agent learned to collect more learned reward than random play,
and did that carry over to the game score? With --pong-tracker (Pong only) it adds a scripted player that moves its
paddle towards the ball (read from the console's RAM): play clearly better than random, which a learned reward that
captured the game rates above random play.

Usage (from the repository root):
  python benchmark/notes/reward_events.py runs/NAME [--steps 20000] [--before 10] [--after 2] [--seed 100] [--random] [--pong-tracker]
The learned reward is shown as z-scores (its mean and std over all the steps played), so runs with different
normalisations compare. Offsets are in agent steps relative to the step whose action was rewarded.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
import rlhf_a2c_atari as atari  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--before", type=int, default=10, help="steps before a point in its window")
    parser.add_argument("--after", type=int, default=2, help="steps after a point in its window")
    parser.add_argument("--seed", type=int, default=100, help="game seed (not the run's: these are fresh games)")
    parser.add_argument("--random", action="store_true", help="also play uniformly random actions and compare")
    parser.add_argument("--pong-tracker", action="store_true", help="with --random: also a scripted ball tracker (Pong)")
    args = parser.parse_args()
    if args.pong_tracker and not args.random:
        parser.error("--pong-tracker is compared with random play: add --random")
    torch.set_num_threads(1)

    checkpoint = torch.load(os.path.join(args.run_dir, "checkpoint.pt"), map_location="cpu", weights_only=False)
    run = checkpoint["args"]
    if checkpoint["reward_ensemble"] is None:
        raise SystemExit(f"error: {args.run_dir} is a true-reward run: it has no reward model")
    env = atari.make_env(run["env"], 0, False, None, run["noop_max"], run["mask_score"])()
    if args.pong_tracker and atari.atari_game(run["env"]) != "pong":
        raise SystemExit(f"error: --pong-tracker plays Pong; {args.run_dir} is a {run['env']} run")
    agent = atari.Agent(env.action_space.n)
    agent.load_state_dict(checkpoint["agent"])
    ensemble = atari.RewardEnsemble(run["ensemble_size"], run["reward_dropout"])
    ensemble.load_state_dict(checkpoint["reward_ensemble"])
    ensemble.eval()
    torch.manual_seed(args.seed)

    def play(choose):
        """`args.steps` steps of fresh games: the learned reward of each step (normalised as A2C saw it in eval mode),
        the game score, the actions and how many games ended."""
        stacks, scores, actions, games = [], [], [], 0
        obs, _ = env.reset(seed=args.seed)
        for _ in range(args.steps):
            action = choose(obs)
            stacks.append(obs)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            scores.append(reward)
            if terminated or truncated:
                games += 1
                obs, _ = env.reset()
        with torch.no_grad():
            learned = torch.cat(
                [
                    ensemble.normalized_reward(torch.as_tensor(np.stack(stacks[i : i + 500])))
                    for i in range(0, len(stacks), 500)
                ]
            ).numpy()
        return learned, np.array(scores), np.array(actions), games

    def agent_action(obs):
        with torch.no_grad():
            return agent.get_action_and_value(torch.as_tensor(obs[None]))[0].item()

    def pong_tracker(obs):
        """Up or down towards the ball; no move within 4 rows of it (RAM 51: the agent's paddle, 54: the ball's row)."""
        ram = env.unwrapped.ale.getRAM()
        gap = int(ram[54]) - int(ram[51])
        return 3 if gap > 4 else 2 if gap < -4 else 0  # Pong's LEFT moves the paddle down, RIGHT up

    learned, scores, actions, games = play(agent_action)
    z = (learned - learned.mean()) / (learned.std() + 1e-8)

    print(f"{args.run_dir} at step {checkpoint['global_step']}: {len(scores)} steps, {games} whole games played")
    offsets = np.arange(-args.before, args.after + 1)
    rows = {}
    for name, sign in (("point won", 1), ("point lost", -1)):
        events = [t for t in np.flatnonzero(np.sign(scores) == sign) if args.before <= t < len(z) - args.after]
        if not events:
            print(f"{name}: none in these steps")
            continue
        profile = np.stack([z[t + offsets] for t in events])  # (events, offsets)
        rows[name] = profile.mean(1)
        print(
            f"{name}: {len(events)} events, learned reward (z) over offsets {offsets[0]}..{offsets[-1]}: "
            f"mean {profile.mean():+.2f}"
        )
        print("  by offset: " + " ".join(f"{o:+d}:{v:+.2f}" for o, v in zip(offsets, profile.mean(0))))
    if len(rows) == 2:
        won, lost = rows["point won"], rows["point lost"]
        # how often a window before a point won outscores one before a point lost (0.5: the model cannot tell)
        auc = (won[:, None] > lost[None, :]).mean() + 0.5 * (won[:, None] == lost[None, :]).mean()
        print(f"windows before a point won outscore those before a point lost in {auc:.2f} of the pairs")

    if args.random:
        rng = np.random.default_rng(args.seed)
        random_learned, random_scores, _, _ = play(lambda obs: int(rng.integers(env.action_space.n)))
        # both policies' learned reward in standard deviations of random play's (the reward model's scale is arbitrary)
        center, scale = random_learned.mean(), random_learned.std() + 1e-8
        rows = [("agent", learned, scores), ("random", random_learned, random_scores)]
        if args.pong_tracker:
            rows.append(("tracker", *play(pong_tracker)[:2]))
        print(f"agent against uniformly random actions, {args.steps} steps each (learned reward in random play's z):")
        for name, rewards, points in rows:
            print(
                f"  {name}: learned reward per step {(rewards.mean() - center) / scale:+.3f}, points won / lost per 1000 "
                f"steps {(points > 0).sum() * 1000 / len(points):.1f} / {(points < 0).sum() * 1000 / len(points):.1f}"
            )
        share = np.bincount(actions, minlength=env.action_space.n) / len(actions)
        meanings = env.unwrapped.get_action_meanings()
        print("  the agent's actions: " + ", ".join(f"{m} {p:.2f}" for m, p in zip(meanings, share)))
    env.close()


if __name__ == "__main__":
    main()
