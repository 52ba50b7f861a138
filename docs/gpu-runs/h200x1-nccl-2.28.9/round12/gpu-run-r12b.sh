#!/bin/bash
# Round 12b (1x H200): the by-hand modes (raw-registered, raw-window) beside the others,
# every collective, in and out of place, data checked; across two processes sharing the
# GPU; and their host cost against unicomm's window and auto modes at host-bound sizes.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
L=$OUT/r12b; mkdir -p $L
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv; } > $L/machine.txt 2>&1
echo "== [$(date +%T)] world 1, every collective" >> $L/steps.log
timeout 200 ./unicomm-bench --vendor cuda --modes raw,raw-registered,raw-window,registered,window,auto -b 8 -e 512M -f 4 -w 5 -n 20 -c 1 --place out,in --coll all_reduce,all_to_all,all_gather,reduce_scatter,broadcast -J $L/raw-modes.json > $L/raw-modes.log 2>&1; echo "rc=$?" >> $L/steps.log
echo "== [$(date +%T)] single thread" >> $L/steps.log
timeout 100 ./unicomm-bench --vendor cuda --single-thread --modes raw-registered,raw-window,window -b 8 -e 64M -f 8 -w 2 -n 10 -c 1 --place out,in --coll all_reduce,all_gather -J $L/raw-modes-single.json > $L/raw-modes-single.log 2>&1; echo "rc=$?" >> $L/steps.log
echo "== [$(date +%T)] two processes sharing the GPU" >> $L/steps.log
timeout 200 ./xtask launch --procs 2 --share-gpu --timeout-s 180 -- ./unicomm-bench --vendor cuda --modes raw,raw-registered,raw-window,window -b 8 -e 64M -f 8 -w 2 -n 10 -c 1 --place out,in --coll all_reduce,all_to_all,all_gather -J $L/raw-modes-procs.json > $L/raw-modes-procs.log 2>&1; echo "rc=$?" >> $L/steps.log
echo "== [$(date +%T)] host cost, 3 runs" >> $L/steps.log
for i in 1 2 3; do
  timeout 120 ./unicomm-bench --vendor cuda --modes raw,plain,raw-window,window,raw-registered,registered,auto --coll all_reduce,all_to_all,all_gather -b 8 -e 2K -f 4 -w 100 -n 2000 -c 0 --place out -J $L/bycost-$i.json > /dev/null 2>>$L/err.log; echo "rc=$?" >> $L/steps.log
done
echo "== [$(date +%T)] done" >> $L/steps.log
tar -C $OUT -czf $OUT/r12b.tar.gz r12b && rm -rf $L
cat $OUT/../r12b-steps 2>/dev/null
