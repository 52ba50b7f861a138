// What a world-1 symmetric kernel's steps cost on the device: each variant captured 20
// times into a CUDA graph, the graph launched 20 times between events (as unicomm-bench
// times), us per kernel. Memory: cudaMalloc, and a cuMem (VMM) allocation as unicomm's.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>

#define CK(x) do { auto e = (x); if (e != 0) { printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); return 1; } } while (0)

__device__ __forceinline__ uint32_t ld_relaxed_sys(const uint32_t* p) { uint32_t v; asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) { uint32_t v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_release_gpu(uint32_t* p, uint32_t v) { asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) { asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ uint64_t now_ns() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

__global__ void k_empty() {}
__global__ void __launch_bounds__(512) k_sync(uint32_t* w) { __syncthreads(); __syncthreads(); }
// Six independent volatile loads by thread 0 (the launch's words), then a barrier of threads.
__global__ void __launch_bounds__(512) k_words(uint32_t* w) {
  __shared__ uint32_t s;
  if (threadIdx.x == 0) { uint32_t a = 0; for (int i = 0; i < 6; i++) a += ((volatile uint32_t*)w)[i * 8]; s = a; }
  __syncthreads();
  if (threadIdx.x == 0 && s == 12345) w[100] = 1;
}
// A world-1 barrier as unicomm's: epoch store, release store to own pad, relaxed-sys poll, acq_rel fence.
template <bool SYS> __global__ void __launch_bounds__(512) k_barrier(uint32_t* w) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t e = ((volatile uint32_t*)w)[0] + 1;
    ((volatile uint32_t*)w)[0] = e;
    if (SYS) st_release_sys(w + 8, e); else st_release_gpu(w + 8, e);
    while ((int32_t)((SYS ? ld_relaxed_sys(w + 8) : ld_relaxed_gpu(w + 8)) - e) < 0) {}
    if (SYS) asm volatile("fence.acq_rel.sys;" ::: "memory"); else asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}
__global__ void __launch_bounds__(512) k_timer(uint32_t* w) {
  if (threadIdx.x == 0) { uint64_t t = now_ns(); if (t == 1) w[100] = 1; }
}
__global__ void __launch_bounds__(512) k_fence_sys(uint32_t* w) {
  if (threadIdx.x == 0) { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
}
__global__ void __launch_bounds__(512) k_threadfence_system(uint32_t* w) {
  if (threadIdx.x == 0) { __threadfence_system(); }
}
// A 1 KB parameter struct read through a __grid_constant__ reference.
struct Big { uint64_t v[96]; };
__global__ void __launch_bounds__(512) k_bigparam(const __grid_constant__ Big b, uint32_t* w) {
  if (threadIdx.x == 0 && b.v[95] == 7) w[100] = 1;
}

// About 48 KB of straight-line code run once (instruction fetch from a cold cache).
__global__ void __launch_bounds__(512) k_bigcode(uint32_t* w) {
  uint32_t a = threadIdx.x, b = 7;
#pragma unroll
  for (int i = 0; i < 3000; i++) { a = a * 2654435761u + b; b ^= a >> 7; }
  if (a == 12345u) w[100] = b;
}
// The same code split over out-of-line functions called in turn.
template <int N> __device__ __noinline__ uint32_t part(uint32_t a, uint32_t b) {
#pragma unroll
  for (int i = 0; i < 300; i++) { a = a * 2654435761u + b + N; b ^= a >> 7; }
  return a ^ b;
}
__global__ void __launch_bounds__(512) k_calls(uint32_t* w) {
  uint32_t a = threadIdx.x;
  a = part<0>(a, 1); a = part<1>(a, 2); a = part<2>(a, 3); a = part<3>(a, 4); a = part<4>(a, 5);
  a = part<5>(a, 6); a = part<6>(a, 7); a = part<7>(a, 8); a = part<8>(a, 9); a = part<9>(a, 10);
  if (a == 12345u) w[100] = a;
}

typedef void (*Launch)(cudaStream_t, uint32_t*);

static float timed(const char* name, cudaStream_t s, uint32_t* w, Launch f) {
  cudaGraph_t g; cudaGraphExec_t x;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < 20; i++) f(s, w);
  cudaStreamEndCapture(s, &g);
  if (cudaGraphInstantiate(&x, g, 0) != cudaSuccess) { printf("%-28s instantiate failed\n", name); return -1; }
  cudaGraphLaunch(x, s);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < 20; i++) cudaGraphLaunch(x, s);
  cudaEventRecord(b, s);
  cudaStreamSynchronize(s);
  float ms; cudaEventElapsedTime(&ms, a, b);
  float us = ms * 1000.f / 400.f;
  printf("%-28s %7.2f us  %s\n", name, us, cudaGetErrorString(cudaGetLastError()));
  cudaGraphExecDestroy(x); cudaGraphDestroy(g);
  return us;
}

static int run(const char* mem, uint32_t* w, cudaStream_t s) {
  printf("-- memory: %s\n", mem);
  timed("empty (1 thread)", s, w, [](cudaStream_t s, uint32_t* w) { k_empty<<<1, 1, 0, s>>>(); });
  timed("empty 512", s, w, [](cudaStream_t s, uint32_t* w) { k_empty<<<1, 512, 0, s>>>(); });
  timed("two __syncthreads", s, w, [](cudaStream_t s, uint32_t* w) { k_sync<<<1, 512, 0, s>>>(w); });
  timed("six volatile words", s, w, [](cudaStream_t s, uint32_t* w) { k_words<<<1, 512, 0, s>>>(w); });
  timed("barrier .gpu", s, w, [](cudaStream_t s, uint32_t* w) { k_barrier<false><<<1, 512, 0, s>>>(w); });
  timed("barrier .sys", s, w, [](cudaStream_t s, uint32_t* w) { k_barrier<true><<<1, 512, 0, s>>>(w); });
  timed("globaltimer", s, w, [](cudaStream_t s, uint32_t* w) { k_timer<<<1, 512, 0, s>>>(w); });
  timed("fence.acq_rel.sys", s, w, [](cudaStream_t s, uint32_t* w) { k_fence_sys<<<1, 512, 0, s>>>(w); });
  timed("__threadfence_system", s, w, [](cudaStream_t s, uint32_t* w) { k_threadfence_system<<<1, 512, 0, s>>>(w); });
  timed("1 KB grid_constant param", s, w, [](cudaStream_t s, uint32_t* w) { Big b = {}; k_bigparam<<<1, 512, 0, s>>>(b, w); });
  timed("48 KB straight code", s, w, [](cudaStream_t s, uint32_t* w) { k_bigcode<<<1, 512, 0, s>>>(w); });
  timed("10 out-of-line calls", s, w, [](cudaStream_t s, uint32_t* w) { k_calls<<<1, 512, 0, s>>>(w); });
  return 0;
}

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t* w; CK(cudaMalloc(&w, 1 << 20)); CK(cudaMemset(w, 0, 1 << 20));
  run("cudaMalloc", w, s);
  // A cuMem allocation with a POSIX fd handle type, mapped read-write on device 0 (unicomm's).
  CUmemAllocationProp p = {};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran; CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, gran, &p, 0));
  CUdeviceptr va; CK(cuMemAddressReserve(&va, gran, 0, 0, 0)); CK(cuMemMap(va, gran, 0, h, 0));
  CUmemAccessDesc d = {}; d.location = p.location; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, gran, &d, 1)); CK(cudaMemset((void*)va, 0, gran));
  run("cuMem (VMM, fd handle)", (uint32_t*)va, s);
  uint32_t* hm; CK(cudaHostAlloc(&hm, 4096, cudaHostAllocMapped)); memset(hm, 0, 4096);
  uint32_t* dm; CK(cudaHostGetDevicePointer(&dm, hm, 0));
  run("mapped host memory", dm, s);
  return 0;
}
