#!/usr/bin/env bash
# One device call (2026-11-30): the Ant-v4 lead's remaining runs on 8 CPU cores (issue 22, c17_envs4 grid), and beside
# them rlhf_a2c_atari.py / rlhf_ppo_mujoco.py on CUDA: checkpoints made on the GPU (brought back and loaded on a CPU
# machine), and Pong's steps/s on this machine. Everything under a deadline well inside the call's 600 s.
set -u
T0=$(date +%s)
REPO=$(pwd)
say() { echo "[t+$(($(date +%s) - T0))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
say installed
nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket'; free -g | head -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, gymnasium, mujoco, ale_py, tyro, numpy; print('torch', torch.__version__, torch.cuda.is_available(), 'gymnasium', gymnasium.__version__, 'mujoco', mujoco.__version__, 'ale_py', ale_py.__version__, 'numpy', numpy.__version__)" || exit 1
python3 -c "import gymnasium as gym; e = gym.make('Ant-v4'); e.reset(seed=0); print('Ant-v4 steps', e.step(e.action_space.sample())[1])" || exit 1

# A: the sweep, 8 workers (each run --threads 1), stopped (SIGTERM: its runs save a checkpoint) at the deadline
say sweep starts
(timeout -k 45 "${SWEEP_S:-475}" python3 benchmark/sweep.py local benchmark/grids/c17_envs4.json --envs Ant-v4 \
  --feedback true 1400 --seeds 6 7 8 9 10 --workers 8 > /tmp/sweep.log 2>&1; echo "sweep rc $?" >> /tmp/sweep.log) &
sweep=$!

# B: the GPU, beside the sweep
mkdir -p /tmp/gpu && cd /tmp/gpu || exit 1
say "atari: a run on the GPU, stopped by SIGTERM at 40 s (or done)"
timeout -s TERM 40 python3 "$REPO/rlhf_a2c_atari.py" --total-timesteps 25600 --pretrain-steps 6400 --pretrain-labels 100 \
  --pretrain-epochs 1 --labels 106 --save-model --exp-name gpu_atari > atari_ckpt.log 2>&1
echo "rc $?"; grep -v -i warn atari_ckpt.log | tail -4
say "mujoco: a run on the GPU (--cuda)"
timeout -s TERM 90 python3 "$REPO/rlhf_ppo_mujoco.py" --env Hopper-v4 --labels 60 --total-timesteps 14336 --cuda \
  --save-model --exp-name gpu_mujoco > mujoco_cuda.log 2>&1
echo "rc $?"; grep -v -i warn mujoco_cuda.log | tail -4
python3 -c "import torch, glob; c = torch.load(glob.glob('runs/Hopper*/checkpoint.pt')[0], map_location=None, weights_only=False); print('mujoco checkpoint tensors on', {str(t.device) for t in c['agent'].values()})"
say "atari: steps/s, true reward and RLHF alternating, 2 repeats"
cd "$REPO" && timeout 230 python3 benchmark/atari_speed_alone.py --steps 30000 --repeats 2 --logs /tmp/gpu/speed
say "atari speed done"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
top -bn1 | head -20

wait $sweep
say sweep ended; tail -30 /tmp/sweep.log
cd "$REPO/benchmark/sweeps/c17_envs4" || exit 1
runs=$(ls -d Ant-v4__true__{6,7,8,9,10} Ant-v4__labels1400__{8,9,10} 2> /dev/null)
exclude=()
for run in $runs; do
  if [ -f "$run/done.json" ]; then exclude+=("--exclude=$run/runs/*/labels.npz"); echo "$run done"; else echo "$run NOT done"; fi
  grep -E "^step " "$run/run.log" | tail -1
done
tar -czf /tmp/ant.tgz "${exclude[@]}" $runs && split -b 15M -d /tmp/ant.tgz "$OUT/ant.tgz.part"
cd /tmp/gpu && tar -czf "$OUT/gpu.tgz" runs speed ./*.log /tmp/sweep.log
ls -la "$OUT"; say packed
