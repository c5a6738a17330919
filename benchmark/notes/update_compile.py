"""Issue 21: does torch.compile make PPO's update cheaper on the CPU? One process, one torch thread; the update of
rlhf_ppo_mujoco.py's Agent as the script does it (10 epochs of 32 minibatches of 64 from 2048 steps, clipped
policy and value losses, gradient clipping, fused Adam) on random data of Hopper's sizes, eager and compiled in turn,
repeated; the seconds of each update after a first, warm-up one (which holds the compilation). Where the optimizer
step is compiled, Adam is not created fused (torch.compile generates its own kernel from Adam's plain form).

    python benchmark/notes/update_compile.py --repeats 5
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rlhf_ppo_mujoco import Agent  # noqa: E402

OBS_DIM, ACT_DIM, BATCH, MINIBATCH, EPOCHS, CLIP = 11, 3, 2048, 64, 10, 0.2


def minibatch_loss(agent, obs, act, old_logprob, advantages, returns, old_values):
    """The script's PPO loss of one minibatch (normalised advantages, clipped value loss, no entropy bonus)."""
    _, logprob, entropy, value = agent.get_action_and_value(obs, act)
    ratio = (logprob - old_logprob).exp()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
    value = value.view(-1)
    clipped = old_values + torch.clamp(value - old_values, -CLIP, CLIP)
    value_loss = 0.5 * torch.max((value - returns) ** 2, (clipped - returns) ** 2).mean()
    return policy_loss + 0.5 * value_loss - 0.0 * entropy.mean(), ((ratio - 1).abs() > CLIP).float().mean()


class Update:
    def __init__(self, variant):
        torch.manual_seed(0)
        self.agent = Agent(OBS_DIM, ACT_DIM)
        self.params = list(self.agent.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=3e-4, eps=1e-5, fused=not variant.endswith("step"))
        compiled_loss, compiled_step = variant in ("compiled loss", "compiled loss and step"), variant.endswith("step")
        self.loss = torch.compile(minibatch_loss, dynamic=False) if compiled_loss else minibatch_loss
        self.step = torch.compile(self.clip_and_step) if compiled_step else self.clip_and_step
        self.data = [torch.randn(BATCH, OBS_DIM), torch.randn(BATCH, ACT_DIM), torch.randn(BATCH) * 0.1 - 3]
        self.data += [torch.randn(BATCH), torch.randn(BATCH), torch.randn(BATCH)]
        self.rng = np.random.default_rng(0)

    def clip_and_step(self):
        nn.utils.clip_grad_norm_(self.params, 0.5)
        self.optimizer.step()

    def __call__(self):
        started = time.perf_counter()
        for _ in range(EPOCHS):
            order = torch.from_numpy(self.rng.permutation(BATCH))
            for start in range(0, BATCH, MINIBATCH):
                rows = order[start : start + MINIBATCH]
                loss, clipped = self.loss(self.agent, *(tensor[rows] for tensor in self.data))
                clipped.item()  # the script logs each minibatch's clip fraction
                self.optimizer.zero_grad()
                loss.backward()
                self.step()
        return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)
    variants = ["eager", "compiled loss", "compiled step", "compiled loss and step"]
    updates = {variant: Update(variant) for variant in variants}
    for variant, update in updates.items():
        print(f"{variant}: first update (with any compilation) {update():.1f} s", flush=True)
    seconds = {variant: [] for variant in variants}
    for repeat in range(options.repeats):  # in turn, so that the machine's load falls on each alike
        for variant, update in updates.items():
            seconds[variant].append(update())
        print(f"repeat {repeat + 1}: " + ", ".join(f"{v} {s[-1]:.3f} s" for v, s in seconds.items()), flush=True)
    eager = statistics.median(seconds["eager"])
    for variant in variants:
        median = statistics.median(seconds[variant])
        print(f"{variant}: median {median:.3f} s per update of 320 minibatches, {eager / median:.2f}x eager's speed")


if __name__ == "__main__":
    main()
