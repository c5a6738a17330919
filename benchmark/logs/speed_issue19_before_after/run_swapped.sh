#!/usr/bin/env bash
# RLHF mode of rlhf_ppo_mujoco.py before (f15fb44, worktree /tmp/wt_before) and after the issue-19 restructuring, (this copy starts the 'after' run first)
# side by side (one per core), same seed, 3 repeats
set -euo pipefail
out=$1
for r in 1 2 3; do
  (cd /work/main && python rlhf_ppo_mujoco.py --env Hopper-v4 --total-timesteps 102400 --seed $r --labels 1400 --exp-name speed_after > /work/main/$out/after_$r.log 2>&1) &
  (cd /tmp/wt_before && python rlhf_ppo_mujoco.py --env Hopper-v4 --total-timesteps 102400 --seed $r --labels 1400 --exp-name speed_before > /work/main/$out/before_$r.log 2>&1) &
  wait
done
for r in 1 2 3; do
  b=$(grep -o "SPS [0-9]*" $out/before_$r.log | tail -1 | cut -d' ' -f2); a=$(grep -o "SPS [0-9]*" $out/after_$r.log | tail -1 | cut -d' ' -f2)
  echo "repeat $r: before $b SPS, after $a SPS, after/before $(python3 -c "print(round($a/$b, 3))")"
done
