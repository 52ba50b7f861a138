#!/bin/bash
# Written by `cargo xtask bundle`: runs the bundle's run.sh once per part named in
# PARTS_LIST (e.g. PARTS_LIST="bench autoprobe procs", then "overlap", then "faults
# conformance quick": each group fits one 10-minute call on 2x H200),
# with each part's logs in one tarball under $OUT (a device call brings back at most 8
# files), the machine's description and a summary with each part's exit status and time.
# The sweep's JSON reads back as tables with `unicomm-bench report DIR/bench/nccl-bench.json`.
cd "$(dirname "$0")"
base=${OUT:-$PWD/logs}; mkdir -p "$base"
: "${PARTS_LIST:?name the parts, e.g. PARTS_LIST=\"bench autoprobe procs\"}"
{ date; nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version --format=csv; lscpu | grep -E "^CPU\(s\)|Model name"; } > "$base/machine-$(echo $PARTS_LIST | tr ' ' '-').txt" 2>&1
rc=0
for p in $PARTS_LIST; do
  mkdir -p "$base/$p"
  start=$(date +%s)
  OUT="$base/$p" PARTS=$p bash ./run.sh > "$base/$p/run.log" 2>&1; prc=$?
  [ $prc -eq 0 ] || rc=1
  echo "PARTS=$p rc=$prc in $(( $(date +%s) - start )) s" | tee -a "$base/summary.txt"
  grep -vE "^\[rank [0-9]+\] test |^test .* ok$" "$base/$p/run.log" | tail -60
  tar -C "$base" -czf "$base/$p.tar.gz" "$p" && rm -rf "${base:?}/$p"
done
exit $rc
