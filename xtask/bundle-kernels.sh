# Written by `cargo xtask bundle`, sourced by run.sh for PARTS=kernels: unicomm's symmetric
# kernels on one GPU against the floors it has. Where a world-1 launch's time goes (`stages`:
# the kernel source with a hook at each step, read on the SM clock; `probe`: each step as a
# kernel of its own); every kernel exact over K_REPLAYS graph replays (10,000 by default);
# the all-reduce sweep with the floors (an empty kernel node, a device-to-device copy of each
# size), timed as nccl-tests times; the decode shapes with the fused norm; the same launched
# as programmatic dependents; and two ranks at once under a private MPS daemon (started and
# stopped here; no device setting changed) against NCCL's own symmetric kernels; a MoE step
# (`moe-ep`) for unicomm's kernels and NCCL EP, and a prefill in both modes. The JSON of
# each timed run is kept under $OUT (kernels-*.json) for docs/performance.md's tables
# (`unicomm-bench report --floors` / `--times`). Timings: one GPU, world 1, or two ranks
# sharing one HBM: the kernels' own costs, never a two-GPU figure.
L="$OUT/kernels.log"; : > "$L"
for b in stages probe rank_conformance unicomm-bench xtask; do
  [ -x "./$b" ] || { echo "kernels: this bundle has no $b (a CUDA bundle builds it): nothing run" | tee -a "$L"; rc=1; return; }
done
krun() { # $1 = label, then the command; its output into the log
  local label=$1; shift
  step kernels "$label"
  "$@" >> "$L" 2>&1; local c=$?
  echo "kernels $label: rc=$c" | tee -a "$L"; [ $c -eq 0 ] || rc=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$L" 2>&1
krun "stages of a world-1 launch" timeout 120 ./stages
krun "each step as a kernel" timeout 120 ./probe
W1="./xtask launch --procs 1 --timeout-s 300"
krun "world 1, every kernel over ${K_REPLAYS:-10000} replays" env UNICOMM_GPU_WORLD=1 $W1 -- ./rank_conformance --vendor cuda --symmetric-only --replays ${K_REPLAYS:-10000}
SWEEP="--vendor cuda --coll all_reduce --modes plain,one-shot,two-shot,lamport -b 8 -e 64M -f 2 -G 20 --place out"
krun "the sweep with the floors" timeout 300 ./unicomm-bench $SWEEP --floor -J "$OUT/kernels-floors.json"
./unicomm-bench report "$OUT/kernels-floors.json" --floors 2>&1 | tee -a "$L"
krun "decode shapes, fused" timeout 300 ./unicomm-bench --vendor cuda --preset decode --modes one-shot,lamport,fused,fused-fp8 -G 20 -J "$OUT/kernels-decode.json"
# Expert parallelism: a decode step for unicomm's kernels and for NCCL EP (run.sh points
# NCCL_EP_HOME at the bundle's nccl-ep/; where it is not found the line says why and fails),
# and a prefill in both modes (the high-throughput one packs the rows).
krun "moe-ep decode, unicomm's kernels" timeout 120 ./unicomm-bench moe-ep --vendor cuda -G 20
krun "moe-ep decode, NCCL EP" timeout 300 ./unicomm-bench moe-ep --vendor cuda -G 20 --engine library
krun "moe-ep prefill, low latency" timeout 120 ./unicomm-bench moe-ep --vendor cuda --tokens 4096 -n 5 -G 2
krun "moe-ep prefill, high throughput" timeout 120 ./unicomm-bench moe-ep --vendor cuda --tokens 4096 -n 5 -G 2 --max-recv 40000
krun "world 1 as programmatic dependents, 300 replays" env UNICOMM_KERNEL_PDL=1 UNICOMM_GPU_WORLD=1 $W1 -- ./rank_conformance --vendor cuda --symmetric-only --replays 300
krun "the sweep as programmatic dependents" env UNICOMM_KERNEL_PDL=1 timeout 300 ./unicomm-bench $SWEEP -J "$OUT/kernels-pdl.json"
MPS=$(command -v nvidia-cuda-mps-control)
if [ -z "$MPS" ]; then
  echo "kernels: no nvidia-cuda-mps-control here: two ranks at once not run" | tee -a "$L"; rc=1
else
  # A private daemon: its pipe and log folders are this run's, and it is stopped below.
  export CUDA_MPS_PIPE_DIRECTORY=${TMPDIR:-/tmp}/unicomm-mps-pipe-$$ CUDA_MPS_LOG_DIRECTORY=${TMPDIR:-/tmp}/unicomm-mps-log-$$
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  krun "MPS daemon started" "$MPS" -d
  krun "two ranks under MPS" ./xtask launch --procs 2 --share-gpu --timeout-s 280 -- ./unicomm-bench --vendor cuda --coll all_reduce --modes plain,window,one-shot,two-shot,lamport -b 8 -e 1M -f 8 -G 20 --place out -J "$OUT/kernels-mps.json"
  echo quit | "$MPS" >> "$L" 2>&1
  echo "kernels: MPS daemon stopped" | tee -a "$L"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
