#!/usr/bin/env python3
"""unicomm's host time per call from `perf` profiles of `unicomm-bench` at one host-bound
size (round 12's gpu-run-ab.sh: `perf record -e cpu-clock:u` of `--modes plain` and of
`--modes raw`, per build): a symbol's share of the samples times the run's time per call is
its nanoseconds per call. Prints, per build and run, the benchmark binary's whole share (plain
minus raw is what unicomm adds inside the binary) and unicomm's own symbols per call
(the layer between the benchmark and the NCCL call: facade, contract, NCCL-API layer, CUDA
runtime; the benchmark's event timing, which raw pays too, left out), then the largest of
them, averaged over the runs.

    python3 docs/bench/perf-cost.py DIR   # DIR holds report-<build>-<mode>-<n>.txt, bench-*.log
"""
import collections
import glob
import os
import re
import sys

UNICOMM = ("unicomm_nccl_api", "unicomm_core", "unicomm::dispatch", "unicomm_nccl::")
TIMING = ("record", "ApiMarker", "elapsed_ms", "Marker", "MarkerTime")


def own(sym):
    return any(u in sym for u in UNICOMM) and not any(t in sym for t in TIMING)


def load(d):
    rows = collections.defaultdict(list)
    for f in sorted(glob.glob(os.path.join(d, "report-*.txt"))):
        _, build, mode, n = os.path.basename(f)[:-4].split("-")
        log = open(f.replace("report-", "bench-").replace(".txt", ".log")).read()
        t = float(re.search(r" (?:plain|raw) \|\s+([0-9.]+)\*?", log).group(1))
        share, syms = None, {}
        for line in open(f):
            p = line.split()
            if len(p) == 2 and p[1].endswith("bench"):
                share = float(p[0].rstrip("%"))
            elif len(p) >= 4 and p[1].endswith("bench"):
                name = " ".join(p[3:-2] if p[-1] == "-" else p[3:])
                syms[name] = syms.get(name, 0.0) + float(p[0].rstrip("%"))
        ns = {k: v / 100 * t * 1000 for k, v in syms.items()}
        rows[(build, mode)].append((n, t, share / 100 * t * 1000, ns))
    return rows


def main(d):
    rows = load(d)
    builds = sorted({b for b, _ in rows}, key=lambda b: (b != "old", b))
    print("| build | mode | run | us per call | binary ns per call | unicomm's own symbols, ns per call |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for b in builds:
        for m in ("plain", "raw"):
            for n, t, binary, ns in rows[(b, m)]:
                u = sum(v for k, v in ns.items() if own(k))
                print(f"| {b} | {m} | {n} | {t:.2f} | {binary:.0f} | {u:.0f} |")
    for b in builds:
        acc = collections.defaultdict(list)
        for _, _, _, ns in rows[(b, "plain")]:
            for k, v in ns.items():
                if own(k):
                    acc[k].append(v)
        runs = len(rows[(b, "plain")])
        print(f"\n{b}, plain, unicomm's largest symbols (ns per call, mean of {runs} runs):")
        for k, xs in sorted(acc.items(), key=lambda kv: -sum(kv[1]))[:10]:
            print(f"  {sum(xs) / runs:6.1f}  {k[:110]}")


if __name__ == "__main__":
    main(sys.argv[1])
