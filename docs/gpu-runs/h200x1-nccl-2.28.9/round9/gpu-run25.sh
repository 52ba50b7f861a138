#!/bin/bash
# Round 9j (1x H200): after the review mends: the GPU-specific suite (the signal tests), the
# drop and the deregistration through wait_for_copies with two processes sharing the GPU.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
log=$OUT/review-mends.log; : > $log
echo "== gpu-specific" >> $log; timeout 90 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture >> $log 2>&1; echo "rc=$?" >> $log
echo "== faults ce-drop" >> $log; UNICOMM_TIMEOUT_MS=10000 timeout 50 ./xtask launch --procs 2 --share-gpu --timeout-s 45 -- ./faults --vendor cuda --scenario ce-drop >> $log 2>&1; echo "rc=$?" >> $log
echo "== bench ce across processes" >> $log; timeout 60 ./xtask launch --procs 2 --share-gpu --timeout-s 55 -- ./unicomm-bench --vendor cuda --modes window,ce,auto --coll all_to_all,all_gather -b 8 -e 16M -f 16 -w 1 -n 5 -c 1 --place out >> $log 2>&1; echo "rc=$?" >> $log
grep -E "^==|test result|rc=|rank 0.*PASSED|wrong elements|panicked" $log
