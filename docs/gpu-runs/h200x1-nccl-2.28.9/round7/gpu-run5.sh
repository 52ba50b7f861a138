#!/bin/bash
# Round 7d (1x H200): the GPU-specific suite on the final code (signal tests' setup refactored).
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-final.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-final.log
grep -E "^test |test result|rc=|latency_on|released_by" $OUT/gpu-specific-final.log
