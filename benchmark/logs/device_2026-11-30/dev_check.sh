#!/usr/bin/env bash
# Second device call (2026-11-30): rlhf_a2c_atari.py's tests on the GPU after the device fix, then Pong's steps/s.
set -u
T0=$(date +%s)
say() { echo "[t+$(($(date +%s) - T0))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
git log --oneline -1 2> /dev/null; nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
say "tests of rlhf_a2c_atari.py (CUDA where the scripts run), 8 workers; the video test left out (no ffmpeg here)"
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_a2c_atari.py -k "not captures_video" \
  tests/test_ppo_mujoco_units.py 2>&1 | tail -40
say "tests done"
timeout 125 python3 benchmark/atari_speed_alone.py --steps 16000 --repeats 2 --logs /tmp/speed
say "speed done"
tar -czf "$OUT/speed.tgz" /tmp/speed 2> /dev/null; ls -la "$OUT"
