#!/bin/bash
# One Ant-v4 700-label run (the C17 grid's flags) of CODE's rlhf_ppo_mujoco.py, with a checkpoint every 12 iterations
# (24,576 steps); each rewritten checkpoint is copied to OUT/ckpt_N.pt, and the run is stopped (SIGTERM) after the 7th
# copy (about 172k steps). The input of notes/early_reward.py (--old OUT_OLD --fix OUT_FIX).
#   bash benchmark/notes/early_checkpoints.sh CODE_DIR OUT_DIR SEED    e.g. /work/bench4 /tmp/early/old4 4
code=$1; out=$2; seed=$3
bash "$(dirname "$0")/checkpoint_copies.sh" "$out" 7 python "$code/rlhf_ppo_mujoco.py" --env Ant-v4 --seed "$seed" \
  --total-timesteps 1000000 --threads 1 --save-model --checkpoint-every 12 --exp-name early --labels 700 \
  --segment-len 30 --env-kwargs '{"ctrl_cost_weight": 0}'
