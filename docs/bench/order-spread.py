#!/usr/bin/env python3
"""How far apart the modes of one run are, per size: for each run's JSON (unicomm-bench -J),
per (collective, size) the slowest mode's time over the fastest's, and plain over raw (the
same NCCL calls with and without unicomm's layer). On a world of one GPU every mode is
host-bound, so the spread measures how well the order of the measurements cancels a
shared host's slow phases.

usage: order-spread.py RUN.json [RUN.json ...]
"""
import json
import statistics as st
import sys


def spread(path, key):
    doc = json.load(open(path))
    cells = {}
    for r in doc["results"]:
        v = r["time"] if key == "time" else r["iterTime"]["p50"]
        cells.setdefault((r["collective"], r["size"], r["inPlace"]), {})[r["mode"]] = v
    modes, plain_raw = [], []
    for v in cells.values():
        modes.append(max(v.values()) / min(v.values()))
        if "plain" in v and "raw" in v:
            plain_raw.append(max(v["plain"], v["raw"]) / min(v["plain"], v["raw"]))
    return doc.get("order", "one mode at every size, then the next"), modes, plain_raw


def p90(v):
    return sorted(v)[int(0.9 * len(v))] if v else float("nan")


for key in ("time", "p50"):
    by_order = {}
    for path in sys.argv[1:]:
        order, modes, pr = spread(path, key)
        print(f"{key:4} {path}: all modes median {st.median(modes):.3f} max {max(modes):.3f}"
              + (f" | plain/raw median {st.median(pr):.3f} max {max(pr):.3f}" if pr else ""))
        o = by_order.setdefault(order, ([], []))
        o[0].extend(modes)
        o[1].extend(pr)
    for order, (modes, pr) in by_order.items():
        print(f"  {key} [{order}]: all modes median {st.median(modes):.3f} p90 {p90(modes):.3f}"
              + (f" | plain/raw median {st.median(pr):.3f} p90 {p90(pr):.3f}" if pr else ""))
