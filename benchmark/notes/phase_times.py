"""Where an iteration of rlhf_ppo_mujoco.py spends its time: the median seconds per iteration of each phase (rollout,
labels and the reward-training round, learned reward and return scaling, GAE, PPO update), over the RL iterations.

    python benchmark/notes/phase_times.py [--rev GIT_REV] -- [ARGS FOR rlhf_ppo_mujoco.py...]

Writes a copy of the script (the working tree's, or the one at GIT_REV) with timers at the phase boundaries into a
temporary folder, runs it with ARGS from the repository root and prints the medians. Used for issue 21
(notes/speed_issue21.md); pin it to one core with `taskset -c 0` to time what one core does.
"""

import argparse
import os
import subprocess
import sys
import tempfile

# (text in the script, the timer put before it); every text must occur in the script
TIMERS = [
    ("        for step in range(0, args.num_steps):\n", "        phase_start = [time.perf_counter()]\n"),
    ("        # RLHF: the actions the environment executed (ClipAction)", "        phase_start.append(time.perf_counter())\n"),
    ("        if pretraining:\n            print(", "        phase_start.append(time.perf_counter())\n"),
    ("        # bootstrap value if not done\n", "        phase_start.append(time.perf_counter())\n"),
    ("        # flatten the batch\n", "        phase_start.append(time.perf_counter())\n"),
    (
        "        y_pred, y_true = b_values",
        "        phase_start.append(time.perf_counter())\n        phase_seconds.append(np.diff(phase_start))\n",
    ),
    ("    for iteration in range(start_iteration", "    phase_seconds = []\n"),
    (
        "    envs.close()\n",
        "    print('PHASES', ' '.join(f'{name} {seconds:.3f}' for name, seconds in zip(PHASE_NAMES, "
        "np.median(phase_seconds, 0))))\n",
    ),
]
PHASE_NAMES = ["rollout", "labels+reward-round", "learned-reward+scaling", "gae", "update"]


def timed_copy(source):
    for text, timer in TIMERS:
        if text not in source:
            raise SystemExit(f"error: the script has no {text.strip()!r}: phase_times.py needs updating")
        source = source.replace(text, timer + text, 1)
    return source.replace("import numpy as np\n", f"import numpy as np\n\nPHASE_NAMES = {PHASE_NAMES!r}\n", 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default=None, help="time the script at this git revision (default: the working tree's)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- ARGS for rlhf_ppo_mujoco.py")
    options = parser.parse_args()
    if options.rev:
        source = subprocess.run(
            ["git", "show", f"{options.rev}:rlhf_ppo_mujoco.py"], capture_output=True, text=True, check=True
        ).stdout
    else:
        source = open("rlhf_ppo_mujoco.py").read()
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "rlhf_ppo_mujoco_timed.py")
        with open(script, "w") as file:
            file.write(timed_copy(source))
        args = options.args[1:] if options.args[:1] == ["--"] else options.args
        result = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    phases = [line for line in result.stdout.splitlines() if line.startswith("PHASES")]
    if result.returncode != 0 or not phases:
        raise SystemExit(f"error: the timed run failed:\n{result.stderr[-2000:]}")
    print(phases[-1], "| last progress line:", [line for line in result.stdout.splitlines() if line.startswith("step")][-1])
