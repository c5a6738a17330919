#!/usr/bin/env bash
# Speed against CleanRL: whole-process wall time of CleanRL's ppo_continuous_action.py (true reward) and of
# rlhf_ppo_mujoco.py in both modes (true reward; 1400 synthetic labels), the same steps on the same machine, one
# process at a time, alternating, repeated; then the medians and their ratios.
# Usage: [OUT=benchmark/logs/FOLDER] bash benchmark/speed_vs_cleanrl.sh [ENV] [STEPS] [REPEATS] [FLAGS FOR OURS...]
# (from the repository root). Flags after the third argument go to both modes of rlhf_ppo_mujoco.py, e.g.
# `bash benchmark/speed_vs_cleanrl.sh Hopper-v4 102400 3 --num-envs 4 --num-steps 512`. With BASE=REV (a git revision)
# both modes of rlhf_ppo_mujoco.py as it was at REV run too, each beside its counterpart in every repeat: a change's
# speed against the code before it, measured in the same run.
#
# CleanRL's script comes from the cleanrl 1.2.0 wheel on PyPI (pip download --no-deps; the wheel declares Python < 3.11,
# hence --python-version 3.10; only this one file is used, with this project's packages) into benchmark/.cleanrl/,
# patched by benchmark/cleanrl_gymnasium1.patch only where gymnasium 1.x requires it: TransformObservation takes the
# observation space, the vector env resets in the same step (as the script's GAE assumes), and final_info is a dict
# with an _episode mask. CleanRL leaves torch's thread count at its default; so does this benchmark. That file is the
# argparse version of 1.2.0; CleanRL's master has moved to tyro, with the same algorithm: rlhf_ppo_mujoco.py follows
# master, so diff it against master's cleanrl/ppo_continuous_action.py. Needs `patch`, GNU time (/usr/bin/time) and a
# Python below 3.12 (the 1.2.0 file imports distutils). CLEANRL=skip leaves CleanRL out: only our two modes, for the
# RLHF mode's speed over the true-reward mode at run lengths where three CleanRL runs would double the benchmark.
set -euo pipefail
env_id=${1:-Hopper-v4}
steps=${2:-102400}
repeats=${3:-3}
shift $(($# < 3 ? $# : 3))
extra=("$@")
out=${OUT:-benchmark/logs/speed_vs_cleanrl}
base=${BASE:-}
cleanrl=benchmark/.cleanrl
for tool in patch /usr/bin/time; do
  command -v "$tool" > /dev/null || { echo "error: $tool is missing (apt-get install -y patch time)" >&2; exit 1; }
done
mkdir -p "$out"
with_cleanrl=$([ "${CLEANRL:-}" = skip ] && echo no || echo yes)
runs=(true-reward synthetic)
[ "$with_cleanrl" = yes ] && runs=(cleanrl "${runs[@]}")
if [ -n "$base" ]; then  # the script at REV, a single file, beside the working tree's
  mkdir -p benchmark/.base && git show "$base:rlhf_ppo_mujoco.py" > benchmark/.base/rlhf_ppo_mujoco.py
  runs+=(base-true-reward base-synthetic)
fi

if [ "$with_cleanrl" = yes ] && [ ! -f "$cleanrl/ppo_continuous_action.py" ]; then
  rm -rf "$cleanrl.tmp" && mkdir -p "$cleanrl.tmp"  # set up in a scratch folder, moved in place only when complete
  pip download cleanrl==1.2.0 --no-deps --python-version 3.10 --only-binary=:all: -d "$cleanrl.tmp" -q
  python -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('cleanrl/ppo_continuous_action.py'))" \
    "$cleanrl.tmp/cleanrl-1.2.0-py3-none-any.whl" "$cleanrl.tmp/ppo_continuous_action.py"
  patch -s -d "$cleanrl.tmp" -p1 < benchmark/cleanrl_gymnasium1.patch
  rm -rf "$cleanrl" && mv "$cleanrl.tmp" "$cleanrl"
fi

timed() {  # timed LOG COMMAND...: the command's output, then its wall time, CPU time and peak memory, in LOG
  /usr/bin/time -f "wall_s %e cpu_s %U %S peak_rss_kb %M" "${@:2}" > "$1" 2>&1
}
for r in $(seq 1 "$repeats"); do
  [ "$with_cleanrl" = yes ] && timed "$out/cleanrl_$r.log" bash -c "cd $cleanrl && exec python ppo_continuous_action.py --env-id $env_id \
    --total-timesteps $steps --seed $r --cuda False"
  for mode in true-reward synthetic; do  # with BASE: REV's run, then the working tree's, mode by mode
    flags=(--feedback true-reward --exp-name speed_true)
    [ "$mode" = synthetic ] && flags=(--feedback synthetic --labels 1400 --exp-name speed_rlhf)
    for prefix in ${base:+base-} ""; do
      script=rlhf_ppo_mujoco.py
      [ "$prefix" = base- ] && script=benchmark/.base/rlhf_ppo_mujoco.py
      timed "$out/$prefix${mode}_$r.log" python "$script" --env "$env_id" --total-timesteps "$steps" --seed "$r" \
        "${flags[@]}" "${extra[@]}"
    done
  done
done
rm -rf "$cleanrl/runs"

python - "$out" "$repeats" "$steps" "${runs[@]}" <<'PY'
import re, statistics, sys
out, repeats, steps, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def figures(run, r):
    text = open(f"{out}/{run}_{r}.log").read()
    wall, user, system, rss = re.findall(r"wall_s ([\d.]+) cpu_s ([\d.]+) ([\d.]+) peak_rss_kb (\d+)", text)[-1]
    sps = re.findall(r"SPS:? (\d+)", text)[-1]  # the script's own figure: steps over time since the first step
    return {"wall": float(wall), "cpu": float(user) + float(system), "rss_mb": int(rss) / 1024, "sps": int(sps)}
table = {(run, r): figures(run, r) for run in runs for r in range(1, repeats + 1)}
print(f"steps per run: {steps}; steps/s below = steps / whole-process wall time")
print("| repeat | " + " | ".join(f"{run}: wall s, steps/s, CPU s, peak MB" for run in runs) + " |")
print("|---|" + "---|" * len(runs))
for r in range(1, repeats + 1):
    cells = [table[run, r] for run in runs]
    print(f"| {r} | " + " | ".join(f"{c['wall']:.1f}, {steps / c['wall']:.0f}, {c['cpu']:.1f}, {c['rss_mb']:.0f}" for c in cells) + " |")
median = {run: statistics.median(table[run, r]["wall"] for r in range(1, repeats + 1)) for run in runs}
sps = {run: statistics.median(table[run, r]["sps"] for r in range(1, repeats + 1)) for run in runs}
print(f"median wall time: " + ", ".join(f"{run} {median[run]:.1f} s" for run in runs))
if "cleanrl" in runs:
    print(f"whole-process steps/s over CleanRL's: true-reward {median['cleanrl'] / median['true-reward']:.2f}x, "
          f"synthetic {median['cleanrl'] / median['synthetic']:.2f}x")
print(f"whole-process steps/s, synthetic over true-reward: {median['true-reward'] / median['synthetic']:.2f}")
print(f"the scripts' own SPS (after start-up), medians: " + ", ".join(f"{run} {sps[run]:.0f}" for run in runs)
      + f"; synthetic over true-reward {sps['synthetic'] / sps['true-reward']:.2f}"
      + (f"; true-reward over CleanRL {sps['true-reward'] / sps['cleanrl']:.2f}x" if "cleanrl" in runs else ""))
if "base-synthetic" in runs:
    print(f"against the base revision's script (whole-process steps/s, new over base): true-reward "
          f"{median['base-true-reward'] / median['true-reward']:.3f}x, synthetic {median['base-synthetic'] / median['synthetic']:.3f}x; "
          f"base synthetic over base true-reward {median['base-true-reward'] / median['base-synthetic']:.2f}")
PY
