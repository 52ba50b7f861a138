#!/bin/bash
# Round 9i (1x H200, two processes sharing it): every bench mode across processes with data
# checked, after the fix of the raw mode's in-place reduce_scatter pointers.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0
log=$OUT/two-procs-all-modes.log; : > $log
timeout 150 ./xtask launch --procs 2 --share-gpu --timeout-s 145 -- ./unicomm-bench --vendor cuda --modes plain,registered,window,raw,ce,auto --coll all_reduce,all_to_all,all_gather,reduce_scatter,broadcast -b 8 -e 16M -f 16 -w 1 -n 5 -c 1 --place out,in -J $OUT/two-procs-all-modes.json >> $log 2>&1; echo "rc=$?" >> $log
grep -E "rc=|rror|wrong elements" $log
python3 -c "
import json,os;d=json.load(open(os.environ['OUT']+'/two-procs-all-modes.json'));r=d['results'];print(len(r),'rows',sum(x['wrong'] for x in r),'wrong',sorted(set(x['mode'] for x in r)))"
