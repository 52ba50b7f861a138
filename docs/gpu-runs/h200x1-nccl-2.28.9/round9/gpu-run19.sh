#!/bin/bash
# Round 9e (1x H200): ce-drop (a communicator dropped while its copy-engine all-to-all waits
# for a peer that never signals), blocking and non-blocking, two processes on one GPU;
# ce-skip/ce-abort again; the GPU-specific suite.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
# First the drop without the fix (dist/faults-before: the same code, the drop always
# finalizing), non-blocking, where the finalize has no deadline of its own.
blog=$OUT/faults-ce-drop-before.log; : > $blog
UNICOMM_NONBLOCKING=1 UNICOMM_TIMEOUT_MS=10000 timeout 70 ./xtask launch --procs 2 --share-gpu --timeout-s 60 -- ../faults-before --vendor cuda --scenario ce-drop >> $blog 2>&1; echo "rc=$?" >> $blog
UNICOMM_TIMEOUT_MS=10000 timeout 70 ./xtask launch --procs 2 --share-gpu --timeout-s 60 -- ../faults-before --vendor cuda --scenario ce-drop >> $blog 2>&1; echo "rc=$?" >> $blog
grep -E "PASSED|rc=|rror|instead" $blog
flog=$OUT/faults-ce-drop.log; : > $flog
run() { echo "== faults $*" >> $flog; timeout 70 ./xtask launch --procs 2 --share-gpu --timeout-s 60 -- ./faults --vendor cuda --scenario "$@" >> $flog 2>&1; echo "rc=$?" >> $flog; }
UNICOMM_TIMEOUT_MS=10000 run ce-drop
UNICOMM_NONBLOCKING=1 UNICOMM_TIMEOUT_MS=10000 run ce-drop
UNICOMM_CE_SYNC=barrier UNICOMM_TIMEOUT_MS=10000 run ce-drop
UNICOMM_TIMEOUT_MS=10000 run ce-skip
run ce-abort
grep -E "^==|PASSED|FAILED|rc=|rror|orders the ranks|instead" $flog
echo "== gpu-specific"; timeout 90 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific-drop.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific-drop.log
grep -E "test result|rc=|FAILED|panicked" $OUT/gpu-specific-drop.log
