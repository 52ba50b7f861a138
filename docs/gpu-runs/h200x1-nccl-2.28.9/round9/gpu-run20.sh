#!/bin/bash
# Diagnosis (1x H200): where the drop without the fix hangs (blocking mode), by the stacks of
# rank 0's threads 30 s into it.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0
which gdb eu-stack pstack 2>&1 | head -3
log=$OUT/drop-before-stacks.log; : > $log
UNICOMM_TIMEOUT_MS=10000 timeout 60 ./xtask launch --procs 2 --share-gpu --timeout-s 55 -- ../faults-before --vendor cuda --scenario ce-drop >> $log 2>&1 &
sleep 30
for p in $(pgrep -f "faults-before --vendor cuda"); do
  r=$(tr '\0' '\n' < /proc/$p/environ | grep "^RANK=")
  echo "=== pid $p $r" >> $log
  for t in /proc/$p/task/*; do echo "-- $(cat $t/comm) wchan=$(cat $t/wchan)" >> $log; cat $t/stack 2>/dev/null | head -6 >> $log; done
  if command -v gdb >/dev/null; then gdb -batch -p $p -ex "thread apply all bt 25" >> $log 2>&1; fi
done
wait
grep -E "^===|^-- |^#|^Thread" $log | head -150
