#!/bin/bash
# Round 9 (1x H200): the copy-engine signals between two processes through imported memory
# (new test shared::copy_engine_signals_across_processes), the refactored cross-process
# export test, the GPU-specific suite.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; } > $OUT/gpu-specific.log
echo "== gpu-specific"; timeout 240 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture >> $OUT/gpu-specific.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific.log
grep -E "test result|rc=|FAILED|panicked|per operation|signals_across" $OUT/gpu-specific.log
for i in $(seq 10); do echo "-- run $i"; timeout 90 ./nccl-gpu --test-threads=1 --exact shared::copy_engine_signals_across_processes shared::exported_memory_maps_into_another_process --nocapture 2>&1 | grep -E "test result|panicked|signals_across|FAILED|error"; done > $OUT/across-repeat.log 2>&1
grep -c "2 passed" $OUT/across-repeat.log; grep -E "FAILED|panicked" $OUT/across-repeat.log | head -3
# Two processes on one GPU as two "hosts" for NCCL (dist/two-hosts.sh): the copy-engine path
# with one rank per process end to end (windows exported and mapped, signals through
# imported memory), and the fault scenarios on it.
L="./xtask launch --procs 2 --timeout-s"
H=../two-hosts.sh
log=$OUT/two-procs.log; : > $log
echo "== rank_conformance, 2 processes on 1 GPU" | tee -a $log
timeout 250 $L 240 -- $H ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$?" >> $log
grep -E "PASSED|FAILED|NOT run|rc=" $log | tail -4
