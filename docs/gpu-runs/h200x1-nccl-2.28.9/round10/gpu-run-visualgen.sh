#!/bin/bash
# Round 10c (1x H200): the visualgen preset with two processes sharing the GPU, NCCL_CUMEM_ENABLE 0/1
# (does the 2-GPU stall under cuMem need NVLink peers, or two ranks?); data checked.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UNICOMM_GPU_WORLD=1
log=$OUT/visualgen-procs.log; : > $log
for cumem in 0 1; do
  echo "== two processes, NCCL_CUMEM_ENABLE=$cumem" >> $log
  start=$(date +%s)
  NCCL_CUMEM_ENABLE=$cumem UNICOMM_TIMEOUT_MS=30000 timeout 150 ./xtask launch --procs 2 --share-gpu --timeout-s 140 -- ./unicomm-bench --vendor cuda --preset visualgen -w 2 -n 5 -c 1 --place out -J $OUT/visualgen-procs-cumem$cumem.json >> $log 2>&1; echo "rc=$? in $(( $(date +%s) - start )) s" >> $log
done
grep -E "^==|rc=|wrong [1-9]|error|stopped" $log | head -40
