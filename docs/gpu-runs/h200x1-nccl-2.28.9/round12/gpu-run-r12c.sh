#!/bin/bash
# Round 12c (1x H200): where the plain call's samples fall inside unicomm's hottest
# functions (perf annotate), 8 B all_reduce, 300,000 calls; and the same for raw-window.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 UNICOMM_GPU_WORLD=1
L=$OUT/r12c; mkdir -p $L
tar -xJf perf.tar.xz -C /tmp; P=/tmp/perf
for m in plain raw-window; do
  LD_LIBRARY_PATH=$P/lib $P/perf record -e cpu-clock:u -F 25000 -o /tmp/p.data ./new-bench --vendor cuda --modes $m --coll all_reduce -b 8 -e 8 -w 1000 -n 300000 --rounds 1 -c 0 --place out > $L/bench-$m.log 2>&1
  LD_LIBRARY_PATH=$P/lib $P/perf report -i /tmp/p.data --no-children --sort dso,symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -70 > $L/report-$m.txt
  if [ $m = plain ]; then
    for s in 'unicomm_nccl_api::comm::ApiComm<R>::call' '<unicomm_nccl::runtime::CudaRuntime as unicomm_nccl_api::runtime::Runtime>::with_device' '<unicomm::dispatch::AnyComm as unicomm_core::backend::Collective>::enqueue' 'unicomm_nccl_api::collective::<impl unicomm_core::backend::Collective for unicomm_nccl_api::comm::ApiComm<R>>::enqueue'; do
      echo "=== $s" >> $L/annotate.txt
      LD_LIBRARY_PATH=$P/lib $P/perf annotate -i /tmp/p.data --stdio -s "$s" 2>/dev/null | grep -E "^ +[0-9]+\.[0-9]+ +:" | sort -rn | head -25 >> $L/annotate.txt
    done
    LD_LIBRARY_PATH=$P/lib $P/perf report -i /tmp/p.data --no-children --sort dso,symbol --stdio --dsos libcuda.so.580.159.04 2>/dev/null | grep -E "^ +[0-9]" | head -15 > $L/libcuda-plain.txt
  fi
  rm -f /tmp/p.data
done
tar -C $OUT -czf $OUT/r12c.tar.gz r12c && rm -rf $L
