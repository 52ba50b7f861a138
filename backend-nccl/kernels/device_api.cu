// unicomm's one-shot all-reduce written against NCCL's device API (NCCL 2.32.3's headers:
// `nccl_device.h`). Built to PTX by `cargo xtask kernels` (nvcc 13.0, -arch=sm_90, the
// headers of the nvidia-nccl-cu13 2.32.3 wheel) and loaded at run time by
// backend-nccl/src/device_kernels.rs.
//
// The device communicator is created in 2.32.3's layout (its `version` told to
// ncclDevCommCreate), which NCCL >= 2.32.3 fills for code built against those headers; its
// size, `sizeof(ncclDevComm)`, is asserted below and checked on the host against the
// same number (nccl-api's `DEVICE_KERNEL_DEV_COMM_BYTES`).
//
// Each block b of the grid opens LSA barrier b (the device communicator holds one per
// block: the host launches at most `lsaBarrierCount` blocks), waits for every LSA peer to
// arrive (their `send` written before their launch), reads every peer's part of the `send`
// window through `ncclGetLsaPointer` and reduces in LSA rank order (rounded to the type at
// each step, as unicomm's other kernels and the mock), writes its own part of `recv`, and
// closes with a second barrier (no peer's `send` is rewritten before every rank has read
// it). The barriers' waits are NCCL's: they watch the communicator's abort flag, which
// ncclCommAbort raises; unicomm aborts the communicator at its deadline, so a peer that
// never comes ends the kernel.

#include <nccl_device.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

static_assert(sizeof(ncclDevComm) == 248, "nccl-api's DEVICE_KERNEL_DEV_COMM_BYTES");

// One launch's operands after the device communicator (nccl-api's `DeviceKernelArgs`).
struct Args {
  unsigned long long send;      // ncclWindow_t
  unsigned long long send_off;  // bytes
  unsigned long long recv;      // ncclWindow_t
  unsigned long long recv_off;  // bytes
  unsigned long long count;     // elements
  unsigned int op;              // 0 sum, 1 max, 2 min
  unsigned int pad;
};
static_assert(sizeof(Args) == 48, "nccl-api's DeviceKernelArgs");

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
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), comm, ncclTeamTagLsa(), blockIdx.x);
  // Acquire: every peer's writes to its `send` before its arrival are seen below.
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);
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
  // Release: this rank's reads of the peers' `send` are done before it arrives.
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_f32(ncclDevComm comm, Args a) { one_shot<float>(comm, a); }

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_f16(ncclDevComm comm, Args a) { one_shot<__half>(comm, a); }

extern "C" __global__ void __launch_bounds__(512)
unicomm_device_api_one_shot_bf16(ncclDevComm comm, Args a) { one_shot<__nv_bfloat16>(comm, a); }
