#!/bin/bash
# Runs one training command that saves checkpoints (rlhf_ppo_mujoco.py with --save-model and --checkpoint-every N) in
# OUT_DIR, copies each rewritten runs/*/checkpoint.pt to OUT_DIR/ckpt_0.pt, ckpt_1.pt, ..., and stops the run (SIGTERM)
# after COPIES copies; the command's output goes to OUT_DIR/run.log. The schedules keep the command's own
# --total-timesteps, so with the same flags and seed the copies are checkpoints of the run that the full command makes.
#   bash benchmark/notes/checkpoint_copies.sh OUT_DIR COPIES COMMAND...
#   e.g. bash benchmark/notes/checkpoint_copies.sh /tmp/climb/s2 14 python "$PWD/rlhf_ppo_mujoco.py" --env Swimmer-v4 \
#        --seed 2 --total-timesteps 1000000 --threads 1 --save-model --checkpoint-every 12 --labels 1400 ...
out=$1; copies=$2; shift 2
mkdir -p "$out" && cd "$out" || exit 1
"$@" > run.log 2>&1 &
pid=$!
last=""
while kill -0 $pid 2>/dev/null; do
  checkpoint=$(ls runs/*/checkpoint.pt 2>/dev/null | head -1)
  if [ -n "$checkpoint" ] && [ "$(stat -c %Y "$checkpoint")" != "$last" ]; then
    sleep 1  # the script writes checkpoint.pt.tmp and renames it: a second is ample
    last=$(stat -c %Y "$checkpoint")
    cp "$checkpoint" "ckpt_$(ls ckpt_*.pt 2>/dev/null | wc -l).pt"
  fi
  if [ "$(ls ckpt_*.pt 2>/dev/null | wc -l)" -ge "$copies" ]; then
    kill -TERM $pid  # once: a second signal stops the script at once, without saving
    wait $pid
    break
  fi
  sleep 2
done
