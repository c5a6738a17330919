#!/bin/bash
# one device call (issue 22): Walker2d-v4 350 and 1400 labels seeds 6-10, HalfCheetah-v4 seed 10 (all four feedbacks)
# and HalfCheetah-v4 1400 labels seeds 7 and 8: 16 runs, one per core, as daemons; stopped with SIGTERM at $1 s (each
# run saves its checkpoint), packed under $OUT for finishing on the development machine with the same commands
T0=$(date +%s); STOP=${1:-500}
el() { echo $(( $(date +%s) - T0 )); }
exec > >(tee $OUT/dev.log) 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nproc; lscpu | grep -E 'Model name'; free -g | head -2
python3 -c "import gymnasium, mujoco, tyro, torch, numpy; print(gymnasium.__version__, mujoco.__version__, torch.__version__, numpy.__version__)" || exit 1
git log --oneline -1
GRID=benchmark/grids/c17_mujoco.json
start() { setsid nohup python3 benchmark/sweep.py local $GRID "$@" --out /tmp/sw > /tmp/sw_$#_$(date +%N).log 2>&1 < /dev/null & echo $! >> /tmp/sw.pids; }
start --envs Walker2d-v4 --feedback 350 1400 --seeds 6 7 8 9 10 --workers 10
start --envs HalfCheetah-v4 --seeds 10 --workers 4
start --envs HalfCheetah-v4 --feedback 1400 --seeds 7 8 --workers 2
echo "started at t=$(el)"
while [ $(el) -lt $STOP ]; do
  sleep 30
  echo "t=$(el) load $(cut -d' ' -f1-3 /proc/loadavg) | $(grep -hv '^#' /tmp/sw/*/run.log 2>/dev/null | tail -1 | cut -c1-140)"
done
kill -TERM $(cat /tmp/sw.pids)
for i in $(seq 50); do alive=0; for p in $(cat /tmp/sw.pids); do kill -0 $p 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; sleep 1; done
echo "stopped after $i s, t=$(el)"; tail -n 3 /tmp/sw_*.log
for f in /tmp/sw/*/run.log; do echo "$(basename $(dirname $f)): $(grep -v '^#' $f | tail -1 | cut -c1-150)"; done
tar czf /tmp/snap.tgz -C /tmp --exclude='*.tmp' --exclude='run.lock' sw; split -b 15m /tmp/snap.tgz $OUT/snap.tgz.part_
ls -la $OUT; echo "t=$(el)"
