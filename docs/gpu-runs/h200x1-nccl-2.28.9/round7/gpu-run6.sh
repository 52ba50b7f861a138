#!/bin/bash
# Round 7e (1x H200): the GPU-specific suite after the review mends; the signal tests 5 more times.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-review.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-review.log
grep -E "^test |test result|rc=|latency_on|released_by" $OUT/gpu-specific-review.log
for i in 1 2 3 4 5; do timeout 60 ./nccl-gpu --test-threads=1 copy_engine_signals --nocapture 2>&1 | grep -E "test result|panicked|per operation|drained"; done > $OUT/signals-review-repeat.log 2>&1
grep -c "4 passed" $OUT/signals-review-repeat.log; grep -E "FAILED|panicked" $OUT/signals-review-repeat.log | head -3
