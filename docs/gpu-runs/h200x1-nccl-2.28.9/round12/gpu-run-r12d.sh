#!/bin/bash
# Round 12d (1x H200): the lock/token/inlining change (668e526, new-bench) against d5ae06b
# (old-bench): perf profiles of plain and raw all_reduce at 8 B (three runs each), the
# six-alternation A/B, and the by-hand comparison of the new build (three runs).
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
mkdir -p $OUT/perf $OUT/ab $OUT/byhand
tar -xJf perf.tar.xz -C /tmp; P=/tmp/perf
for i in 1 2 3; do
  for v in old new; do
    for m in plain raw; do
      LD_LIBRARY_PATH=$P/lib $P/perf record -e cpu-clock:u -F 20000 -o /tmp/p.data ./$v-bench --vendor cuda --modes $m --coll all_reduce -b 8 -e 8 -w 1000 -n 200000 --rounds 1 -c 0 --place out > $OUT/perf/bench-$v-$m-$i.log 2>&1
      LD_LIBRARY_PATH=$P/lib $P/perf report -i /tmp/p.data --no-children --sort dso,symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | grep -E "bench " | head -60 > $OUT/perf/report-$v-$m-$i.txt
      LD_LIBRARY_PATH=$P/lib $P/perf report -i /tmp/p.data --no-children --sort dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -10 >> $OUT/perf/report-$v-$m-$i.txt
      rm -f /tmp/p.data
    done
  done
done
tar -C $OUT -czf $OUT/perf.tar.gz perf && rm -rf $OUT/perf
for i in 1 2 3 4 5 6; do
  for v in old new; do
    timeout 120 ./$v-bench --vendor cuda --order size --modes raw,plain,registered,window,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 2K -f 4 -w 100 -n 2000 -c 0 --place out -J $OUT/ab/bench-$v-$i.json > /dev/null 2>>$OUT/ab/err.log
  done
done
tar -C $OUT -czf $OUT/ab.tar.gz ab && rm -rf $OUT/ab
for i in 1 2 3; do
  timeout 120 ./new-bench --vendor cuda --modes raw,plain,raw-window,window,raw-registered,registered,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 2K -f 4 -w 100 -n 2000 -c 0 --place out -J $OUT/byhand/bycost-$i.json > /dev/null 2>>$OUT/byhand/err.log
done
tar -C $OUT -czf $OUT/byhand.tar.gz byhand && rm -rf $OUT/byhand
echo done
