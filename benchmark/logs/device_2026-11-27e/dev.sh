#!/bin/bash
# one device call (issue 22): the C17 grid's labelled runs with the action-clipping fix (grid c17_clipfix.json), Ant-v4 350, 700 and 1400 labels seeds 1-3, Walker2d-v4 700 labels seeds 1-5 and 350 labels seeds 5-6:
# 16 runs at once as daemons, stopped with SIGTERM at $1 s (each run saves its checkpoint), packed under $OUT
# (TensorBoard files left out: the report reads run.log) in 15 MB parts, for finishing on the development machine with
# the same commands. A second call on the warm machine finds the saved runs in /tmp/sw and resumes them.
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
start benchmark/grids/c17_clipfix.json --envs Ant-v4 --feedback 350 700 1400 --seeds 1 2 3 --workers 9 --out /tmp/sw/c17_clipfix
start benchmark/grids/c17_clipfix.json --envs Walker2d-v4 --feedback 700 --seeds 1 2 3 4 5 --workers 5 --out /tmp/sw/c17_clipfix
start benchmark/grids/c17_clipfix.json --envs Walker2d-v4 --feedback 350 --seeds 5 6 --workers 2 --out /tmp/sw/c17_clipfix
echo "started at t=$(el)"
while [ $(el) -lt $STOP ]; do
  sleep 30
  echo "t=$(el) load $(cut -d' ' -f1-3 /proc/loadavg) | $(grep -hv '^#' /tmp/sw/*/*/run.log 2>/dev/null | tail -1 | cut -c1-140)"
done
kill -TERM $(cat /tmp/sw.pids)
for i in $(seq 50); do alive=0; for p in $(cat /tmp/sw.pids); do kill -0 $p 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; sleep 1; done
echo "stopped after $i s, t=$(el)"; tail -n 3 /tmp/sw_*.log
for f in /tmp/sw/*/*/run.log; do echo "$(basename $(dirname $(dirname $f)))/$(basename $(dirname $f)): $(grep -v '^#' $f | tail -1 | cut -c1-150)"; done
tar czf /tmp/snap.tgz -C /tmp --exclude='*.tmp' --exclude='run.lock' --exclude='events.out.tfevents*' sw; split -b 15M /tmp/snap.tgz /tmp/snap.tgz.part_; ls -la /tmp/snap.tgz.part_*; cp /tmp/snap.tgz.part_a[a-d] $OUT/  # any further parts: a third call, cp /tmp/snap.tgz.part_a[e-z] $OUT/
ls -la $OUT; echo "t=$(el)"
