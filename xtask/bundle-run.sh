#!/bin/bash
# Written by `cargo xtask bundle`: runs every GPU test and benchmark of the bundle on a
# machine without a Rust toolchain. Logs go to $OUT (or ./logs). NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/logs}; mkdir -p "$OUT"
cd "$(dirname "$0")"
step() { echo "== $*"; }
rc=0
export UNICOMM_GPU_WORLD=$(nvidia-smi -L | grep -c "^GPU")
# The suite's world sizes are 1, 2, 3, 4, 8 (rstest names world_1_1 .. world_5_8); those
# larger than this machine's GPU count are not run, and this says so.
SKIP=""
for w in "2 world_2_2" "3 world_3_3" "4 world_4_4" "8 world_5_8"; do
  set -- $w
  if [ "$UNICOMM_GPU_WORLD" -lt "$1" ]; then SKIP="$SKIP --skip $2"; echo "conformance: world size $1 not run ($UNICOMM_GPU_WORLD GPU(s) here)"; fi
done
step loader;      ./loader --test-threads=1 --nocapture 2>&1 | tee "$OUT/loader.log" | tail -3 || rc=1
step gpu-specific; timeout 300 ./gpu --test-threads=1 --skip conformance:: --nocapture 2>&1 | tee "$OUT/gpu_specific.log" | grep -E "^test |test result|panicked|as NCCL" ; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
step doctor;      ./doctor 2>&1 | tee "$OUT/doctor.log"
step allreduce_ub; timeout 120 ./allreduce_ub --vendor cuda 2>&1 | tee "$OUT/allreduce_ub.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
step alltoall_ub;  timeout 120 ./alltoall_ub --vendor cuda 2>&1 | tee "$OUT/alltoall_ub.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
step from_env;     # one rank per process, as torchrun would start them
if [ "$UNICOMM_GPU_WORLD" -ge 2 ]; then
  for r in 0 1; do RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 UNICOMM_BOOTSTRAP_TIMEOUT_S=60 timeout 120 ./from_env --vendor cuda & done 2>&1 | tee "$OUT/from_env.log"
  wait; grep -c PASSED "$OUT/from_env.log" | grep -q '^2$' || rc=1
else echo "from_env: needs 2 GPUs, $UNICOMM_GPU_WORLD here: not run"; fi
step overhead;     timeout 300 ./overhead 2>&1 | tee "$OUT/overhead.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
step conformance;  timeout ${CONF_TIMEOUT:-400} ./gpu --test-threads=1 conformance:: $SKIP > "$OUT/conformance.log" 2>&1; c=$?
grep -E "test result|^failures:|FAILED" "$OUT/conformance.log" | head -20; grep -c " ok$" "$OUT/conformance.log"; [ $c -eq 0 ] || rc=1
echo "overall rc=$rc"
exit $rc
