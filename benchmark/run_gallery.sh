#!/usr/bin/env bash
# README's gallery: each behaviour learned from 900 scripted labels (--feedback scripted), next to the same task trained
# on its own reward, then a looping GIF of each trained agent.
# Usage: bash benchmark/run_gallery.sh [STEPS] [SEED]   (run from the repository root; defaults 1000000 1)
# Two runs at a time (JOBS=N to change); logs in benchmark/logs/behaviours/{env}__gallery_{name}__{seed}.log, runs
# (with --save-model checkpoints) in runs/. A run whose log has its final "wall_s" line is skipped, so a stopped batch
# can be run again. Then each finished run's first evaluation episode (seed SEED) is filmed for GIF_SECONDS (3) into
# benchmark/gallery/{name}.gif, and its scores are written to benchmark/gallery/{name}.txt.
set -euo pipefail
steps=${1:-1000000}
seed=${2:-1}
seconds=${GIF_SECONDS:-3}
logs=benchmark/logs/behaviours
mkdir -p "$logs" benchmark/gallery
no_end='{"terminate_when_unhealthy": false}'
# a fall (torso below 0.7 m) still ends the episode, but any tilt is allowed: turning over is no fall
falls_end='{"healthy_angle_range": [-1000, 1000]}'
runs=(  # name|env|flags
  "backflip|Hopper-v4|--feedback scripted --behaviour backflip --labels 900 --env-kwargs $no_end"
  "backflip_falls_end|Hopper-v4|--feedback scripted --behaviour backflip --labels 900 --env-kwargs $falls_end"
  "one_leg|Walker2d-v4|--feedback scripted --behaviour one-leg --labels 900"
  "backwards|HalfCheetah-v4|--feedback scripted --behaviour backwards --labels 900"
  "true_hopper|Hopper-v4|--feedback true-reward"
  "true_walker2d|Walker2d-v4|--feedback true-reward"
  "true_halfcheetah|HalfCheetah-v4|--feedback true-reward"
)

train() {  # name env flags...
  local name=$1 env_id=$2 log="$logs/$2__gallery_$1__${seed}.log"
  shift 2
  grep -q "^wall_s " "$log" 2>/dev/null && return
  local start=$SECONDS
  python rlhf_ppo_mujoco.py --env "$env_id" --seed "$seed" --total-timesteps "$steps" --exp-name "gallery_$name" \
    --save-model "$@" > "$log" 2>&1
  echo "wall_s $((SECONDS - start))" >> "$log"
}

for entry in "${runs[@]}"; do
  IFS='|' read -r name env_id flags <<< "$entry"
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n; done
  if [[ $flags == *--env-kwargs* ]]; then  # the JSON after --env-kwargs is one argument
    train "$name" "$env_id" ${flags%% --env-kwargs *} --env-kwargs "${flags#* --env-kwargs }" &
  else
    train "$name" "$env_id" $flags &
  fi
done
wait

for entry in "${runs[@]}"; do
  IFS='|' read -r name env_id flags <<< "$entry"
  run_dir=$(ls -d runs/"${env_id}__gallery_${name}__${seed}__"* 2>/dev/null | tail -1)
  [ -n "$run_dir" ] && [ -f "$run_dir/checkpoint.pt" ] || continue
  rm -rf "$run_dir/eval"
  python rlhf_ppo_mujoco.py --resume "$run_dir" --eval-only --eval-episodes 1 --capture-video --video-format gif \
    --video-seconds "$seconds" 2>/dev/null | tee "benchmark/gallery/$name.txt"
  cp "$run_dir/eval/videos/episode-0.gif" "benchmark/gallery/$name.gif"
done
