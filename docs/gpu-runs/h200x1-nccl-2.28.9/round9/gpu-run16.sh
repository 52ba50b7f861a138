#!/bin/bash
# Round 9b (1x H200): two processes on one GPU as two "hosts" for NCCL (dist/two-hosts.sh):
# the copy-engine bench modes with every signal mechanism, and the fault scenarios.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L="./xtask launch --procs 2 --timeout-s"
H=../two-hosts.sh
log=$OUT/two-procs-bench.log; : > $log
for sync in signals barrier; do
  echo "== bench ce, 2 processes, UNICOMM_CE_SYNC=$sync" | tee -a $log
  UNICOMM_CE_SYNC=$sync timeout 150 $L 140 -- $H ./unicomm-bench --vendor cuda --modes window,ce --coll all_to_all,all_gather -b 8 -e 64M -f 8 -w 2 -n 10 -c 1 --place out,in -J $OUT/bench-2procs-$sync.json >> $log 2>&1; echo "rc=$?" >> $log
done
echo "== bench ce, 2 processes, UNICOMM_CE_SIGNAL=copy" | tee -a $log
UNICOMM_CE_SIGNAL=copy timeout 150 $L 140 -- $H ./unicomm-bench --vendor cuda --modes ce --coll all_to_all,all_gather -b 1K -e 16M -f 16 -w 2 -n 10 -c 1 --place out >> $log 2>&1; echo "rc=$?" >> $log
grep -E "wrong|rc=|rror|copy-engine" $log | tail -12
flog=$OUT/faults-2procs.log; : > $flog
for sc in ce-skip ce-abort skip abort; do
  echo "== faults $sc" >> $flog
  UNICOMM_TIMEOUT_MS=10000 timeout 130 $L 120 -- $H ./faults --vendor cuda --scenario $sc >> $flog 2>&1; echo "rc=$?" >> $flog
done
echo "== faults kill" >> $flog
kport=$((29600 + RANDOM % 300))
for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$kport UNICOMM_TIMEOUT_MS=20000 timeout 120 $H ./faults --vendor cuda --scenario kill & done >> $flog 2>&1
wait; echo "kill done" >> $flog
grep -E "PASSED|FAILED|rc=|rror|orders the ranks" $flog | tail -24
