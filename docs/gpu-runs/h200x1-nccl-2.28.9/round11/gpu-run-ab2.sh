#!/bin/bash
# Round 11f (1x H200): the host-cost A/B again with more alternations (6 per build) at the
# smallest sizes, all_reduce and all_gather, before (c75360a, dist/old) and after.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
mkdir -p $OUT/ab2
for i in 1 2 3 4 5 6; do
  for v in old new; do
    b=./old; [ $v = new ] && b=./unicomm-bundle
    timeout 120 $b/unicomm-bench --vendor cuda --order size --modes raw,plain,registered,window,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 2K -f 4 -w 100 -n 2000 -c 0 --place out -J $OUT/ab2/bench-$v-$i.json > /dev/null 2>>$OUT/ab2/err.log
  done
done
tar -C $OUT -czf $OUT/ab2.tar.gz ab2 && rm -rf $OUT/ab2
