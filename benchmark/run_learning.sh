#!/usr/bin/env bash
# Learning benchmark: RLHF (synthetic labels) next to true-reward PPO, same script, same seeds, same step budget.
# Usage: bash benchmark/run_learning.sh [ENV] [STEPS] [LABELS] [SEEDS...]   (run from the repository root)
# Runs two jobs at a time (one per core; JOBS=N to change), logs to benchmark/logs/{env}__{exp_name}__{seed}.log and
# TensorBoard events to runs/; then: python benchmark/plot.py --env ENV
set -euo pipefail
env_id=${1:-Hopper-v4}
steps=${2:-1000000}
labels=${3:-1400}
shift $(($# < 3 ? $# : 3))
seeds=${*:-1 2 3}
mkdir -p benchmark/logs
for seed in $seeds; do
  echo "${env_id}__bench_true__${seed} --env $env_id --total-timesteps $steps --seed $seed --feedback true-reward --exp-name bench_true"
  echo "${env_id}__bench_rlhf_${labels}__${seed} --env $env_id --total-timesteps $steps --seed $seed --labels $labels --exp-name bench_rlhf_${labels}"
done | xargs -L 1 -P "${JOBS:-2}" sh -c 'log=benchmark/logs/$0.log; python rlhf_ppo_mujoco.py "$@" > "$log" 2>&1'
