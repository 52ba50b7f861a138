#!/bin/sh
# Two ranks on one GPU. NCCL 2.28.9 refuses two ranks of one host on one GPU ("Duplicate GPU
# detected", init.cc), so each process claims a host id of its own (NCCL_HOSTID): NCCL then
# joins them over its network transport (sockets), while unicomm's copy-engine exchange
# (abstract Unix sockets of this host) still reaches the peer and maps its memory.
export NCCL_HOSTID="unicomm-one-gpu-rank-$RANK" LOCAL_RANK=0
exec "$@"
