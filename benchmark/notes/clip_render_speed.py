"""How fast MuJoCo renders the clips people label (rlhf_ppo_mujoco.py --feedback human: 320x320, the "track" camera),
with the model's shadows and floor reflection as they are and with each turned off; the four renderers alternate, 30
frames each, 5 repeats, and each is given as frames/s and as a ratio to the default measured in the same repeat.

Usage (from the repository root): MUJOCO_GL=egl python benchmark/notes/clip_render_speed.py [ENV_ID]
"""

import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402


def make(env_id, shadows, reflection):
    env = gym.make(env_id, render_mode="rgb_array", width=320, height=320, camera_name="track")
    env.reset(seed=0)
    if not shadows:
        env.unwrapped.model.light_castshadow[:] = 0
    if not reflection:
        env.unwrapped.model.mat_reflectance[:] = 0
    env.render()  # the renderer's context is made here, outside the timing
    return env


env_id = sys.argv[1] if len(sys.argv) > 1 else "Hopper-v4"
kinds = {
    "as the model has it": (True, True),
    "no shadows": (False, True),
    "no reflection": (True, False),
    "neither": (False, False),
}
envs = {name: make(env_id, *flags) for name, flags in kinds.items()}
rates = {name: [] for name in kinds}
for repeat in range(5):
    for name, env in envs.items():
        start = time.perf_counter()
        for _ in range(30):
            env.unwrapped.step(env.action_space.sample())
            env.render()
        rates[name].append(30 / (time.perf_counter() - start))
default = np.array(rates["as the model has it"])
print(f"{env_id}, 320x320 frames with a simulator step each, medians over 5 repeats")
for name, values in rates.items():
    print(f"{name}: {np.median(values):.1f} frames/s, {np.median(np.array(values) / default):.2f}x the default")
