#!/bin/bash
# Round 11c (1x H200): unicomm's host cost per call, the code before (c75360a, dist/old) and
# after the per-call changes (registry answers remembered, both buffers under one lock, the
# stream's watcher check without a lock, the policy's rules by index), alternating, same
# machine, same session. Host-bound sizes (a world of one), where the host's cost per call
# is the time.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
mkdir -p $OUT/ab
log=$OUT/ab/ab.log; : > $log
for i in 1 2 3; do
  for v in old new; do
    b=./old; [ $v = new ] && b=./unicomm-bundle
    echo "== $v overhead $i" >> $log
    timeout 120 $b/overhead >> $log 2>&1
    echo "== $v bench $i" >> $log
    timeout 120 $b/unicomm-bench --vendor cuda --order size --modes raw,plain,registered,window,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 128K -f 4 -w 50 -n 1000 -c 0 --place out -J $OUT/ab/bench-$v-$i.json >> $log 2>&1
  done
done
echo "== new, data checked, every mode incl. ce" >> $log
timeout 200 ./unicomm-bundle/unicomm-bench --vendor cuda --coll all_reduce,all_to_all,all_gather,reduce_scatter,broadcast -b 8 -e 512M -f 8 -w 2 -n 10 -c 1 --place out,in -J $OUT/ab/check-new.json >> $log 2>&1; echo "rc=$?" >> $log
echo "== new, GPU-specific suite" >> $log
timeout 200 ./unicomm-bundle/nccl-gpu --test-threads=1 --skip conformance:: >> $log 2>&1; echo "rc=$?" >> $log
echo "== new, conformance world 1" >> $log
timeout 200 ./unicomm-bundle/nccl-gpu --test-threads=1 conformance:: > $OUT/ab/conformance.log 2>&1; echo "rc=$?" >> $log; grep "test result" $OUT/ab/conformance.log >> $log
echo "== new, two processes: rank_conformance with the check, faults mismatch and policy" >> $log
cd unicomm-bundle
UNICOMM_CHECK_COLLECTIVES=1 timeout 240 ./xtask launch --procs 2 --share-gpu --timeout-s 230 -- ./rank_conformance --vendor cuda >> $log 2>&1; echo "rc=$?" >> $log
for s in mismatch policy ce-skip; do UNICOMM_TIMEOUT_MS=10000 timeout 120 ./xtask launch --procs 2 --share-gpu --timeout-s 110 -- ./faults --vendor cuda --scenario $s >> $log 2>&1; echo "rc=$?" >> $log; done
cd ..
tar -C $OUT -czf $OUT/ab.tar.gz ab && rm -rf $OUT/ab
