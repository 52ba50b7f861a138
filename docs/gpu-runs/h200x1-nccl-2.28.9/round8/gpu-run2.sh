#!/bin/bash
# Round 8b (1x H200): after the review mends (env::choice for the copy-engine variables; the
# signal tests read words back through one helper): the GPU-specific suite, the four signal
# tests 3 more times, one rank in its own process.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
echo "== gpu-specific"; timeout 200 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-review.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-review.log
grep -E "test result|rc=|FAILED|panicked|per operation" $OUT/gpu-specific-review.log
for i in 1 2 3; do timeout 60 ./nccl-gpu --test-threads=1 copy_engine_signals --nocapture 2>&1 | grep -E "test result|panicked|per operation|drained"; done > $OUT/signals-review-repeat.log 2>&1
grep -c "4 passed" $OUT/signals-review-repeat.log; grep -E "FAILED|panicked" $OUT/signals-review-repeat.log | head -3
echo "== rank_conformance, 1 process"; timeout 150 ./xtask launch --procs 1 --timeout-s 140 -- ./rank_conformance --vendor cuda > $OUT/rank-conformance.log 2>&1; echo "rc=$?" >> $OUT/rank-conformance.log
grep -E "PASSED|FAILED|error|rc=" $OUT/rank-conformance.log | tail -3
