#!/usr/bin/env bash
# Learning benchmark: RLHF (synthetic labels) next to true-reward PPO, same script, same seeds, same step budget.
# Usage: bash benchmark/run_learning.sh [ENV] [STEPS] [LABELS] [SEEDS...]   (run from the repository root)
# Runs two jobs at a time (one per core) and writes TensorBoard logs under runs/; plot with benchmark/plot.py.
set -euo pipefail
env_id=${1:-Hopper-v4}
steps=${2:-1000000}
labels=${3:-1400}
shift $(( $# < 3 ? $# : 3 )) || true
seeds=${*:-1 2 3}
jobs=${JOBS:-2}
mkdir -p benchmark/logs
for seed in $seeds; do
  echo "--env $env_id --total-timesteps $steps --seed $seed --feedback true-reward --exp-name bench_true"
  echo "--env $env_id --total-timesteps $steps --seed $seed --feedback synthetic --labels $labels --exp-name bench_rlhf_${labels}"
done | xargs -P "$jobs" -I{} sh -c 'python rlhf_ppo_mujoco.py {} > "benchmark/logs/$(echo "{}" | tr -c "a-zA-Z0-9_.\n-" _).log" 2>&1'
