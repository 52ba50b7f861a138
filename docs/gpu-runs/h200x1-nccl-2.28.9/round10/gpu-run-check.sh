#!/bin/bash
# Round 10f (1x H200): UNICOMM_CHECK_COLLECTIVES=1 with two processes sharing the GPU: the
# mismatch scenario (count, reduction, path), the policy scenario again, rank_conformance
# with the check on (every collective compared first), the GPU-specific suite.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UNICOMM_GPU_WORLD=1
log=$OUT/check.log; : > $log
echo "== faults mismatch" >> $log; UNICOMM_TIMEOUT_MS=30000 timeout 90 ./xtask launch --procs 2 --share-gpu --timeout-s 80 -- ./faults --vendor cuda --scenario mismatch >> $log 2>&1; echo "rc=$?" >> $log
echo "== faults policy" >> $log; UNICOMM_TIMEOUT_MS=30000 timeout 90 ./xtask launch --procs 2 --share-gpu --timeout-s 80 -- ./faults --vendor cuda --scenario policy >> $log 2>&1; echo "rc=$?" >> $log
echo "== rank_conformance, UNICOMM_CHECK_COLLECTIVES=1" >> $log; start=$(date +%s); UNICOMM_CHECK_COLLECTIVES=1 timeout 240 ./xtask launch --procs 2 --share-gpu --timeout-s 230 -- ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$? in $(( $(date +%s) - start )) s" >> $log
echo "== rank_conformance, check off" >> $log; start=$(date +%s); timeout 240 ./xtask launch --procs 2 --share-gpu --timeout-s 230 -- ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$? in $(( $(date +%s) - start )) s" >> $log
echo "== bench across processes, check on, data checked" >> $log; UNICOMM_CHECK_COLLECTIVES=1 timeout 120 ./xtask launch --procs 2 --share-gpu --timeout-s 110 -- ./unicomm-bench --vendor cuda --modes plain,registered,window,ce,auto --coll all_reduce,all_to_all,all_gather,reduce_scatter,broadcast -b 8 -e 4M -f 32 -w 1 -n 5 -c 1 --place out,in -J $OUT/check-bench.json >> $log 2>&1; echo "rc=$?" >> $log
echo "== gpu-specific" >> $log; timeout 120 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture >> $log 2>&1; echo "rc=$?" >> $log
grep -E "^==|rc=|PASSED|FAILED|refused|wrong [1-9]|panicked|rror" $log | head -60
