"""README.md's code maps stay true: each row's line range starts at its anchor (the first line, after the previous
row's, that holds it) and ends where the next row starts; the map covers each script from `class Args` to the end."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def code_map(script):
    """The rows (first line, last line, anchor, what) of README's table under the heading "### Code map: `script`"."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(f"### Code map: `{script}`")
    rows = []
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        found = re.match(r"\| (\d+)-(\d+) \| `([^`]+)` \|([^|]*)\|", line)
        if found:
            rows.append((int(found[1]), int(found[2]), found[3], found[4]))
    return rows


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco.py", "rlhf_moving_dot.py", "rlhf_a2c_atari.py"])
def test_the_code_map_in_readme_points_at_the_lines_it_names(script):
    source = (ROOT / script).read_text().splitlines()
    rows = code_map(script)
    assert len(rows) >= 10 and rows[0][2] == "class Args"
    starts, line = [], 0
    for _, _, anchor, _ in rows:
        line = next((i for i in range(line, len(source)) if anchor in source[i]), None)
        assert line is not None, f"README.md's code map of {script}: `{anchor}` is not in the script (after the row before)"
        starts.append(line + 1)
    expected = [(first, next_first - 1) for first, next_first in zip(starts, starts[1:] + [len(source) + 1])]
    fix = "\n".join(f"| {first}-{last} | `{anchor}` |" for (first, last), (_, _, anchor, _) in zip(expected, rows))
    assert [(first, last) for first, last, _, _ in rows] == expected, f"update README.md's code map of {script}:\n{fix}"


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco.py", "rlhf_moving_dot.py", "rlhf_a2c_atari.py"])
def test_every_name_a_code_map_row_gives_is_in_its_script(script):
    source = (ROOT / script).read_text()
    for _, _, _, what in code_map(script):
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", what):
            assert re.search(rf"\b{re.escape(name)}\b", source), f"README.md's code map of {script}: `{name}` is not in it"
