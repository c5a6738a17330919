#!/usr/bin/env bash
# Second device call (2026-12-04), after the fix of a reward model's dropout stream saved on another kind of device:
# a tiny labelled Atari run made on the CPU (CUDA hidden), resumed on the GPU; then rlhf_a2c_atari.py's tests on the
# GPU with a line per test (-v), so that a call cut off by its time limit still names what failed.
set -u
T0=$(date +%s)
REPO=$(pwd)
say() { echo "[t+$(($(date +%s) - T0))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
git log --oneline -1 2> /dev/null
mkdir -p /tmp/cpu && cd /tmp/cpu || exit 1
say "a tiny labelled Atari run on the CPU (CUDA hidden), saved"
TINY="--total-timesteps 1200 --num-envs 2 --round-steps 100 --pretrain-steps 400 --labels 12 --pretrain-labels 6
  --segment-len 5 --pretrain-epochs 2 --reward-batch-size 4 --reward-train-every 4 --reward-eval-every 2
  --reward-eval-labels 8 --log-every 10 --noop-max 2 --threads 1"
CUDA_VISIBLE_DEVICES= timeout 100 python3 "$REPO/rlhf_a2c_atari.py" $TINY --save-model --exp-name cpu_made 2>&1 | tail -2
say "resumed on the GPU"
timeout 100 python3 "$REPO/rlhf_a2c_atari.py" --resume runs/PongNoFrameskip-v4__cpu_made__1__* 2>&1 | grep -v -i warn | tail -5
echo "rc ${PIPESTATUS[0]}"
cd "$REPO" || exit 1
say "rlhf_a2c_atari.py's tests on the GPU, 14 workers"
timeout "${TESTS_S:-240}" python3 -m pytest -n 14 -v --tb=short -rfE -p no:cacheprovider tests/test_a2c_atari.py \
  > "$OUT/pytest_atari.log" 2>&1
echo "pytest rc $?"
grep -E " (FAILED|ERROR) |passed|failed|node down" "$OUT/pytest_atari.log" | tail -40
say done
