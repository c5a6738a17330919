"""Rendering and encoding speed of Hopper-v4 clips for human feedback at several sizes (MUJOCO_GL=egl, software).

MUJOCO_GL=egl python benchmark/notes/clip_render_speed.py 160 256 320
MUJOCO_GL=egl python benchmark/notes/clip_render_speed.py --scene 320

With --scene: what the model's shadows and floor reflection cost at that size (the "track" camera, as the clips are
rendered): the model as it is and with each turned off, alternating, 30 frames each, 5 repeats; frames/s and the ratio
to the model as it is, measured in the same repeat (medians).
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")
import gymnasium as gym  # noqa: E402
import imageio.v2 as imageio  # noqa: E402
import numpy as np  # noqa: E402


def render_and_encode(size):
    env = gym.make("Hopper-v4", render_mode="rgb_array", width=size, height=size)
    env.reset(seed=0)
    frames = [env.render()]
    t = time.perf_counter()
    for _ in range(60):
        env.step(env.action_space.sample())
        frames.append(env.render())
    r = time.perf_counter() - t
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        imageio.mimwrite(
            os.path.join(d, "c.webm"),
            frames[:60],
            fps=30,
            codec="libvpx-vp9",
            macro_block_size=1,
            output_params=["-deadline", "realtime", "-cpu-used", "8", "-b:v", "0", "-crf", "32"],
        )
        n = os.path.getsize(os.path.join(d, "c.webm"))
    e = time.perf_counter() - t
    print(
        f"{size}px: render {60 / r:.1f} frames/s, encode 60 frames {e:.2f} s, clip {n / 1024:.0f} KiB; a pair (2 x 60 frames) {2 * (r + e):.1f} s"
    )
    env.close()


def scene_costs(size):
    kinds = {"as the model has it": (True, True), "no shadows": (False, True), "no reflection": (True, False)}
    kinds["neither"] = (False, False)
    envs = {}
    for name, (shadows, reflection) in kinds.items():
        env = gym.make("Hopper-v4", render_mode="rgb_array", width=size, height=size, camera_name="track")
        env.reset(seed=0)
        if not shadows:
            env.unwrapped.model.light_castshadow[:] = 0
        if not reflection:
            env.unwrapped.model.mat_reflectance[:] = 0
        env.render()  # the renderer's context is made here, outside the timing
        envs[name] = env
    rates = {name: [] for name in kinds}
    for _ in range(5):
        for name, env in envs.items():
            t = time.perf_counter()
            for _ in range(30):
                env.unwrapped.step(env.action_space.sample())
                env.render()
            rates[name].append(30 / (time.perf_counter() - t))
    default = np.array(rates["as the model has it"])
    print(f"{size}px, the track camera, medians over 5 repeats")
    for name, values in rates.items():
        print(f"{name}: {np.median(values):.1f} frames/s, {np.median(np.array(values) / default):.2f}x the model as it is")


if sys.argv[1:2] == ["--scene"]:
    for size in [int(x) for x in sys.argv[2:]]:
        scene_costs(size)
else:
    for size in [int(x) for x in sys.argv[1:]]:
        render_and_encode(size)
