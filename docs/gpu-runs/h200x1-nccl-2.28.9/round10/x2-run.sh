#!/bin/bash
# The 2-GPU round: PARTS_LIST="bench" (then "autoprobe overlap procs", then "faults conformance quick")
# runs the bundle's run.sh once per part; each part's logs come back as one tarball.
cd "$(dirname "$0")/unicomm-bundle"
base=$OUT
{ date; nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version --format=csv; lscpu | grep -E "^CPU\(s\)|Model name"; } > $base/machine-$(echo $PARTS_LIST | tr ' ' '-').txt 2>&1
for p in $PARTS_LIST; do
  mkdir -p $base/$p
  start=$(date +%s)
  OUT=$base/$p PARTS=$p bash ./run.sh > $base/$p/run.log 2>&1; rc=$?
  echo "PARTS=$p rc=$rc in $(( $(date +%s) - start )) s" | tee -a $base/summary.txt
  grep -vE "^\[rank [0-9]+\] test |^test .* ok$" $base/$p/run.log | tail -60
  tar -C $base -czf $base/$p.tar.gz $p && rm -rf $base/$p
done
