#!/usr/bin/env python3
"""PyTorch's TCPStore under the rendezvous harness's scenario, for a side-by-side figure.

What `rendezvous-scale` does for unicomm, done with TCPStore: rank 0 alone in one process
(pinned to the first core) makes a store holding a 128-byte id; the other ranks are threads
of `--procs` processes (pinned to the second core), released at one instant, each opening a
client and reading the id. One JSON line per run: the time until every rank holds the id,
each rank's join p50/p99/max, TCP connections opened per joining rank and listen overflows
(the kernel's counters: the machine should be otherwise quiet). Loopback only.

Needs torch, which unicomm never installs: run it from a throwaway environment outside the
repository (`python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch`), never
in CI: `/tmp/torchenv/bin/python bench/scripts/tcpstore_scale.py --ranks 1024,4096 --runs 3
--backend libuv`.
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time


def kernel():
    """TCP ActiveOpens and ListenOverflows/ListenDrops from /proc/net."""
    out = {}
    for path, keys in (("/proc/net/snmp", ("ActiveOpens",)), ("/proc/net/netstat", ("ListenOverflows", "ListenDrops"))):
        lines = open(path).read().splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            names, nums = head.split()[1:], vals.split()[1:]
            for k in keys:
                if k in names:
                    out[k] = int(nums[names.index(k)])
    return out


def pin(cpu):
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def serve(port, world, libuv, cpu, ready, stop):
    import torch.distributed as dist

    pin(cpu)
    store = dist.TCPStore("127.0.0.1", port, world, True, datetime.timedelta(seconds=120),
                          wait_for_workers=False, use_libuv=libuv)
    store.set("id", os.urandom(128))
    ready.put("ready")
    stop.get()
    del store


def join(port, world, ranks, libuv, cpu, release_q, ready, results):
    import torch.distributed as dist

    pin(cpu)
    times = [None] * len(ranks)
    go, at = threading.Event(), [0]

    def one(i):
        go.wait()
        delay = at[0] - time.time_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        t0 = time.time_ns()
        s = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=120),
                          use_libuv=libuv)
        assert len(s.get("id")) == 128
        times[i] = (t0, time.time_ns())

    # Every thread started (and waiting) before the release, as the Rust harness's ranks.
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ranks))]
    for t in threads:
        t.start()
    ready.put("ready")
    at[0] = release_q.get()
    go.set()
    for t in threads:
        t.join()
    results.put(times)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(n, procs, libuv, pinned):
    ctx = mp.get_context("spawn")
    port = free_port()
    ready, stop, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=serve, args=(port, n, libuv, 0 if pinned else None, ready, stop))
    server.start()
    ready.get(timeout=60)
    per = -(-(n - 1) // procs)
    groups = [list(range(f, min(f + per, n))) for f in range(1, n, per)]
    releases = [ctx.Queue() for _ in groups]
    joiners = [ctx.Process(target=join, args=(port, n, g, libuv, 1 if pinned else None, q, ready, results))
               for g, q in zip(groups, releases)]
    for j in joiners:
        j.start()
    for _ in joiners:
        ready.get(timeout=120)  # torch imported, the process pinned
    before = kernel()
    release = time.time_ns() + 200_000_000
    for q in releases:
        q.put(release)
    times = []
    for _ in joiners:
        times.extend(results.get(timeout=300))
    after = kernel()
    for j in joiners:
        j.join()
    stop.put(None)
    server.join()
    ends = [b for _, b in times]
    joins = sorted((b - a) / 1e9 for a, b in times)
    q = lambda f: joins[min(len(joins) - 1, int(f * (len(joins) - 1)))]
    return {
        "store": "tcpstore-" + ("libuv" if libuv else "legacy"),
        "ranks": n,
        "all_hold_id_s": round((max(ends) - release) / 1e9, 4),
        "join_p50_s": round(q(0.5), 4),
        "join_p99_s": round(q(0.99), 4),
        "join_max_s": round(joins[-1], 4),
        "connections_per_rank": round((after["ActiveOpens"] - before["ActiveOpens"]) / (n - 1), 3),
        "listen_overflows": after["ListenOverflows"] - before["ListenOverflows"],
        "listen_drops": after["ListenDrops"] - before["ListenDrops"],
        "pinned": pinned,
    }


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--ranks", default="1024")
    a.add_argument("--procs", type=int, default=4)
    a.add_argument("--runs", type=int, default=1)
    a.add_argument("--backend", choices=["libuv", "legacy"], default="libuv")
    a.add_argument("--no-pin", action="store_true")
    args = a.parse_args()
    pinned = not args.no_pin and (os.cpu_count() or 1) >= 2
    for n in (int(x) for x in args.ranks.split(",")):
        for _ in range(args.runs):
            print(json.dumps(run_once(n, args.procs, args.backend == "libuv", pinned)), flush=True)


if __name__ == "__main__":
    main()
