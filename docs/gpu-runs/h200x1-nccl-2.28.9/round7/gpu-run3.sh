#!/bin/bash
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
for i in $(seq 1 10); do timeout 60 ./nccl-gpu --test-threads=1 --exact shared::copy_engine_signals_latency_on_one_gpu --nocapture 2>&1 | grep -E "latency_on_one_gpu:|test result|panicked"; done > $OUT/latency-ab.log 2>&1
grep -E "per operation|FAILED|panicked" $OUT/latency-ab.log
