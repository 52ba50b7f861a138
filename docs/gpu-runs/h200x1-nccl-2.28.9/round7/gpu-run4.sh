#!/bin/bash
# Round 7c (1x H200): CUDA signalling by stream writes: the GPU-specific suite, the signal
# tests repeated, the latency A/B again.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
echo "== gpu-specific"; timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-writes.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-writes.log
grep -E "^test |test result|rc=|latency_on|released_by" $OUT/gpu-specific-writes.log
echo "== signal tests x15"
for i in $(seq 1 15); do timeout 60 ./nccl-gpu --test-threads=1 copy_engine_signals --nocapture 2>&1 | grep -E "test result|panicked|per operation|drained"; done > $OUT/signals-writes-repeat.log 2>&1
grep -c "4 passed" $OUT/signals-writes-repeat.log; grep -E "FAILED|panicked" $OUT/signals-writes-repeat.log | head; grep "per operation" $OUT/signals-writes-repeat.log | head -3
echo "== ce per process with writes (world 1: Alone; a smoke test of the mapped path)"
timeout 150 ./xtask launch --procs 1 --timeout-s 140 -- ./unicomm-bench --vendor cuda --modes window,ce -b 8 -e 64M -f 8 -w 5 -n 20 -c 1 --coll all_to_all,all_gather --place out > $OUT/procs1-ce-writes.log 2>&1; echo "rc=$?" >> $OUT/procs1-ce-writes.log
grep -E "rc=|error" $OUT/procs1-ce-writes.log | head -3
