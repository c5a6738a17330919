#!/usr/bin/env bash
# Speed benchmark: steps/s of RLHF (synthetic labels) over steps/s of the true-reward mode, the two run side by side
# (one per core) on the same machine, repeated; also the peak resident memory of each run.
# Usage: [OUT=benchmark/logs/FOLDER] bash benchmark/run_speed.sh [ENV] [STEPS] [REPEATS] [LABELS]   (from the repository root)
set -euo pipefail
env_id=${1:-Hopper-v4}
steps=${2:-102400}
repeats=${3:-3}
labels=${4:-1400}
out=${OUT:-benchmark/logs/speed}  # OUT=folder keeps earlier logs
mkdir -p "$out"
for r in $(seq 1 "$repeats"); do
  for mode in true-reward synthetic; do
    /usr/bin/time -f "peak_rss_kb %M" python rlhf_ppo_mujoco.py --env "$env_id" --total-timesteps "$steps" \
      --seed "$r" --feedback "$mode" --labels "$labels" --exp-name "speed_${mode}" > "$out/${mode}_${r}.log" 2>&1 &
  done
  wait
done
python - "$out" "$repeats" <<'PY'
import re, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def final(mode, r, pattern):
    text = open(f"{out}/{mode}_{r}.log").read()
    return float(re.findall(pattern, text)[-1])
rows = []
for r in range(1, repeats + 1):
    true_sps, rlhf_sps = (final(m, r, r"SPS (\d+)") for m in ("true-reward", "synthetic"))
    true_mb, rlhf_mb = (final(m, r, r"peak_rss_kb (\d+)") / 1024 for m in ("true-reward", "synthetic"))
    rows.append((r, true_sps, rlhf_sps, rlhf_sps / true_sps, true_mb, rlhf_mb))
print("| repeat | true-reward SPS | RLHF SPS | ratio | true-reward peak MB | RLHF peak MB |")
print("|---|---|---|---|---|---|")
for r, t, h, ratio, tm, hm in rows:
    print(f"| {r} | {t:.0f} | {h:.0f} | {ratio:.3f} | {tm:.0f} | {hm:.0f} |")
print(f"median ratio RLHF/true-reward: {statistics.median(row[3] for row in rows):.3f}")
print(f"max RLHF peak memory: {max(row[5] for row in rows):.0f} MB")
PY
