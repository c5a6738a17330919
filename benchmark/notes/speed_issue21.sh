#!/usr/bin/env bash
# Issue 21's speed figures (notes/speed_issue21.md) in one run, from the repository root, on an otherwise idle machine
# (about 37 minutes on 2 cores):
#   bash benchmark/notes/speed_issue21.sh
# 1. side by side against CleanRL's PPO (benchmark/speed_vs_cleanrl.sh, 102,400 steps, 3 repeats), ours at 4 x 512 and
#    at 1 x 2048 (the default);
# 2. seconds per iteration of each phase on one core (taskset -c 0), before issue 21 (5cebf75, 1 x 2048) and after
#    (4 x 512 and 8 x 256), both modes;
# 3. start-up: seconds to the first environment step, ours before and after, CleanRL's;
# 4. the simulator alone (notes/env_step_rate.py);
# 5. rlhf_moving_dot.py's default run before (5cebf75) and after, alternating, 3 repeats.
# Each part writes to benchmark/logs/speed_issue21_*; the CleanRL part to benchmark/logs/speed_vs_cleanrl*.
set -euo pipefail
export MUJOCO_GL=egl
before=5cebf75
logs=benchmark/logs
copies=$(mktemp -d)
trap 'rm -rf "$copies"' EXIT
git show "$before:rlhf_ppo_mujoco.py" > "$copies/rlhf_ppo_mujoco_before.py"
git show "$before:rlhf_moving_dot.py" > "$copies/rlhf_moving_dot_before.py"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; commit $(git rev-parse --short HEAD)"

echo "== 1. against CleanRL"
bash benchmark/speed_vs_cleanrl.sh Hopper-v4 102400 3 --num-envs 4 --num-steps 512 | tee "$logs/speed_vs_cleanrl_summary.txt"

echo "== 2. phases, one core"
for repeat in 1 2; do
  for mode in true-reward synthetic; do
    for version in before after after_8x256; do
      case $version in
        before) rev=(--rev "$before") layout=() ;;
        after) rev=() layout=(--num-envs 4 --num-steps 512) ;;
        after_8x256) rev=() layout=(--num-envs 8 --num-steps 256) ;;
      esac
      echo "$version $mode repeat $repeat: $(taskset -c 0 python benchmark/notes/phase_times.py "${rev[@]}" -- --env Hopper-v4 \
        --total-timesteps 40960 --seed "$repeat" --feedback "$mode" --exp-name phases "${layout[@]}")"
    done
  done
done | tee "$logs/speed_issue21_phases.txt"

echo "== 3. start-up"
{
  for mode in true-reward synthetic; do
    echo "after, $mode: $(python benchmark/first_step.py -- rlhf_ppo_mujoco.py --feedback "$mode" --exp-name startup)"
    echo "before, $mode: $(python benchmark/first_step.py -- "$copies/rlhf_ppo_mujoco_before.py" --feedback "$mode" \
      --exp-name startup)"
  done
  echo "CleanRL: $(python benchmark/first_step.py --cwd benchmark/.cleanrl -- ppo_continuous_action.py --env-id Hopper-v4 \
    --cuda False)"
  for repeat in 1 2 3; do  # torch.optim's Adam imports torch._dynamo (the torch.compile stack) when created and at step()
    python -c "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import torch._dynamo; \
print(f'import torch {t1 - t0:.2f} s, then torch._dynamo {time.perf_counter() - t1:.2f} s')"
  done
} | tee "$logs/speed_issue21_first_step.txt"
rm -rf benchmark/.cleanrl/runs

echo "== 4. the simulator alone"
{
  python benchmark/notes/env_step_rate.py --envs 4
  python benchmark/notes/env_step_rate.py --envs 1 --steps 10240
} | tee "$logs/speed_issue21_env_step_rate.txt"

echo "== 5. moving dot, default run, before and after"
mkdir -p "$logs/speed_moving_dot_issue21"
for repeat in 1 2 3; do
  for version in before after; do
    script=rlhf_moving_dot.py
    [ "$version" = before ] && script="$copies/rlhf_moving_dot_before.py"
    /usr/bin/time -f "wall_s %e cpu_s %U %S" python "$script" --seed "$repeat" --exp-name "speed_$version" \
      > "$logs/speed_moving_dot_issue21/${version}_$repeat.log" 2>&1
  done
done
for version in before after; do
  echo "$version: wall s $(grep -h -o 'wall_s [0-9.]*' "$logs"/speed_moving_dot_issue21/"${version}"_*.log | cut -d' ' -f2 | sort -n \
    | tr '\n' ' ')(median is the middle one)"
done | tee "$logs/speed_moving_dot_issue21/summary.txt"
echo "== 6. against CleanRL at 1 x 2048"
OUT=benchmark/logs/speed_vs_cleanrl_1x2048 bash benchmark/speed_vs_cleanrl.sh Hopper-v4 102400 3 --num-envs 1 --num-steps 2048 \
  | tee "$logs/speed_vs_cleanrl_1x2048_summary.txt"
echo ALLDONE
