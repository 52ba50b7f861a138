#!/bin/bash
# Round 9h (1x H200, two processes sharing it): every bench mode across processes with data
# checked (auto: the split communicator and the policy across processes), direct and as CUDA
# graphs; rank_conformance non-blocking.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0
L="./xtask launch --procs 2 --share-gpu --timeout-s"
log=$OUT/two-procs-all-modes.log; : > $log
echo "== bench, every mode" >> $log
timeout 150 $L 145 -- ./unicomm-bench --vendor cuda --modes plain,registered,window,raw,ce,auto --coll all_reduce,all_to_all,all_gather,reduce_scatter,broadcast -b 8 -e 16M -f 16 -w 1 -n 5 -c 1 --place out,in -J $OUT/two-procs-all-modes.json >> $log 2>&1; echo "rc=$?" >> $log
echo "== bench, every mode, CUDA graphs" >> $log
timeout 100 $L 95 -- ./unicomm-bench --vendor cuda --modes window,ce,auto --coll all_to_all,all_gather -b 8 -e 16M -f 16 -w 1 -n 5 -G 3 -c 1 --place out -J $OUT/two-procs-graphs.json >> $log 2>&1; echo "rc=$?" >> $log
echo "== rank_conformance non-blocking" >> $log
UNICOMM_NONBLOCKING=1 timeout 90 $L 85 -- ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$?" >> $log
grep -E "^==|rc=|rror|PASSED|skipped" $log | grep -v "^\[rank 1\]"
python3 - <<'P'
import json,os
for f in ["two-procs-all-modes.json","two-procs-graphs.json"]:
    p=os.path.join(os.environ["OUT"],f)
    if os.path.exists(p):
        d=json.load(open(p)); r=d["results"]; print(f, len(r), "rows", sum(x["wrong"] for x in r), "wrong", sorted(set(x["mode"] for x in r)))
P
