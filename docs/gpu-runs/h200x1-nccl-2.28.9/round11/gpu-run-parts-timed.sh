#!/bin/bash
# Round 11b (1x H200): the 2-GPU round's parts (bench, autoprobe, procs) timed on one GPU
# through x2-run.sh, so the 2-GPU session knows what fits its 10-minute calls; steps stamped.
cd "$(dirname "$0")"
PARTS_LIST="bench autoprobe procs" timeout 570 bash ./x2-run.sh > $OUT/parts.log 2>&1
echo "x2-run rc=$?" >> $OUT/parts.log
for d in bench autoprobe procs; do [ -d $OUT/$d ] && tar -C $OUT -czf $OUT/$d-partial.tar.gz $d && rm -rf $OUT/$d; done
true
