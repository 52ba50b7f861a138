// unicomm's symmetric kernels for NVIDIA GPUs: the one-shot, two-shot and Lamport
// all-reduce over symmetric memory, the fused residual add + RMSNorm after any of them, and
// the barrier on the signal pads. The protocol is the mock's (backend-mock/src/symmetric/
// kernels.rs) and the layout comm-core's (comm-core/src/symmetric.rs): a pad per rank with
// its epoch, one arrival word per peer, the count word and the Lamport round, counters that
// wrap and live in the pad so that a graph's replays count on. Every call carries its
// signature (comm-core/src/symmetric/signature.rs: the operation, type, reduction, count,
// the fused norm's width and epsilon, as words with their top bit clear): the barrier
// kernels publish it in the pad (two places, by the parity of the first barrier's epoch)
// and compare every rank's after their first barrier; Lamport writes it with its round as
// the header of every slot and compares every header before it reduces a slot. A rank that
// waits in a barrier while a peer's Lamport header of this round came (or in Lamport while
// a peer arrived at a barrier this rank never entered) reports the mismatch, not a timeout.
//
// One thread block of BLOCK threads per launch: thread 0 runs the barriers, every thread
// its elements. Every wait on a peer also watches the communicator's abort word (mapped
// host memory the host sets at abort), the world's poison word in this rank's pad (a peer
// that gave up) and a deadline (%globaltimer from the kernel's start), and reports the
// first fault into the control block the host reads at its next wait.
//
// Built by `cargo xtask kernels` (nvcc 13.0 from NVIDIA's wheels, -arch=sm_90 -ptx) into
// symmetric.ptx beside it, which the CUDA runtime loads at run time.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define MAX_WORLD 16
#define BLOCK 512
#define PAD_EPOCH 0
#define PAD_ARRIVAL(p) (8 + 4 * (p))
#define PAD_ROUND (8 + 4 * MAX_WORLD)
#define PAD_POISON (PAD_ROUND + 4)
#define PAD_SIGNATURE (PAD_POISON + 4)
#define SIG_WORDS 8
#define LAMPORT_HEADER (4 * SIG_WORDS)
#define SIG_ROUND (SIG_WORDS - 1)
#define PAD_GONE(q) (PAD_SIGNATURE + 2 * LAMPORT_HEADER + 4 * (q))

enum { ALG_ONE_SHOT = 0, ALG_TWO_SHOT = 1, ALG_LAMPORT = 2, ALG_BARRIER = 3 };
enum { OP_SUM = 0, OP_MAX = 1, OP_MIN = 2 };
enum {
  FAULT_TIMEOUT = 1,
  FAULT_ABORTED = 2,
  FAULT_MISMATCH = 3,
  FAULT_POISONED = 4,
  FAULT_TYPE = 6,
  FAULT_GONE = 7
};

// The communicator's control block, in mapped host memory.
struct Control {
  uint32_t abort;   // set by the host at abort
  uint32_t fault;   // the first fault's code (0: none)
  uint32_t rank;    // the rank it names
  uint32_t epoch;   // the barrier epoch or Lamport round it happened in
  uint64_t detail;  // a mismatch: the word's index << 32 | that rank's word (epoch: ours)
};

// nccl-api/src/sys/kernel_args.rs's `KernelParams`, field for field.
struct Params {
  uint64_t peers[MAX_WORLD];
  uint64_t pads[MAX_WORLD];
  uint64_t out, residual, weight;
  uint64_t control;
  uint64_t timeout_ns;
  uint64_t count;
  uint64_t hidden;
  uint64_t lamport;  // byte offset of the Lamport workspace from a rank's data
  uint64_t slot;     // bytes of one Lamport slot
  uint32_t rank, world, algorithm, op, norm;
  float eps;
  uint32_t sig[SIG_WORDS];  // the call's signature, the round word 0
  uint32_t typed;           // Lamport: the type is the workspace's (else headers only)
  uint32_t workspace;       // the allocation has Lamport workspaces
};

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t* pad_word(const Params& p, uint32_t rank, int at) {
  return (uint32_t*)(p.pads[rank] + at);
}

// The element types, as their bits.
template <typename T> struct Ty;
template <> struct Ty<float> {
  typedef uint32_t Bits;
  static const uint32_t poison = 0x80000000u;
  __device__ static float f(Bits b) { return __uint_as_float(b); }
  __device__ static Bits bits(float x) { return __float_as_uint(x); }
};
template <> struct Ty<__half> {
  typedef uint16_t Bits;
  static const uint16_t poison = 0x8000u;
  __device__ static float f(Bits b) { return __half2float(__ushort_as_half(b)); }
  __device__ static Bits bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
template <> struct Ty<__nv_bfloat16> {
  typedef uint16_t Bits;
  static const uint16_t poison = 0x8000u;
  __device__ static float f(Bits b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
  __device__ static Bits bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};

template <typename T>
__device__ __forceinline__ typename Ty<T>::Bits load(uint64_t base, uint64_t i) {
  return ((volatile typename Ty<T>::Bits*)base)[i];
}
template <typename T>
__device__ __forceinline__ void store(uint64_t base, uint64_t i, typename Ty<T>::Bits b) {
  ((volatile typename Ty<T>::Bits*)base)[i] = b;
}

// `a` and `b` reduced by `op`, rounded to the type (the mock's rounding at each step).
template <typename T>
__device__ __forceinline__ typename Ty<T>::Bits reduce(uint32_t op, typename Ty<T>::Bits a,
                                                       typename Ty<T>::Bits b) {
  float x = Ty<T>::f(a), y = Ty<T>::f(b);
  float r = op == OP_MAX ? fmaxf(x, y) : op == OP_MIN ? fminf(x, y) : x + y;
  return Ty<T>::bits(r);
}

// Records a fault (the first, unless two kernels of the communicator fail at once) with
// plain stores and fences: the control block is host memory, where a PCIe system may not
// run the device's atomics. A timeout also poisons every rank's pad, so that the peers'
// waits end at once.
__device__ void report(const Params& p, uint32_t code, uint32_t rank, uint32_t epoch,
                       uint64_t detail) {
  volatile Control* c = (volatile Control*)p.control;
  if (c->fault == 0u) {
    c->rank = rank;
    c->epoch = epoch;
    c->detail = detail;
    __threadfence_system();
    c->fault = code;
  }
  if (code == FAULT_TIMEOUT) {
    for (uint32_t q = 0; q < p.world; q++) st_release(pad_word(p, q, PAD_POISON), p.rank + 1);
  }
  __threadfence_system();
}

// A fault that ends a wait now: the host's abort, a peer's poison, the deadline.
__device__ uint32_t stop(const Params& p, uint64_t start) {
  if (((volatile Control*)p.control)->abort) return FAULT_ABORTED;
  if (*(volatile uint32_t*)pad_word(p, p.rank, PAD_POISON)) return FAULT_POISONED;
  if (now_ns() - start > p.timeout_ns) return FAULT_TIMEOUT;
  return 0;
}

// Rank q's Lamport workspace b, slot s (its header; the data after LAMPORT_HEADER).
__device__ __forceinline__ uint64_t lamport_slot(const Params& p, uint32_t q, uint32_t b, uint32_t s) {
  return p.peers[q] + p.lamport + ((uint64_t)b * p.world + s) * p.slot;
}

// Reports the mismatch of `mine` and rank q's `theirs` at their first differing word.
__device__ void report_mismatch(const Params& p, const uint32_t* mine, uint32_t q,
                                const volatile uint32_t* theirs) {
  uint32_t i = 0;
  while (i < SIG_WORDS - 1 && mine[i] == theirs[i]) i++;
  report(p, FAULT_MISMATCH, q, mine[i], ((uint64_t)i << 32) | theirs[i]);
}

// A barrier of epoch e waiting on rank q: 1 (reported) where q's Lamport header of this
// rank's round is in this rank's workspace while q never arrived at e (read in that
// order: q arrives before any later call's header).
__device__ uint32_t in_lamport(const Params& p, uint32_t q, uint32_t e) {
  if (!p.workspace) return 0;
  uint32_t round = *(volatile uint32_t*)pad_word(p, p.rank, PAD_ROUND);
  const uint32_t* h = (const uint32_t*)lamport_slot(p, p.rank, round % 3, q);
  if (ld_acquire(h) >> 31) return 0;
  if (((volatile const uint32_t*)h)[SIG_ROUND] != (round & 0x7fffffffu)) return 0;
  if ((int32_t)(ld_acquire(pad_word(p, p.rank, PAD_ARRIVAL(q))) - e) >= 0) return 0;
  report_mismatch(p, p.sig, q, (const volatile uint32_t*)h);
  return FAULT_MISMATCH;
}

// Whether rank q released its part (its departure word in this rank's pad, written by q's
// host once q's device was idle).
__device__ __forceinline__ bool gone(const Params& p, uint32_t q) {
  return *(volatile uint32_t*)pad_word(p, p.rank, PAD_GONE(q)) != 0u;
}

// Thread 0's barrier: this rank's epoch advanced and written into every rank's arrival
// word for it, then every rank's word for this epoch awaited. 0, or the fault.
__device__ uint32_t barrier0(const Params& p, uint64_t start) {
  uint32_t* epoch = pad_word(p, p.rank, PAD_EPOCH);
  uint32_t e = *(volatile uint32_t*)epoch + 1;
  *(volatile uint32_t*)epoch = e;
  __threadfence_system();
  for (uint32_t q = 0; q < p.world; q++) st_release(pad_word(p, q, PAD_ARRIVAL(p.rank)), e);
  for (uint32_t q = 0; q < p.world; q++) {
    const uint32_t* w = pad_word(p, p.rank, PAD_ARRIVAL(q));
    for (uint32_t n = 1; (int32_t)(ld_acquire(w) - e) < 0; n++) {
      if ((n & 255) == 0) {
        uint32_t f = stop(p, start);
        if (f) {
          report(p, f, q, e, 0);
          return f;
        }
        if (in_lamport(p, q, e)) return FAULT_MISMATCH;
        // Its last arrival came before its departure word: seen gone, read again.
        if (gone(p, q) && (int32_t)(ld_acquire(w) - e) < 0) {
          report(p, FAULT_GONE, q, e, 0);
          return FAULT_GONE;
        }
      }
    }
  }
  return 0;
}

// Every thread's barrier: true when passed; false after a fault (reported).
__device__ bool barrier(const Params& p, uint64_t start, uint32_t* fault) {
  __syncthreads();
  if (threadIdx.x == 0) *fault = barrier0(p, start);
  __syncthreads();
  __threadfence();
  return *fault == 0;
}

// The signature's place in a pad for the call whose first barrier has epoch e.
__device__ __forceinline__ uint32_t* pad_signature(const Params& p, uint32_t q, uint32_t e) {
  return pad_word(p, q, PAD_SIGNATURE + (e % 2) * LAMPORT_HEADER);
}

// The signature published, the first barrier, every rank's compared: every rank reads the
// same words (each stays until its rank's next first barrier, which no rank passes before
// every rank read them), so a mismatch is reported by every rank after the same barrier.
__device__ bool agree(const Params& p, uint64_t start, uint32_t* fault) {
  __shared__ uint32_t differs;
  if (threadIdx.x == 0) {
    uint32_t next = *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH) + 1;
    volatile uint32_t* mine = pad_signature(p, p.rank, next);
    for (int i = 0; i < SIG_WORDS; i++) mine[i] = p.sig[i];
    differs = 0;
  }
  if (!barrier(p, start, fault)) return false;
  if (threadIdx.x == 0) {
    uint32_t e = *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH);
    for (uint32_t q = 0; q < p.world && !differs; q++) {
      volatile uint32_t* theirs = pad_signature(p, q, e);
      for (int i = 0; i < SIG_WORDS; i++) {
        if (theirs[i] != p.sig[i]) {
          report_mismatch(p, p.sig, q, theirs);
          differs = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  return !differs;
}

// Element i of every rank's data reduced in rank order.
template <typename T>
__device__ __forceinline__ typename Ty<T>::Bits reduce_all(const Params& p, uint64_t i) {
  typename Ty<T>::Bits acc = load<T>(p.peers[0], i);
  for (uint32_t q = 1; q < p.world; q++) acc = reduce<T>(p.op, acc, load<T>(p.peers[q], i));
  return acc;
}

template <typename T> __device__ bool one_shot(const Params& p, uint64_t start, uint32_t* fault) {
  if (!agree(p, start, fault)) return false;
  for (uint64_t i = threadIdx.x; i < p.count; i += BLOCK) store<T>(p.out, i, reduce_all<T>(p, i));
  return barrier(p, start, fault);
}

template <typename T> __device__ bool two_shot(const Params& p, uint64_t start, uint32_t* fault) {
  if (!agree(p, start, fault)) return false;
  uint64_t lo = p.count * p.rank / p.world, hi = p.count * (p.rank + 1) / p.world;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += BLOCK)
    store<T>(p.peers[p.rank], i, reduce_all<T>(p, i));
  if (!barrier(p, start, fault)) return false;
  for (uint32_t r = 0; r < p.world; r++) {
    uint64_t a = p.count * r / p.world, b = p.count * (r + 1) / p.world;
    for (uint64_t i = a + threadIdx.x; i < b; i += BLOCK) store<T>(p.out, i, load<T>(p.peers[r], i));
  }
  return barrier(p, start, fault);
}

// Thread 0's wait for rank q's header in this rank's slot: 0 once written, else the fault
// (reported). Also ends where q arrived at a barrier this rank never entered while its
// header is still missing (q runs a barrier kernel here: its signature is in its pad).
__device__ uint32_t header0(const Params& p, uint64_t start, const uint32_t* sig, uint32_t q,
                            const uint32_t* h, uint32_t round) {
  for (uint32_t n = 1; ld_acquire(h) >> 31; n++) {
    if ((n & 255) != 0) continue;
    uint32_t f = stop(p, start);
    if (f) {
      report(p, f, q, round, 0);
      return f;
    }
    uint32_t a = ld_acquire(pad_word(p, p.rank, PAD_ARRIVAL(q)));
    uint32_t e = *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH);
    if ((int32_t)(a - e) > 0 && (ld_acquire(h) >> 31)) {
      report_mismatch(p, sig, q, pad_signature(p, q, a));
      return FAULT_MISMATCH;
    }
    if (gone(p, q) && (ld_acquire(h) >> 31)) {
      report(p, FAULT_GONE, q, round, 0);
      return FAULT_GONE;
    }
  }
  return 0;
}

// Lamport's one shot: this rank's input (where its type is the workspace's) and then its
// header (signature and round, the first word released last) stored into its slot of
// every rank's workspace of this round; every header awaited and compared (the same on
// every rank: a call that differs anywhere is a mismatch everywhere); the slots reduced,
// each element awaited until it is no longer the poison; the workspace of the round before
// cleared; the round advanced, after a mismatch too (every call exchanges its headers, of
// count 0 too, so the rounds stay in step).
template <typename T> __device__ bool lamport(const Params& p, uint64_t start, uint32_t* fault) {
  typedef typename Ty<T>::Bits B;
  __shared__ uint32_t round, missing, sig[SIG_WORDS];
  if (threadIdx.x == 0) {
    round = *(volatile uint32_t*)pad_word(p, p.rank, PAD_ROUND);
    missing = 0;
    for (int i = 0; i < SIG_WORDS; i++) sig[i] = p.sig[i];
    sig[SIG_ROUND] = round & 0x7fffffffu;
  }
  __syncthreads();
  uint32_t b = round % 3;
  if (p.typed) {
    for (uint64_t i = threadIdx.x; i < p.count; i += BLOCK) {
      B x = load<T>(p.peers[p.rank], i);
      if (x == Ty<T>::poison) x = 0;
      for (uint32_t q = 0; q < p.world; q++)
        store<T>(lamport_slot(p, q, b, p.rank) + LAMPORT_HEADER, i, x);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (uint32_t q = 0; q < p.world; q++) {
      uint32_t* h = (uint32_t*)lamport_slot(p, q, b, p.rank);
      for (int i = 1; i < SIG_WORDS; i++) ((volatile uint32_t*)h)[i] = sig[i];
      __threadfence_system();
      st_release(h, sig[0]);
    }
    uint32_t verdict = 0;
    for (uint32_t q = 0; q < p.world && !*fault; q++) {
      const uint32_t* h = (const uint32_t*)lamport_slot(p, p.rank, b, q);
      uint32_t f = header0(p, start, sig, q, h, round);
      if (f) {
        *fault = f;
        missing = q + 1;
        break;
      }
      for (int i = 0; i < SIG_WORDS && !verdict; i++) {
        if (((const volatile uint32_t*)h)[i] != sig[i]) {
          report_mismatch(p, sig, q, (const volatile uint32_t*)h);
          verdict = FAULT_MISMATCH;
        }
      }
    }
    if (!*fault && verdict) *fault = verdict;
    if (!*fault && !p.typed) {
      // Every rank called it with another type than the workspace's.
      report(p, FAULT_TYPE, p.rank, sig[0], 0);
      *fault = FAULT_TYPE;
    }
  }
  __syncthreads();
  if (missing) return false;  // a timeout, an abort, a barrier kernel on a peer: no round end
  bool ok = *fault == 0;
  for (uint64_t i = threadIdx.x; ok && i < p.count && !*(volatile uint32_t*)&missing; i += BLOCK) {
    B acc = 0;
    for (uint32_t q = 0; q < p.world; q++) {
      uint64_t slot = lamport_slot(p, p.rank, b, q) + LAMPORT_HEADER;
      B v;
      for (uint32_t n = 1; (v = load<T>(slot, i)) == Ty<T>::poison; n++) {
        if ((n & 255) == 0) {
          uint32_t f = stop(p, start);
          if (f) {
            if (atomicCAS(&missing, 0u, q + 1) == 0u) *fault = f;
            break;
          }
        }
      }
      if (*(volatile uint32_t*)&missing) break;
      acc = q == 0 ? v : reduce<T>(p.op, acc, v);
    }
    store<T>(p.out, i, acc);
  }
  __syncthreads();
  if (missing) {
    if (threadIdx.x == 0) report(p, *fault, missing - 1, round, 0);
    return false;
  }
  uint64_t stale = lamport_slot(p, p.rank, (b + 2) % 3, 0);
  for (uint64_t i = threadIdx.x; i < (uint64_t)p.world * p.slot / sizeof(B); i += BLOCK)
    store<T>(stale, i, Ty<T>::poison);
  __syncthreads();
  if (threadIdx.x == 0) *(volatile uint32_t*)pad_word(p, p.rank, PAD_ROUND) = round + 1;
  return ok;
}

// The fused residual add and RMSNorm over `out` (the all-reduce's result): per row,
// residual = out + residual (rounded to the type), out = residual / sqrt(mean(residual^2)
// + eps) * weight, the mean and the scale in f32.
template <typename T> __device__ void add_and_norm(const Params& p) {
  __shared__ float partial[BLOCK / 32];
  __shared__ float scale;
  __syncthreads();
  for (uint64_t row = 0; row < p.count / p.hidden; row++) {
    uint64_t base = row * p.hidden;
    float ss = 0.f;
    for (uint64_t j = threadIdx.x; j < p.hidden; j += BLOCK) {
      typename Ty<T>::Bits r = reduce<T>(OP_SUM, load<T>(p.out, base + j), load<T>(p.residual, base + j));
      store<T>(p.residual, base + j, r);
      float x = Ty<T>::f(r);
      ss += x * x;
    }
    for (int o = 16; o > 0; o /= 2) ss += __shfl_down_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int w = 0; w < BLOCK / 32; w++) t += partial[w];
      scale = 1.f / sqrtf(t / (float)p.hidden + p.eps);
    }
    __syncthreads();
    for (uint64_t j = threadIdx.x; j < p.hidden; j += BLOCK) {
      float x = Ty<T>::f(load<T>(p.residual, base + j));
      store<T>(p.out, base + j, Ty<T>::bits(x * scale * Ty<T>::f(load<T>(p.weight, j))));
    }
    __syncthreads();
  }
}

template <typename T> __device__ void run(const Params& p) {
  __shared__ uint32_t fault;
  __shared__ uint64_t start;
  if (threadIdx.x == 0) {
    fault = 0;
    start = now_ns();
  }
  __syncthreads();
  bool ok;
  switch (p.algorithm) {
    case ALG_ONE_SHOT: ok = one_shot<T>(p, start, &fault); break;
    case ALG_TWO_SHOT: ok = two_shot<T>(p, start, &fault); break;
    case ALG_LAMPORT: ok = lamport<T>(p, start, &fault); break;
    default: agree(p, start, &fault); return;
  }
  if (ok && p.norm) add_and_norm<T>(p);
}

extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f32(Params p) { run<float>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f16(Params p) { run<__half>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_bf16(Params p) { run<__nv_bfloat16>(p); }
