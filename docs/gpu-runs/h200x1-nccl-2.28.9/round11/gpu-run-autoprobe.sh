#!/bin/bash
# Round 11d (1x H200): the autoprobe part with its new step (NCCL's kernels per mode from
# NCCL_DEBUG_SUBSYS=TUNING), to check its mechanics; in a world of one NCCL copies, so
# the kernel lines say what a single rank runs.
cd "$(dirname "$0")"
PARTS_LIST="autoprobe" bash ./x2-run.sh > $OUT/parts.log 2>&1
