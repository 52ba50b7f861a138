#!/bin/bash
# Round 10, final code (1x H200): the ranks' agreement on the automatic policy, two processes sharing
# the GPU (xtask launch --share-gpu): the faults policy scenario; the bench's auto mode
# across processes (the agreement on the real NCCL, data checked); rank-specific tune
# files (two nodes tuned separately) refused at once; rank_conformance; the GPU suite.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UNICOMM_GPU_WORLD=1
log=$OUT/agree-final.log; : > $log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
echo "== faults policy" >> $log; UNICOMM_TIMEOUT_MS=30000 timeout 90 ./xtask launch --procs 2 --share-gpu --timeout-s 80 -- ./faults --vendor cuda --scenario policy >> $log 2>&1; echo "rc=$?" >> $log
echo "== bench auto across processes (one tune file)" >> $log
printf 'all_reduce 65536 window\nall_reduce max registered\nall_to_all 1048576 window\nall_to_all max ce\nall_gather 1048576 registered\nall_gather max ce\n' > $OUT/tune-a.txt
UNICOMM_TUNE_FILE=$OUT/tune-a.txt timeout 120 ./xtask launch --procs 2 --share-gpu --timeout-s 110 -- ./unicomm-bench --vendor cuda --modes registered,window,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 16M -f 16 -w 1 -n 5 -c 1 --place out,in -J $OUT/auto-procs-final.json >> $log 2>&1; echo "rc=$?" >> $log
echo "== bench auto across processes, a tune file per rank (differing)" >> $log
printf 'all_reduce max window\n' > $OUT/tune-1.txt; cp $OUT/tune-a.txt $OUT/tune-0.txt
start=$(date +%s%N)
UNICOMM_TIMEOUT_MS=60000 timeout 120 ./xtask launch --procs 2 --share-gpu --timeout-s 110 -- bash -c 'UNICOMM_TUNE_FILE=$OUT/tune-$RANK.txt exec ./unicomm-bench --vendor cuda --modes auto --coll all_reduce -b 8 -e 1M -f 16 -w 1 -n 5 -c 1 --place out' >> $log 2>&1; echo "rc=$? (expected non-zero) after $(( ($(date +%s%N) - start) / 1000000 )) ms, deadline 60 s" >> $log
echo "== rank_conformance across processes" >> $log; timeout 240 ./xtask launch --procs 2 --share-gpu --timeout-s 230 -- ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$?" >> $log
echo "== gpu-specific" >> $log; timeout 120 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture >> $log 2>&1; echo "rc=$?" >> $log
grep -E "^==|test result|rc=|PASSED|FAILED|wrong|differs|panicked|error" $log | head -60
