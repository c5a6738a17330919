#!/usr/bin/env bash
# One device call (2026-12-04): the tests of the scripts where they run on CUDA (rlhf_a2c_atari.py by default, and
# rlhf_ppo_mujoco.py's --cuda case) on a GPU, every line of pytest's output kept under $OUT (the 2026-11-30 call kept
# only its last 40 lines: six failures and a dead worker, unnamed); first, a tiny labelled Atari run on the GPU whose
# run folder comes back, to resume on a CPU machine. Needs .whl/ (the wheels below, Python 3.12; imageio-ffmpeg is too
# large to carry, so the tests that film fail there for want of ffmpeg: told apart in the log).
set -u
T0=$(date +%s)
REPO=$(pwd)
say() { echo "[t+$(($(date +%s) - T0))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
say installed
nproc; python3 --version; command -v ffmpeg || echo "no ffmpeg"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
mkdir -p /tmp/gpu && cd /tmp/gpu || exit 1
say "a tiny labelled Atari run on the GPU (the tests' TINY flags), saved"
timeout 120 python3 "$REPO/rlhf_a2c_atari.py" --total-timesteps 1200 --num-envs 2 --round-steps 100 --pretrain-steps 400 \
  --labels 12 --pretrain-labels 6 --segment-len 5 --pretrain-epochs 2 --reward-batch-size 4 --reward-train-every 4 \
  --reward-eval-every 2 --reward-eval-labels 8 --log-every 10 --noop-max 2 --threads 1 --save-model \
  --exp-name gpu_made > "$OUT/atari_gpu_run.log" 2>&1
echo "rc $?"; tail -3 "$OUT/atari_gpu_run.log"
tar -czf "$OUT/atari_gpu_run.tgz" runs && ls -la "$OUT"
cd "$REPO" || exit 1
say "tests on the GPU, 12 workers"
timeout "${TESTS_S:-400}" python3 -m pytest -n 12 -rfE -p no:cacheprovider --durations=15 tests/test_a2c_atari.py \
  tests/test_ppo_mujoco_units.py tests/test_ppo_mujoco_runs.py > "$OUT/pytest.log" 2>&1
echo "pytest rc $?"
grep -E "^(FAILED|ERROR)|passed|failed|node down" "$OUT/pytest.log" | tail -40
say done
