#!/bin/bash
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib NCCL_NVLS_ENABLE=0
{ ldd --version | head -1; ./perf --version; cat /proc/sys/kernel/perf_event_paranoid; } > $OUT/env.txt 2>&1
./perf record -e cpu-clock:u -F 20000 -g -o $OUT/p.data ./overhead > $OUT/overhead.log 2>$OUT/record.err
./perf report -i $OUT/p.data --no-children --sort dso,symbol --stdio 2>$OUT/report.err | grep -E "^ +[0-9]" | head -80 > $OUT/report.txt
./perf report -i $OUT/p.data --no-children --sort dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -15 > $OUT/dso.txt
rm -f $OUT/p.data
