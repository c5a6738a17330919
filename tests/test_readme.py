"""README.md's code maps stay true: each row's line range starts at its anchor (the first line, after the previous
row's, that holds it) and ends where the next row starts; the map covers each script from `class Args` to the end.
And the documentation's links lead somewhere: every relative link names a file that exists, every `#anchor` a heading
of the file it points into."""

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


DOCS = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "benchmark").rglob("*.md"))]


def heading_anchors(path):
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading's anchor numbered -1, -2, ...; lines inside code fences are not headings."""
    anchors, seen, in_code = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not in_code:
            anchor = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            anchors.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
            seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_leads_to_a_file_and_heading(doc):
    path = ROOT / doc
    broken = []
    for target, anchor in re.findall(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        linked = (path.parent / target).resolve() if target else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            broken.append(f"{target}#{anchor}: no such heading in {linked}")
    assert not broken, f"{doc}: " + "; ".join(broken)
