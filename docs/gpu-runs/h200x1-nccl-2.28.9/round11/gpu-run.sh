#!/bin/bash
# Round 11 (1x H200): the code after 85366d9 (c4ab6d5 refusing rank in the check; fd34205
# runtime-malloc scratch, Route refactor; c75360a launch) on the GPU: faults, conformance,
# quick parts, then the check scenarios across two processes sharing the GPU.
cd "$(dirname "$0")"
echo "rev c75360a" > $OUT/summary.txt
PARTS_LIST="faults conformance quick" bash ./x2-run.sh > $OUT/parts.log 2>&1
mkdir -p $OUT/check; OUT=$OUT/check bash ./gpu-run-check.sh > $OUT/check/summary.log 2>&1
tar -C $OUT -czf $OUT/check.tar.gz check && rm -rf $OUT/check
