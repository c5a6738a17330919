"""The simulator's own speed: Hopper-v4 environment steps per second with random actions and no policy, stepped by
gymnasium's SyncVectorEnv (one process, as the scripts do) and AsyncVectorEnv (a process per environment), with the
wrappers rlhf_ppo_mujoco.py uses. The ceiling for rollouts on this machine (notes/speed_issue21.md).

    python benchmark/notes/env_step_rate.py [--envs 4] [--steps 2560] [--repeats 2]
"""

import argparse
import time

import gymnasium as gym
import numpy as np


def make_hopper():
    env = gym.make("Hopper-v4")
    env = gym.wrappers.RecordEpisodeStatistics(env)
    return gym.wrappers.ClipAction(env)


def steps_per_second(vector_env_class, num_envs, steps):
    envs = vector_env_class([make_hopper] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, num_envs, 3)).astype(np.float32)
    start = time.perf_counter()
    for action in actions:
        envs.step(action)
    seconds = time.perf_counter() - start
    envs.close()
    return steps * num_envs / seconds


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2560, help="steps of each environment")
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()
    for repeat in range(1, options.repeats + 1):
        for name, vector_env_class in (("sync", gym.vector.SyncVectorEnv), ("async", gym.vector.AsyncVectorEnv)):
            rate = steps_per_second(vector_env_class, options.envs, options.steps)
            print(f"repeat {repeat}, {name}, {options.envs} envs: {rate:.0f} environment steps/s")
