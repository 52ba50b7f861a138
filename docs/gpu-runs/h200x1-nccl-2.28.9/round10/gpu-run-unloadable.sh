#!/bin/bash
# Round 10e (1x H200): a rank whose own automatic policy does not load (a missing tune file;
# a misspelt UNICOMM_AUTO_COPY_ENGINE): it fails with its own error, its peer with the
# mismatch, both at once (not at the 60 s deadline). Two processes sharing the GPU.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UNICOMM_GPU_WORLD=1
log=$OUT/agree-unloadable.log; : > $log
for case in tune env; do
  echo "== rank 1: $case does not load" >> $log
  start=$(date +%s%N)
  CASE=$case UNICOMM_TIMEOUT_MS=60000 timeout 120 ./xtask launch --procs 2 --share-gpu --timeout-s 110 -- bash -c 'if [ "$RANK" = 1 ]; then if [ "$CASE" = tune ]; then export UNICOMM_TUNE_FILE=/nonexistent/tune.txt; else export UNICOMM_AUTO_COPY_ENGINE=maybe; fi; fi; exec ./unicomm-bench --vendor cuda --modes auto --coll all_reduce -b 8 -e 1M -f 16 -w 1 -n 5 -c 1 --place out' >> $log 2>&1
  echo "rc=$? (expected non-zero) after $(( ($(date +%s%N) - start) / 1000000 )) ms, deadline 60 s" >> $log
done
grep -E "^==|rc=|stopped" $log
