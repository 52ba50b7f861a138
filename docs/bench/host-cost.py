#!/usr/bin/env python3
"""Host cost per call, before against after: for runs of `unicomm-bench --order size` at
host-bound sizes (every row `hostBound`), the median over sizes and runs of each mode's
mean time per call, per collective and build, and the ratios that goal 3 turns on: auto
over the mode its policy picks there, and each mode over raw NCCL.

    python3 docs/bench/host-cost.py DIR     # DIR holds bench-<build>-<n>.json
"""
import glob
import json
import os
import statistics
import sys

# What the built-in policy picks below 1 MiB (nccl-api/src/policy.rs, DEFAULTS).
PICKED = {"all_reduce": "window", "all_to_all": "registered", "all_gather": "registered"}


def load(d):
    runs = {}
    for f in sorted(glob.glob(os.path.join(d, "bench-*-*.json"))):
        build = os.path.basename(f).split("-")[1]
        runs.setdefault(build, []).append(json.load(open(f)))
    return runs


def main(d):
    runs = load(d)
    builds = sorted(runs, key=lambda b: (b != "old", b))
    print("| collective | build | raw | plain | registered | window | auto | auto / picked | plain / raw | auto / raw | host-bound rows |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for coll in ["all_reduce", "all_to_all", "all_gather"]:
        for b in builds:
            t = {}  # mode -> [time per (run, size)]
            ratio = {"picked": [], "plain": [], "auto": []}
            bound = total = 0
            for doc in runs[b]:
                rows = [r for r in doc["results"] if r["collective"] == coll and not r["inPlace"]]
                by = {}
                for r in rows:
                    by.setdefault(r["size"], {})[r["mode"]] = r["time"]
                    t.setdefault(r["mode"], []).append(r["time"])
                    bound += r["hostBound"]
                    total += 1
                for size, m in by.items():
                    ratio["picked"].append(m["auto"] / m[PICKED[coll]])
                    ratio["plain"].append(m["plain"] / m["raw"])
                    ratio["auto"].append(m["auto"] / m["raw"])
            med = {m: statistics.median(v) for m, v in t.items()}
            print(
                f"| {coll} | {b} | "
                + " | ".join(f"{med[m]:.2f}" for m in ["raw", "plain", "registered", "window", "auto"])
                + f" | {statistics.median(ratio['picked']):.3f} | {statistics.median(ratio['plain']):.3f}"
                + f" | {statistics.median(ratio['auto']):.3f} | {bound}/{total} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
