#!/bin/bash
# One call on the GPU machine: the copy-engine signals round (session 2026-12-01, third).
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv; lscpu | grep -E "^CPU\(s\)|Model name"; echo "UNICOMM_GPU_WORLD=$UNICOMM_GPU_WORLD"; } > $OUT/machine.txt 2>&1
echo "== gpu-specific"; timeout 200 ./nccl-gpu --test-threads=1 --skip conformance:: --nocapture > $OUT/gpu-specific.log 2>&1; echo "rc=$?" >> $OUT/gpu-specific.log
grep -E "^test |test result" $OUT/gpu-specific.log
echo "== loader"; timeout 60 ./nccl-loader --test-threads=1 > $OUT/loader.log 2>&1; tail -2 $OUT/loader.log
echo "== examples"; { timeout 60 ./allreduce_ub --vendor cuda; timeout 60 ./alltoall_ub --vendor cuda; timeout 60 ./doctor; } > $OUT/examples.log 2>&1; grep -E "PASSED|FAILED|rror" $OUT/examples.log | head
echo "== ce direct"; timeout 150 ./unicomm-bench --vendor cuda --modes window,ce,auto -b 8 -e 512M -f 4 -w 5 -n 20 -c 1 --coll all_to_all,all_gather --place out -J $OUT/ce-direct.json > $OUT/ce.log 2>&1; echo "rc=$?" >> $OUT/ce.log
echo "== ce graphs"; timeout 150 ./unicomm-bench --vendor cuda --modes window,ce,auto -G 20 -b 8 -e 512M -f 4 -w 5 -n 20 -c 1 --coll all_to_all,all_gather --place out -J $OUT/ce-G.json >> $OUT/ce.log 2>&1; echo "rc=$?" >> $OUT/ce.log
echo "== ce per process"; timeout 120 ./xtask launch --procs 1 --timeout-s 100 -- ./unicomm-bench --vendor cuda --modes window,ce -b 1M -e 64M -f 4 -w 5 -n 20 -c 1 --coll all_to_all,all_gather --place out >> $OUT/ce.log 2>&1; echo "rc=$?" >> $OUT/ce.log
grep -E "^# |rc=|wrong" $OUT/ce.log | head -40
SKIP=$(while read w name; do [ "$w" -gt "$UNICOMM_GPU_WORLD" ] && printf -- "--skip %s " "$name"; done < worlds.txt)
echo "== conformance ($SKIP)"; timeout 230 ./nccl-gpu --test-threads=1 conformance:: $SKIP > $OUT/conformance.log 2>&1; echo "rc=$?" >> $OUT/conformance.log
grep -E "test result|rc=" $OUT/conformance.log; grep -c " ok$" $OUT/conformance.log
xz -9 $OUT/conformance.log
