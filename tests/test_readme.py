"""README.md's code maps stay true: each row's line range starts at its anchor (the first line, after the previous
row's, that holds it) and ends where the next row starts; the map covers each script from `class Args` to the end.
And the documentation's links lead somewhere: every relative link names a file that exists, every `#anchor` a heading
of the file it points into. And each default in README's flag tables is the one the script's Args has."""

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


# README's words for a default, and what each means in Args
DEFAULT_WORDS = {"on": True, "off": False, "none": None, "": None}
# a row whose flags share one default told in words: each flag's default in Args (B-Pref's perfect teacher: it always
# prefers the higher return, no noise, no myopia, skips nothing, calls no pair equal)
SHARED_DEFAULTS = {
    "perfect teacher": {
        "teacher_beta": float("inf"),
        "teacher_gamma": 1.0,
        "teacher_epsilon": 0.0,
        "teacher_skip_threshold": float("-inf"),
        "teacher_equal_margin": 0.0,
    }
}
# defaults Args leaves None and the script fills in at run time, told in README as what they become (that the script
# fills them so is not checked here)
FILLED_AT_RUN_TIME = {("rlhf_moving_dot.py", "preference_db"): "runs/NAME/preferences.sqlite"}


def flag_rows(script):
    """(flag names as Args fields, README's default cell) of each row of the table under "### `script`" in "## Flags"
    whose first cell names flags."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(f"### `{script}`", lines.index("## Flags"))
    rows = []
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `--"):
            rows.append(([flag.replace("-", "_") for flag in re.findall(r"`--([a-z0-9-]+)", cells[0])], cells[1]))
    return rows


def readme_value(word):
    """A default as README writes it (`text`, "text", a number, on/off/none) as a Python value."""
    word = word.strip()
    if word.lower() in DEFAULT_WORDS:
        return DEFAULT_WORDS[word.lower()]
    if word[:1] in '`"' and word[-1:] == word[:1]:
        return word[1:-1]
    try:
        return float(word)
    except ValueError:
        return word


@pytest.mark.parametrize("script", ["rlhf_ppo_mujoco.py", "rlhf_moving_dot.py", "rlhf_a2c_atari.py"])
def test_every_default_in_readmes_flag_tables_is_the_scripts(script):
    module = __import__(script.removesuffix(".py"))
    defaults = vars(module.Args())
    rows = flag_rows(script)
    assert len(rows) >= 10
    for flags, cell in rows:
        where = f"README.md's flag table of {script}, the row of {', '.join('--' + f.replace('_', '-') for f in flags)}"
        if cell in SHARED_DEFAULTS:
            assert {flag: defaults[flag] for flag in flags} == SHARED_DEFAULTS[cell], where
            continue
        words = cell.split(",") if len(flags) > 1 else [cell]
        assert len(words) == len(flags), f"{where}: {len(flags)} flags, defaults {cell!r}"
        for flag, word in zip(flags, words):
            assert flag in defaults, f"{where}: the script has no --{flag.replace('_', '-')}"
            documented, actual = readme_value(word), defaults[flag]
            if actual is None and (script, flag) in FILLED_AT_RUN_TIME:
                actual = FILLED_AT_RUN_TIME[script, flag]
            assert documented == actual, f"{where}: README says {word.strip()!r}, the script's default is {actual!r}"
