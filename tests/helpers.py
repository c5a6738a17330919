"""Running the script as a user does: in a subprocess, in a fresh folder, judged by what it writes."""

import subprocess
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SCRIPT = Path(__file__).resolve().parents[1] / "rlhf_ppo_mujoco.py"


def run_script(cwd, args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args.split()], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def only_run_dir(cwd):
    (run_dir,) = (Path(cwd) / "runs").iterdir()
    return run_dir


def scalars(run_dir):
    """Every scalar the run logged to TensorBoard: {tag: [(step, value), ...]}."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
