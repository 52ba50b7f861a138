// unicomm's one-shot all-reduce written against NCCL's device API (NCCL 2.32.3's headers:
// `nccl_device.h`). Built to PTX by `cargo xtask kernels` (nvcc 13.0, -arch=sm_90, the
// headers of the nvidia-nccl-cu13 2.32.3 wheel) and loaded at run time by
// backend-nccl/src/kernels.rs.
//
// The device communicator is created in 2.32.3's layout (its `version` told to
// ncclDevCommCreate), which NCCL >= 2.32.3 fills for code built against those headers; its
// size, `sizeof(ncclDevComm)`, is asserted below and checked on the host against the
// same number (nccl-api's `DEVICE_KERNEL_DEV_COMM_BYTES`).
//
// Each block b of the grid runs LSA barrier b (the device communicator holds one per block:
// the host launches at most `lsaBarrierCount` blocks) on its thread 0, waits for every LSA
// peer to arrive (their `send` written before their launch), reads every peer's part of the
// `send` window through `ncclGetLsaPointer` and reduces in LSA rank order (rounded to the
// type at each step, as unicomm's other kernels and the mock), writes its own part of
// `recv`, and closes with a second barrier (no peer's `send` is rewritten before every rank
// has read it).
//
// Every wait on a peer is NCCL's timed barrier wait, in slices: between two slices thread 0
// reads the communicator's abort word (unicomm's control block, set by the host at abort,
// before NCCL's abort frees anything) and the deadline from the kernel's start. Either ends
// the kernel at once, the fault written to the control block, and no thread touches a
// peer's memory after it: NCCL's ncclCommAbort unmaps the peers' memory while a kernel on
// the user's stream may still run (a kernel that went on after NCCL's own abort flag raised
// CUDA_ERROR_ILLEGAL_ADDRESS on an H100, NCCL 2.32.3).

#include <nccl_device.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <new>

static_assert(sizeof(ncclDevComm) == 248, "nccl-api's DEVICE_KERNEL_DEV_COMM_BYTES");

// One launch's operands after the device communicator (nccl-api's `DeviceKernelArgs`).
struct Args {
  unsigned long long send;        // ncclWindow_t
  unsigned long long send_off;    // bytes
  unsigned long long recv;        // ncclWindow_t
  unsigned long long recv_off;    // bytes
  unsigned long long count;       // elements
  unsigned long long control;     // the communicator's Control (symmetric.cu's), mapped
  unsigned long long timeout_ns;  // how long a wait lasts, from the kernel's start
  unsigned int op;                // 0 sum, 1 max, 2 min
  unsigned int rank;
};
static_assert(sizeof(Args) == 64, "nccl-api's DeviceKernelArgs");

// The control block (symmetric.cu's `Control`, nccl-api's `Control`).
struct Control {
  unsigned int abort, fault, rank, epoch;
  unsigned long long detail;
};
#define FAULT_ABORTED 2
#define FAULT_BARRIER 5  // an LSA peer never arrived at NCCL's barrier by the deadline
// NCCL's timed wait between two looks at the abort word and the deadline (about 50 us).
#define SLICE_CYCLES 100000ull

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The first fault, with plain stores and system fences (host memory: no atomics).
__device__ void report(const Args& a, unsigned int code, unsigned int which) {
  volatile Control* c = (volatile Control*)a.control;
  if (c->fault == 0u) {
    c->rank = a.rank;
    c->epoch = which;
    c->detail = 0;
    __threadfence_system();
    c->fault = code;
  }
  __threadfence_system();
}

typedef ncclLsaBarrierSession<ncclCoopThread> Bar;

// Thread 0's barrier: false where the abort word or the deadline ended it (reported).
__device__ bool barrier(Bar& bar, const Args& a, unsigned long long start, unsigned int which) {
  bar.arrive(ncclCoopThread(), cuda::memory_order_acq_rel);
  while (bar.wait(ncclCoopThread(), cuda::memory_order_acq_rel, SLICE_CYCLES) != ncclSuccess) {
    if (((volatile Control*)a.control)->abort) {
      report(a, FAULT_ABORTED, which);
      return false;
    }
    if (now_ns() - start > a.timeout_ns) {
      report(a, FAULT_BARRIER, which);
      return false;
    }
  }
  return true;
}

__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }

__device__ __forceinline__ float round_to(float v, const float*) { return v; }
__device__ __forceinline__ float round_to(float v, const __half*) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float round_to(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ void store(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float reduce(float a, float b, unsigned int op) {
  return op == 1 ? fmaxf(a, b) : op == 2 ? fminf(a, b) : a + b;
}

template <typename T>
__device__ void one_shot(const ncclDevComm& comm, const Args& a) {
  const unsigned long long start = now_ns();
  __shared__ int go;
  // Thread 0's session, alive across both barriers; its end (which saves the barrier's
  // epoch for the next kernel) is skipped after a fault: the communicator is being aborted.
  __align__(16) unsigned char storage[sizeof(Bar)];
  Bar* bar = nullptr;
  if (threadIdx.x == 0) {
    bar = new (storage) Bar(ncclCoopThread(), comm, ncclTeamTagLsa(), blockIdx.x);
    go = barrier(*bar, a, start, 0);
  }
  __syncthreads();
  if (!go) return;  // no peer's memory is touched after an abort or the deadline
  ncclWindow_t send = (ncclWindow_t)a.send;
  ncclWindow_t recv = (ncclWindow_t)a.recv;
  T* out = (T*)ncclGetLocalPointer(recv, a.recv_off);
  const int peers = comm.lsaSize;
  const size_t step = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += step) {
    float v = load((const T*)ncclGetLsaPointer(send, a.send_off, 0), i);
    for (int p = 1; p < peers; p++) {
      const T* in = (const T*)ncclGetLsaPointer(send, a.send_off, p);
      v = round_to(reduce(v, load(in, i), a.op), (const T*)nullptr);
    }
    store(out, i, v);
  }
  __syncthreads();  // every thread's reads of the peers are done before the arrival
  if (threadIdx.x == 0 && barrier(*bar, a, start, 1)) bar->~Bar();
}

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_f32(ncclDevComm comm, Args a) { one_shot<float>(comm, a); }

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_f16(ncclDevComm comm, Args a) { one_shot<__half>(comm, a); }

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_bf16(ncclDevComm comm, Args a) { one_shot<__nv_bfloat16>(comm, a); }
