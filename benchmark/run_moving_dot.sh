#!/usr/bin/env bash
# Moving-dot benchmark: RLHF with synthetic labels (online, the default), the blog's offline variant (--offline) and
# PPO on the true reward, same seeds and steps; each run's wall time is appended to its log (wall_s, /usr/bin/time).
# Usage: bash benchmark/run_moving_dot.sh [OBSERVATION] [STEPS] [SEEDS...]   (run from the repository root)
# MODES="true rlhf offline" (the default) picks which of the three to run; TAG=_x appends _x to the experiment names
# (keeps earlier logs).
# Runs two jobs at a time (one per core; JOBS=N to change), logs to benchmark/logs/MovingDot-v0-{observation}__*.log;
# then: python benchmark/plot.py --env MovingDot-v0-position
set -euo pipefail
observation=${1:-position}
steps=${2:-200000}
shift $(($# < 2 ? $# : 2))
seeds=${*:-1 2 3 4 5}
mkdir -p benchmark/logs
for seed in $seeds; do
  common="--observation $observation --total-timesteps $steps --seed $seed"
  for mode in ${MODES:-true rlhf offline}; do
    case $mode in
      true) extra="--feedback true-reward" ;;
      rlhf) extra="" ;;
      offline) extra="--offline" ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    echo "MovingDot-v0-${observation}__bench_${mode}${TAG:-}__${seed} $common $extra --exp-name bench_${mode}${TAG:-}"
  done
done | xargs -L 1 -P "${JOBS:-2}" sh -c \
  'log=benchmark/logs/$0.log; /usr/bin/time -f "wall_s %e" python rlhf_moving_dot.py "$@" > "$log" 2>&1'
