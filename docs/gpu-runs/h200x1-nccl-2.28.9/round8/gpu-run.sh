#!/bin/bash
# Round 8 (1x H200): the conformance reference computed for one period of the inputs
# (commit 996782c): the GPU suite at world 1, one rank in its own process, the GPU-specific tests.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi -L; date -u; } > $OUT/machine.txt 2>&1
SKIP="--skip world_2_2 --skip world_3_3 --skip world_4_4 --skip world_5_8"
echo "== conformance ($SKIP)"; s=$(date +%s); timeout 300 ./nccl-gpu --test-threads=1 conformance:: $SKIP > $OUT/conformance.log 2>&1; echo "rc=$? $(( $(date +%s) - s )) s" >> $OUT/conformance.log
grep -E "test result|rc=" $OUT/conformance.log
echo "== rank_conformance, 1 process"; timeout 150 ./xtask launch --procs 1 --timeout-s 140 -- ./rank_conformance --vendor cuda > $OUT/rank-conformance.log 2>&1; echo "rc=$?" >> $OUT/rank-conformance.log
grep -E "PASSED|FAILED|error|rc=" $OUT/rank-conformance.log | tail -4
echo "== gpu-specific"; timeout 200 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific.log
grep -E "test result|rc=|FAILED|panicked" $OUT/gpu-specific.log
xz -9 $OUT/conformance.log
