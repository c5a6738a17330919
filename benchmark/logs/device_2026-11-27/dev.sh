#!/bin/bash
# one device call (issue 22): a screen of two changes at Hopper-v4 350 labels, 16 runs at once as daemons, one per core:
# --selection random (grid hopper350_random.json, seeds 1-10) and --reward-updates 64 (hopper350_updates64.json,
# seeds 1-6). Stopped with SIGTERM at $1 s (each run saves its checkpoint) and packed under $OUT without checkpoints,
# labels or TensorBoard files (the pace is read from run.log). A second call on the warm machine finds the saved runs in
# /tmp and resumes them. The runs are a screen: compared by pace (true return at the steps reached) with the default's
# runs of the same seeds, not finished to 1M steps.
T0=$(date +%s); STOP=${1:-500}
el() { echo $(( $(date +%s) - T0 )); }
exec > >(tee $OUT/dev.log) 2>&1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nproc; lscpu | grep -E 'Model name'; free -g | head -2
python3 -c "import gymnasium, mujoco, tyro, torch, numpy, matplotlib; print(gymnasium.__version__, mujoco.__version__, torch.__version__, numpy.__version__)" || exit 1
git log --oneline -1; git status --short | head
start() { setsid nohup python3 benchmark/sweep.py local "$@" > /tmp/sw_$(date +%N).log 2>&1 < /dev/null & echo $! >> /tmp/sw.pids; }
rm -f /tmp/sw.pids
start benchmark/grids/hopper350_random.json --workers 10 --out /tmp/sw/random
start benchmark/grids/hopper350_updates64.json --seeds 1 2 3 4 5 6 --workers 6 --out /tmp/sw/updates64
echo "started at t=$(el)"
while [ $(el) -lt $STOP ]; do
  sleep 30
  echo "t=$(el) load $(cut -d' ' -f1-3 /proc/loadavg) | $(grep -hv '^#' /tmp/sw/*/*/run.log 2>/dev/null | tail -1 | cut -c1-140)"
done
kill -TERM $(cat /tmp/sw.pids)
for i in $(seq 50); do alive=0; for p in $(cat /tmp/sw.pids); do kill -0 $p 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; sleep 1; done
echo "stopped after $i s, t=$(el)"; tail -n 3 /tmp/sw_*.log
for f in /tmp/sw/*/*/run.log; do echo "$(basename $(dirname $(dirname $f)))/$(basename $(dirname $f)): $(grep -v '^#' $f | tail -1 | cut -c1-150)"; done
tar czf $OUT/snap.tgz -C /tmp --exclude='*.tmp' --exclude='run.lock' --exclude='events.out.tfevents*' --exclude='*.pt' --exclude='labels.npz' sw
ls -la $OUT; echo "t=$(el)"
