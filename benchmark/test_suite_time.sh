#!/usr/bin/env bash
# The test suite's time with the scripts started from a zygote (tests/warm_start.py, the default) over its time with
# every run started cold (RLHF_TESTS_COLD=1), the two alternated (cold first in odd repeats, warm first in even ones),
# each the whole of README's test command; also the CPU time the machine spent in each (from /proc/stat: every process,
# the zygotes' runs included, which pytest's own rusage misses).
# Usage: [OUT=benchmark/logs/FOLDER] bash benchmark/test_suite_time.sh [REPEATS]   (from the repository root, in the
# virtual environment, with nothing else running). A suite whose log in FOLDER is complete is not run again, so a
# second call after an interruption runs only what is left, then prints the table.
set -euo pipefail
repeats=${1:-2}
out=${OUT:-benchmark/logs/test_suite_time}
mkdir -p "$out"
export MUJOCO_GL=egl
busy_seconds() {  # CPU seconds spent by the whole machine since boot (user, nice, system, irq, softirq)
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2 + $3 + $4 + $7 + $8) / hz}' /proc/stat
}
for r in $(seq 1 "$repeats"); do
  if [ $((r % 2)) -eq 1 ]; then order="cold warm"; else order="warm cold"; fi
  for mode in $order; do
    cold=$([ "$mode" = cold ] && echo 1 || echo 0)
    if grep -q '^wall_s ' "$out/${mode}_${r}.log" 2>/dev/null; then continue; fi  # measured by an earlier call
    cpu_before=$(busy_seconds)
    started=$(date +%s.%N)
    RLHF_TESTS_COLD=$cold python -m pytest -n 3 tests -q -p no:cacheprovider > "$out/${mode}_${r}.log" 2>&1 || true
    ended=$(date +%s.%N)
    cpu_after=$(busy_seconds)
    echo "wall_s $(awk "BEGIN{print $ended - $started}") cpu_s $(awk "BEGIN{print $cpu_after - $cpu_before}")" >> "$out/${mode}_${r}.log"
  done
done
python - "$out" "$repeats" <<'PY'
import re, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def figures(mode, r):
    text = open(f"{out}/{mode}_{r}.log").read()
    wall, cpu = map(float, re.search(r"wall_s ([\d.]+) cpu_s ([\d.]+)", text).groups())
    summary = re.findall(r"^=* ?(\d+ (?:passed|failed).*?) in [\d.]+s", text, re.M)[-1]  # pytest -q: no "=" around it
    return wall, cpu, summary
print("| repeat | cold wall s | warm wall s | warm/cold wall | cold CPU s | warm CPU s | warm/cold CPU | cold tests | warm tests |")
print("|---|---|---|---|---|---|---|---|---|")
walls, cpus = [], []
for r in range(1, repeats + 1):
    (cw, cc, cs), (ww, wc, ws) = figures("cold", r), figures("warm", r)
    walls.append(ww / cw), cpus.append(wc / cc)
    print(f"| {r} | {cw:.0f} | {ww:.0f} | {ww / cw:.3f} | {cc:.0f} | {wc:.0f} | {wc / cc:.3f} | {cs} | {ws} |")
print(f"median warm/cold: wall {statistics.median(walls):.3f}, CPU {statistics.median(cpus):.3f}")
PY
