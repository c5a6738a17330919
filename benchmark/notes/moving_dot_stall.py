"""Why a moving-dot RLHF run stalls: is the learned reward wrong, or the policy stuck? Reads a run's checkpoint
(`rlhf_moving_dot.py ... --save-model`) and compares, over every position of the field and every action, the learned
(normalised) reward with the true one, and the agent's action probabilities with the best moves.

    python rlhf_moving_dot.py --seed 39 --save-model --exp-name stall
    python benchmark/notes/moving_dot_stall.py runs/MovingDot-v0-position__stall__39__*/
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_moving_dot as dot  # noqa: E402

BANDS = [(0, 3), (3, 10), (10, 30), (30, 60), (60, 300)]  # distance to the centre, pixels


def main(run_dir):
    checkpoint = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=False)
    ensemble = dot.RewardEnsemble((2,), len(dot.MOVES), checkpoint["args"]["ensemble_size"])
    ensemble.load_state_dict(checkpoint["reward_ensemble"])
    agent = dot.Agent((2,), len(dot.MOVES))
    agent.load_state_dict(checkpoint["agent"])

    rows, cols = np.meshgrid(np.arange(dot.LOW[0], dot.HIGH[0] + 1), np.arange(dot.LOW[1], dot.HIGH[1] + 1), indexing="ij")
    positions = np.stack([rows, cols], -1).reshape(-1, 2)
    obs = torch.as_tensor(dot.observe(positions, "position"))
    distance = np.linalg.norm(positions - dot.CENTRE, axis=1)
    true, learned = np.zeros((len(positions), len(dot.MOVES))), np.zeros((len(positions), len(dot.MOVES)))
    for action, move in enumerate(dot.MOVES):
        after = np.clip(positions + move, dot.LOW, dot.HIGH)
        true[:, action] = np.sign(distance - np.linalg.norm(after - dot.CENTRE, axis=1))
        learned[:, action] = ensemble.normalized_reward(obs, torch.full((len(positions),), action)).numpy()
    with torch.no_grad():
        probs = torch.softmax(agent.actor(agent.network(obs)), -1).numpy()

    best_learned = learned.argmax(1)
    print(f"{run_dir}: step {checkpoint['global_step']}")
    print("learned reward, mean per true reward -1 / 0 / +1:", [round(float(learned[true == v].mean()), 2) for v in (-1, 0, 1)])
    print(
        "positions where the learned reward's best action is not a move closer:",
        f"{(true[np.arange(len(true)), best_learned] < 1).mean():.3f}",
    )
    print("agent, by distance to the centre: expected true reward per step, P(stay), P(a move closer)")
    for low, high in BANDS:
        band = (distance >= low) & (distance < high)
        expected = (probs[band] * true[band]).sum(1).mean()
        closer = (probs[band] * (true[band] == 1)).sum(1).mean()
        print(
            f"  {low:3d}-{high:3d} px ({band.sum():5d} positions): {expected:+.2f}, {probs[band, 0].mean():.2f}, {closer:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
