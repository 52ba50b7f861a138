#!/usr/bin/env python3
"""How goal 3's ratio behaves where it cannot tell the paths apart: over a sweep's
host-bound cells (out of place, `hostBound` rows), auto's time over the best fixed mode's,
with the issue's fixed modes (plain, registered, window, raw, ce) and with the by-hand modes
(raw-registered, raw-window) added. Run on a world of one, where every path is the same
single-rank copy and every row is host-bound, it gives the ratio's floor on that host: what
unicomm's per-call time and the minimum over several noisy modes make of a tie.

    python3 docs/bench/goal3-floor.py SWEEP.json [...]
"""
import json
import os
import statistics as st
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from goal3 import BY_HAND, MODES  # noqa: E402  (the sweep's modes, as goal3.py names them)

ALL = [m for m in MODES if m != "auto"]
# The issue's fixed modes: every one but the by-hand modes added in round 12 (raw stays).
ISSUE = [m for m in ALL if m not in BY_HAND or m == "raw"]


def main(paths):
    print("| sweep | fixed modes | host-bound cells | auto over 1.03x (mean) | (median iteration) | median ratio | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for f in paths:
        doc = json.load(open(f))
        cells = {}
        for r in doc["results"]:
            if not r["inPlace"]:
                cells.setdefault((r["collective"], r["size"]), {})[r["mode"]] = r
        for label, fixed in (("the issue's", ISSUE), ("with by-hand", ALL)):
            mean, med = [], []
            for v in cells.values():
                fx = [v[m] for m in fixed if m in v]
                if "auto" not in v or len(fx) < 2 or not v["auto"].get("hostBound"):
                    continue
                mean.append(v["auto"]["time"] / min(r["time"] for r in fx))
                med.append(v["auto"]["iterTime"]["p50"] / min(r["iterTime"]["p50"] for r in fx))
            if mean:
                print(f"| {f} | {label} | {len(mean)} | {sum(x > 1.03 for x in mean)} | "
                      f"{sum(x > 1.03 for x in med)} | {st.median(mean):.3f} | {max(mean):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
