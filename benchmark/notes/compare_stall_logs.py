"""Sets two outputs of notes/hopper_stall.py for the same runs side by side: per run (its "## NAME" header line), the
learned reward's fit on the forward velocity (a / b, R^2, correlation) in each, and whether the episode tables (length,
true return) are identical. Written to recheck the figures computed before hopper_stall.py's play recorded the
executed (clipped) actions (fortieth session): the episodes must be the same, only the learned reward's figures may
move.

    python benchmark/notes/compare_stall_logs.py NEW_LOG OLD_LOG [OLD_LOG ...]
"""

import re
import sys

FIT = re.compile(r"R\^2 ([\d.]+)\); a / b = (-?[\d.]+).*correlation with x velocity (-?[\d.]+)")
EPISODE = re.compile(r"^\| \d+ \| (\d+) \| \w+ \| (-?[\d.]+) \|")


def parse(path):
    """{run: {"fit": (R^2, a / b, correlation), "episodes": [(length, true return), ...]}}"""
    runs, name = {}, None
    for line in open(path):
        if line.startswith("## "):
            name = line.split()[1]
            runs[name] = {"fit": None, "episodes": []}
        elif name is not None and (fit := FIT.search(line)):
            runs[name]["fit"] = tuple(float(x) for x in fit.groups())
        elif name is not None and (episode := EPISODE.search(line)):
            runs[name]["episodes"].append(episode.groups())
    return runs


def main():
    new, old = parse(sys.argv[1]), {}
    for path in sys.argv[2:]:
        old.update(parse(path))
    print("| run | a / b before | after | R^2 before | after | correlation before | after | episodes identical |")
    print("|---|---|---|---|---|---|---|---|")
    moves = []
    for name in sorted(new):
        if name not in old or new[name]["fit"] is None or old[name]["fit"] is None:
            print(f"| {name} | not in both logs with a fit | | | | | | |")
            continue
        (r2_new, ab_new, corr_new), (r2_old, ab_old, corr_old) = new[name]["fit"], old[name]["fit"]
        same = new[name]["episodes"] == old[name]["episodes"]
        print(f"| {name} | {ab_old} | {ab_new} | {r2_old} | {r2_new} | {corr_old} | {corr_new} | {same} |")
        moves.append((ab_new - ab_old, r2_new - r2_old, corr_new - corr_old, same))
    if moves:
        moves = list(zip(*moves))
        print(
            f"{len(moves[0])} runs: a / b moved {min(moves[0]):+.2f} to {max(moves[0]):+.2f} (up in "
            f"{sum(m > 0 for m in moves[0])}), R^2 {min(moves[1]):+.2f} to {max(moves[1]):+.2f}, correlation "
            f"{min(moves[2]):+.2f} to {max(moves[2]):+.2f}; episodes identical in {sum(moves[3])}"
        )


if __name__ == "__main__":
    main()
