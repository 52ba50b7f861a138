#!/usr/bin/env python3
"""Goal 3 of issue #10 from a sweep's JSON (unicomm-bench -J): per collective and size, every
mode's time, the best fixed mode (every mode but auto) and auto's time over it, by the mean
time (nccl-tests' figure) and by the median iteration. Prints markdown tables and the sizes
where auto is over 1.03x. Where the run's tune file lies beside the JSON (nccl-tune.txt or
rccl-tune.txt, what UNICOMM_TUNE_FILE pointed to), each row also names the path auto took
by those rules (the library's rule: the first line of the collective whose bound is at
least the size), so a miss reads as a wrong choice (auto's path is not the best mode) or
as a cost of the same path (it is). Where the sweep has the by-hand modes (raw,
raw-registered, raw-window: the NCCL call through the function table on plain, registered
and window buffers), a last column gives auto over the best of them: auto against every way
of calling NCCL by hand.

usage: goal3.py SWEEP.json [--place out|in]
"""
import json
import os
import sys

GOAL = 1.03
PATH_MODE = {"window": "window", "registered": "registered", "ce": "ce"}
MODES = ["plain", "registered", "window", "raw", "raw-registered", "raw-window", "ce", "auto"]
BY_HAND = ("raw", "raw-registered", "raw-window")


def tune_rules(json_path):
    """The rules of the tune file beside the sweep's JSON: [(collective, bound, path)]."""
    d = os.path.dirname(os.path.abspath(json_path))
    for name in ("nccl-tune.txt", "rccl-tune.txt"):
        f = os.path.join(d, name)
        if os.path.exists(f):
            rules = []
            for line in open(f):
                fields = line.split("#")[0].split()
                if len(fields) == 3:
                    c, b, p = fields
                    rules.append((c, float("inf") if b == "max" else int(b), p))
            return f, rules
    return None, None


def auto_path(rules, coll, size):
    for c, bound, p in rules:
        if c == coll and size <= bound:
            return PATH_MODE.get(p, p)
    return "registered"


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
    tune, rules = tune_rules(path)
    if tune:
        print(f"# auto's path per row from {tune}")
    misses = []
    for coll in colls:
        sizes = sorted(s for c, s in cells if c == coll)
        modes = [m for m in MODES if any(m in cells[(coll, s)] for s in sizes)]
        hand = any(m in modes for m in BY_HAND[1:])
        print(f"\n**{coll}** (time in us, `*` host-bound)\n")
        took = " auto took |" if rules else ""
        by = " auto / best by hand |" if hand else ""
        print("| size | " + " | ".join(modes) + f" | best fixed |{took} auto / best (mean) | (median) |{by}")
        print("| ---: |" + " ---: |" * len(modes) + " --- |" + (" --- |" if rules else "") + " ---: | ---: |"
              + (" ---: |" if hand else ""))
        for s in sizes:
            v = cells[(coll, s)]
            fixed = {m: t for m, t in v.items() if m != "auto"}
            row = [f"{v[m][0]:.2f}{'*' if v[m][2] else ''}" if m in v else "-" for m in modes]
            if not fixed or "auto" not in v:
                print(f"| {s} | " + " | ".join(row) + " | - |" + (" - |" if rules else "") + " - | - |"
                      + (" - |" if hand else ""))
                continue
            best = min(fixed, key=lambda m: fixed[m][0])
            best_med = min(t[1] for t in fixed.values())
            r_mean = v["auto"][0] / fixed[best][0]
            r_med = v["auto"][1] / best_med
            flag = " **miss**" if r_mean > GOAL else ""
            p = auto_path(rules, coll, s) if rules else None
            if r_mean > GOAL:
                misses.append((coll, s, r_mean, r_med, p, best))
            cell = f" {p} |" if rules else ""
            by_hand = [v[m][0] for m in BY_HAND if m in v]
            by = (f" {v['auto'][0] / min(by_hand):.3f} |" if by_hand else " - |") if hand else ""
            print(f"| {s} | " + " | ".join(row) + f" | {best} |{cell} {r_mean:.3f}{flag} | {r_med:.3f} |{by}")
    print(f"\nauto over {GOAL}x the best fixed mode (mean): {len(misses)} cells")
    for coll, s, a, b, p, best in misses:
        why = ""
        if p:
            why = (f"; auto took {p}, the best mode's own path" if p == best
                   else f"; auto took {p}, the best was {best}")
        print(f"- {coll} {s} B: {a:.3f} (median {b:.3f}){why}")


if __name__ == "__main__":
    main()
