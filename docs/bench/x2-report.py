#!/usr/bin/env python3
"""The tables of docs/benchmarks.md from one 2-GPU round of the bundle, so the doc is
written from the run's files, not by hand: goal 4 (copy engines at 512 MiB against NCCL's
best fixed mode and the link), goal 3 (auto over the best fixed mode, via goal3.py; its
floor at host-bound sizes, goal3-floor.py; the small sizes with CUDA graphs), the
copy-engine path under each ordering (signals by writes, by copies, barriers), auto's memory
and speed with NCCL's split sharing, the visualgen preset, the path across processes.

usage: x2-report.py DIR     (DIR holds the parts as x2-run.sh leaves them, extracted:
                             bench/, autoprobe/, procs/, overlap/ ...; missing files are said)
"""
import json
import os
import sys

LINK = 386.2  # GB/s per direction, both GPUs copying at once (2x H200, NV18)
GOAL4 = 367.0
NCCL_MODES = ["plain", "registered", "window", "raw", "raw-registered", "raw-window"]


def load(path):
    if not os.path.exists(path):
        print(f"- not found: {path}")
        return None
    return json.load(open(path))


def rows(doc, place_in=False):
    return [r for r in doc["results"] if r["inPlace"] == place_in]


def cell(doc, coll, size, mode, place_in=False):
    for r in rows(doc, place_in):
        if r["collective"] == coll and r["size"] == size and r["mode"] == mode:
            return r
    return None


def header(doc, path):
    lib = doc["library"]
    print(f"\n`{os.path.basename(path)}`: {lib['backend']} {lib['version']}, {doc['nranks']} ranks, "
          f"{doc.get('order', 'one mode at every size')}, {doc.get('warmupIters')} warm-up / {doc.get('iters')} iterations")


def goal4(doc, path):
    print("\n### Goal 4: copy engines at 512 MiB (busbw GB/s)\n")
    header(doc, path)
    print("\n| collective | NCCL best fixed mode | ce | auto | ce / link | goal (>= 367) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for coll in ["all_to_all", "all_gather"]:
        fixed = [(m, cell(doc, coll, 512 << 20, m)) for m in NCCL_MODES]
        fixed = [(m, r) for m, r in fixed if r]
        ce, auto = cell(doc, coll, 512 << 20, "ce"), cell(doc, coll, 512 << 20, "auto")
        if not fixed or not ce:
            print(f"| {coll} | - | - | - | - | not measured |")
            continue
        bm, br = max(fixed, key=lambda x: x[1]["busBw"])
        if doc["nranks"] < 2:
            met = "not judged: one rank (busbw is 0 by nccl-tests' formula)"
        elif ce["busBw"] >= GOAL4:
            met = "met"
        else:
            met = f"missed by {GOAL4 - ce['busBw']:.1f}"
        a = f"{auto['busBw']:.1f}" if auto else "-"
        print(f"| {coll} | {br['busBw']:.1f} ({bm}) | **{ce['busBw']:.1f}** | {a} | "
              f"{ce['busBw'] / LINK:.3f} | {met} |")
    wrong = sum(r["wrong"] or 0 for r in doc["results"])
    print(f"\nwrong elements in the whole run: {wrong}")


def cesync(d):
    print("\n### The copy-engine path by ordering (median time in us at small sizes; busbw GB/s at 512 MiB)\n")
    docs = {s: load(os.path.join(d, f"nccl-cesync-{s}.json")) for s in ["signals", "signals-copy", "barrier"]}
    docs = {s: x for s, x in docs.items() if x}
    if not docs:
        return
    print("| collective | size | window | " + " | ".join(f"ce ({s})" for s in docs) + " |")
    print("| --- | ---: | ---: |" + " ---: |" * len(docs))
    for coll in ["all_to_all", "all_gather"]:
        for size in [8, 2048, 131072, 8 << 20, 512 << 20]:
            any_doc = next(iter(docs.values()))
            w = cell(any_doc, coll, size, "window")
            big = size == 512 << 20
            fmt = (lambda r: f"{r['busBw']:.1f}") if big else (lambda r: f"{r['iterTime']['p50']:.2f}")
            vals = [fmt(cell(x, coll, size, "ce")) if cell(x, coll, size, "ce") else "-" for x in docs.values()]
            print(f"| {coll} | {size} | {fmt(w) if w else '-'} | " + " | ".join(vals) + " |")


def autoprobe(d):
    print("\n### Auto forced to the window path against the window mode (all_reduce, median iteration)\n")
    docs = {ce: load(os.path.join(d, f"nccl-autoprobe-ce{ce}.json")) for ce in (0, 1)}
    if all(docs.values()):
        print("| size | auto / window, UNICOMM_AUTO_COPY_ENGINE=0 | =1 | auto / registered, 0 | 1 |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for r in rows(docs[0]):
            if r["mode"] != "auto":
                continue
            got = [cell(docs[ce], "all_reduce", r["size"], m) for ce in (0, 1) for m in ("auto", "window", "registered")]
            if not all(got):
                continue
            a0, w0, g0, a1, w1, g1 = [c["iterTime"]["p50"] for c in got]
            print(f"| {r['size']} | {a0 / w0:.3f} | {a1 / w1:.3f} | {a0 / g0:.3f} | {a1 / g1:.3f} |")
    kernels = os.path.join(d, "nccl-autoprobe-kernels.txt")
    if os.path.exists(kernels):
        print("\nNCCL's kernels per mode (rank 0's TUNING lines, `nccl-autoprobe-kernels.txt`):\n")
        print("```text")
        print(open(kernels).read().rstrip())
        print("```")
    else:
        print(f"\n{kernels}: missing")


def autoshare(d):
    print("\n### Auto with NCCL_COMM_SPLIT_SHARE_RESOURCES 0 and 1\n")
    a, b = load(os.path.join(d, "nccl-autoshare0.json")), load(os.path.join(d, "nccl-autoshare1.json"))
    if not (a and b):
        return
    mib = lambda doc, m: doc.get("memoryBytes", {}).get(m, 0) / (1 << 20)
    print("| mode | memory, share 0 (MiB) | share 1 (MiB) |")
    print("| --- | ---: | ---: |")
    for m in ["window", "auto", "registered"]:
        print(f"| {m} | {mib(a, m):.1f} | {mib(b, m):.1f} |")
    # Ratios inside one run are the comparison (the two runs are minutes apart on a shared
    # host); the last column, across the runs, says how far the runs differ as a whole.
    print("\n| collective | size | auto / window, share 0 | share 1 | auto / registered, share 0 | share 1 | registered, run 1 / run 0 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    med = lambda doc, r, m: cell(doc, r["collective"], r["size"], m)
    for r in rows(a):
        if r["mode"] != "auto":
            continue
        got = [med(x, r, m) for x in (a, b) for m in ("auto", "window", "registered")]
        if not all(got):
            continue
        (a0, w0, g0), (a1, w1, g1) = [[c["iterTime"]["p50"] for c in got[i:i + 3]] for i in (0, 3)]
        print(f"| {r['collective']} | {r['size']} | {a0 / w0:.3f} | {a1 / w1:.3f} | "
              f"{a0 / g0:.3f} | {a1 / g1:.3f} | {g1 / g0:.3f} |")
    print(f"\nwrong elements: {sum(r['wrong'] or 0 for x in (a, b) for r in x['results'])}")


def visualgen(d):
    print("\n### The visualgen preset (time in us; best fixed NCCL mode, ce, auto)\n")
    for cm in ["0", "1", "auto"]:
        doc = load(os.path.join(d, f"nccl-visualgen-cumem{cm}.json"))
        if not doc:
            continue
        print(f"\nNCCL_CUMEM_ENABLE={cm}:\n")
        print("| workload | best fixed | ce | auto | auto / best |")
        print("| --- | ---: | ---: | ---: | ---: |")
        labels = []
        for r in rows(doc):
            if r["label"] not in labels:
                labels.append(r["label"])
        for lab in labels:
            rs = {r["mode"]: r for r in rows(doc) if r["label"] == lab}
            fixed = {m: rs[m] for m in NCCL_MODES + ["ce"] if m in rs}
            if not fixed:
                continue
            bm = min(fixed, key=lambda m: fixed[m]["time"])
            ce = f"{rs['ce']['time']:.1f}" if "ce" in rs else "-"
            au = rs.get("auto")
            ratio = f"{au['time'] / fixed[bm]['time']:.3f}" if au else "-"
            print(f"| {lab} | {fixed[bm]['time']:.1f} ({bm}) | {ce} | {au['time']:.1f} | {ratio} |" if au else
                  f"| {lab} | {fixed[bm]['time']:.1f} ({bm}) | {ce} | - | - |")


def procs(d):
    print("\n### The copy-engine path across two processes (busbw GB/s)\n")
    doc = load(os.path.join(d, "nccl-bench-procs-ce.json"))
    if not doc:
        return
    header(doc, "nccl-bench-procs-ce.json")
    sizes = sorted({r["size"] for r in rows(doc)})
    print("\n| collective | size | registered | window | ce |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for coll in ["all_to_all", "all_gather"]:
        for s in sizes:
            v = [cell(doc, coll, s, m) for m in ["registered", "window", "ce"]]
            print(f"| {coll} | {s} | " + " | ".join(f"{r['busBw']:.1f}" if r else "-" for r in v) + " |")
    print(f"\nwrong elements: {sum(r['wrong'] or 0 for r in doc['results'])}")


def main():
    d = sys.argv[1]
    bench = os.path.join(d, "bench")
    sweep_path = os.path.join(bench, "nccl-bench.json")
    sweep = load(sweep_path)
    if sweep:
        goal4(sweep, sweep_path)
        print("\n### Goal 3 (goal3.py)\n")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import goal3
        sys.argv = ["goal3.py", sweep_path]
        goal3.main()
        import importlib
        floor = importlib.import_module("goal3-floor")
        print("\n### Goal 3's ratio at host-bound sizes (goal3-floor.py)\n")
        floor.main([sweep_path])
    graphs_path = os.path.join(bench, "nccl-bench-graphs.json")
    if load(graphs_path):
        print("\n### Goal 3 with CUDA graphs, small sizes (goal3.py on -G 20)\n")
        sys.argv = ["goal3.py", graphs_path]
        goal3.main()
    cesync(bench)
    visualgen(bench)
    autoprobe(os.path.join(d, "autoprobe"))
    autoshare(os.path.join(d, "autoprobe"))
    procs(os.path.join(d, "procs"))


if __name__ == "__main__":
    main()
