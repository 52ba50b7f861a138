#!/bin/bash
# Round 7b (1x H200): the signals' cost per operation on one GPU, and the GPU-specific suite.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
echo "== gpu-specific"; timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-b.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-b.log
grep -E "^test |test result|rc=|latency_on|released_by" $OUT/gpu-specific-b.log
echo "== latency repeats"
for i in $(seq 1 10); do timeout 60 ./nccl-gpu --test-threads=1 --exact shared::copy_engine_signals_latency_on_one_gpu --nocapture 2>&1 | grep -E "latency_on_one_gpu:|test result|panicked"; done > $OUT/latency-repeat.log 2>&1
cat $OUT/latency-repeat.log | grep -E "us per|FAILED|panicked"
