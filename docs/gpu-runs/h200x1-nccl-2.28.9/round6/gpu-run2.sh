#!/bin/bash
# Second call: the final code's GPU-specific tests (incl. the signals in a CUDA graph), and
# the two signal tests 25 times each (a race would show as a failure or a hang).
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
echo "== gpu-specific"; timeout 200 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific.log
grep -E "^test |test result|rc=" $OUT/gpu-specific.log
echo "== signals x25"; ok=0
for i in $(seq 25); do timeout 60 ./nccl-gpu --test-threads=1 copy_engine_signals >> $OUT/signals-repeat.log 2>&1 && ok=$((ok+1)); done
echo "signal tests: $ok of 25 runs passed (2 tests each)" | tee -a $OUT/signals-repeat.log
grep -c "test result: ok. 2 passed" $OUT/signals-repeat.log
xz -9 $OUT/signals-repeat.log
