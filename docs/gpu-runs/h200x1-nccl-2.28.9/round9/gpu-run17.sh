#!/bin/bash
# Round 9c (1x H200): after the two fixes (the abort releases the signal waits beside
# ncclCommAbort, not after it; a stream's waits report an abort once): the fault scenarios
# with two processes on one GPU (dist/two-hosts.sh), the GPU-specific suite again.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
L="./xtask launch --procs 2 --timeout-s"
H=../two-hosts.sh
flog=$OUT/faults-2procs-fixed.log; : > $flog
run() { echo "== faults $*" >> $flog; timeout 70 $L 60 -- $H ./faults --vendor cuda --scenario "$@" >> $flog 2>&1; echo "rc=$?" >> $flog; }
UNICOMM_TIMEOUT_MS=10000 run ce-skip
run ce-abort
UNICOMM_TIMEOUT_MS=10000 run skip
run abort
UNICOMM_CE_SYNC=barrier UNICOMM_TIMEOUT_MS=10000 run ce-skip
UNICOMM_NONBLOCKING=1 UNICOMM_TIMEOUT_MS=10000 run ce-skip
grep -E "^==|PASSED|FAILED|rc=|rror|orders the ranks" $flog
echo "== gpu-specific"; timeout 150 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-fixed.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-fixed.log
grep -E "test result|rc=|FAILED|panicked" $OUT/gpu-specific-fixed.log
