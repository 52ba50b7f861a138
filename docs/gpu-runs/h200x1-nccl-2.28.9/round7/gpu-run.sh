#!/bin/bash
# Round 7 (1x H200): the signal waits released at abort, and the GPU-specific suite again.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi -L; ls -l /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null; date -u; git -C .. log -1 --oneline 2>/dev/null; } > $OUT/machine.txt 2>&1
echo "== gpu-specific"; timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific.log
grep -E "^test |test result|rc=|released_by" $OUT/gpu-specific.log
echo "== release repeats"
for i in $(seq 1 20); do timeout 30 ./nccl-gpu --test-threads=1 --exact shared::copy_engine_signals_released_by_the_host --nocapture 2>&1 | grep -E "drained|test result|panicked"; done > $OUT/release-repeat.log 2>&1
grep -c "1 passed" $OUT/release-repeat.log; grep drained $OUT/release-repeat.log | head -3
SKIP="--skip world_2_2 --skip world_3_3 --skip world_4_4 --skip world_5_8"
echo "== conformance ($SKIP)"; timeout 250 ./nccl-gpu --test-threads=1 conformance:: $SKIP > $OUT/conformance.log 2>&1; echo "rc=$?" >> $OUT/conformance.log
grep -E "test result|rc=" $OUT/conformance.log
xz -9 $OUT/conformance.log
