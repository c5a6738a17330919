#!/usr/bin/env bash
# Atari benchmark: A2C from synthetic preferences (RLHF) next to A2C on the game score, the two run side by side (one
# per core, --threads 1) on the same machine, same seed and steps; each log ends with the run's wall time and peak
# memory (/usr/bin/time). Logs: benchmark/logs/{env}__bench_{true,rlhf}__{seed}.log (plot.py reads them).
# Usage: bash benchmark/run_atari.sh [ENV] [STEPS] [SEEDS...]   (run from the repository root)
# RLHF_FLAGS="..." adds flags to the RLHF runs (e.g. CPU-sized reward training); SPEED_ONLY=1 stops each RLHF run
# when its true-reward partner finishes (for the steps/s ratio only); LOGS=DIR writes the logs elsewhere. Runs save
# checkpoints (also when stopped with kill/Ctrl-C): continue one with
#   python rlhf_a2c_atari.py --resume runs/NAME >> LOG 2>&1   (plot.py reads the appended lines in place of the old)
# Then:
#   python benchmark/atari_speed.py --env ENV      (steps/s ratio per seed and the median; peak memory)
#   python benchmark/plot.py --env ENV             (curves and table)
set -euo pipefail
env_id=${1:-PongNoFrameskip-v4}
steps=${2:-10000000}
shift $(($# < 2 ? $# : 2))
seeds=${*:-1 2 3}
logs=${LOGS:-benchmark/logs}
mkdir -p "$logs"
name=${env_id//\//-}
time_it=(/usr/bin/time -f "wall_s %e\npeak_rss_kb %M")
for seed in $seeds; do  # one pair at a time, so each ratio compares two runs that shared the machine throughout
  common=(--env "$env_id" --total-timesteps "$steps" --seed "$seed" --threads 1 --save-model)
  "${time_it[@]}" python rlhf_a2c_atari.py "${common[@]}" --feedback true-reward --exp-name bench_true \
    > "$logs/${name}__bench_true__${seed}.log" 2>&1 &
  true_pid=$!
  # shellcheck disable=SC2086
  "${time_it[@]}" python rlhf_a2c_atari.py "${common[@]}" ${RLHF_FLAGS:-} --exp-name bench_rlhf \
    > "$logs/${name}__bench_rlhf__${seed}.log" 2>&1 &
  rlhf_pid=$!
  wait "$true_pid"
  if [ -n "${SPEED_ONLY:-}" ]; then  # the ratio needs both running: stop RLHF when the baseline is done
    pkill -TERM -P "$rlhf_pid" || true  # (a script's background jobs ignore Ctrl-C's SIGINT)
  fi
  wait "$rlhf_pid" || true
done
