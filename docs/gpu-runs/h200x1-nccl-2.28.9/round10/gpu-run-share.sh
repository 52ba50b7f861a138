#!/bin/bash
# Round 10b (1x H200): auto's second communicator with NCCL's split resource sharing
# (NCCL_COMM_SPLIT_SHARE_RESOURCES 0/1): a world of one and two processes sharing the GPU;
# memory per mode and data checked (correctness: the speeds of a shared GPU say nothing).
cd "$(dirname "$0")/unicomm-bundle"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 UNICOMM_GPU_WORLD=1
log=$OUT/share.log; : > $log
for share in 0 1; do
  echo "== world of one, NCCL_COMM_SPLIT_SHARE_RESOURCES=$share" >> $log
  NCCL_COMM_SPLIT_SHARE_RESOURCES=$share timeout 100 ./unicomm-bench --vendor cuda --modes window,auto,registered --coll all_reduce,all_to_all -b 8 -e 512M -f 8 -w 5 -n 20 -c 1 --place out -J $OUT/share$share-w1.json >> $log 2>&1; echo "rc=$?" >> $log
  echo "== two processes, NCCL_COMM_SPLIT_SHARE_RESOURCES=$share" >> $log
  NCCL_COMM_SPLIT_SHARE_RESOURCES=$share NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE=$OUT/nccl-share$share.%h.%p.log timeout 150 ./xtask launch --procs 2 --share-gpu --timeout-s 140 -- ./unicomm-bench --vendor cuda --modes window,auto,registered --coll all_reduce,all_to_all -b 8 -e 64M -f 8 -w 2 -n 10 -c 1 --place out -J $OUT/share$share-p2.json >> $log 2>&1; echo "rc=$?" >> $log
done
grep -h -i "split\|share" $OUT/nccl-share*.log | sort | uniq -c | head -20 >> $log
rm -f $OUT/nccl-share*.log
grep -E "^==|rc=|# mode|wrong [1-9]|error" $log | head -60
