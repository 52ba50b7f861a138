#!/bin/bash
# Written by `cargo xtask bundle`: runs every GPU test and benchmark of the bundle on a
# machine without a Rust toolchain, for the vendor(s) whose binaries it holds (nccl-*,
# rccl-*). Logs go to $OUT (or ./logs). NVLink multicast stays off. A vendor whose GPU is
# absent fails its tests (NoDevice), it is never skipped.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/logs}; mkdir -p "$OUT"
cd "$(dirname "$0")"
# NCCL EP as the bundle fetched it: the library for the driver's CUDA major is found under
# NCCL_EP_HOME/lib/cuXX, its JIT reads its headers there, NCCL's from NCCL_HOME, nvcc from
# CUDA_HOME.
if [ -d nccl-ep/ep ]; then
  export NCCL_EP_HOME=$PWD/nccl-ep/ep NCCL_HOME=$PWD/nccl-ep/nccl CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
fi
step() { echo "== [$(date +%T)] $*"; }
rc=0
# PARTS=all (default), quick (tests, examples, overhead), conformance, cesync (the
# copy-engine path ordered by signals against barriers), autoprobe (why auto
# trails the window mode for small all_reduce; auto's memory with shared split resources), bench (the
# unicomm-bench sweep and the visualgen preset), faults (deadlines, a killed rank, resource
# churn), procs (one rank per process, default and network transports; with one GPU both
# ranks share it, for correctness) or overlap (a
# kernel's slowdown under NCCL's and the copy-engine all_to_all; the single-thread sweep), groups
# (process groups: split, the mesh, gather/scatter, the variable-size exchanges, fp8, scaled
# sums, in one process and as 2, 3 and 4 processes; the engine example), shrink (a rank
# SIGKILLed, the survivors shrink or re-form and go on), candle (unicomm-candle's Llama block and
# its all-reduce op against candle's own, on candle's CUDA backend), multirank (2 processes on one GPU in
# NCCL's multi-rank mode, NCCL >= 2.30.3: multirank.sh), kernels (unicomm's symmetric
# kernels on one GPU against its floors, world 1 and two ranks under MPS: kernels.sh),
# rccl-on-cuda (a rocm bundle's RCCL backend on an NVIDIA GPU through its HIP-on-CUDA runtime, NCCL standing in for RCCL): each takes
# minutes, so a time-limited session can run them in separate calls. BENCH_ARGS adds to the
# sweep's arguments.
PARTS=${PARTS:-all}
# NCCL=torch (PyTorch's wheel, 2.28.9 on the GPU machine), system (the machine's own), a
# libnccl.so.2 path, or a .so.xz as `nccl-sm90` writes it (unpacked under $TMPDIR): the
# library every part loads (UNICOMM_NCCL_LIBRARY). Unset: the library's own search. The
# doctor's line names the path and version loaded, at the top of each part's output.
TORCH_NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
case "${NCCL:-}" in
  "") ;;
  torch) export UNICOMM_NCCL_LIBRARY=$TORCH_NCCL ;;
  system) export UNICOMM_NCCL_LIBRARY=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}') ;;
  *.xz) d="${TMPDIR:-/tmp}/unicomm-nccl-$$"; mkdir -p "$d"
        xz -dc "$NCCL" > "$d/libnccl.so.2" || { echo "NCCL=$NCCL: cannot unpack"; exit 1; }
        export UNICOMM_NCCL_LIBRARY=$d/libnccl.so.2 ;;
  *) export UNICOMM_NCCL_LIBRARY=$NCCL ;;
esac
if [ -n "${NCCL:-}" ] && [ ! -f "$UNICOMM_NCCL_LIBRARY" ]; then echo "NCCL=$NCCL: no library at '$UNICOMM_NCCL_LIBRARY'"; exit 1; fi
[ -x ./doctor ] && echo "NCCL for PARTS=$PARTS: $(./doctor 2>&1 | grep -m1 'library: nccl' || echo 'not loaded (see the doctor)')" | tee -a "$OUT/nccl.txt"
# Ranks sharing a GPU (--share-gpu): two take NCCL's multi-rank mode where the NCCL has it
# (>= 2.30.3; the launcher says which), more are separate hosts (the mode takes at most 2
# per GPU). NCCL 2.32.3 gives no symmetric window to ranks it sees on separate hosts (a
# NULL window: Unsupported), where 2.28.9 gave one, so two ranks on one GPU reach windows
# only in the mode. Set NCCL_MULTI_RANK_GPU_ENABLE to choose for every launch.
xlaunch() {
  local n; n=$(printf '%s ' "$@" | sed -nE 's/.*--procs ([0-9]+).*/\1/p')
  if [ "${n:-2}" -gt 2 ] && [ -z "${NCCL_MULTI_RANK_GPU_ENABLE:-}" ]; then
    NCCL_MULTI_RANK_GPU_ENABLE=0 ./xtask launch "$@"
  else ./xtask launch "$@"; fi
}
if [ "$PARTS" = multirank ]; then source ./multirank.sh; exit $rc; fi
if [ "$PARTS" = kernels ]; then source ./kernels.sh; exit $rc; fi
gpus() { # $1 = cuda|rocm
  if [ "$1" = cuda ]; then nvidia-smi -L 2>/dev/null | grep -c "^GPU"
  else ls /sys/class/kfd/kfd/topology/nodes 2>/dev/null | while read n; do grep -q "^simd_count [1-9]" /sys/class/kfd/kfd/topology/nodes/$n/properties && echo; done | wc -l; fi
}
# The suite's world sizes (worlds.txt, written by the xtask from its one list): those larger
# than this machine's GPU count are not run, and this says so.
skips() { # $1 = GPU count
  while read w name; do
    if [ "$1" -lt "$w" ] && [ "$w" -gt 1 ]; then printf -- "--skip %s " "$name"; echo "conformance: world size $w not run ($1 GPU(s) here)" >&2; fi
  done < worlds.txt
}
if [ "$PARTS" = candle ]; then
  # unicomm-candle on candle's CUDA backend: the tensor-parallel Llama block as 2 processes
  # (sharing the GPU where there is one: NCCL told they are separate hosts), bf16 and f32,
  # each rank against the unsharded forward on the GPU; then the all-reduce op's cost per
  # call against candle's own op over cudarc's NCCL, world 1. candle's binaries link CUDA
  # 13.0's libraries (the toolkit's lib64) and libnccl.so.2 (PyTorch's wheel).
  [ -x ./llama_tp ] && [ -x ./allreduce_cost ] && [ -x ./pipeline_tp ] || { echo "candle: this bundle has no unicomm-candle binaries (cargo xtask bundle --vendor cuda)"; exit 1; }
  # cudarc's NCCL (candle's own op in allreduce_cost) is the one unicomm loads: two NCCLs in
  # one process failed candle's op on 2.32.3 (ncclInvalidArgument).
  NCCL_DIR=${NCCL_DIR:-$(dirname "${UNICOMM_NCCL_LIBRARY:-$TORCH_NCCL}")}
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU"); [ "$n" -ge 1 ] || { echo "candle: no NVIDIA GPU here"; exit 1; }
  [ "$n" -ge 2 ] && share= || share=--share-gpu
  rc=0; L="$OUT/candle.log"; : > "$L"
  ldd ./llama_tp | grep -E "cuda|cublas|curand|nvrtc|nccl|not found" | tee -a "$L"
  step candle llama_tp, one rank; timeout 120 ./llama_tp --vendor cuda --ranks 1 --dtype bf16 2>&1 | tee -a "$L" | tail -2; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  for dt in bf16 f32; do
    step candle llama_tp, 2 processes, $dt
    xlaunch --procs 2 $share --timeout-s 200 -- ./llama_tp --vendor cuda --dtype $dt 2>&1 | tee -a "$L" | grep -E "llama_tp|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  done
  # Two pipeline stages of two tensor-parallel ranks (send/recv between the stages).
  step candle pipeline_tp, 4 processes
  xlaunch --procs 4 $share --timeout-s 200 -- ./pipeline_tp --vendor cuda 2>&1 | tee -a "$L" | grep -E "pipeline_tp|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  # A step of candle's kernels and unicomm's all-reduce captured in one CUDA graph, replayed
  # with a new input each time: world 1, then 2 processes.
  if [ -x ./captured_step ]; then
    step candle captured_step, one rank; timeout 120 ./captured_step 2>&1 | tee -a "$L" | tail -1; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step candle captured_step, 2 processes
    xlaunch --procs 2 $share --timeout-s 200 -- ./captured_step 2>&1 | tee -a "$L" | grep -E "captured_step|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  else echo "candle: no captured_step in this bundle: not run"; rc=1; fi
  step candle allreduce_cost; timeout 200 ./allreduce_cost 2>&1 | tee -a "$L"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  echo "overall rc=$rc"; exit $rc
fi
if [ "$PARTS" = rccl-on-cuda ]; then
  # The RCCL backend, unchanged, on an NVIDIA GPU: the HIP runtime is the test-only
  # HIP-on-CUDA library of this bundle, RCCL is NCCL's library (the same C API; set
  # RCCL_STAND_IN to another libnccl.so.2). It proves the backend's own logic on a GPU, not
  # HIP's semantics on AMD hardware (docs/rocm.md).
  [ -x ./rccl-conformance ] && [ -f ./libunicomm_hip_on_cuda.so ] || { echo "rccl-on-cuda: this bundle has no RCCL binaries or no HIP-on-CUDA runtime (cargo xtask bundle --vendor rocm)"; exit 1; }
  export UNICOMM_HIP_LIBRARY=$PWD/libunicomm_hip_on_cuda.so
  export UNICOMM_RCCL_LIBRARY=${RCCL_STAND_IN:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}
  [ -f "$UNICOMM_RCCL_LIBRARY" ] || { echo "rccl-on-cuda: no NCCL at $UNICOMM_RCCL_LIBRARY (set RCCL_STAND_IN)"; exit 1; }
  n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU"); [ "$n" -ge 1 ] || { echo "rccl-on-cuda: no NVIDIA GPU here"; exit 1; }
  export UNICOMM_GPU_WORLD=1; [ "$n" -ge 2 ] && share= || share=--share-gpu
  rc=0; L="$OUT/rccl-on-cuda.log"; : > "$L"
  step rccl-on-cuda doctor; ./doctor 2>&1 | tee -a "$L" | grep -A3 "^\[rocm\]"
  for e in allreduce_ub alltoall_ub; do step rccl-on-cuda $e; timeout 120 ./$e --vendor rocm 2>&1 | tee -a "$L" | tail -1; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1; done
  step rccl-on-cuda gpu-specific
  for t in registration ranks ipc signals symmetric; do [ -x ./rccl-$t ] || continue; timeout 200 ./rccl-$t --test-threads=1 >> "$L" 2>&1 || rc=1; done; grep -E "test result|FAILED" "$L" | tail -4
  # unicomm's symmetric kernels through HIP: the one source's PTX, loaded by HIP-on-CUDA
  # (an AMD GPU refuses it: Unsupported naming why), world 1 and one rank per process.
  step rccl-on-cuda symmetric_decode, world 1 and 2 processes
  timeout 120 ./symmetric_decode --vendor rocm --ranks 1 2>&1 | tee -a "$L" | tail -2; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  xlaunch --procs 2 $share --timeout-s 200 -- ./symmetric_decode --vendor rocm 2>&1 | tee -a "$L" | grep -E "PASSED|FAILED|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  step rccl-on-cuda faults sym-skip; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor rocm --scenario sym-skip 2>&1 | tee -a "$L" | grep -E "PASSED|FAILED|error"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  step rccl-on-cuda conformance and groups, world 1
  timeout 300 ./rccl-conformance --test-threads=1 $(skips 1) >> "$L" 2>&1 || rc=1
  timeout 200 ./rccl-groups --test-threads=1 >> "$L" 2>&1 || rc=1; grep -E "test result|FAILED" "$L" | tail -2
  for n2 in 2 3; do step rccl-on-cuda $n2 processes; xlaunch --procs $n2 $share --timeout-s 200 -- ./rank_conformance --vendor rocm 2>&1 | tee -a "$L" | grep -E "PASSED|FAILED|error"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1; done
  step rccl-on-cuda copy engines across processes, data checked
  xlaunch --procs 2 $share --timeout-s 200 -- ./unicomm-bench --vendor rocm --modes window,ce --coll all_to_all,all_to_all_v,all_gather -b 64K -e 4M -f 4 -w 2 -n 5 --place out 2>&1 | tee -a "$L" | grep -E "wrong|error|==>" ; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  for sc in skip ce-skip ce-abort; do step rccl-on-cuda faults $sc; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor rocm --scenario $sc 2>&1 | tee -a "$L" | grep -E "PASSED|FAILED|error"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1; done
  step rccl-on-cuda shrink; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 4 $share --expect-lost 3 --timeout-s 200 -- ./shrink --vendor rocm --victim 3 2>&1 | tee -a "$L" | grep -E "PASSED|FAILED|error"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  echo "overall rc=$rc"; exit $rc
fi
# A part that finds no vendor's binaries (a slim tar without them) fails, never passes.
vendors_run=0
for v in nccl rccl; do
  ls ./$v-* > /dev/null 2>&1 || continue
  vendors_run=$((vendors_run + 1))
  vendor=$([ $v = nccl ] && echo cuda || echo rocm)
  export UNICOMM_GPU_WORLD=$(gpus $vendor); [ "$UNICOMM_GPU_WORLD" -ge 1 ] || UNICOMM_GPU_WORLD=1
  SKIP=$(skips "$UNICOMM_GPU_WORLD")
  loader=$([ $v = nccl ] && echo nccl-loader || echo rccl-hip_loader)
  if [ "$PARTS" = bench ] || [ "$PARTS" = all ]; then
    # Calibrate the automatic policy (cargo xtask tune), then the sweep with every mode,
    # auto reading those thresholds, so auto is compared with each fixed mode in one run.
    step $v tune
    timeout ${TUNE_TIMEOUT:-150} ./unicomm-bench --vendor $vendor --modes registered,window,ce --place out --coll all_reduce,all_to_all,all_gather -b 8 -e 512M -f 4 -w ${BENCH_WARMUP:-20} -n ${BENCH_ITERS:-200} --tune "$OUT/$v-tune.txt" -J "$OUT/$v-tune.json" > "$OUT/$v-tune.log" 2>&1 || rc=1
    cat "$OUT/$v-tune.txt"
    export UNICOMM_TUNE_FILE="$OUT/$v-tune.txt"
    step $v bench sweep
    timeout ${BENCH_TIMEOUT:-240} ./unicomm-bench --vendor $vendor -b 8 -e 512M -f 4 -w ${BENCH_WARMUP:-20} -n ${BENCH_ITERS:-200} ${BENCH_ARGS---coll all_reduce,all_to_all,all_gather --place out} -J "$OUT/$v-bench.json" --plot "$OUT/$v-bench.svg" > "$OUT/$v-bench.log" 2>&1 || rc=1
    grep "^# mode" "$OUT/$v-bench.log"
    # The small sizes again with CUDA graphs (-G, CUDA only): the device's time without the
    # host's per-call cost, where direct calls tie at the host's pace (a2b12b3:docs/benchmarks.md).
    if [ $v = nccl ]; then
      step $v bench graphs, small sizes
      timeout ${GRAPHS_TIMEOUT:-120} ./unicomm-bench --vendor $vendor -G 20 -b 8 -e 2M -f 4 -w ${BENCH_WARMUP:-20} -n ${BENCH_ITERS:-200} --coll all_reduce,all_to_all,all_gather --place out -J "$OUT/$v-bench-graphs.json" > "$OUT/$v-bench-graphs.log" 2>&1 || rc=1
      grep -E "^# mode|wrong|error" "$OUT/$v-bench-graphs.log" | tail -12
    fi
    # NCCL_CUMEM_ENABLE unset is NCCL's auto-detection (-2: on where cuMem works, as on H200),
    # so the sweep above already ran on cuMem; 1 forces it. With 1 NCCL's INIT/P2P/REG log is
    # kept (the tail) to show where a stall sits (NVIDIA/nccl#2379: a cuMem fd request
    # through the proxy's Unix socket can wait forever).
    for cumem in 0 1 auto; do
      step $v visualgen NCCL_CUMEM_ENABLE=$cumem
      if [ $cumem = auto ]; then unset NCCL_CUMEM_ENABLE; else export NCCL_CUMEM_ENABLE=$cumem; fi
      dbg=(); [ $cumem = 1 ] && dbg=(env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,REG NCCL_DEBUG_FILE="$OUT/$v-visualgen-cumem1-nccl.%h.%p.log")
      # A stall becomes a Timeout naming the wait (UNICOMM_TIMEOUT_MS), before `timeout` kills it.
      UNICOMM_TIMEOUT_MS=${PRESET_DEADLINE_MS:-30000} timeout ${PRESET_TIMEOUT:-60} "${dbg[@]}" ./unicomm-bench --vendor $vendor --preset visualgen -w 5 -n 20 --place out -J "$OUT/$v-visualgen-cumem$cumem.json" > "$OUT/$v-visualgen-cumem$cumem.log" 2>&1 || rc=1
      tail -3 "$OUT/$v-visualgen-cumem$cumem.log"
    done
    unset NCCL_CUMEM_ENABLE
    # Keep the NCCL log small enough to come back: its last lines say where it stopped.
    for f in "$OUT/$v"-visualgen-cumem1-nccl.*.log; do [ -f "$f" ] && tail -200 "$f" > "$f.tail" && rm -f "$f"; done
    unset UNICOMM_TUNE_FILE
  fi
  if [ "$PARTS" = bench ] || [ "$PARTS" = cesync ] || [ "$PARTS" = all ]; then
    # The copy-engine path ordered by signals (the default: stream waits on flags the peers'
    # copy engines write, no kernel) against the NCCL barriers it used before, the window
    # mode as the common reference of the runs; data checked. `signals-copy`: the peers
    # signalled by 4-byte copies (UNICOMM_CE_SIGNAL=copy) instead of stream writes.
    for sync in signals signals-copy barrier; do
      step $v copy-engine sync $sync
      sig=write; [ $sync = signals-copy ] && sig=copy
      UNICOMM_CE_SIGNAL=$sig UNICOMM_CE_SYNC=${sync%-copy} timeout ${BENCH_TIMEOUT:-240} ./unicomm-bench --vendor $vendor --modes window,ce -b 8 -e 512M -f 4 -w ${BENCH_WARMUP:-20} -n ${BENCH_ITERS:-200} -c 1 --coll all_to_all,all_gather --place out -J "$OUT/$v-cesync-$sync.json" > "$OUT/$v-cesync-$sync.log" 2>&1 || rc=1
      grep -E "^# mode|wrong| 536870912 " "$OUT/$v-cesync-$sync.log" | tail -6
    done
  fi
  if [ "$PARTS" = bench ] || [ "$PARTS" = cesync ]; then continue; fi
  if [ "$PARTS" = autoprobe ]; then
    # Why auto trails the window mode for all_reduce at 8-32 KiB (a2b12b3:docs/benchmarks.md): auto
    # forced to the window path, with and without the copy-engine sharing (peer access).
    printf 'all_reduce max window\n' > "$OUT/$v-autoprobe-tune.txt"
    for ce in 0 1; do
      step $v autoprobe UNICOMM_AUTO_COPY_ENGINE=$ce
      UNICOMM_TUNE_FILE="$OUT/$v-autoprobe-tune.txt" UNICOMM_AUTO_COPY_ENGINE=$ce timeout 120 ./unicomm-bench --vendor $vendor --modes window,auto,registered --coll all_reduce -b 2K -e 128K -f 2 -w 50 -n 500 --place out -J "$OUT/$v-autoprobe-ce$ce.json" > "$OUT/$v-autoprobe-ce$ce.log" 2>&1 || rc=1
      grep -E "float" "$OUT/$v-autoprobe-ce$ce.log"
    done
    # Which kernel NCCL runs for each mode's calls (NCCL_DEBUG_SUBSYS=TUNING: rank 0 logs
    # "AllReduce [Symmetric]: N Bytes -> Kernel K" for a symmetric kernel, "AllReduce: N
    # Bytes -> Algo A proto P" otherwise): whether auto's window path gets the window
    # mode's kernels. One process per mode; the lines counted per size and kernel (lines of
    # 8-392 bytes seen once are the benchmark's own exchanges, not its calls).
    for mode in window auto registered; do
      step $v autoprobe NCCL kernels: $mode
      UNICOMM_TUNE_FILE="$OUT/$v-autoprobe-tune.txt" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING NCCL_DEBUG_FILE="$OUT/$v-autoprobe-kernels-$mode.%h.%p.log" timeout 120 ./unicomm-bench --vendor $vendor --modes $mode --coll all_reduce -b 2K -e 128K -f 4 -w 2 -n 10 --rounds 1 -c 0 --place out > /dev/null 2>&1 || rc=1
      { echo "# $mode: calls per size and kernel (rank 0's NCCL TUNING lines)"
        cat "$OUT/$v-autoprobe-kernels-$mode".*.log 2>/dev/null | grep -oE "AllReduce( \[Symmetric\])?: [0-9]+ Bytes -> (Kernel [A-Za-z_0-9]+|Algo [A-Za-z_]+ proto [A-Za-z0-9]+)" | sort | uniq -c
      } >> "$OUT/$v-autoprobe-kernels.txt"
      rm -f "$OUT/$v-autoprobe-kernels-$mode".*.log
    done
    cat "$OUT/$v-autoprobe-kernels.txt"
    # Auto's second communicator with NCCL's resource sharing between a communicator and
    # its splits (NCCL_COMM_SPLIT_SHARE_RESOURCES, read at the parent's creation): its
    # device memory (window set up first, so auto's figure is the second communicator's)
    # and whether sharing changes the paths' speed; data checked.
    for share in 0 1; do
      step $v auto memory NCCL_COMM_SPLIT_SHARE_RESOURCES=$share
      NCCL_COMM_SPLIT_SHARE_RESOURCES=$share timeout 150 ./unicomm-bench --vendor $vendor --modes window,auto,registered --coll all_reduce,all_to_all -b 8 -e 512M -f 8 -w 5 -n 20 -c 1 --place out -J "$OUT/$v-autoshare$share.json" > "$OUT/$v-autoshare$share.log" 2>&1 || rc=1
      grep -E "^# mode|wrong" "$OUT/$v-autoshare$share.log"
    done
    continue
  fi
  if [ "$PARTS" = groups ] || [ "$PARTS" = all ]; then
    step $v groups in one process
    timeout 300 ./$v-groups --test-threads=1 --nocapture 2>&1 | tee "$OUT/$v-groups.log" | grep -E "^test |test result|panicked"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # One rank per process; with fewer GPUs than ranks the processes share them
    # (--share-gpu: NCCL is told they are on separate hosts; correctness, not speed).
    for n in 2 3 4; do
      if [ "$UNICOMM_GPU_WORLD" -ge $n ]; then share=; else share=--share-gpu; fi
      step $v groups: $n processes $share
      xlaunch --procs $n $share --timeout-s 300 -- ./rank_conformance --vendor $vendor --groups-only 2>&1 | tee -a "$OUT/$v-groups.log" | grep -E "PASSED|FAILED|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    done
    if [ "$UNICOMM_GPU_WORLD" -ge 4 ]; then share=; else share=--share-gpu; fi
    step $v engine_mesh: 4 processes $share
    xlaunch --procs 4 $share --timeout-s 300 -- ./engine_mesh --vendor $vendor 2>&1 | tee -a "$OUT/$v-groups.log" | grep -E "PASSED|FAILED|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # An engine's own bootstrap: rank 0's UniqueId through a file, init_rank on every rank.
    if [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then share=; else share=--share-gpu; fi
    step $v by_id: 2 processes $share
    xlaunch --procs 2 $share --timeout-s 120 -- ./by_id --vendor $vendor 2>&1 | tee -a "$OUT/$v-groups.log" | grep -E "PASSED|FAILED|error|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # NCCL's many-root creation (ncclCommInitRankScalable): 4 ranks, one root per 2; NCCL's
    # own log says how the communicator was made (kept in the groups log).
    if [ "$UNICOMM_GPU_WORLD" -ge 4 ]; then share=; else share=--share-gpu; fi
    step $v many roots: 4 processes $share, UNICOMM_RANKS_PER_ROOT=2
    UNICOMM_RANKS_PER_ROOT=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT xlaunch --procs 4 $share --timeout-s 120 -- ./from_env --vendor $vendor 2>&1 | tee -a "$OUT/$v-groups.log" | grep -E "PASSED|FAILED|error|==>|[Ss]calable|roots"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  fi
  if [ "$PARTS" = groups ]; then continue; fi
  if [ "$PARTS" = shrink ] || [ "$PARTS" = all ]; then
    # Four ranks, one SIGKILLed mid-stream; the survivors shrink and go on, data exact. With
    # fewer GPUs the processes share them (--share-gpu). 1: the deadline aborts the stuck
    # communicator, so the survivors re-form; 2: a watchdog revokes it first (NCCL >= 2.28.7),
    # so ncclCommShrink runs on it; 3: re-forming asked for, rank 0 lost.
    if [ "$UNICOMM_GPU_WORLD" -ge 4 ]; then share=; else share=--share-gpu; fi
    step $v shrink: deadline, victim 3
    UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 4 $share --expect-lost 3 --timeout-s 200 -- ./shrink --vendor $vendor --victim 3 2>&1 | tee "$OUT/$v-shrink.log" | grep -E "PASSED|FAILED|error|lost|now rank|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v shrink: revoke after 3 s, victim 3
    UNICOMM_TIMEOUT_MS=30000 xlaunch --procs 4 $share --expect-lost 3 --timeout-s 200 -- ./shrink --vendor $vendor --victim 3 --revoke-after-ms 3000 2>&1 | tee -a "$OUT/$v-shrink.log" | grep -E "PASSED|FAILED|error|lost|now rank|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v shrink: re-form asked for, victim 0
    UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 4 $share --expect-lost 0 --timeout-s 200 -- ./shrink --vendor $vendor --victim 0 --mode reform 2>&1 | tee -a "$OUT/$v-shrink.log" | grep -E "PASSED|FAILED|error|lost|now rank|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # NCCL's own shrink on a live communicator: 4: the victim silent (its peers' collective
    # hangs), a watchdog revokes the communicator (ncclCommRevoke, NCCL >= 2.28.7), then
    # ncclCommShrink; 5 and 6: a planned departure, default and abort modes.
    step $v shrink: a silent rank, revoke, ncclCommShrink
    UNICOMM_TIMEOUT_MS=60000 xlaunch --procs 4 $share --timeout-s 200 -- ./shrink --vendor $vendor --victim 3 --fault hang --revoke-after-ms 3000 2>&1 | tee -a "$OUT/$v-shrink.log" | grep -E "PASSED|FAILED|error|lost|now rank|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    for mode in default abort; do
      step $v shrink: a planned departure, mode $mode
      UNICOMM_TIMEOUT_MS=30000 xlaunch --procs 4 $share --timeout-s 200 -- ./shrink --vendor $vendor --victim 2 --fault leave --mode $mode 2>&1 | tee -a "$OUT/$v-shrink.log" | grep -E "PASSED|FAILED|error|lost|now rank|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    done
  fi
  if [ "$PARTS" = shrink ]; then continue; fi
  if [ "$PARTS" = faults ] || [ "$PARTS" = all ]; then
    # One rank per process through the bundle's launcher (xtask launch = run --procs). With
    # one GPU the two processes share it (--share-gpu: NCCL is told they are on two hosts).
    if [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then share=; else share=--share-gpu; echo "faults: one GPU here: the two ranks share it (xtask launch --share-gpu)"; fi
    step $v faults skip;  UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario skip 2>&1 | tee "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v faults abort; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario abort 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # The same on the copy-engine path (signal waits, which the abort must release).
    step $v faults ce-skip; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario ce-skip 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v faults ce-abort; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario ce-abort 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # Signal waits behind an all-reduce only the abort ends; a communicator dropped while
    # its all-to-all waits for a peer that never signals.
    step $v faults ce-behind; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario ce-behind 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v faults ce-drop; UNICOMM_TIMEOUT_MS=10000 xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario ce-drop 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # The ranks' automatic policies differ (rank 1's thresholds and UNICOMM_AUTO_COPY_ENGINE=0).
    # Calls that differ between the ranks, compared first (UNICOMM_CHECK_COLLECTIVES=1).
    step $v faults mismatch; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario mismatch 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    step $v faults policy; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario policy 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # A completion handle forgotten while its all-reduce waits for a late peer, then its
    # output dropped: the free waits for the device; a buffer allocated after it is intact.
    step $v faults forget; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario forget 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # A completion handle's own communicator aborted from another thread: Aborted at once.
    step $v faults completion-abort; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario completion-abort 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # A pending completion handle dropped while its peer is late: at once, the work exact.
    step $v faults completion-drop; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario completion-drop 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # A completion handle whose collective the ranks disagree on: Mismatch at once.
    step $v faults completion-mismatch; xlaunch --procs 2 $share --timeout-s 120 -- ./faults --vendor $vendor --scenario completion-mismatch 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    # Ranks told different world sizes by their launcher: each refused at once (by hand).
    step $v faults world-mismatch; kport=$((29600 + RANDOM % 300))
    for r in 0 1; do
      if [ -n "$share" ]; then dev=0; hostid="NCCL_HOSTID=unicomm-wm-$kport-$r"; else dev=$r; hostid=; fi
      env $hostid RANK=$r WORLD_SIZE=$((2 + r)) LOCAL_RANK=$dev MASTER_ADDR=127.0.0.1 MASTER_PORT=$kport UNICOMM_BOOTSTRAP_TIMEOUT_S=60 timeout 90 ./faults --vendor $vendor --scenario world-mismatch &
    done 2>&1 | tee -a "$OUT/$v-faults.log"
    wait; [ "$(grep -cE "faults world-mismatch: rank [01]: .*PASSED" "$OUT/$v-faults.log")" = 2 ] || { echo "faults world-mismatch: not both ranks passed"; rc=1; }
    # Started by hand, not by the launcher (which would stop rank 0 as soon as rank 1
    # dies): the verdict is rank 0's, on its own.
    # kill: during plain calls; kill-replay: during a captured graph's replays.
    for scenario in kill kill-replay; do
      step $v faults $scenario
      kport=$((29600 + RANDOM % 300))
      for r in 0 1; do
        if [ -n "$share" ]; then dev=0; hostid="NCCL_HOSTID=unicomm-kill-$kport-$r"; else dev=$r; hostid=; fi
        env $hostid RANK=$r WORLD_SIZE=2 LOCAL_RANK=$dev MASTER_ADDR=127.0.0.1 MASTER_PORT=$kport UNICOMM_TIMEOUT_MS=20000 timeout 120 ./faults --vendor $vendor --scenario $scenario &
      done 2>&1 | tee -a "$OUT/$v-faults.log"
      wait; grep -qE "faults $scenario: rank 0: (.*; )?PASSED" "$OUT/$v-faults.log" || { echo "faults $scenario: rank 0 did not pass"; rc=1; }
    done
    step $v faults churn; timeout $(( ${CHURN_BUDGET:-240} + 90 )) ./faults --vendor $vendor --scenario churn --comms ${CHURN_COMMS:-1000} --budget-s ${CHURN_BUDGET:-240} 2>&1 | tee -a "$OUT/$v-faults.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  fi
  if [ "$PARTS" = procs ] || [ "$PARTS" = all ]; then
    if [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then
      for transport in default net; do
        if [ $transport = net ]; then export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; nowin=--no-windows; else nowin=; fi
        log="$OUT/$v-procs-$transport.log"; : > "$log"
        for prog in allreduce_ub alltoall_ub "rank_conformance $nowin"; do
          step $v 2 processes $transport: $prog
          xlaunch --procs 2 --timeout-s 300 -- ./$prog --vendor $vendor 2>&1 | tee -a "$log" | grep -E "PASSED|FAILED|error|NOT run|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
        done
        step $v bench $transport transports
        timeout ${BENCH_TIMEOUT:-240} ./unicomm-bench --vendor $vendor --modes plain,registered -b 8 -e 512M -f 4 -w 5 -n 20 --coll all_reduce,all_to_all,all_gather --place out -J "$OUT/$v-bench-$transport.json" >> "$log" 2>&1 || rc=1
        grep -E "^#|^ +[0-9]+ " "$log" | tail -3
        unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
      done
      # The copy-engine path with one rank per process (windows exported and mapped across
      # the two processes), beside NCCL's registered and window modes; data checked.
      step $v bench 2 processes: copy engines
      xlaunch --procs 2 --timeout-s 300 -- ./unicomm-bench --vendor $vendor --modes registered,window,ce --coll all_to_all,all_gather -b 1M -e 512M -f 4 -w 5 -n 20 -c 1 --place out -J "$OUT/$v-bench-procs-ce.json" > "$OUT/$v-bench-procs-ce.log" 2>&1 || rc=1
      grep -E "mode|512|wrong|error|==>" "$OUT/$v-bench-procs-ce.log" | tail -12
    else
      # One GPU: the two processes share it (xtask launch --share-gpu), for correctness
      # only (NCCL joins them over sockets; their contexts time-share the GPU).
      echo "procs: one GPU here: the two ranks share it (correctness, not speed)"
      log="$OUT/$v-procs-shared-gpu.log"; : > "$log"
      for prog in allreduce_ub alltoall_ub rank_conformance; do
        step $v 2 processes on one GPU: $prog
        xlaunch --procs 2 --share-gpu --timeout-s 300 -- ./$prog --vendor $vendor 2>&1 | tee -a "$log" | grep -E "PASSED|FAILED|error|NOT run|==>"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
      done
      step $v bench 2 processes on one GPU: copy engines, data checked
      xlaunch --procs 2 --share-gpu --timeout-s 300 -- ./unicomm-bench --vendor $vendor --modes window,ce --coll all_to_all,all_gather -b 8 -e 64M -f 8 -w 2 -n 10 -c 1 --place out,in -J "$OUT/$v-bench-procs-ce.json" > "$OUT/$v-bench-procs-ce.log" 2>&1 || rc=1
      grep -E "wrong|error|==>" "$OUT/$v-bench-procs-ce.log" | tail -6
    fi
  fi
  if [ "$PARTS" = overlap ] || [ "$PARTS" = all ]; then
    if [ -x ./overlap ] && [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then
      # The copy-engine path beside a kernel, ordered by signals (default) and by barriers.
      step overlap; timeout 200 ./overlap 2>&1 | tee "$OUT/$v-overlap.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
      step overlap barrier; UNICOMM_CE_SYNC=barrier timeout 200 ./overlap 2>&1 | tee -a "$OUT/$v-overlap.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
      step bench single-thread; timeout 200 ./unicomm-bench --vendor $vendor --single-thread --modes plain,registered,window -b 8 -e 512M -f 4 -w 5 -n 20 --coll all_reduce,all_to_all --place out -J "$OUT/$v-bench-single.json" > "$OUT/$v-bench-single.log" 2>&1 || rc=1
      grep -E "^# mode" "$OUT/$v-bench-single.log"
    else
      # Never a silent pass: the part was asked for and could not run here.
      echo "overlap: needs 2 GPUs and the overlap binary, $UNICOMM_GPU_WORLD GPU(s) here: not run"
      [ "$PARTS" = overlap ] && rc=1
    fi
  fi
  if [ "$PARTS" = faults ] || [ "$PARTS" = procs ] || [ "$PARTS" = overlap ]; then continue; fi
  if [ "$PARTS" != conformance ]; then
  step $v loader;       ./$loader --test-threads=1 --nocapture 2>&1 | tee "$OUT/$v-loader.log" | tail -3; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  step $v gpu-specific  # the GPU test crate's binaries but the suite, one per area
  fail=0; for t in registration ranks ipc signals cuda symmetric device_api config_log; do [ -x ./$v-$t ] || continue; timeout 300 ./$v-$t --test-threads=1 --nocapture || fail=1; done > "$OUT/$v-gpu_specific.log" 2>&1
  grep -E "^test |test result|panicked|as the library|Comm config" "$OUT/$v-gpu_specific.log"; [ $fail -eq 0 ] || rc=1
  step doctor;          ./doctor 2>&1 | tee "$OUT/doctor.log"
  if [ -x ./bootstrap-unit ] && [ -z "${rendezvous_done:-}" ]; then rendezvous_done=1
    # The rendezvous's tests on this machine's network stack (once, whatever the vendor).
    step rendezvous;    timeout 300 ./bootstrap-unit --test-threads=2 > "$OUT/rendezvous.log" 2>&1 || rc=1
    grep -E "test result|FAILED|panicked" "$OUT/rendezvous.log"
  fi
  step allreduce_ub;    timeout 120 ./allreduce_ub --vendor $vendor 2>&1 | tee "$OUT/$v-allreduce_ub.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  step alltoall_ub;     timeout 120 ./alltoall_ub --vendor $vendor 2>&1 | tee "$OUT/$v-alltoall_ub.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  step from_env;        # one rank per process, as torchrun would start them
  if [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then
    for r in 0 1; do RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 UNICOMM_BOOTSTRAP_TIMEOUT_S=60 timeout 120 ./from_env --vendor $vendor & done 2>&1 | tee "$OUT/$v-from_env.log"
    wait; grep -c PASSED "$OUT/$v-from_env.log" | grep -q '^2$' || rc=1
  else echo "from_env: needs 2 GPUs, $UNICOMM_GPU_WORLD here: not run"; fi
  if [ -x ./overhead ] && [ $v = nccl ]; then
    step overhead;      timeout 300 ./overhead 2>&1 | tee "$OUT/overhead.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
  fi
  fi
  [ "$PARTS" = quick ] && continue
  [ -x ./$v-conformance ] || { echo "$v conformance: no $v-conformance in this bundle: NOT run"; rc=1; continue; }
  step $v conformance;  timeout ${CONF_TIMEOUT:-400} ./$v-conformance --test-threads=1 $SKIP > "$OUT/$v-conformance.log" 2>&1; c=$?
  grep -E "test result|^failures:|FAILED" "$OUT/$v-conformance.log" | head -20; grep -c " ok$" "$OUT/$v-conformance.log"; [ $c -eq 0 ] || rc=1
done
[ $vendors_run -gt 0 ] || { echo "PARTS=$PARTS: this bundle holds no vendor's binaries (nccl-*, rccl-*): nothing run"; rc=1; }
echo "overall rc=$rc"
exit $rc
