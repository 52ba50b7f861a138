#!/bin/bash
# Third call: after the review mends (the per-stream event recorded again in place).
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
echo "== gpu-specific"; timeout 200 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-mended.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-mended.log
grep -E "^test |test result|rc=" $OUT/gpu-specific-mended.log
echo "== ce per process (mapped windows: the recorded-again event on every call)"
timeout 150 ./xtask launch --procs 1 --timeout-s 140 -- ./unicomm-bench --vendor cuda --modes window,ce -b 8 -e 512M -f 4 -w 5 -n 20 -c 1 --coll all_to_all,all_gather --place out -J $OUT/procs1-ce-mended.json > $OUT/procs1-ce-mended.log 2>&1; echo "rc=$?" >> $OUT/procs1-ce-mended.log
grep -E "rc=|error" $OUT/procs1-ce-mended.log | head
