#!/bin/bash
# Round 9g (1x H200): after the review mend of the faults example: the bundle's faults part
# (one GPU: --share-gpu), churn shortened.
cd "$(dirname "$0")/unicomm-bundle"
PARTS=faults CHURN_COMMS=40 CHURN_BUDGET=40 CHURN_TIMEOUT=90 timeout 400 ./run.sh > $OUT/bundle-faults-final.log 2>&1; echo "rc=$?" >> $OUT/bundle-faults-final.log
grep -E "^== |rank 0.*PASSED|FAILED|rc=|rror|churn: PASSED|overall" $OUT/bundle-faults-final.log | tail -24
