#!/bin/bash
# Builds the probes: `probe` (what each step of a world-1 symmetric kernel costs in a CUDA
# graph, as separate kernels) and `stages` (unicomm's kernel itself, each step of a launch
# read on the SM clock), with the toolkit `cargo xtask kernels` fetches (target/cuda-kit) or
# the machine's nvcc. Run them on the GPU machine; they need a CUDA 13 driver (static
# cudart 13). Usage: build.sh [OUTPUT_DIR]
set -e
D=$(dirname "$0")
K=${CUDA_KIT:-$D/../../target/cuda-kit/nvidia/cu13}
NVCC=$(command -v nvcc || echo "$K/bin/nvcc")
O=${1:-.}
for p in probe stages; do
  PATH=$K/bin:$PATH "$NVCC" -O3 -std=c++17 -arch=sm_90 -o "$O/$p" "$D/$p.cu" \
    -I"$K/include" -L"$K/lib" -L"$K/lib/stubs" -lcuda -cudart static
done
