#!/bin/bash
# one device call: HalfCheetah-v4 seeds 6-9 (16 runs, one per core) as a daemon; beside it rlhf_a2c_atari.py on the
# GPU (RLHF Pong, C17 defaults), stopped with SIGTERM at $2 s and resumed on the GPU; everything stopped at $1 s, packed
T0=$(date +%s); STOP=${1:-520}; ATARI_STOP=${2:-380}
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MUJOCO_GL=disable
nproc; lscpu | grep -E 'Model name'; free -g | head -2; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import gymnasium, mujoco, tyro, torch, numpy, ale_py; print(gymnasium.__version__, mujoco.__version__, torch.__version__, numpy.__version__, ale_py.__version__, torch.cuda.is_available())" || exit 1
git log --oneline -1
setsid nohup python3 benchmark/sweep.py local benchmark/grids/c17_mujoco.json --envs HalfCheetah-v4 --seeds 6 7 8 9 --workers 16 --out /tmp/sw > /tmp/sw.log 2>&1 < /dev/null &
echo $! > /tmp/sw.pid
setsid nohup python3 rlhf_a2c_atari.py --env PongNoFrameskip-v4 --seed 1 --threads 2 --save-model --exp-name gpu_rlhf > /tmp/atari.log 2>&1 < /dev/null &
echo $! > /tmp/atari.pid
echo "started at t=$(el)"
resumed=0
while [ $(el) -lt $STOP ]; do
  sleep 20
  echo "t=$(el) load $(cut -d' ' -f1-3 /proc/loadavg) gpu $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) | atari: $(grep -v '^#' /tmp/atari.log | tail -1 | cut -c1-150)"
  if [ $resumed = 0 ] && [ $(el) -ge $ATARI_STOP ]; then
    kill -TERM $(cat /tmp/atari.pid); for i in $(seq 60); do kill -0 $(cat /tmp/atari.pid) 2>/dev/null || break; sleep 1; done
    echo "atari stopped after $i s at t=$(el)"; ls -la runs/*gpu_rlhf*
    run=$(ls -d runs/*gpu_rlhf* | head -1)
    setsid nohup python3 rlhf_a2c_atari.py --resume $run --threads 2 > /tmp/atari_resume.log 2>&1 < /dev/null &
    echo $! > /tmp/atari.pid; resumed=1
  fi
done
kill -TERM $(cat /tmp/sw.pid) $(cat /tmp/atari.pid)
for i in $(seq 50); do kill -0 $(cat /tmp/sw.pid) 2>/dev/null || break; sleep 1; done
echo "stopped after $i s, t=$(el)"; tail -5 /tmp/sw.log
for f in /tmp/sw/*/run.log; do echo "$(basename $(dirname $f)): $(grep -v '^#' $f | tail -1 | cut -c1-150)"; done
cp /tmp/atari.log /tmp/atari_resume.log /tmp/sw.log $OUT/
tar czf /tmp/snap.tgz -C /tmp --exclude='*.tmp' sw; split -b 15m /tmp/snap.tgz $OUT/snap.tgz.part_
tar czf $OUT/atari_runs.tgz --exclude='*.pt' --exclude='*.npz' runs
ls -la $OUT; echo "t=$(el)"
