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
// ranks disagreeing. Thread q of a block meets rank q (one round trip per barrier at any
// world; a rank never waits for itself, so at world 1 a barrier is the block's __syncthreads);
// the hot path is inline (its parameters read from the constant bank, not through a generic
// pointer) and the waits' slow paths out of line; the first fault a block finds is claimed by
// one thread, which reports it. The last block to finish advances the launch's number
// (PAD_DONE counts them). The data moves in 16-byte vectors where every address and the count
// allow it.
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
#include <cuda_fp8.h>
#include <stdint.h>

// A probe's hook at step n of a launch (bench/probe/stages.cu times each): nothing in the
// library's build.
#ifndef STAGE
#define STAGE(n)
#endif

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
#define PAD_GRID PAD_USED(3)
#define PAD_BLOCKS 256
#define PAD_BLOCK_ARRIVAL(b, p) (PAD_BLOCKS + 4 * ((b) * MAX_WORLD + (p)))
#define MAX_BLOCKS 128

enum { ALG_ONE_SHOT = 0, ALG_TWO_SHOT = 1, ALG_LAMPORT = 2, ALG_BARRIER = 3, ALG_DISPATCH = 4, ALG_COMBINE = 5, ALG_ALL_TO_ALL_V = 6 };
enum { OP_SUM = 0, OP_MAX = 1, OP_MIN = 2 };
enum {
  FAULT_TIMEOUT = 1,
  FAULT_ABORTED = 2,
  FAULT_MISMATCH = 3,
  FAULT_POISONED = 4,
  FAULT_TYPE = 6,
  FAULT_GONE = 7
};
// A call every rank refuses alike (the communicator goes on): a dispatch's slot past its
// capacity, a routing naming an expert out of range; an all-to-all's negative split, a
// rank sending more than its input or receiving more than the bound.
enum { REFUSED_CAPACITY = 1, REFUSED_EXPERT = 2, REFUSED_SPLIT = 3, REFUSED_SENT = 4, REFUSED_RECEIVED = 5, REFUSED_PACKED = 6 };
// Within a block: a wait ended by another thread's fault (never in the control block).
__device__ constexpr uint32_t FAULT_OTHER = 256;

// The communicator's control block, in mapped host memory.
struct Control {
  uint32_t abort;   // set by the host at abort
  uint32_t fault;   // the first fault's code (0: none)
  uint32_t rank;    // the rank it names
  uint32_t epoch;   // the barrier epoch or Lamport round it happened in
  uint64_t detail;  // a mismatch: the word's index << 32 | that rank's word (epoch: ours)
  uint32_t refused;       // the first refusal's code (0: none), cleared by the host
  uint32_t refused_rank;  // the source rank it names
  uint64_t refused_at;    // the expert << 32 | the rank holding it
  uint64_t refused_count; // the tokens << 32 | the capacity
};

// An expert dispatch's or combine's operands (nccl-api/src/sys/kernel_args/mod.rs's
// `ExpertArgs`), over the group's layout (comm-core/src/symmetric/expert.rs): `peers` and
// `pads` are the receive slots' (`[L][W][M]` rows of `row_bytes`), `out` the dispatch's
// expert-major rows or the combine's tokens, `hidden` the elements of a row.
struct Expert {
  uint64_t meta[MAX_WORLD];    // each rank's counts (`L * W` i64), then its slots' origins; an
                               // all-to-all's: its splits (`3 x W` i64)
  uint64_t back[MAX_WORLD];    // each rank's landing rows (`[M][K]` rows of the type)
  uint64_t scales[MAX_WORLD];  // each rank's FP8 scale slots (`[L][W][M][per_token]`), or 0
  uint64_t tokens;             // the dispatch's tokens (`[n]` rows), the combine's experts' rows
  uint64_t ids, weights;       // `[n][K]` i32 and f32
  uint64_t counts;             // the dispatch's `[L]` i32
  uint64_t in_scales, out_scales;  // an FP8 dispatch's `[n][per]` and `[L][W * M][per]` f32
  uint64_t masked;             // the layout's masked ranks, rank r at bit r
  uint32_t experts, max_tokens, top_k, n, per_token, layout_world, row_bytes;
  uint32_t max_recv;           // the high-throughput layout's packed rows a rank (0: low latency)
};

// nccl-api/src/sys/kernel_args/mod.rs's `KernelParams`, field for field.
struct Params {
  uint64_t peers[MAX_WORLD];
  uint64_t pads[MAX_WORLD];
  uint64_t out, residual, weight;
  uint64_t out8, scale;  // the fused norm's FP8 (e4m3) output and its f32 scale (0: none)
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
  Expert x;                 // an expert dispatch's or combine's operands (else unused)
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
__device__ __forceinline__ void st_volatile_v4(void* at, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(at), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
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
__device__ __noinline__ void report(const Params& p, uint32_t code, uint32_t rank, uint32_t epoch,
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
__device__ __noinline__ uint32_t stop(const Params& p, uint64_t start) {
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
__device__ __noinline__ void report_mismatch(const Params& p, const uint32_t* mine, uint32_t q,
                                const volatile uint32_t* theirs) {
  uint32_t i = 0;
  while (i < SIG_WORDS - 1 && mine[i] == theirs[i]) i++;
  report(p, FAULT_MISMATCH, q, mine[i], ((uint64_t)i << 32) | theirs[i]);
}

// What every block keeps of its launch: its start, the launch's number, epoch and Lamport
// round (read at its start; block 0 advances the epoch, the last block the others), its
// first fault (claimed by one thread: the one that reports it).
struct Launch {
  uint64_t start;
  uint32_t call, epoch, round, fault;
  uint32_t held;     // this block held the Lamport round (a header or element never came)
  uint32_t used[3];  // PAD_USED of each workspace, read with the launch's words
};

// Claims the block's fault for `f`: true for the one thread whose fault it is (it reports).
__device__ __forceinline__ bool claim(Launch& l, uint32_t f) {
  return atomicCAS(&l.fault, 0u, f) == 0u;
}

// Whether rank q's Lamport header of this launch's round is in this rank's workspace while
// q never arrived at epoch e (read in that order: q arrives before any later call's
// header): a barrier waiting on q that never ends.
__device__ __noinline__ bool in_lamport(const Params& p, const Launch& l, uint32_t q, uint32_t e) {
  if (!p.workspace) return false;
  const uint32_t* h = (const uint32_t*)lamport_slot(p, p.rank, l.round % 3, q);
  if (ld_acquire(h) >> 31) return false;
  if (((volatile const uint32_t*)h)[SIG_ROUND] != (l.round & 0x7fffffffu)) return false;
  return (int32_t)(ld_acquire(pad_word(p, p.rank, PAD_ARRIVAL(q))) - e) < 0;
}

// Whether rank q released its part (its departure word in this rank's pad, written by q's
// host once q's device was idle).
__device__ __forceinline__ bool gone(const Params& p, uint32_t q) {
  return *(volatile uint32_t*)pad_word(p, p.rank, PAD_GONE(q)) != 0u;
}

// Whether block 0 found this launch's ranks disagreeing (or gave up): the other blocks'
// waits end there.
__device__ __forceinline__ bool verdict(const Params& p, const Launch& l) {
  return *(volatile uint32_t*)pad_word(p, p.rank, PAD_VERDICT) == l.call + 1u;
}
__device__ __forceinline__ void post_verdict(const Params& p, const Launch& l) {
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_VERDICT) = l.call + 1u;
  __threadfence();
}

// A release store and an acquire load at the scope the peers need (GPU where every rank
// is on this one).
__device__ __forceinline__ void st_release_peers(const Params& p, uint32_t* at, uint32_t v) {
  if (p.local) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(at), "r"(v) : "memory");
  } else {
    st_release(at, v);
  }
}

// Thread q's part of a barrier, for rank q (every peer by its own thread, at once): this
// rank's arrival `v` released into rank q's pad at `mine`, rank q's word `theirs` in this
// rank's pad awaited (relaxed polls, then one acquire fence). Block 0's waits (`epoch`) also
// end where q runs Lamport instead; the other blocks' at block 0's verdict. 0, or the fault
// (claimed and reported by this thread, or another's).
// The wait itself (out of line: the word not yet there is the slow path).
__device__ __noinline__ uint32_t meet_wait(const Params& p, Launch& l, uint32_t q, const uint32_t* w, uint32_t v,
                                           bool epoch) {
  for (uint32_t n = 1; (int32_t)(ld_relaxed(w) - v) < 0; n++) {
    if ((n & 255) != 0) continue;
    if (*(volatile uint32_t*)&l.fault) return l.fault;
    if (!epoch && verdict(p, l)) {
      claim(l, FAULT_MISMATCH);
      return FAULT_MISMATCH;
    }
    uint32_t f = stop(p, l.start);
    if (!f && epoch && in_lamport(p, l, q, v)) {
      if (claim(l, FAULT_MISMATCH))
        report_mismatch(p, p.sig, q, (const volatile uint32_t*)lamport_slot(p, p.rank, l.round % 3, q));
      return FAULT_MISMATCH;
    }
    // Its last arrival came before its departure word: seen gone, read again.
    if (!f && gone(p, q) && (int32_t)(ld_acquire(w) - v) < 0) f = FAULT_GONE;
    if (f) {
      if (claim(l, f)) report(p, f, q, v, 0);
      return f;
    }
  }
  return 0;
}
__device__ __forceinline__ uint32_t meet(const Params& p, Launch& l, uint32_t q, int mine, int theirs, uint32_t v,
                                         bool epoch) {
  st_release_peers(p, pad_word(p, q, mine), v);
  const uint32_t* w = pad_word(p, p.rank, theirs);
  if ((int32_t)(ld_relaxed(w) - v) < 0) {
    uint32_t f = meet_wait(p, l, q, w, v, epoch);
    if (f) return f;
  }
  fence_peers(p);
  return 0;
}

// Every thread's barrier `i` (1 to 3) of the launch: block 0's on the epoch words (the
// epoch advanced), block b's on its own arrival words (the launch's number); rank q met by
// thread q (a rank does not wait for itself: at world 1 a barrier is the block's alone).
// True when passed; false after a fault (reported; block 0's verdict posted).
__device__ __forceinline__ bool barrier(const Params& p, Launch& l, uint32_t i) {
  uint32_t e = l.epoch + 1;
  __syncthreads();
  uint32_t q = threadIdx.x;
  if (blockIdx.x == 0) {
    if (q == 0) {
      l.epoch = e;
      *(volatile uint32_t*)pad_word(p, p.rank, PAD_EPOCH) = e;
    }
    if (q < p.world && q != p.rank) meet(p, l, q, PAD_ARRIVAL(p.rank), PAD_ARRIVAL(q), e, true);
  } else if (q < p.world && q != p.rank) {
    uint32_t b = blockIdx.x;
    meet(p, l, q, PAD_BLOCK_ARRIVAL(b, p.rank), PAD_BLOCK_ARRIVAL(b, q), 4u * l.call + i, false);
  }
  __syncthreads();
  if (l.fault && blockIdx.x == 0 && threadIdx.x == 0) post_verdict(p, l);
  return l.fault == 0;
}

// The signature's place in a pad for the call whose first barrier has epoch e.
__device__ __forceinline__ uint32_t* pad_signature(const Params& p, uint32_t q, uint32_t e) {
  return pad_word(p, q, PAD_SIGNATURE + (e % 2) * LAMPORT_HEADER);
}

// Block 0: the signature published, the first barrier, every rank's compared (rank q's by
// thread q, its eight words in two 16-byte loads): every rank reads the same words (each
// stays until its rank's next first barrier, which no rank passes before every rank read
// them), so a mismatch is reported by every rank after the same barrier. The other blocks:
// their first barrier.
__device__ __forceinline__ bool enter(const Params& p, Launch& l) {
  if (blockIdx.x != 0) return barrier(p, l, 1);
  if (threadIdx.x == 0) {
    uint4* mine = (uint4*)pad_signature(p, p.rank, l.epoch + 1);
    st_volatile_v4(mine, make_uint4(p.sig[0], p.sig[1], p.sig[2], p.sig[3]));
    st_volatile_v4(mine + 1, make_uint4(p.sig[4], p.sig[5], p.sig[6], p.sig[7]));
  }
  if (!barrier(p, l, 1)) return false;
  STAGE(3);
  uint32_t q = threadIdx.x;
  if (q < p.world && q != p.rank) {
    const uint32_t* theirs = pad_signature(p, q, l.epoch);
    uint4 a = ld_volatile_v4(theirs), c = ld_volatile_v4(theirs + 4);
    uint32_t got[SIG_WORDS] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    bool same = true;
#pragma unroll
    for (int i = 0; i < SIG_WORDS; i++) same = same && got[i] == p.sig[i];
    if (!same && claim(l, FAULT_MISMATCH)) {
      report_mismatch(p, p.sig, q, theirs);
      post_verdict(p, l);
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
// Units lo..hi of `dst` over the grid, each the reduction of every rank's same unit, U
// units per thread at a time (the loads of all U issued before their stores: W * U loads in
// flight per thread).
template <typename T, int L, int W, int U>
__device__ __forceinline__ void reduce_range(const Params& p, uint64_t dst, uint64_t lo, uint64_t hi) {
  const uint64_t stride = (uint64_t)gridDim.x * BLOCK;
  uint64_t u = lo + (uint64_t)blockIdx.x * BLOCK + threadIdx.x;
  for (; u + (U - 1) * stride < hi; u += U * stride) {
    Pack<T, L> x[U];
#pragma unroll
    for (int k = 0; k < U; k++) x[k] = reduce_w<T, L, W>(p, u + k * stride);
#pragma unroll
    for (int k = 0; k < U; k++) st_unit<T, L>(dst, u + k * stride, x[k]);
  }
  for (; u < hi; u += stride) st_unit<T, L>(dst, u, reduce_w<T, L, W>(p, u));
}
// The same, the world picked once from the compile-time ones (1, 2, 4, 8) or not.
template <typename T, int L>
__device__ __noinline__ void reduce_units(const Params& p, uint64_t dst, uint64_t lo, uint64_t hi) {
  switch (p.world) {
    case 1: return reduce_range<T, L, 1, 4>(p, dst, lo, hi);
    case 2: return reduce_range<T, L, 2, 2>(p, dst, lo, hi);
    case 4: return reduce_range<T, L, 4, 1>(p, dst, lo, hi);
    case 8: return reduce_range<T, L, 8, 1>(p, dst, lo, hi);
    default: return reduce_range<T, L, 0, 1>(p, dst, lo, hi);
  }
}
// Units lo..hi of `src` copied into `dst` over the grid, four per thread at a time.
template <typename T, int L>
__device__ __forceinline__ void copy_units(uint64_t src, uint64_t dst, uint64_t lo, uint64_t hi) {
  const uint64_t stride = (uint64_t)gridDim.x * BLOCK;
  uint64_t u = lo + (uint64_t)blockIdx.x * BLOCK + threadIdx.x;
  for (; u + 3 * stride < hi; u += 4 * stride) {
    Pack<T, L> x[4];
#pragma unroll
    for (int k = 0; k < 4; k++) x[k] = ld_unit<T, L>(src, u + k * stride);
#pragma unroll
    for (int k = 0; k < 4; k++) st_unit<T, L>(dst, u + k * stride, x[k]);
  }
  for (; u < hi; u += stride) st_unit<T, L>(dst, u, ld_unit<T, L>(src, u));
}
// Unit u's reduction with the world picked per unit (the fused norm's rows).
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
  STAGE(4);
  if (row == 0) {
    reduce_units<T, L>(p, p.out, 0, p.count / L);
  } else {
    each(p.count / L, row, [&](uint64_t u) { st_unit<T, L>(p.out, u, reduce_all<T, L>(p, u)); });
  }
  STAGE(5);
  return barrier(p, l, 2);
}

template <typename T, int L> __device__ bool two_shot(const Params& p, Launch& l) {
  if (!enter(p, l)) return false;
  uint64_t units = p.count / L;
  uint64_t lo = units * p.rank / p.world, hi = units * (p.rank + 1) / p.world;
  reduce_units<T, L>(p, p.peers[p.rank], lo, hi);
  if (!barrier(p, l, 2)) return false;
  for (uint32_t r = 0; r < p.world; r++) {
    uint64_t a = units * r / p.world, b = units * (r + 1) / p.world;
    copy_units<T, L>(p.peers[r], p.out, a, b);
  }
  // A third meeting: no rank rewrites its input while a peer still gathers from it.
  return barrier(p, l, 3);
}

// Thread q of block 0's wait for rank q's header in this rank's slot: 0 once written, else
// the fault (claimed and reported by this thread; FAULT_OTHER: another thread's). Also ends where q arrived
// at a barrier this rank never entered while its header is still missing (q runs a barrier
// kernel here: its signature is in its pad).
__device__ __noinline__ uint32_t header(const Params& p, Launch& l, const uint32_t* sig, uint32_t q,
                           const uint32_t* h) {
  for (uint32_t n = 1; ld_acquire(h) >> 31; n++) {
    if ((n & 255) != 0) continue;
    if (*(volatile uint32_t*)&l.fault) return FAULT_OTHER;
    uint32_t f = stop(p, l.start);
    if (f) {
      if (claim(l, f)) report(p, f, q, l.round, 0);
      return f;
    }
    uint32_t a = ld_acquire(pad_word(p, p.rank, PAD_ARRIVAL(q)));
    if ((int32_t)(a - l.epoch) > 0 && (ld_acquire(h) >> 31)) {
      if (claim(l, FAULT_MISMATCH)) report_mismatch(p, sig, q, pad_signature(p, q, a));
      return FAULT_MISMATCH;
    }
    if (gone(p, q) && (ld_acquire(h) >> 31)) {
      if (claim(l, FAULT_GONE)) report(p, FAULT_GONE, q, l.round, 0);
      return FAULT_GONE;
    }
  }
  return 0;
}

// Block 0's part of Lamport, rank q's by thread q (every peer: a rank's own part never goes
// through its workspace): this rank's header (signature and
// round, the first word released last) into its slot of rank q's workspace, rank q's
// header awaited and compared (the same on every rank: a call that differs anywhere is a
// mismatch everywhere); then the bytes this round leaves in this rank's workspace recorded
// for their clearing two rounds on. A header never seen holds the round (no round end); a
// mismatch does not (every call exchanges its headers, of count 0 too, so the rounds stay
// in step).
__device__ __noinline__ void lamport_headers(const Params& p, Launch& l, uint32_t b, uint32_t bytes) {
  uint32_t q = threadIdx.x;
  if (q < p.world && q != p.rank) {
    uint32_t sig[SIG_WORDS];
#pragma unroll
    for (int i = 0; i < SIG_WORDS; i++) sig[i] = p.sig[i];
    sig[SIG_ROUND] = l.round & 0x7fffffffu;
    uint32_t* mine = (uint32_t*)lamport_slot(p, q, b, p.rank);
    st_volatile_v4(mine + 4, make_uint4(sig[4], sig[5], sig[6], sig[7]));
    for (int i = 1; i < 4; i++) ((volatile uint32_t*)mine)[i] = sig[i];
    st_release_peers(p, mine, sig[0]);
    const uint32_t* h = (const uint32_t*)lamport_slot(p, p.rank, b, q);
    uint32_t f = header(p, l, sig, q, h);
    if (f && f != FAULT_OTHER) {
      l.held = 1;
    } else if (!f) {
      // The header's eight words in two 16-byte loads (not eight round trips).
      uint4 x = ld_volatile_v4(h), y = ld_volatile_v4(h + 4);
      uint32_t got[SIG_WORDS] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
      bool same = true;
#pragma unroll
      for (int i = 0; i < SIG_WORDS; i++) same = same && got[i] == sig[i];
      if (!same && claim(l, FAULT_MISMATCH)) report_mismatch(p, sig, q, (const volatile uint32_t*)h);
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // Every rank called it with another type than the workspace's.
  if (!p.typed && claim(l, FAULT_TYPE)) report(p, FAULT_TYPE, p.rank, p.sig[0], 0);
  // A disagreeing peer may have written past this call's count: all of each slot then.
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_USED(b)) = l.fault ? (uint32_t)p.slot : bytes;
  if (l.held) *(volatile uint32_t*)pad_word(p, p.rank, PAD_HOLD) = l.call + 1u;
  if (l.fault) post_verdict(p, l);
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
    if (q == p.rank) continue;  // never written: this rank's part is read from its input
    uint64_t slot = base + (uint64_t)q * p.slot;
    if (wide) {
      uint4 v = make_uint4(w, w, w, w);
      each_in(0, (used + 15) / 16, [&](uint64_t u) { __stcg((uint4*)slot + u, v); });
    } else {
      each_in(0, (used + sizeof(B) - 1) / sizeof(B), [&](uint64_t u) { ((volatile B*)slot)[u] = Ty<T>::poison; });
    }
  }
}

// Unit u of this rank's input as Lamport sends it (the poison, a negative zero, as +0).
template <typename T, int L> __device__ __forceinline__ Pack<T, L> lamport_own(const Params& p, uint64_t u) {
  Pack<T, L> x = ld_unit<T, L>(p.peers[p.rank], u);
#pragma unroll
  for (int k = 0; k < L; k++)
    if (x.b[k] == Ty<T>::poison) x.b[k] = 0;
  return x;
}

// Lamport's one shot over the grid: this rank's input (where its type is the workspace's)
// stored into its slot of every peer's workspace of this round (its own part read from the
// input), each unit by the block that
// owns it; block 0 exchanges and compares the headers meanwhile; each block reduces its
// units, each awaited until no element is the poison (or block 0's verdict, or a fault);
// then clears its share of the round before's workspace. The last block advances the round
// unless a header never came.
template <typename T, int L> __device__ bool lamport(const Params& p, Launch& l, uint64_t row) {
  typedef typename Ty<T>::Bits B;
  uint32_t b = l.round % 3;
  uint64_t units = p.count / L;
  __shared__ uint32_t stopped;
  if (threadIdx.x == 0) stopped = 0;
  if (p.typed && p.world > 1) {
    each(units, row, [&](uint64_t u) {
      Pack<T, L> x = lamport_own<T, L>(p, u);
      for (uint32_t q = 0; q < p.world; q++)
        if (q != p.rank) st_unit<T, L>(lamport_slot(p, q, b, p.rank) + LAMPORT_HEADER, u, x);
    });
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    uint64_t bytes = (LAMPORT_HEADER + p.count * sizeof(B) + 15) / 16 * 16;
    lamport_headers(p, l, b, (uint32_t)(bytes < p.slot ? bytes : p.slot));
  }
  __syncthreads();
  if (p.typed && !l.fault) {
    each(units, row, [&](uint64_t u) {
      if (*(volatile uint32_t*)&stopped) return;
      Pack<T, L> acc;
      for (uint32_t q = 0; q < p.world; q++) {
        uint64_t slot = lamport_slot(p, p.rank, b, q) + LAMPORT_HEADER;
        Pack<T, L> v;
        if (q == p.rank) {
          v = lamport_own<T, L>(p, u);
        } else for (uint32_t n = 1;; n++) {
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
              claim(l, f);
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

// Element i of `base` through L2 (the block wrote it before its last __syncthreads, or it
// is read-only), and its store: not `volatile`, so that a thread's loads of several
// elements are in flight at once rather than one round trip each.
template <typename T> __device__ __forceinline__ typename Ty<T>::Bits ld_elem(uint64_t base, uint64_t i) {
  return __ldcg((const typename Ty<T>::Bits*)base + i);
}
template <typename T> __device__ __forceinline__ void st_elem(uint64_t base, uint64_t i, typename Ty<T>::Bits b) {
  __stcg((typename Ty<T>::Bits*)base + i, b);
}

// The elements j, j + BLOCK, ... of a row this thread owns, NORM_UNROLL at a time (their
// loads issued before the first use), then one at a time: f(j) for each, in order.
#define NORM_UNROLL 4
template <typename Ld, typename Use>
__device__ __forceinline__ void each_of_row(uint64_t hidden, Ld ld, Use use) {
  uint64_t j = threadIdx.x;
  for (; j + (NORM_UNROLL - 1) * BLOCK < hidden; j += NORM_UNROLL * BLOCK) {
    decltype(ld(j)) v[NORM_UNROLL];
#pragma unroll
    for (int k = 0; k < NORM_UNROLL; k++) v[k] = ld(j + k * BLOCK);
#pragma unroll
    for (int k = 0; k < NORM_UNROLL; k++) use(j + k * BLOCK, v[k]);
  }
  for (; j < hidden; j += BLOCK) use(j, ld(j));
}

// The fused residual add and RMSNorm over `out` (the all-reduce's result), this block's
// rows: residual = out + residual (rounded to the type), out = residual / sqrt(mean(
// residual^2) + eps) * weight, the mean and the scale in f32; with `out8`, also
// out8 = e4m3(out * scale), saturated (TensorRT-LLM's and FlashInfer's FP8 output).
template <typename T> __device__ void add_and_norm(const Params& p) {
  typedef typename Ty<T>::Bits B;
  __shared__ float partial[BLOCK / 32];
  __shared__ float scale;
  const float fp8_scale = p.out8 ? *(const float*)p.scale : 0.f;
  __syncthreads();
  for (uint64_t row = blockIdx.x; row < p.count / p.hidden; row += gridDim.x) {
    uint64_t base = row * p.hidden;
    float ss = 0.f;
    each_of_row(
        p.hidden,
        [&](uint64_t j) { return make_uint2(ld_elem<T>(p.out, base + j), ld_elem<T>(p.residual, base + j)); },
        [&](uint64_t j, uint2 v) {
          B r = reduce<T>(OP_SUM, (B)v.x, (B)v.y);
          st_elem<T>(p.residual, base + j, r);
          float x = Ty<T>::f(r);
          ss += x * x;
        });
    for (int o = 16; o > 0; o /= 2) ss += __shfl_down_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int w = 0; w < BLOCK / 32; w++) t += partial[w];
      scale = 1.f / sqrtf(t / (float)p.hidden + p.eps);
    }
    __syncthreads();
    each_of_row(
        p.hidden,
        [&](uint64_t j) { return make_uint2(ld_elem<T>(p.residual, base + j), ld_elem<T>(p.weight, j)); },
        [&](uint64_t j, uint2 v) {
          B y = Ty<T>::bits(Ty<T>::f((B)v.x) * scale * Ty<T>::f((B)v.y));
          st_elem<T>(p.out, base + j, y);
          // The result in T times the FP8 scale, saturated to e4m3's finite range (the mock's).
          if (p.out8)
            ((uint8_t*)p.out8)[base + j] = __nv_cvt_float_to_fp8(Ty<T>::f(y) * fp8_scale, __NV_SATFINITE, __NV_E4M3);
        });
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

// The first refusal of this rank's kernels, reported for the host (one thread).
__device__ void refuse(const Params& p, uint32_t code, uint32_t rank, uint64_t at, uint64_t count) {
  volatile Control* ctl = (volatile Control*)p.control;
  if (ctl->refused != 0u) return;
  ctl->refused_rank = rank;
  ctl->refused_at = at;
  ctl->refused_count = count;
  __threadfence_system();
  ctl->refused = code;
}

// Expert parallelism's dispatch and combine: the mock's protocol (backend-mock/src/symmetric/
// expert.rs) over the grid. Dispatch: the signature agreed at the first barrier; warp w of
// the grid takes experts w, w + warps, ...: it scans the routing in (token, k) order (a
// ballot per 32 entries), pushes each token routed to its expert into the holder's slot
// (local expert, this rank) with its origin, then writes the slot's count in the holder's
// counts; the second barrier; every block reads every rank's counts (the same verdict on
// every rank: a refusal reported, the output left alone); warp w compacts slot pairs
// (local expert, source) w, w + warps, ... expert-major. Combine: the signature agreed;
// each slot pair's rows pushed back to their tokens' ranks at (token, k); the second
// barrier; each token's rows summed by their weights in k order in f32 (no fused
// multiply-add: the reference rounds the product), rounded once.
#define WARPS (BLOCK / 32)
#define NO_RANK 0xffffffffu
// A count that says the source's routing named an expert outside 0..experts.
#define BAD_ID 0xffffffffffffffffull

// The group's rank holding expert `id` (NO_RANK where its layout rank is masked or past it).
__device__ __forceinline__ uint32_t holder(const Expert& x, uint32_t id) {
  uint32_t lr = id / (x.experts / x.layout_world);
  if (lr >= x.layout_world || (lr < 64 && (x.masked >> lr) & 1)) return NO_RANK;
  uint64_t below = lr >= 64 ? x.masked : x.masked & ((1ull << lr) - 1);
  return lr - (uint32_t)__popcll(below);
}

// `bytes` from `src` to `dst` by one warp: 16-byte vectors four in flight where every
// address and the length allow, else bytes.
__device__ __forceinline__ void warp_copy(uint64_t src, uint64_t dst, uint64_t bytes, uint32_t lane) {
  if (((src | dst | bytes) & 15) == 0) {
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    uint64_t n = bytes / 16, i = lane;
    for (; i + 96 < n; i += 128) {
      uint4 a = __ldcg(s + i), b = __ldcg(s + i + 32), c = __ldcg(s + i + 64), e = __ldcg(s + i + 96);
      __stcg(d + i, a);
      __stcg(d + i + 32, b);
      __stcg(d + i + 64, c);
      __stcg(d + i + 96, e);
    }
    for (; i < n; i += 32) __stcg(d + i, __ldcg(s + i));
  } else {
    for (uint64_t i = lane; i < bytes; i += 32) ((volatile uint8_t*)dst)[i] = __ldcg((const uint8_t*)src + i);
  }
}

// Every block of this rank at grid-wide barrier i (1, 2) of the launch: thread 0 of each
// adds its arrival to the rank's count (after a fence at the peers' scope: what its block
// wrote into peers' memory goes first) and waits for i arrivals a block; the wait ends at
// block 0's verdict, an abort, a peer's poison or the deadline. A block's barrier with the
// same block of every peer after this one then orders every block of every rank.
__device__ bool grid_barrier(const Params& p, Launch& l, uint32_t i) {
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_peers(p);
    uint32_t* count = pad_word(p, p.rank, PAD_GRID);
    atomicAdd(count, 1u);
    const uint32_t want = i * gridDim.x;
    for (uint32_t n = 1; ld_acquire(count) < want; n++) {
      if ((n & 255) != 0) continue;
      if (blockIdx.x != 0 && verdict(p, l)) {
        claim(l, FAULT_MISMATCH);
        break;
      }
      uint32_t f = stop(p, l.start);
      if (f) {
        if (claim(l, f)) report(p, f, p.rank, l.epoch, 0);
        break;
      }
    }
  }
  __syncthreads();
  return l.fault == 0;
}

// Slot (l, s)'s count word in rank r's counts.
__device__ __forceinline__ volatile uint64_t* slot_count(const Params& p, uint32_t r, uint32_t l, uint32_t s) {
  return (volatile uint64_t*)p.x.meta[r] + (uint64_t)l * p.world + s;
}
// Index of slot (l, s)'s entry idx among the slots.
__device__ __forceinline__ uint64_t slot_of(const Params& p, uint32_t l, uint32_t s, uint64_t idx) {
  return ((uint64_t)l * p.world + s) * p.x.max_tokens + idx;
}

// Warp w's experts: each routed token pushed into its holder's slot, then the slot's count.
__device__ void push_tokens(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world, k = x.top_k;
  const uint64_t entries = (uint64_t)x.n * k, rb = x.row_bytes;
  const int32_t* ids = (const int32_t*)x.ids;
  for (uint32_t e = warp; e < x.experts; e += warps) {
    uint32_t r = holder(x, e);
    if (r == NO_RANK) continue;
    uint32_t l = e % local;
    uint64_t next = 0;
    bool bad = false;
    // 128 entries a step, their four loads in flight before the first ballot.
    for (uint64_t c0 = 0; c0 < entries; c0 += 128) {
      int32_t id4[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        uint64_t i = c0 + 32 * u + lane;
        id4[u] = i < entries ? __ldcg(ids + i) : -1;
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const uint64_t c = c0 + 32 * u;
        bad = bad || id4[u] >= (int32_t)x.experts;
        for (uint32_t hit = __ballot_sync(~0u, id4[u] == (int32_t)e); hit; hit &= hit - 1) {
          uint64_t i = c + (__ffs(hit) - 1), idx = next++;
          if (idx >= x.max_tokens) continue;
          uint64_t slot = slot_of(p, l, p.rank, idx), t = i / k;
          warp_copy(x.tokens + t * rb, p.peers[r] + slot * rb, rb, lane);
          if (x.scales[r]) {
            const float* from = (const float*)x.in_scales + t * x.per_token;
            float* to = (float*)x.scales[r] + slot * x.per_token;
            for (uint32_t j = lane; j < x.per_token; j += 32) ((volatile float*)to)[j] = from[j];
          }
          if (lane == 0) ((volatile uint64_t*)x.meta[r])[(uint64_t)local * p.world + slot] = i;
        }
      }
    }
    bad = __any_sync(~0u, bad);
    if (lane == 0) *slot_count(p, r, l, p.rank) = bad ? BAD_ID : next;
  }
}

// Every rank's counts read by every block: the first refusal in (rank, expert, source)
// order (the same on every rank, which read the same words), reported by block 0; true
// where there is none.
__device__ bool counts_fit(const Params& p) {
  __shared__ uint32_t first;
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world, pairs = local * p.world, all = p.world * pairs;
  if (threadIdx.x == 0) first = NO_RANK;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < all; i += BLOCK) {
    uint64_t c = *slot_count(p, i / pairs, (i % pairs) / p.world, i % p.world);
    if (c == BAD_ID || c > x.max_tokens) atomicMin(&first, i);
  }
  __syncthreads();
  uint32_t i = first;
  if (i == NO_RANK) return true;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint32_t r = i / pairs, l = (i % pairs) / p.world, s = i % p.world;
    uint64_t c = *slot_count(p, r, l, s);
    uint32_t lr = r;  // the layout's rank of group rank r: the r-th unmasked one
    for (uint32_t q = 0, seen = 0; q < x.layout_world; q++) {
      if (q < 64 && (x.masked >> q) & 1) continue;
      if (seen++ == r) { lr = q; break; }
    }
    refuse(p, c == BAD_ID ? REFUSED_EXPERT : REFUSED_CAPACITY, s, ((uint64_t)(lr * local + l) << 32) | r,
           c == BAD_ID ? x.experts : (c << 32) | x.max_tokens);
  }
  return false;
}

// Rank r's tokens counted before source s in local expert l's slots (its place in the
// expert-major output), and slot (l, s)'s count, each at most the capacity.
__device__ __forceinline__ uint64_t before(const Params& p, uint32_t r, uint32_t l, uint32_t s, uint64_t* n) {
  uint64_t off = 0, m = p.x.max_tokens;
  for (uint32_t q = 0; q < s; q++) off += min(*slot_count(p, r, l, q), m);
  *n = min(*slot_count(p, r, l, s), m);
  return off;
}

// Warp w's slot pairs compacted into the output expert-major; the pair of the last source
// writes its expert's count.
__device__ void compact(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world;
  const uint64_t rb = x.row_bytes, wm = (uint64_t)p.world * x.max_tokens;
  for (uint32_t pr = warp; pr < local * p.world; pr += warps) {
    uint32_t l = pr / p.world, s = pr % p.world;
    uint64_t n, off = before(p, p.rank, l, s, &n);
    for (uint64_t idx = 0; idx < n; idx++) {
      uint64_t row = l * wm + off + idx, slot = slot_of(p, l, s, idx);
      warp_copy(p.peers[p.rank] + slot * rb, p.out + row * rb, rb, lane);
      if (x.scales[p.rank]) {
        const float* from = (const float*)x.scales[p.rank] + slot * x.per_token;
        float* to = (float*)x.out_scales + row * x.per_token;
        for (uint32_t j = lane; j < x.per_token; j += 32) to[j] = ((volatile const float*)from)[j];
      }
    }
    if (s == p.world - 1 && lane == 0) ((int32_t*)x.counts)[l] = (int32_t)(off + n);
  }
}

__device__ void dispatch_packed(const Params& p, Launch& l);

__device__ void dispatch(const Params& p, Launch& l) {
  if (p.x.max_recv) return dispatch_packed(p, l);
  const uint32_t lane = threadIdx.x % 32, warps = gridDim.x * WARPS;
  const uint32_t warp = blockIdx.x * WARPS + threadIdx.x / 32;
  // Block 0 compared the signatures before any block writes into a peer's memory.
  if (!enter(p, l) || !grid_barrier(p, l, 1)) return;
  push_tokens(p, warp, warps, lane);
  if (!grid_barrier(p, l, 2) || !barrier(p, l, 2)) return;
  // A refused call leaves the output alone on every rank (the counts past the capacity
  // are never read as rows).
  if (counts_fit(p)) compact(p, warp, warps, lane);
}

// Warp w's slot pairs: each row of the experts' output pushed back to its token's rank,
// at row (token, k) of its landing rows.
__device__ void push_back(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world;
  const uint64_t rb = x.row_bytes, wm = (uint64_t)p.world * x.max_tokens;
  const uint64_t rows = (uint64_t)x.max_tokens * x.top_k;
  for (uint32_t pr = warp; pr < local * p.world; pr += warps) {
    uint32_t l = pr / p.world, s = pr % p.world;
    uint64_t n, off = before(p, p.rank, l, s, &n);
    for (uint64_t idx = 0; idx < n; idx++) {
      uint64_t origin = ((volatile uint64_t*)x.meta[p.rank])[(uint64_t)local * p.world + slot_of(p, l, s, idx)];
      if (origin >= rows) continue;  // never written so (a source's entry is below n * K)
      warp_copy(x.tokens + (l * wm + off + idx) * rb, x.back[s] + origin * rb, rb, lane);
    }
  }
}

// Each of this rank's tokens: its landing rows weighted and summed in k order, L elements a
// thread at a time.
template <typename T, int L> __device__ void sum_back(const Params& p) {
  const Expert& x = p.x;
  const uint32_t k = x.top_k;
  const uint64_t row = p.hidden / L, units = (uint64_t)x.n * row;
  const int32_t* ids = (const int32_t*)x.ids;
  const float* w = (const float*)x.weights;
  for (uint64_t u = (uint64_t)blockIdx.x * BLOCK + threadIdx.x; u < units; u += (uint64_t)gridDim.x * BLOCK) {
    uint64_t t = u / row, j = u % row;
    float acc[L];
#pragma unroll
    for (int e = 0; e < L; e++) acc[e] = 0.0f;
    for (uint32_t q = 0; q < k; q++) {
      int32_t id = __ldcg(ids + t * k + q);
      if (id < 0 || holder(x, (uint32_t)id) == NO_RANK) continue;
      float wt = __ldcg(w + t * k + q);
      Pack<T, L> v = ld_unit<T, L>(x.back[p.rank], (t * k + q) * row + j);
#pragma unroll
      for (int e = 0; e < L; e++) acc[e] = __fadd_rn(acc[e], __fmul_rn(wt, Ty<T>::f(v.b[e])));
    }
    Pack<T, L> o;
#pragma unroll
    for (int e = 0; e < L; e++) o.b[e] = Ty<T>::bits(acc[e]);
    st_unit<T, L>(p.out, u, o);
  }
}

__device__ void push_back_packed(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane);

template <typename T> __device__ void combine(const Params& p, Launch& l) {
  const uint32_t lane = threadIdx.x % 32, warps = gridDim.x * WARPS;
  const uint32_t warp = blockIdx.x * WARPS + threadIdx.x / 32;
  if (!enter(p, l) || !grid_barrier(p, l, 1)) return;
  if (p.x.max_recv) {
    push_back_packed(p, warp, warps, lane);
  } else {
    push_back(p, warp, warps, lane);
  }
  if (!grid_barrier(p, l, 2) || !barrier(p, l, 2)) return;
  const uint64_t n = Lanes<T>::N;
  if ((p.out | p.x.back[p.rank]) % 16 == 0 && p.hidden % n == 0) {
    sum_back<T, Lanes<T>::N>(p);
  } else {
    sum_back<T, 1>(p);
  }
}

// The high-throughput layout (`x.max_recv` packed rows a rank; the mock's protocol,
// backend-mock/src/symmetric/expert_packed.rs): after the signatures, warp w counts its
// experts' tokens (a ballot per 32 entries) into their holders' counts; the second barrier;
// every block reads every rank's counts (a rank's total past max_recv, or an expert id out of
// range, refused alike on every rank); warp w pushes its experts' tokens into the holders'
// packed rows at the rows their counts give, with their origins; the third barrier; this
// rank's packed rows copied out, block 0 writing each local expert's count and first row.
// Combine: each row pushed back to its token's landing row, as at low latency.

// Holder r's first packed row of slot range (l, s): its rows of local experts before l,
// then of l's sources before s.
__device__ __forceinline__ uint64_t first_row(const Params& p, uint32_t r, uint32_t l, uint32_t s) {
  uint64_t at = 0;
  for (uint32_t l2 = 0; l2 <= l; l2++) {
    const uint32_t sources = l2 == l ? s : p.world;
    for (uint32_t q = 0; q < sources; q++) at += *slot_count(p, r, l2, q);
  }
  return at;
}

// Warp w's experts: each one's tokens counted into its holder's counts (BAD_ID where the
// routing names an expert out of range).
__device__ void count_tokens(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world;
  const uint64_t entries = (uint64_t)x.n * x.top_k;
  const int32_t* ids = (const int32_t*)x.ids;
  for (uint32_t e = warp; e < x.experts; e += warps) {
    uint32_t r = holder(x, e);
    if (r == NO_RANK) continue;
    uint64_t n = 0;
    bool bad = false;
    for (uint64_t c = 0; c < entries; c += 32) {
      int32_t id = c + lane < entries ? __ldcg(ids + c + lane) : -1;
      bad = bad || id >= (int32_t)x.experts;
      n += __popc(__ballot_sync(~0u, id == (int32_t)e));
    }
    bad = __any_sync(~0u, bad);
    if (lane == 0) *slot_count(p, r, e % local, p.rank) = bad ? BAD_ID : n;
  }
}

// Every rank's counts read by every block: the first refusal in rank order (an expert id
// out of range, else a total past max_recv), reported by block 0; true where there is none.
__device__ bool packed_fit(const Params& p) {
  __shared__ uint32_t first;
  __shared__ unsigned long long totals[MAX_WORLD];
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world, pairs = local * p.world;
  if (threadIdx.x == 0) first = NO_RANK;
  if (threadIdx.x < p.world) totals[threadIdx.x] = 0;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < p.world * pairs; i += BLOCK) {
    uint64_t c = *slot_count(p, i / pairs, (i % pairs) / p.world, i % p.world);
    if (c == BAD_ID) atomicMin(&first, i);
    else atomicAdd(&totals[i / pairs], (unsigned long long)c);
  }
  __syncthreads();
  const bool report = blockIdx.x == 0 && threadIdx.x == 0;
  if (first != NO_RANK) {
    if (report) refuse(p, REFUSED_EXPERT, first % p.world, 0, x.experts);
    return false;
  }
  for (uint32_t r = 0; r < p.world; r++) {
    if (totals[r] > x.max_recv) {
      if (report) refuse(p, REFUSED_PACKED, r, x.max_recv, totals[r]);
      return false;
    }
  }
  return true;
}

// Warp w's experts: each routed token pushed into its holder's packed rows (the rows its
// slot range starts at, then in (token, k) order), with its origin (and an FP8 dispatch's
// scales into the same rows of the holder's scale slots).
__device__ void push_packed(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world, k = x.top_k;
  const uint64_t entries = (uint64_t)x.n * k, rb = x.row_bytes;
  const int32_t* ids = (const int32_t*)x.ids;
  for (uint32_t e = warp; e < x.experts; e += warps) {
    uint32_t r = holder(x, e);
    if (r == NO_RANK) continue;
    uint64_t row = first_row(p, r, e % local, p.rank);
    for (uint64_t c = 0; c < entries; c += 32) {
      int32_t id = c + lane < entries ? __ldcg(ids + c + lane) : -1;
      for (uint32_t hit = __ballot_sync(~0u, id == (int32_t)e); hit; hit &= hit - 1) {
        uint64_t i = c + (__ffs(hit) - 1);
        warp_copy(x.tokens + (i / k) * rb, p.peers[r] + row * rb, rb, lane);
        if (x.scales[r]) {
          const float* from = (const float*)x.in_scales + (i / k) * x.per_token;
          float* to = (float*)x.scales[r] + row * x.per_token;
          for (uint32_t j = lane; j < x.per_token; j += 32) ((volatile float*)to)[j] = from[j];
        }
        if (lane == 0) ((volatile uint64_t*)x.meta[r])[(uint64_t)local * p.world + row] = i;
        row++;
      }
    }
  }
}

// This rank's packed rows (and an FP8 dispatch's scales) into the output (a warp a row),
// each local expert's count and first row by block 0.
__device__ void unpack(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world;
  const uint64_t rb = x.row_bytes, total = first_row(p, p.rank, local - 1, p.world);
  for (uint64_t row = warp; row < total; row += warps) {
    warp_copy(p.peers[p.rank] + row * rb, p.out + row * rb, rb, lane);
    if (x.scales[p.rank]) {
      const float* from = (const float*)x.scales[p.rank] + row * x.per_token;
      float* to = (float*)x.out_scales + row * x.per_token;
      for (uint32_t j = lane; j < x.per_token; j += 32) to[j] = ((volatile const float*)from)[j];
    }
  }
  if (blockIdx.x == 0) {
    for (uint32_t l = threadIdx.x; l < local; l += BLOCK) {
      uint64_t at = first_row(p, p.rank, l, 0), next = first_row(p, p.rank, l, p.world);
      ((int32_t*)x.counts)[l] = (int32_t)(next - at);
      ((int32_t*)x.counts)[local + l] = (int32_t)at;
    }
  }
}

__device__ void dispatch_packed(const Params& p, Launch& l) {
  const uint32_t lane = threadIdx.x % 32, warps = gridDim.x * WARPS;
  const uint32_t warp = blockIdx.x * WARPS + threadIdx.x / 32;
  if (!enter(p, l) || !grid_barrier(p, l, 1)) return;
  count_tokens(p, warp, warps, lane);
  if (!grid_barrier(p, l, 2) || !barrier(p, l, 2)) return;
  // A refused call moves nothing on every rank (all read the same counts).
  if (!packed_fit(p)) return;
  push_packed(p, warp, warps, lane);
  if (!grid_barrier(p, l, 3) || !barrier(p, l, 3)) return;
  unpack(p, warp, warps, lane);
}

// Warp w's slot pairs: each packed row of the experts' output pushed back to its token's
// rank, at row (token, k) of its landing rows.
__device__ void push_back_packed(const Params& p, uint32_t warp, uint32_t warps, uint32_t lane) {
  const Expert& x = p.x;
  const uint32_t local = x.experts / x.layout_world;
  const uint64_t rb = x.row_bytes, rows = (uint64_t)x.max_tokens * x.top_k;
  for (uint32_t pr = warp; pr < local * p.world; pr += warps) {
    uint32_t l = pr / p.world, s = pr % p.world;
    uint64_t at = first_row(p, p.rank, l, s), n = *slot_count(p, p.rank, l, s);
    // After a refused dispatch the counts may pass max_recv (or be BAD_ID): every row read
    // stays inside the packed rows.
    if (n == BAD_ID) continue;
    for (uint64_t idx = 0; idx < n && at + idx < x.max_recv; idx++) {
      uint64_t origin = ((volatile uint64_t*)x.meta[p.rank])[(uint64_t)local * p.world + at + idx];
      if (origin >= rows) continue;  // never written so (a source's entry is below n * K)
      warp_copy(x.tokens + (at + idx) * rb, x.back[s] + origin * rb, rb, lane);
    }
  }
}

// The all-to-all with counts on the device (the mock's protocol, backend-mock/src/symmetric/
// exchange.rs): after the first barrier every block reads every rank's row 0 of the splits
// (`x.meta`, what rank p sends rank q), so every rank finds the same refusal, in the mock's
// order; else each rank pulls its part from every rank's input (`peers`, `count` elements of
// `row_bytes` a rank) packed in rank order over the grid, block 0 writes rows 1 and 2 of its
// splits; the second barrier (a refused call too), after which the inputs and splits are
// the ranks' again (a peer's kernel ends only after every block of this rank met it).
__device__ __forceinline__ int64_t split(const Params& p, uint32_t r, uint32_t q) {
  return ((volatile const int64_t*)p.x.meta[r])[q];
}
__device__ bool splits_fit(const Params& p) {
  __shared__ uint32_t fit;
  if (threadIdx.x == 0) {
    uint32_t code = 0, rank = 0;
    uint64_t at = p.count, count = 0;
    for (uint32_t r = 0; r < p.world && !code; r++) {
      uint64_t sent = 0;
      for (uint32_t q = 0; q < p.world && !code; q++) {
        int64_t n = split(p, r, q);
        if (n < 0) code = REFUSED_SPLIT, rank = r, at = q, count = (uint64_t)n;
        sent += (uint64_t)n;
      }
      if (!code && sent > p.count) code = REFUSED_SENT, rank = r, count = sent;
    }
    for (uint32_t q = 0; q < p.world && !code; q++) {
      uint64_t got = 0;
      for (uint32_t r = 0; r < p.world; r++) got += (uint64_t)split(p, r, q);
      if (got > p.count) code = REFUSED_RECEIVED, rank = q, count = got;
    }
    fit = code == 0;
    if (code && blockIdx.x == 0) refuse(p, code, rank, at, count);
  }
  __syncthreads();
  return fit;
}
// `bytes` from `src` to `dst` over the grid: 16-byte vectors where every address and the
// length allow, else bytes.
__device__ __forceinline__ void grid_copy(uint64_t src, uint64_t dst, uint64_t bytes) {
  const uint64_t tid = (uint64_t)blockIdx.x * BLOCK + threadIdx.x, stride = (uint64_t)gridDim.x * BLOCK;
  if (((src | dst | bytes) & 15) == 0) {
    for (uint64_t i = tid; i < bytes / 16; i += stride) __stcg((uint4*)dst + i, __ldcg((const uint4*)src + i));
  } else {
    for (uint64_t i = tid; i < bytes; i += stride) ((uint8_t*)dst)[i] = __ldcg((const uint8_t*)src + i);
  }
}
__device__ void all_to_all_v(const Params& p, Launch& l) {
  if (!enter(p, l)) return;
  if (splits_fit(p)) {
    const uint64_t s = p.x.row_bytes;
    uint64_t at = 0;
    for (uint32_t q = 0; q < p.world; q++) {
      uint64_t n = (uint64_t)split(p, q, p.rank), from = 0;
      for (uint32_t r = 0; r < p.rank; r++) from += (uint64_t)split(p, q, r);
      grid_copy(p.peers[q] + from * s, p.out + at * s, n * s);
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        volatile int64_t* mine = (volatile int64_t*)p.x.meta[p.rank];
        mine[p.world + q] = (int64_t)n;
        mine[2 * p.world + q] = (int64_t)at;
      }
      at += n;
    }
  }
  barrier(p, l, 2);
}

// The last block of the launch: the launch's number advanced, the Lamport round where no
// header went missing.
__device__ __forceinline__ void finish(const Params& p, const Launch& l) {
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
  // Every block passed its grid-wide barriers: the count starts again at the next launch.
  if (p.algorithm == ALG_DISPATCH || p.algorithm == ALG_COMBINE) *(volatile uint32_t*)pad_word(p, p.rank, PAD_GRID) = 0;
  // The next launch on the stream reads them: the kernel's end orders them, no fence.
  *(volatile uint32_t*)pad_word(p, p.rank, PAD_CALL) = l.call + 1;
}

template <typename T, int L> __device__ bool algorithm(const Params& p, Launch& l) {
  uint64_t row = p.norm ? p.hidden / L : 0;
  switch (p.algorithm) {
    case ALG_ONE_SHOT: return one_shot<T, L>(p, l, row);
    case ALG_TWO_SHOT: return two_shot<T, L>(p, l);
    case ALG_LAMPORT: return lamport<T, L>(p, l, row);
    // Their own ends (no norm after them).
    case ALG_DISPATCH: dispatch(p, l); return false;
    case ALG_COMBINE: combine<T>(p, l); return false;
    case ALG_ALL_TO_ALL_V: all_to_all_v(p, l); return false;
    default: enter(p, l); return false;
  }
}

template <typename T> __device__ void run(const Params& p) {
  __shared__ Launch l;
  STAGE(0);
  // Launched as a programmatic dependent (backend-nccl's dependent.rs): the grid before it
  // finished and its memory visible before any of this kernel's loads; the next launch may
  // be scheduled at once (it waits the same way). Without that launch, both are no-ops.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  STAGE(1);
  if (threadIdx.x == 0) {
    // The launch's words in one pass (independent loads, one round trip).
    l.start = now_ns();
    l.fault = 0;
    l.held = 0;
    // Weak loads (several in flight at once): only this rank's kernels write them, and the
    // previous one on the stream ended before this one's start.
    const uint32_t* pad = pad_word(p, p.rank, 0);
    l.call = __ldcg(pad + PAD_CALL / 4);
    l.epoch = __ldcg(pad + PAD_EPOCH / 4);
    l.round = __ldcg(pad + PAD_ROUND / 4);
    for (int b = 0; b < 3; b++) l.used[b] = __ldcg(pad + PAD_USED(b) / 4);
  }
  __syncthreads();
  STAGE(2);
  bool ok = vectors<T>(p) ? algorithm<T, Lanes<T>::N>(p, l) : algorithm<T, 1>(p, l);
  STAGE(6);
  if (ok && p.norm) add_and_norm<T>(p);
  finish(p, l);
  STAGE(7);
}

// Nothing: the floor a launch of this module has (unicomm-bench's `--floor`).
extern "C" __global__ void unicomm_symmetric_empty() {}

extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f32(const __grid_constant__ Params p) { run<float>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_f16(const __grid_constant__ Params p) { run<__half>(p); }
extern "C" __global__ void __launch_bounds__(BLOCK) unicomm_symmetric_bf16(const __grid_constant__ Params p) { run<__nv_bfloat16>(p); }
