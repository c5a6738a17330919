#!/usr/bin/env bash
# Learning benchmark: RLHF (synthetic labels) next to true-reward PPO, same script, same seeds, same step budget.
# Usage: bash benchmark/run_learning.sh [ENV] [STEPS] [LABELS] [SEEDS...]   (run from the repository root)
# Runs two jobs at a time (one per core; JOBS=N to change), logs to benchmark/logs/{env}__{exp_name}__{seed}.log and
# TensorBoard events to runs/; then: python benchmark/plot.py --env ENV. TAG=_x appends _x to the experiment names
# (keeps earlier results); FLAGS="--num-envs 4 --num-steps 512" adds flags to every run; a run whose log already
# reaches the last step is skipped, so a stopped grid can be re-run.
set -euo pipefail
env_id=${1:-Hopper-v4}
steps=${2:-1000000}
labels=${3:-1400}
shift $(($# < 3 ? $# : 3))
seeds=${*:-1 2 3}
tag=${TAG:-}
flags=${FLAGS:-}
last_step=$((steps / 2048 * 2048))
mkdir -p benchmark/logs
for seed in $seeds; do
  echo "${env_id}__bench_true${tag}__${seed} --env $env_id --total-timesteps $steps --seed $seed --feedback true-reward --exp-name bench_true${tag} $flags"
  echo "${env_id}__bench_rlhf_${labels}${tag}__${seed} --env $env_id --total-timesteps $steps --seed $seed --labels $labels --exp-name bench_rlhf_${labels}${tag} $flags"
done | while read -r name rest; do
  grep -q "^step ${last_step}," "benchmark/logs/${name}.log" 2>/dev/null || echo "$name $rest"
done | xargs -r -L 1 -P "${JOBS:-2}" sh -c 'log=benchmark/logs/$0.log; python rlhf_ppo_mujoco.py "$@" > "$log" 2>&1'
