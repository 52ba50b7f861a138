// unicomm's symmetric kernels for NVIDIA GPUs: the one-shot, two-shot and Lamport
// all-reduce over symmetric memory, the fused residual add + RMSNorm after any of them, and
// the barrier on the signal pads. The protocol is the mock's (backend-mock/src/symmetric/
// kernels.rs) and the layout comm-core's (comm-core/src/symmetric/mod.rs): a pad per rank
// with its epoch, one arrival word per peer, the Lamport round, counters that wrap and live
// in the pad so that a graph's replays count on. Every call carries its signature
// (comm-core/src/symmetric/signature.rs: the operation, type, reduction, count, the fused
// norm's width and epsilon, as words with their top bit clear): block 0's barriers publish
// it in the pad (two places, by the parity of the first barrier's epoch) and compare every
// rank's after their first barrier; Lamport writes it with its round as the header of every
// slot and block 0 compares every header. A rank that waits in a barrier while a peer's
// Lamport header of this round came (or in Lamport while a peer arrived at a barrier this
// rank never entered) reports the mismatch, not a timeout.
//
// A grid of blocks of BLOCK threads (the host sizes it by the count, at most MAX_BLOCKS and
// what the GPU holds at once: blocks that wait on each other must be co-resident). Block 0
// runs the agreement and the epoch barriers above; block b > 0 meets the same block of every
// peer on its own arrival words (PAD_BLOCK_ARRIVAL), with values from the launch's number
// (PAD_CALL), and ends its waits at block 0's verdict (PAD_VERDICT) where block 0 found the
// ranks disagreeing. The last block to finish advances the launch's number (PAD_DONE counts
// them). The data moves in 16-byte vectors where every address and the count allow it.
// Every wait on a peer also watches the communicator's abort word (mapped host memory the
// host sets at abort), the world's poison word in this rank's pad (a peer that gave up) and
// a deadline (%globaltimer from the kernel's start), and reports the first fault into the
// control block the host reads at its next wait. Fences are at system scope where a peer is
// another GPU, at GPU scope where every rank is on this one (`local`).
//
// Built by `cargo xtask kernels` (nvcc 13.0 from NVIDIA's wheels, -arch=sm_90 -ptx) into
// symmetric.ptx beside it, and into symmetric.fatbin (SASS for sm_90 and sm_100 by CUDA
// 12.8's ptxas, and the PTX), which the CUDA runtime loads.

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
#define PAD_CALL PAD_GONE(MAX_WORLD)
#define PAD_DONE (PAD_CALL + 4)
#define PAD_VERDICT (PAD_DONE + 4)
#define PAD_HOLD (PAD_VERDICT + 4)
#define PAD_USED(b) (PAD_HOLD + 4 + 4 * (b))
#define PAD_BLOCKS 256
#define PAD_BLOCK_ARRIVAL(b, p) (PAD_BLOCKS + 4 * ((b) * MAX_WORLD + (p)))
#define MAX_BLOCKS 128

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
  uint32_t local;           // every rank on this GPU: fences at GPU scope
  uint32_t blocks;          // the grid the host asked for (the launcher may clamp it)
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
__device__ __forceinline__ uint32_t ld_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Sixteen bytes read again at every call (a peer may write them meanwhile).
__device__ __forceinline__ uint4 ld_volatile_v4(const void* at) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(at)
               : "memory");
  return v;
}
// A fence at the scope the peers need: one before a barrier's arrivals (with the relaxed
// stores after it, a release) and one after its waits (an acquire).
__device__ __forceinline__ void fence_peers(const Params& p) {
  if (p.local) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  } else {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
  }
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
  fence_peers(p);
  for (uint32_t q = 0; q < p.world; q++) st_relaxed(pad_word(p, q, PAD_ARRIVAL(p.rank)), e);
  for (uint32_t q = 0; q < p.world; q++) {
    const uint32_t* w = pad_word(p, p.rank, PAD_ARRIVAL(q));
    for (uint32_t n = 1; (int32_t)(ld_relaxed(w) - e) < 0; n++) {
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
  fence_peers(p);
  return 0;
}

// What every block keeps of its launch: its start, the launch's number and Lamport round
// (read at its start; the last block advances them), its first fault.
struct Launch {
  uint64_t start;
  uint32_t call, round, fault;
  uint32_t held;     // this block held the Lamport round (a header or element never came)
  uint32_t used[3];  // PAD_USED of each workspace, read with the launch's words
};

// Whether block 0 found this launch's ranks disagreeing (or gave up): the other blocks'
// waits end there.
__device__ __forceinline__ bool verdict(const Params& p, const Launch& l) {
  return *(volatile uint32_t*)pad_word(p, p.rank, PAD_VERDICT) == l.call + 1u;
}
__device__ __forceinline__ void post_verdict(const Params& p, const Launch& l) {
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_VERDICT) = l.call + 1u;
  __threadfence();
}

// Thread 0's barrier `i` (1 to 3) of a block b > 0: its arrival (the launch's number) in
// every rank's pad, every rank's same block awaited. 0, or the fault (reported; block 0's
// verdict was reported by block 0).
__device__ uint32_t block_barrier0(const Params& p, const Launch& l, uint32_t i) {
  uint32_t b = blockIdx.x, v = 4u * l.call + i;
  fence_peers(p);
  for (uint32_t q = 0; q < p.world; q++) st_relaxed(pad_word(p, q, PAD_BLOCK_ARRIVAL(b, p.rank)), v);
  for (uint32_t q = 0; q < p.world; q++) {
    const uint32_t* w = pad_word(p, p.rank, PAD_BLOCK_ARRIVAL(b, q));
    for (uint32_t n = 1; (int32_t)(ld_relaxed(w) - v) < 0; n++) {
      if ((n & 255) != 0) continue;
      if (verdict(p, l)) return FAULT_MISMATCH;
      uint32_t f = stop(p, l.start);
      if (f) {
        report(p, f, q, v, 0);
        return f;
      }
      if (gone(p, q) && (int32_t)(ld_acquire(w) - v) < 0) {
        report(p, FAULT_GONE, q, v, 0);
        return FAULT_GONE;
      }
    }
  }
  fence_peers(p);
  return 0;
}

// Every thread's barrier `i` of the launch: block 0's on the epoch words, another block's on
// its own. True when passed; false after a fault (reported, and block 0's posted).
__device__ bool barrier(const Params& p, Launch& l, uint32_t i) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t f = blockIdx.x == 0 ? barrier0(p, l.start) : block_barrier0(p, l, i);
    if (f && !l.fault) l.fault = f;
    if (f && blockIdx.x == 0) post_verdict(p, l);
  }
  __syncthreads();
  return l.fault == 0;
}

// The signature's place in a pad for the call whose first barrier has epoch e.
__device__ __forceinline__ uint32_t* pad_signature(const Params& p, uint32_t q, uint32_t e) {
  return pad_word(p, q, PAD_SIGNATURE + (e % 2) * LAMPORT_HEADER);
}

// Block 0: the signature published, the first barrier, every rank's compared: every rank
// reads the same words (each stays until its rank's next first barrier, which no rank
// passes before every rank read them), so a mismatch is reported by every rank after the
// same barrier. The other blocks: their first barrier.
__device__ bool enter(const Params& p, Launch& l) {
  if (blockIdx.x != 0) return barrier(p, l, 1);
  if (threadIdx.x == 0) {
    uint32_t next = *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH) + 1;
    volatile uint32_t* mine = pad_signature(p, p.rank, next);
    for (int i = 0; i < SIG_WORDS; i++) mine[i] = p.sig[i];
  }
  if (!barrier(p, l, 1)) return false;
  if (threadIdx.x == 0) {
    uint32_t e = *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH);
    for (uint32_t q = 0; q < p.world && !l.fault; q++) {
      volatile uint32_t* theirs = pad_signature(p, q, e);
      for (int i = 0; i < SIG_WORDS; i++) {
        if (theirs[i] != p.sig[i]) {
          report_mismatch(p, p.sig, q, theirs);
          l.fault = FAULT_MISMATCH;
          post_verdict(p, l);
          break;
        }
      }
    }
  }
  __syncthreads();
  return l.fault == 0;
}

// L elements of T moved as one unit: a 16-byte vector, or one element (L = 1).
template <typename T, int L> struct Pack {
  typename Ty<T>::Bits b[L];
};
template <typename T> struct Lanes {
  static const int N = 16 / sizeof(typename Ty<T>::Bits);
};

// Unit u of `base` (through L2, not L1: a peer's data is read once per call).
template <typename T, int L> __device__ __forceinline__ Pack<T, L> ld_unit(uint64_t base, uint64_t u) {
  Pack<T, L> x;
  if constexpr (sizeof(Pack<T, L>) == 16) {
    uint4 v = __ldcg((const uint4*)base + u);
    memcpy(&x, &v, 16);
  } else {
    x.b[0] = ((volatile typename Ty<T>::Bits*)base)[u];
  }
  return x;
}
// The same, read again at every call (Lamport's polling).
template <typename T, int L> __device__ __forceinline__ Pack<T, L> ld_unit_volatile(uint64_t base, uint64_t u) {
  Pack<T, L> x;
  if constexpr (sizeof(Pack<T, L>) == 16) {
    uint4 v = ld_volatile_v4((const uint4*)base + u);
    memcpy(&x, &v, 16);
  } else {
    x.b[0] = ((volatile typename Ty<T>::Bits*)base)[u];
  }
  return x;
}
template <typename T, int L> __device__ __forceinline__ void st_unit(uint64_t base, uint64_t u, const Pack<T, L>& x) {
  if constexpr (sizeof(Pack<T, L>) == 16) {
    uint4 v;
    memcpy(&v, &x, 16);
    __stcg((uint4*)base + u, v);
  } else {
    ((volatile typename Ty<T>::Bits*)base)[u] = x.b[0];
  }
}
template <typename T, int L> __device__ __forceinline__ void reduce_into(uint32_t op, Pack<T, L>& acc, const Pack<T, L>& x) {
#pragma unroll
  for (int k = 0; k < L; k++) acc.b[k] = reduce<T>(op, acc.b[k], x.b[k]);
}

// Every unit of `units` this block's threads own: flat over the grid, or (row > 0: units
// per row, the fused norm's) whole rows per block, so that a block normalizes what it reduced.
template <typename F> __device__ __forceinline__ void each(uint64_t units, uint64_t row, F f) {
  if (row == 0) {
    for (uint64_t u = (uint64_t)blockIdx.x * BLOCK + threadIdx.x; u < units; u += (uint64_t)gridDim.x * BLOCK) f(u);
  } else {
    for (uint64_t r = blockIdx.x; r * row < units; r += gridDim.x)
      for (uint64_t j = threadIdx.x; j < row; j += BLOCK) f(r * row + j);
  }
}
// Units lo..hi over the grid (the two-shot's partitions: the same block of every rank owns
// the same units of each).
template <typename F> __device__ __forceinline__ void each_in(uint64_t lo, uint64_t hi, F f) {
  for (uint64_t u = lo + (uint64_t)blockIdx.x * BLOCK + threadIdx.x; u < hi; u += (uint64_t)gridDim.x * BLOCK) f(u);
}

// Unit u of every rank's data reduced in rank order, W ranks (W > 0: known at compile time,
// every peer's load issued before the first reduction).
template <typename T, int L, int W> __device__ __forceinline__ Pack<T, L> reduce_w(const Params& p, uint64_t u) {
  if constexpr (W > 0) {
    Pack<T, L> x[W];
#pragma unroll
    for (int q = 0; q < W; q++) x[q] = ld_unit<T, L>(p.peers[q], u);
#pragma unroll
    for (int q = 1; q < W; q++) reduce_into<T, L>(p.op, x[0], x[q]);
    return x[0];
  } else {
    Pack<T, L> acc = ld_unit<T, L>(p.peers[0], u);
    for (uint32_t q = 1; q < p.world; q++) reduce_into<T, L>(p.op, acc, ld_unit<T, L>(p.peers[q], u));
    return acc;
  }
}
// The same, the world picked once per unit from the compile-time ones (2, 4, 8) or not.
template <typename T, int L> __device__ __forceinline__ Pack<T, L> reduce_all(const Params& p, uint64_t u) {
  switch (p.world) {
    case 1: return ld_unit<T, L>(p.peers[0], u);
    case 2: return reduce_w<T, L, 2>(p, u);
    case 4: return reduce_w<T, L, 4>(p, u);
    case 8: return reduce_w<T, L, 8>(p, u);
    default: return reduce_w<T, L, 0>(p, u);
  }
}

template <typename T, int L> __device__ bool one_shot(const Params& p, Launch& l, uint64_t row) {
  if (!enter(p, l)) return false;
  each(p.count / L, row, [&](uint64_t u) { st_unit<T, L>(p.out, u, reduce_all<T, L>(p, u)); });
  return barrier(p, l, 2);
}

template <typename T, int L> __device__ bool two_shot(const Params& p, Launch& l) {
  if (!enter(p, l)) return false;
  uint64_t units = p.count / L;
  uint64_t lo = units * p.rank / p.world, hi = units * (p.rank + 1) / p.world;
  each_in(lo, hi, [&](uint64_t u) { st_unit<T, L>(p.peers[p.rank], u, reduce_all<T, L>(p, u)); });
  if (!barrier(p, l, 2)) return false;
  for (uint32_t r = 0; r < p.world; r++) {
    uint64_t a = units * r / p.world, b = units * (r + 1) / p.world;
    each_in(a, b, [&](uint64_t u) { st_unit<T, L>(p.out, u, ld_unit<T, L>(p.peers[r], u)); });
  }
  // A third meeting: no rank rewrites its input while a peer still gathers from it.
  return barrier(p, l, 3);
}

// Thread 0 of block 0's wait for rank q's header in this rank's slot: 0 once written, else
// the fault (reported). Also ends where q arrived at a barrier this rank never entered while
// its header is still missing (q runs a barrier kernel here: its signature is in its pad).
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

// Block 0's part of Lamport: this rank's header (signature and round, the first word
// released last) into its slot of every rank's workspace, every header awaited and compared
// (the same on every rank: a call that differs anywhere is a mismatch everywhere), and the
// bytes this round leaves in this rank's workspace recorded for their clearing two rounds
// on. A header never seen holds the round (no round end); a mismatch does not (every call
// exchanges its headers, of count 0 too, so the rounds stay in step).
__device__ void lamport_headers0(const Params& p, Launch& l, uint32_t b, uint32_t bytes) {
  uint32_t sig[SIG_WORDS];
  for (int i = 0; i < SIG_WORDS; i++) sig[i] = p.sig[i];
  sig[SIG_ROUND] = l.round & 0x7fffffffu;
  fence_peers(p);
  for (uint32_t q = 0; q < p.world; q++) {
    uint32_t* h = (uint32_t*)lamport_slot(p, q, b, p.rank);
    for (int i = 1; i < SIG_WORDS; i++) ((volatile uint32_t*)h)[i] = sig[i];
    st_release(h, sig[0]);
  }
  uint32_t verdict = 0, held = 0;
  for (uint32_t q = 0; q < p.world && !verdict; q++) {
    const uint32_t* h = (const uint32_t*)lamport_slot(p, p.rank, b, q);
    uint32_t f = header0(p, l.start, sig, q, h, l.round);
    if (f) {
      verdict = f;
      held = 1;
      break;
    }
    // The header's eight words in two 16-byte loads (not eight round trips).
    uint4 a = ld_volatile_v4(h), c = ld_volatile_v4(h + 4);
    uint32_t got[SIG_WORDS] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    for (int i = 0; i < SIG_WORDS && !verdict; i++) {
      if (got[i] != sig[i]) {
        report_mismatch(p, sig, q, (const volatile uint32_t*)h);
        verdict = FAULT_MISMATCH;
      }
    }
  }
  if (!verdict && !p.typed) {
    // Every rank called it with another type than the workspace's.
    report(p, FAULT_TYPE, p.rank, sig[0], 0);
    verdict = FAULT_TYPE;
  }
  // A disagreeing peer may have written past this call's count: all of each slot then.
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_USED(b)) = verdict ? (uint32_t)p.slot : bytes;
  if (held) {
    *(volatile uint32_t*)pad_word(p, p.rank, PAD_HOLD) = l.call + 1u;
    l.held = 1;
  }
  if (verdict) {
    if (!l.fault) l.fault = verdict;
    post_verdict(p, l);
  }
}

// The round before's workspace back to the poison, as far as that round wrote into it: this
// block's share of every slot.
template <typename T> __device__ void lamport_clear(const Params& p, const Launch& l, uint32_t stale) {
  typedef typename Ty<T>::Bits B;
  uint64_t used = l.used[stale];
  if (used > p.slot) used = p.slot;
  uint64_t base = lamport_slot(p, p.rank, stale, 0);
  bool wide = (base % 16 == 0) && (p.slot % 16 == 0);
  uint32_t w = sizeof(B) == 4 ? Ty<T>::poison : ((uint32_t)Ty<T>::poison << 16 | Ty<T>::poison);
  for (uint32_t q = 0; q < p.world; q++) {
    uint64_t slot = base + (uint64_t)q * p.slot;
    if (wide) {
      uint4 v = make_uint4(w, w, w, w);
      each_in(0, (used + 15) / 16, [&](uint64_t u) { __stcg((uint4*)slot + u, v); });
    } else {
      each_in(0, (used + sizeof(B) - 1) / sizeof(B), [&](uint64_t u) { ((volatile B*)slot)[u] = Ty<T>::poison; });
    }
  }
}

// Lamport's one shot over the grid: this rank's input (where its type is the workspace's)
// stored into its slot of every rank's workspace of this round, each unit by the block that
// owns it; block 0 exchanges and compares the headers meanwhile; each block reduces its
// units, each awaited until no element is the poison (or block 0's verdict, or a fault);
// then clears its share of the round before's workspace. The last block advances the round
// unless a header never came.
template <typename T, int L> __device__ bool lamport(const Params& p, Launch& l, uint64_t row) {
  typedef typename Ty<T>::Bits B;
  uint32_t b = l.round % 3;
  uint64_t units = p.count / L;
  if (p.typed) {
    each(units, row, [&](uint64_t u) {
      Pack<T, L> x = ld_unit<T, L>(p.peers[p.rank], u);
#pragma unroll
      for (int k = 0; k < L; k++)
        if (x.b[k] == Ty<T>::poison) x.b[k] = 0;
      for (uint32_t q = 0; q < p.world; q++) st_unit<T, L>(lamport_slot(p, q, b, p.rank) + LAMPORT_HEADER, u, x);
    });
  }
  __syncthreads();
  __shared__ uint32_t stopped;
  if (threadIdx.x == 0) {
    stopped = 0;
    if (blockIdx.x == 0) {
      uint64_t bytes = (LAMPORT_HEADER + p.count * sizeof(B) + 15) / 16 * 16;
      lamport_headers0(p, l, b, (uint32_t)(bytes < p.slot ? bytes : p.slot));
      if (l.fault) stopped = 1;
    }
  }
  __syncthreads();
  if (p.typed && !stopped) {
    each(units, row, [&](uint64_t u) {
      if (*(volatile uint32_t*)&stopped) return;
      Pack<T, L> acc;
      for (uint32_t q = 0; q < p.world; q++) {
        uint64_t slot = lamport_slot(p, p.rank, b, q) + LAMPORT_HEADER;
        Pack<T, L> v;
        for (uint32_t n = 1;; n++) {
          v = ld_unit_volatile<T, L>(slot, u);
          bool ready = true;
#pragma unroll
          for (int k = 0; k < L; k++) ready = ready && v.b[k] != Ty<T>::poison;
          if (ready) break;
          if ((n & 255) == 0) {
            uint32_t f = verdict(p, l) ? FAULT_MISMATCH : stop(p, l.start);
            if (f) {
              if (atomicCAS(&stopped, 0u, q + 1) == 0u && f != FAULT_MISMATCH) {
                report(p, f, q, l.round, 0);
                *(volatile uint32_t*)pad_word(p, p.rank, PAD_HOLD) = l.call + 1u;
                l.held = 1;
              }
              if (!l.fault) l.fault = f;
              return;
            }
          }
        }
        if (q == 0) acc = v; else reduce_into<T, L>(p.op, acc, v);
      }
      st_unit<T, L>(p.out, u, acc);
    });
  }
  __syncthreads();
  lamport_clear<T>(p, l, (b + 2) % 3);
  return l.fault == 0;
}

// The fused residual add and RMSNorm over `out` (the all-reduce's result), this block's
// rows: residual = out + residual (rounded to the type), out = residual / sqrt(mean(
// residual^2) + eps) * weight, the mean and the scale in f32.
template <typename T> __device__ void add_and_norm(const Params& p) {
  __shared__ float partial[BLOCK / 32];
  __shared__ float scale;
  __syncthreads();
  for (uint64_t row = blockIdx.x; row < p.count / p.hidden; row += gridDim.x) {
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

// Whether every address the call moves units through is 16-byte aligned and the count (and
// the norm's row) a whole number of vectors.
template <typename T> __device__ bool vectors(const Params& p) {
  const uint64_t n = Lanes<T>::N;
  uint64_t any = p.out | p.lamport | p.slot;
  for (uint32_t q = 0; q < p.world; q++) any |= p.peers[q];
  return any % 16 == 0 && p.count % n == 0 && (!p.norm || p.hidden % n == 0);
}

// The last block of the launch: the launch's number advanced, the Lamport round where no
// header went missing.
__device__ void finish(const Params& p, const Launch& l) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  bool held = l.held;
  if (gridDim.x > 1) {
    // The last block of several, found by the count of those done (one block is the last).
    __threadfence();
    uint32_t* done = pad_word(p, p.rank, PAD_DONE);
    if (atomicAdd(done, 1u) != gridDim.x - 1) return;
    *(volatile uint32_t*)done = 0;
    held = *(volatile uint32_t*)pad_word(p, p.rank, PAD_HOLD) == l.call + 1u;
  }
  if (p.algorithm == ALG_LAMPORT && !held) *(volatile uint32_t*)pad_word(p, p.rank, PAD_ROUND) = l.round + 1;
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_CALL) = l.call + 1;
  __threadfence();
}

template <typename T, int L> __device__ bool algorithm(const Params& p, Launch& l) {
  uint64_t row = p.norm ? p.hidden / L : 0;
  switch (p.algorithm) {
    case ALG_ONE_SHOT: return one_shot<T, L>(p, l, row);
    case ALG_TWO_SHOT: return two_shot<T, L>(p, l);
    case ALG_LAMPORT: return lamport<T, L>(p, l, row);
    default: enter(p, l); return false;
  }
}

template <typename T> __device__ void run(const Params& p) {
  __shared__ Launch l;
  if (threadIdx.x == 0) {
    // The launch's words in one pass (independent loads, one round trip).
    l.start = now_ns();
    l.fault = 0;
    l.held = 0;
    l.call = *(volatile uint32_t*)pad_word(p, p.rank, PAD_CALL);
    l.round = *(volatile uint32_t*)pad_word(p, p.rank, PAD_ROUND);
    for (int b = 0; b < 3; b++) l.used[b] = *(volatile uint32_t*)pad_word(p, p.rank, PAD_USED(b));
  }
  __syncthreads();
  bool ok = vectors<T>(p) ? algorithm<T, Lanes<T>::N>(p, l) : algorithm<T, 1>(p, l);
  if (ok && p.norm) add_and_norm<T>(p);
  finish(p, l);
}

// Nothing: the floor a launch of this module has (unicomm-bench's `--floor`).
extern "C" __global__ void unicomm_symmetric_empty() {}

extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f32(Params p) { run<float>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f16(Params p) { run<__half>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_bf16(Params p) { run<__nv_bfloat16>(p); }
