#!/usr/bin/env python3
"""Goal 3 of issue #10 from a sweep's JSON (unicomm-bench -J): per collective and size, every
mode's time, the best fixed mode (every mode but auto) and auto's time over it, by the mean
time (nccl-tests' figure) and by the median iteration. Prints markdown tables and the sizes
where auto is over 1.03x.

usage: goal3.py SWEEP.json [--place out|in]
"""
import json
import sys

GOAL = 1.03


def main():
    path = sys.argv[1]
    place_in = len(sys.argv) > 3 and sys.argv[2] == "--place" and sys.argv[3] == "in"
    doc = json.load(open(path))
    cells = {}
    colls = []
    for r in doc["results"]:
        if r["inPlace"] != place_in:
            continue
        if r["collective"] not in colls:
            colls.append(r["collective"])
        cells.setdefault((r["collective"], r["size"]), {})[r["mode"]] = (
            r["time"], r["iterTime"]["p50"], r.get("hostBound", False))
    print(f"# {path}: {doc['library']['backend']} {doc['library']['version']}, "
          f"{doc['nranks']} ranks, {doc.get('order', 'one mode at every size')}")
    misses = []
    for coll in colls:
        sizes = sorted(s for c, s in cells if c == coll)
        modes = [m for m in ["plain", "registered", "window", "raw", "ce", "auto"]
                 if any(m in cells[(coll, s)] for s in sizes)]
        print(f"\n**{coll}** (time in us, `*` host-bound)\n")
        print("| size | " + " | ".join(modes) + " | best fixed | auto / best (mean) | (median) |")
        print("| ---: |" + " ---: |" * len(modes) + " --- | ---: | ---: |")
        for s in sizes:
            v = cells[(coll, s)]
            fixed = {m: t for m, t in v.items() if m != "auto"}
            row = [f"{v[m][0]:.2f}{'*' if v[m][2] else ''}" if m in v else "-" for m in modes]
            if not fixed or "auto" not in v:
                print(f"| {s} | " + " | ".join(row) + " | - | - | - |")
                continue
            best = min(fixed, key=lambda m: fixed[m][0])
            best_med = min(t[1] for t in fixed.values())
            r_mean = v["auto"][0] / fixed[best][0]
            r_med = v["auto"][1] / best_med
            flag = " **miss**" if r_mean > GOAL else ""
            if r_mean > GOAL:
                misses.append((coll, s, r_mean, r_med))
            print(f"| {s} | " + " | ".join(row) + f" | {best} | {r_mean:.3f}{flag} | {r_med:.3f} |")
    print(f"\nauto over {GOAL}x the best fixed mode (mean): {len(misses)} cells")
    for coll, s, a, b in misses:
        print(f"- {coll} {s} B: {a:.3f} (median {b:.3f})")


if __name__ == "__main__":
    main()
