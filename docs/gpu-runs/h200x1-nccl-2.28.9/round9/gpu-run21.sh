#!/bin/bash
# Round 9f (1x H200, two processes sharing it): the abort releases the signal waits before
# ncclCommAbort and (what is left behind a kernel) beside it; ce-behind (the waits behind an
# all-reduce only the abort ends) three times, the other copy-engine scenarios once more.
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0
flog=$OUT/faults-release-first.log; : > $flog
run() { echo "== faults $*" >> $flog; timeout 50 ./xtask launch --procs 2 --share-gpu --timeout-s 45 -- ./faults --vendor cuda --scenario "$@" >> $flog 2>&1; echo "rc=$?" >> $flog; }
export UNICOMM_TIMEOUT_MS=10000
run ce-behind; run ce-behind; run ce-behind
UNICOMM_NONBLOCKING=1 run ce-behind
run ce-skip
UNICOMM_TIMEOUT_MS=120000 run ce-abort
run ce-drop
UNICOMM_NONBLOCKING=1 run ce-drop
grep -E "^==|rank 0.*PASSED|FAILED|rc=|rror|instead|still waiting" $flog
