#!/bin/bash
# Round 9d (1x H200): the bundle's own faults and procs parts on one GPU (xtask launch
# --share-gpu), churn shortened.
cd "$(dirname "$0")/unicomm-bundle"
PARTS=procs timeout 280 ./run.sh > $OUT/bundle-procs.log 2>&1; echo "rc=$?" >> $OUT/bundle-procs.log
grep -E "^==|PASSED|FAILED|wrong|rc=|rror|one GPU" $OUT/bundle-procs.log | grep -v "^\[rank 1\]" | tail -20
PARTS=faults CHURN_COMMS=40 CHURN_BUDGET=40 CHURN_TIMEOUT=90 timeout 300 ./run.sh > $OUT/bundle-faults.log 2>&1; echo "rc=$?" >> $OUT/bundle-faults.log
grep -E "^==|PASSED|FAILED|rc=|rror|one GPU|churn" $OUT/bundle-faults.log | tail -24
