"""One-off (2026-11-26, notes/device_batch.md): the run.logs of the HalfCheetah-v4 seeds 6-9 batch hold the progress
lines of two processes of the same run, interleaved (a second sweep resumed each run from an older checkpoint while
the first process still ran). Each process's lines are a sequence 2,048 steps apart; a line continuing both sequences
goes to the one whose steps/s it is nearer (the second ran at about half the first's). Keeps the first process's lines
up to its checkpoint (step 512,000), drops the rest, and says so in a `# device batch:` line.

Usage: python clean_device_log.py RUN_FOLDER/run.log ...   (rewrites each log in place)
"""

import re
import sys
from pathlib import Path

PROGRESS = re.compile(r"step (\d+), SPS (\d+)")
CHECKPOINT_STEP = 512_000


def step_and_sps(line):
    match = PROGRESS.match(line)
    return (int(match[1]), int(match[2])) if match else None


def clean(path, keep_to=CHECKPOINT_STEP):
    lines = Path(path).read_text().splitlines(keepends=True)
    second_start = next(i for i, line in enumerate(lines) if " UTC, resumed: " in line)
    before, after = lines[:second_start], lines[second_start + 1 :]
    first_last = [step_and_sps(line)[0] for line in before if step_and_sps(line)][-1]
    resume_line = next(line for line in after if line.startswith("resumed "))
    second_from = int(re.search(r"at step (\d+)", resume_line)[1])
    last = {"first": (first_last, 800), "second": (second_from, 400)}  # (last step, last steps/s) of each process
    kept, dropped = [], 0
    for line in after:
        progress = step_and_sps(line)
        if progress is None:  # the resume's own lines, saves, warnings: not attributable, dropped
            dropped += 1
            continue
        step, sps = progress
        owners = [name for name, (last_step, _) in last.items() if last_step + 2048 == step]
        if len(owners) == 2:
            owners = [min(owners, key=lambda name: abs(last[name][1] - sps))]
        assert len(owners) == 1, (path, line)
        last[owners[0]] = (step, sps)
        if owners[0] == "first" and step <= keep_to:
            kept.append(line)
        else:
            dropped += 1
    assert last["first"][0] >= keep_to, (path, last)
    past_checkpoint = [line for line in before if step_and_sps(line) and step_and_sps(line)[0] > keep_to]
    before = [line for line in before if line not in past_checkpoint]
    dropped += len(past_checkpoint)
    last_kept = [line for line in before + kept if step_and_sps(line)][-1]
    assert step_and_sps(last_kept)[0] == keep_to, (path, last_kept)
    note = (
        f"# device batch: a second sweep resumed this run from step {second_from} while the first process still ran; "
        f"its lines and the first process's after its checkpoint at step {keep_to} removed ({dropped} lines)\n"
    )
    Path(path).write_text("".join(before + kept + [note]))
    print(path, "kept", len(kept), "dropped", dropped, "first to", last["first"][0], "second to", last["second"][0])


if __name__ == "__main__":
    for log_path in sys.argv[1:]:
        clean(log_path)
