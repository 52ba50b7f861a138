# Written by `cargo xtask bundle`, sourced by run.sh for PARTS=multirank: two processes on
# the one GPU in NCCL's own multi-rank mode (NCCL >= 2.30.3: NCCL_MULTI_RANK_GPU_ENABLE=1,
# one host, P2P between the ranks, NCCL's symmetric kernels), correctness only (the two
# contexts time-share the GPU). Run with NCCL naming such a library (NCCL=path.so.xz). NCCL's
# INIT lines (transport, symmetric support) and, per unicomm-bench mode, the kernels NCCL
# ran (its TUNING lines, counted) are kept in multirank.log.
L="$OUT/multirank.log"; : > "$L"
[ -n "${UNICOMM_NCCL_LIBRARY:-}" ] || { echo "multirank: name a NCCL >= 2.30.3 (NCCL=... or UNICOMM_NCCL_LIBRARY)" | tee -a "$L"; rc=1; return; }
L2="./xtask launch --procs 2 --share-gpu --timeout-s 300"
line=$($L2 -- true 2>&1 | grep -m1 -- "--share-gpu")
echo "$line" | tee -a "$L"
echo "$line" | grep -q "multi-rank mode" || { echo "multirank: the launcher did not take NCCL's multi-rank mode" | tee -a "$L"; rc=1; return; }
run2() { # $1 = label, then the command after the launcher's --
  local label=$1; shift
  step multirank "$label"
  $L2 -- "$@" >> "$L" 2>&1; local c=$?
  echo "multirank $label: rc=$c" | tee -a "$L"; [ $c -eq 0 ] || rc=1
}
# NCCL's INIT lines of the first launch: the transport between the ranks and symmetric support.
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE="$OUT/mr-init.%h.%p.log" run2 "rank_conformance (captured steps of every path)" ./rank_conformance --vendor cuda
grep -hoE "via P2P[^ ]*|via NET[^ ]*|via SHM[^ ]*|isAllCudaP2p [0-9]|symmetricSupport [0-9]|nvlsSupport [0-9]|Duplicate GPU[^\n]*" "$OUT"/mr-init.*.log 2>/dev/null | sort | uniq -c | tee -a "$L"
rm -f "$OUT"/mr-init.*.log
# unicomm's own kernels (the symmetric all-reduces, the fused norm, the device-API kernel)
# over 1,000 graph replays each, every replay checked (MR_REPLAYS to change: 10,000 took
# 414 s on an H200 as 2 processes, more than the part fits in a 10-minute call beside the rest).
step multirank own kernels; ./xtask launch --procs 2 --share-gpu --timeout-s 560 -- ./rank_conformance --vendor cuda --symmetric-only --replays ${MR_REPLAYS:-1000} >> "$L" 2>&1; c=$?
echo "multirank own kernels, ${MR_REPLAYS:-1000} replays: rc=$c" | tee -a "$L"; [ $c -eq 0 ] || rc=1
run2 "groups suite" ./rank_conformance --vendor cuda --groups-only
run2 "by_id" ./by_id --vendor cuda
# A world of one grown into both processes (ncclCommGrow, NCCL >= 2.29.2).
run2 "grow" ./grow --vendor cuda
for sc in skip abort ce-skip ce-abort mismatch forget completion-abort completion-drop completion-mismatch sym-skip sym-abort sym-leave dev-skip; do
  UNICOMM_TIMEOUT_MS=10000 run2 "faults $sc" ./faults --vendor cuda --scenario $sc
done
# kill, kill-replay and sym-kill (a peer SIGKILLed among replays of unicomm's kernel) started by hand (the launcher would stop rank 0 when rank 1 dies),
# in the multi-rank mode's environment; the verdict is rank 0's.
for sc in kill kill-replay sym-kill; do
  step multirank faults $sc; kport=$((29600 + RANDOM % 300))
  for r in 0 1; do
    env -u NCCL_HOSTID NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_CTAS=${NCCL_MAX_CTAS:-8} RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$kport UNICOMM_TIMEOUT_MS=20000 timeout 120 ./faults --vendor cuda --scenario $sc &
  done >> "$L" 2>&1
  wait; grep -qE "faults $sc: rank 0: (.*; )?PASSED" "$L" && echo "multirank faults $sc: rank 0 PASSED" || { echo "multirank faults $sc: rank 0 did not pass"; rc=1; }
done
# Ranks told different world sizes (rank 0 WORLD_SIZE=2, rank 1 3): both refused at once.
step multirank faults world-mismatch; kport=$((29600 + RANDOM % 300))
for r in 0 1; do
  env -u NCCL_HOSTID NCCL_MULTI_RANK_GPU_ENABLE=1 RANK=$r WORLD_SIZE=$((2 + r)) LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$kport UNICOMM_BOOTSTRAP_TIMEOUT_S=60 timeout 90 ./faults --vendor cuda --scenario world-mismatch &
done >> "$L" 2>&1
wait; [ "$(grep -cE "faults world-mismatch: rank [01]: .*PASSED" "$L")" = 2 ] && echo "multirank faults world-mismatch: both ranks PASSED" || { echo "multirank faults world-mismatch: not both ranks passed"; rc=1; }
step multirank faults churn; timeout $(( ${CHURN_BUDGET:-120} + 90 )) ./faults --vendor cuda --scenario churn --comms 200 --budget-s ${CHURN_BUDGET:-120} >> "$L" 2>&1; c=$?
echo "multirank faults churn: rc=$c" | tee -a "$L"; [ $c = 0 ] || rc=1
# A rank SIGKILLed, the survivor shrinks or re-forms; a planned departure (default, abort).
UNICOMM_TIMEOUT_MS=10000 $L2 --expect-lost 1 -- ./shrink --vendor cuda --victim 1 >> "$L" 2>&1; c=$?; echo "multirank shrink killed: rc=$c" | tee -a "$L"; [ $c = 0 ] || rc=1
for mode in default abort; do UNICOMM_TIMEOUT_MS=30000 run2 "shrink leave $mode" ./shrink --vendor cuda --victim 1 --fault leave --mode $mode; done
if [ -x ./llama_tp ]; then
  NCCL_DIR=$(dirname "$UNICOMM_NCCL_LIBRARY") LD_LIBRARY_PATH=/usr/local/cuda/lib64:$(dirname "$UNICOMM_NCCL_LIBRARY")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} run2 "candle llama_tp bf16" ./llama_tp --vendor cuda --dtype bf16
else echo "multirank: no llama_tp in this bundle: not run" | tee -a "$L"; rc=1; fi
# unicomm-bench, data checked, every mode and collective; the kernels NCCL ran per mode.
for mode in plain registered window ce; do
  colls=all_reduce,all_gather,reduce_scatter,all_to_all,all_to_all_v,broadcast,gather,scatter
  [ $mode = ce ] && colls=all_to_all,all_gather
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING NCCL_DEBUG_FILE="$OUT/mr-tune-$mode.%h.%p.log" run2 "bench $mode" ./unicomm-bench --vendor cuda --modes $mode --coll $colls -b 8 -e 4M -f 8 -w 2 -n 5 -c 1 --place out
  { echo "# $mode: NCCL kernels (TUNING lines of both ranks, by collective and kernel)"
    cat "$OUT"/mr-tune-$mode.*.log 2>/dev/null | grep -oE "[A-Za-z]+( \[Symmetric\])?: [0-9]+ Bytes -> (Kernel [A-Za-z_0-9]+|Algo [A-Za-z_]+ proto [A-Za-z0-9]+)" | sed -E 's/: [0-9]+ Bytes//' | sort | uniq -c
  } | tee -a "$L"
  rm -f "$OUT"/mr-tune-$mode.*.log
done
run2 "bench symmetric kernels" ./unicomm-bench --vendor cuda --modes plain,window,one-shot,two-shot,lamport,device-api --coll all_reduce -b 8 -e 1M -f 8 -w 2 -n 5 -c 1 --place out
run2 "bench fp8 all_reduce" ./unicomm-bench --vendor cuda --modes plain,window --coll all_reduce -d f8e4m3 -b 8 -e 1M -f 8 -w 2 -n 5 -c 1 --place out
run2 "bench scaled sums" ./unicomm-bench --vendor cuda --modes plain,window --coll all_reduce,reduce_scatter -o premulsum -b 8 -e 1M -f 8 -w 2 -n 5 -c 1 --place out
run2 "bench decode preset in graphs" ./unicomm-bench --vendor cuda --preset decode --modes plain,window -G 5 -w 2 -n 5 -c 1 --place out
grep -E "wrong|FAILED|panicked|error" "$L" | grep -v "^ *0 wrong" | head -20
echo "overall rc=$rc"
