"""PyTorch's RMSprop against the TensorFlow RMSProp of the A2C C17 ran (OpenAI baselines), with the same settings
(alpha 0.99, eps 1e-5, lr 7e-4): the same A2C gradients fed to both update rules, the update's norm along the way.

    python benchmark/notes/rmsprop_tf_vs_torch.py [--gradients 20 --steps 3000]

The gradients: a fresh rlhf_a2c_atari.py agent on 80 Pong frame stacks of random play, A2C's loss on returns at the
learned reward's scale (std 0.05), clipped to norm 0.5 as the script does; --gradients of them (a new batch of actions
and returns each), fed in turn for --steps steps (the agent is not updated: the rules alone are compared).
PyTorch: v = alpha v + (1 - alpha) g^2 from v = 0, step lr g / (sqrt(v) + eps). TensorFlow: from v = 1, step
lr g / sqrt(v + eps).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rlhf_a2c_atari as atari  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gradients", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3000)
    options = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = atari.make_env("PongNoFrameskip-v4", 0, False, None, noop_max=2)()
    observation, _ = env.reset(seed=0)
    stacks = []
    for _ in range(80):
        stacks.append(observation)
        observation, *_ = env.step(int(rng.integers(6)))
    frames = torch.as_tensor(np.stack(stacks))
    agent = atari.Agent(6)
    gradients = []
    for _ in range(options.gradients):
        agent.zero_grad()
        actions = torch.as_tensor(rng.integers(6, size=len(frames)))
        _, logprob, entropy, value = agent.get_action_and_value(frames, actions)
        returns = torch.as_tensor(rng.normal(0, 0.05, len(frames)), dtype=torch.float32)
        advantages = returns - value.flatten().detach()
        loss = -(advantages * logprob).mean() - 0.01 * entropy.mean() + 0.5 * ((returns - value.flatten()) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        gradients.append(torch.cat([p.grad.flatten() for p in agent.parameters()]))
    lr, alpha, eps = 7e-4, 0.99, 1e-5
    torch_v, tf_v = torch.zeros_like(gradients[0]), torch.ones_like(gradients[0])
    print("step | update norm, PyTorch | update norm, TensorFlow | ratio")
    for step in range(1, options.steps + 1):
        g = gradients[(step - 1) % len(gradients)]
        torch_v = alpha * torch_v + (1 - alpha) * g**2
        tf_v = alpha * tf_v + (1 - alpha) * g**2
        if step in (1, 10, 100, 300, 1000, 3000, options.steps):
            torch_step = (lr * g / (torch_v.sqrt() + eps)).norm().item()
            tf_step = (lr * g / (tf_v + eps).sqrt()).norm().item()
            print(f"{step} | {torch_step:.3g} | {tf_step:.3g} | {torch_step / tf_step:.3g}")


if __name__ == "__main__":
    main()
