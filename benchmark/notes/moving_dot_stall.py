"""Why a moving-dot RLHF run stalls: is the learned reward wrong, or the policy stuck? Reads a run's checkpoint
(`rlhf_moving_dot.py ... --save-model`) and compares, over every position of the field and every action, the learned
(normalised) reward with the true one, and the agent's action probabilities with the best moves. Then it asks whether
the learned reward can be exploited: value iteration on the field (the dot's moves are deterministic) gives the policy
that is optimal under the learned reward (discount 0.99, as PPO's), and each policy is scored by its true return over
2000-step episodes from random starts (the environment's reset).

    python rlhf_moving_dot.py --seed 39 --save-model --exp-name stall
    python benchmark/notes/moving_dot_stall.py runs/MovingDot-v0-position__stall__39__*/
"""

import collections
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_moving_dot as dot  # noqa: E402

BANDS = [(0, 3), (3, 10), (10, 30), (30, 60), (60, 300)]  # distance to the centre, pixels


def optimal_policy(reward, next_state, gamma=0.99, sweeps=2000):
    """Value iteration on a deterministic grid: reward (states, actions), next_state (states, actions) -> best actions."""
    value = np.zeros(len(reward))
    for _ in range(sweeps):
        q = reward + gamma * value[next_state]
        value = q.max(1)
    return q.argmax(1)


def episode_returns(action_probs, true, learned, next_state, steps=2000, episodes=400, seed=0):
    """Mean true and learned return of a policy (probabilities (states, actions)) from uniformly random starts, and
    the states the episodes end in."""
    rng = np.random.default_rng(seed)
    state = rng.integers(0, len(true), episodes)
    true_return, learned_return = np.zeros(episodes), np.zeros(episodes)
    for _ in range(steps):
        action = (rng.random(episodes)[:, None] > action_probs[state].cumsum(1)).sum(1).clip(max=true.shape[1] - 1)
        true_return += true[state, action]
        learned_return += learned[state, action]
        state = next_state[state, action]
    return true_return.mean(), learned_return.mean(), state


def cells(positions, size=10, top=4):
    """The `top` most common `size`-pixel cells (row, column of their corner) of some positions, with their counts."""
    return collections.Counter((int(row), int(col)) for row, col in positions // size * size).most_common(top)


def main(run_dir):
    checkpoint = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=False)
    rows, cols = np.meshgrid(np.arange(dot.LOW[0], dot.HIGH[0] + 1), np.arange(dot.LOW[1], dot.HIGH[1] + 1), indexing="ij")
    positions = np.stack([rows, cols], -1).reshape(-1, 2)
    observation = checkpoint["args"].get("observation", "position")
    obs = torch.as_tensor(dot.observe(positions, observation))
    progress = checkpoint["args"].get("reward_form", "action") == "progress"
    ensemble = dot.RewardEnsemble(tuple(obs.shape[1:]), len(dot.MOVES), checkpoint["args"]["ensemble_size"], progress)
    ensemble.load_state_dict(checkpoint["reward_ensemble"])
    agent = dot.Agent(tuple(obs.shape[1:]), len(dot.MOVES))
    agent.load_state_dict(checkpoint["agent"])
    distance = np.linalg.norm(positions - dot.CENTRE, axis=1)
    true, learned = np.zeros((len(positions), len(dot.MOVES))), np.zeros((len(positions), len(dot.MOVES)))
    next_state = np.zeros((len(positions), len(dot.MOVES)), np.int64)
    width = dot.HIGH[1] - dot.LOW[1] + 1
    for action, move in enumerate(dot.MOVES):
        after = np.clip(positions + move, dot.LOW, dot.HIGH)
        next_state[:, action] = (after[:, 0] - dot.LOW[0]) * width + after[:, 1] - dot.LOW[1]
        true[:, action] = np.sign(distance - np.linalg.norm(after - dot.CENTRE, axis=1))
        inputs = dot.reward_inputs(positions, np.full(len(positions), action), observation)
        learned[:, action] = ensemble.normalized_reward(*inputs).numpy()
    with torch.no_grad():
        probs = torch.softmax(agent.actor(agent.network(dot.as_input(obs))), -1).numpy()

    best_learned = learned.argmax(1)
    print(f"{run_dir}: step {checkpoint['global_step']}")
    print(
        "learned reward, mean per true reward -1 / 0 / +1:", [round(float(learned[true == v].mean()), 2) for v in (-1, 0, 1)]
    )
    print(
        "positions where the learned reward's best action is not a move closer:",
        f"{(true[np.arange(len(true)), best_learned] < 1).mean():.3f}",
    )
    print(
        "by distance to the centre: the agent's expected true reward per step, P(stay), P(a move closer); the learned"
        " reward of a move closer and of a move away, each less staying's"
    )
    gain = learned - learned[:, :1]  # what each action earns over staying at the same position
    for low, high in BANDS:
        band = (distance >= low) & (distance < high)
        expected = (probs[band] * true[band]).sum(1).mean()
        closer = (probs[band] * (true[band] == 1)).sum(1).mean()
        print(
            f"  {low:3d}-{high:3d} px ({band.sum():5d} positions): {expected:+.2f}, {probs[band, 0].mean():.2f}, {closer:.2f};"
            f" {gain[band][true[band] == 1].mean():+.2f}, {gain[band][true[band] == -1].mean():+.2f}"
        )

    one_hot = np.eye(len(dot.MOVES))
    policies = {
        "optimal under the learned reward": one_hot[optimal_policy(learned, next_state)],
        "greedy on the true reward": one_hot[true.argmax(1)],
        "the agent (sampling)": probs,
    }
    print("policy: true return, learned return (2000-step episodes, random starts)")
    ends = {}
    for name, policy in policies.items():
        true_return, learned_return, ends[name] = episode_returns(policy, true, learned, next_state)
        print(f"  {name}: {true_return:.1f}, {learned_return:.1f}")
    end = ends["the agent (sampling)"]
    far_ends = distance[end] > 10
    print(
        f"the agent's episodes: {far_ends.mean():.2f} end more than 10 px from the centre; where most of those end"
        f" (row, column: episodes): {cells(positions[end[far_ends]])}"
    )
    parked = (best_learned == 0) & (distance > 3)  # staying beats every move: a local maximum of the learned reward
    print(
        f"positions more than 3 px from the centre where staying beats every move under the learned reward:"
        f" {parked.sum()}, in 10-px cells {cells(positions[parked])}"
    )
    # every episode has 2000 steps, so a reward offset changes no choice: compare choices of equal length
    stay = learned[:, 0]
    print(f"learned reward of staying: varies by {stay.max() - stay.min():.2f} over the field (true: 0 everywhere)")
    back = {1: 2, 2: 1, 3: 4, 4: 3}  # the move that undoes each move
    there_and_back = np.stack([learned[:, a] + learned[next_state[:, a], b] for a, b in back.items()], 1)
    blocked = next_state[:, list(back)] == np.arange(len(positions))[:, None]  # a move into the border is no move
    there_and_back[blocked] = -np.inf
    best_cycle = there_and_back.max(1)  # a margin of 1e-4: the progress form's loops tie with staying up to float error
    print(
        f"positions where a move there and back earns more than staying twice (true: never): {(best_cycle > 2 * stay + 1e-4).mean():.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
