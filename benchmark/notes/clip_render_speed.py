"""Rendering and encoding speed of Hopper-v4 clips for human feedback at several sizes (MUJOCO_GL=egl, software).

MUJOCO_GL=egl python benchmark/notes/clip_render_speed.py 160 256 320
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")
import gymnasium as gym  # noqa: E402
import imageio.v2 as imageio  # noqa: E402

for size in [int(x) for x in sys.argv[1:]]:
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
        f"{size}px: render {60/r:.1f} frames/s, encode 60 frames {e:.2f} s, clip {n/1024:.0f} KiB; a pair (2 x 60 frames) {2*(r+e):.1f} s"
    )
    env.close()
