"""README.md's code maps stay true: each row's line range starts at its anchor (the first line, after the previous
row's, that holds it) and ends where the next row starts; the map covers each script from `class Args` to the end."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def code_map(script):
    """The rows (first line, last line, anchor) of README's table under the heading "### Code map: `script`"."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(f"### Code map: `{script}`")
    rows = []
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        found = re.match(r"\| (\d+)-(\d+) \| `([^`]+)` \|", line)
        if found:
            rows.append((int(found[1]), int(found[2]), found[3]))
    return rows


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco.py", "rlhf_moving_dot.py", "rlhf_a2c_atari.py"])
def test_the_code_map_in_readme_points_at_the_lines_it_names(script):
    source = (ROOT / script).read_text().splitlines()
    rows = code_map(script)
    assert len(rows) >= 10 and rows[0][2] == "class Args"
    starts, line = [], 0
    for _, _, anchor in rows:
        line = next((i for i in range(line, len(source)) if anchor in source[i]), None)
        assert line is not None, f"README.md's code map of {script}: `{anchor}` is not in the script (after the row before)"
        starts.append(line + 1)
    expected = [(first, next_first - 1) for first, next_first in zip(starts, starts[1:] + [len(source) + 1])]
    fix = "\n".join(f"| {first}-{last} | `{anchor}` |" for (first, last), (_, _, anchor) in zip(expected, rows))
    assert [(first, last) for first, last, _ in rows] == expected, f"update README.md's code map of {script}:\n{fix}"
