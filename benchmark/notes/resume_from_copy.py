"""Makes a run folder that `rlhf_ppo_mujoco.py --resume` continues from one checkpoint copy of
notes/checkpoint_copies.sh: the copy as checkpoint.pt, and the run's labels.npz cut to the labels it held at the copy's
step (the count its run.log printed for that step), so that the resumed run asks for labels as the original did.

    python benchmark/notes/resume_from_copy.py COPY_DIR K OUT_RUN_DIR
    e.g. python benchmark/notes/resume_from_copy.py /tmp/freeze/s5 7 /tmp/swap/s5_k7/runs/copy7
         cd /tmp/swap/s5_k7 && python /tmp/oracleclone/rlhf_ppo_mujoco.py --resume runs/copy7

COPY_DIR holds ckpt_K.pt, run.log and runs/<name>/labels.npz (the labels at the end of the copying run).
Used for the Swimmer-v4 reward swaps (notes/c17_grid.md, forty-first session)."""

import glob
import os
import re
import shutil
import sys

import numpy as np
import torch

copy_dir, k, out_run_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
copy_path = f"{copy_dir}/ckpt_{k}.pt"
step = torch.load(copy_path, map_location="cpu", weights_only=False)["global_step"]
with open(f"{copy_dir}/run.log") as log:
    counts = dict(re.findall(r"^step (\d+),.* labels (\d+)/", log.read(), re.M))
if str(step) not in counts:
    raise SystemExit(f"error: {copy_dir}/run.log has no progress line for step {step}")
held = int(counts[str(step)])
(labels_path,) = glob.glob(f"{copy_dir}/runs/*/labels.npz")
with np.load(labels_path) as saved:
    labels = {name: saved[name] if name == "consumed_seq" else saved[name][:held] for name in saved.files}
if len(labels["mu"]) != held:
    raise SystemExit(f"error: {labels_path} holds {len(labels['mu'])} labels, fewer than the {held} at step {step}")
os.makedirs(out_run_dir, exist_ok=True)
shutil.copyfile(copy_path, f"{out_run_dir}/checkpoint.pt")
np.savez(f"{out_run_dir}/labels.npz", **labels)
print(f"{out_run_dir}: ckpt_{k}.pt, step {step}, {held} labels")
