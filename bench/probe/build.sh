#!/bin/bash
# Builds the probe (what each step of a world-1 symmetric kernel costs in a CUDA graph):
# with the toolkit `cargo xtask kernels` fetches (target/cuda-kit), or the machine's nvcc.
# Run the binary on the GPU machine; it needs a CUDA 13 driver (static cudart 13).
set -e
K=${CUDA_KIT:-$(dirname "$0")/../../target/cuda-kit/nvidia/cu13}
NVCC=$(command -v nvcc || echo "$K/bin/nvcc")
PATH=$K/bin:$PATH "$NVCC" -O3 -std=c++17 -arch=sm_90 -o "${1:-probe}" "$(dirname "$0")/probe.cu" \
  -I"$K/include" -L"$K/lib" -L"$K/lib/stubs" -lcuda -cudart static
