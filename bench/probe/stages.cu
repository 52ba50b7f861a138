// Where a world-1 launch of unicomm's symmetric kernel spends its time: the kernel source
// itself (nccl-api/kernels/symmetric.cu) built with a hook at each step, thread 0 of block 0
// reading the SM clock and %globaltimer there, each launch's readings kept; the launches
// captured 20 to a CUDA graph and the graph launched 20 times (as unicomm-bench times).
// Prints the mean of each step over the last 200 launches and the gap between a launch's
// end and the next one's start. Built by build.sh beside it.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <cstring>

#define STEPS 8
#define KEPT 512
__device__ unsigned long long probe_clk[KEPT][STEPS];
__device__ unsigned long long probe_ns[KEPT][STEPS];
__device__ unsigned int probe_n;
__shared__ unsigned probe_i;  // this launch's entry (read from probe_n once, at its start)
__device__ __forceinline__ void probe_stage(int n) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (n == 0) probe_i = *(volatile unsigned*)&probe_n;
  unsigned i = probe_i % KEPT;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  probe_clk[i][n] = clock64();
  probe_ns[i][n] = t;
  if (n == STEPS - 1) *(volatile unsigned*)&probe_n = probe_i + 1;
}
#define STAGE(n) probe_stage(n)
// Another version of the kernel (with the same hooks) by -DKERNEL='"path"'.
#ifndef KERNEL
#define KERNEL "../../nccl-api/kernels/symmetric.cu"
#endif
#include KERNEL

#define CK(x) do { auto e = (x); if (e != 0) { printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); exit(1); } } while (0)

static const char* NAMES[STEPS] = {"start", "griddepcontrol", "launch words", "barrier 1",
                                    "signatures", "data", "barrier 2", "finish"};

struct Case { const char* name; int type; uint32_t alg; uint64_t count; uint32_t elem; uint32_t grid; };

// us a call of `launch`: captured 20 times into a graph, the graph launched once, then 20
// times between two events (as unicomm-bench times a mode).
template <typename F> static float graph_us(cudaStream_t s, F launch) {
  cudaGraph_t g; cudaGraphExec_t x;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 20; i++) launch();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&x, g, 0));
  CK(cudaGraphLaunch(x, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < 20; i++) cudaGraphLaunch(x, s);
  cudaEventRecord(b, s);
  CK(cudaStreamSynchronize(s));
  float ms; cudaEventElapsedTime(&ms, a, b);
  cudaGraphExecDestroy(x); cudaGraphDestroy(g);
  cudaEventDestroy(a); cudaEventDestroy(b);
  return ms * 1000.f / 400.f;
}

// The Lamport workspaces filled with bf16's poison (negative zero), as the allocation fills them.
__global__ void fill_poison(uint16_t* w, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) w[i] = 0x8000;
}

static void one(const Case& c, uint8_t* data, size_t data_bytes, uint8_t* out, Control* ctl, Control* host, cudaStream_t s) {
  static unsigned long long zero[KEPT][STEPS];
  CK(cudaMemcpyToSymbol(probe_clk, zero, sizeof zero));
  CK(cudaMemcpyToSymbol(probe_ns, zero, sizeof zero));
  Params p;
  memset(&p, 0, sizeof p);
  p.peers[0] = (uint64_t)data;
  p.pads[0] = (uint64_t)(data + data_bytes);
  p.out = (uint64_t)out;
  p.control = (uint64_t)ctl;
  p.timeout_ns = 10ull * 1000 * 1000 * 1000;
  p.count = c.count;
  p.lamport = data_bytes + 8448;
  p.slot = LAMPORT_HEADER + data_bytes;
  p.world = 1;
  p.algorithm = c.alg;
  p.local = 1;
  // Lamport over a bf16 workspace (every case that runs it is bf16).
  p.typed = p.workspace = c.alg == ALG_LAMPORT;
  uint64_t units = c.count * c.elem / 16;
  uint32_t blocks = (uint32_t)((units + BLOCK - 1) / BLOCK);
  if (blocks < 1) blocks = 1;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  // A larger grid than the pads hold arrival words for: world 1 meets no peer, so its blocks
  // never touch them (what the bandwidth would be with more blocks).
  if (c.grid) blocks = c.grid;
  p.blocks = blocks;
  float us = graph_us(s, [&] {
    if (c.type == 0) unicomm_symmetric_f32<<<blocks, BLOCK, 0, s>>>(p);
    else unicomm_symmetric_bf16<<<blocks, BLOCK, 0, s>>>(p);
  });
  static unsigned long long clk[KEPT][STEPS], ns[KEPT][STEPS];
  unsigned n;
  CK(cudaMemcpyFromSymbol(clk, probe_clk, sizeof clk));
  CK(cudaMemcpyFromSymbol(ns, probe_ns, sizeof ns));
  CK(cudaMemcpyFromSymbol(&n, probe_n, sizeof n));
  printf("%-34s %3u blocks  %6.2f us a call (events)  %7.1f GB/s read+written  fault %u\n", c.name, blocks, us,
         2.0 * c.count * c.elem / us / 1000.0, host->fault);
  double sc[STEPS] = {0}, sn[STEPS] = {0}, gap = 0, gap_clk = 0;
  int m = 0;
  for (unsigned k = n - 200; k < n; k++) {
    unsigned i = k % KEPT, j = (k - 1) % KEPT;
    // A step a launch skips (no reading) is folded into the next one read.
    int last = 0;
    for (int st = 1; st < STEPS; st++) {
      if (ns[i][st] == 0) continue;
      sc[st] += (double)(clk[i][st] - clk[i][last]);
      sn[st] += (double)(ns[i][st] - ns[i][last]);
      last = st;
    }
    gap += (double)(ns[i][0] - ns[j][STEPS - 1]);
    gap_clk += (double)(ns[i][STEPS - 1] - ns[i][0]);
    m++;
  }
  for (int st = 1; st < STEPS; st++)
    printf("   %-16s %8.0f cycles %8.3f us\n", NAMES[st], sc[st] / m, sn[st] / m / 1000.0);
  printf("   %-16s %8s        %8.3f us (start to finish)\n", "in the kernel", "", gap_clk / m / 1000.0);
  printf("   %-16s %8s        %8.3f us (a finish to the next start)\n", "between", "", gap / m / 1000.0);
}

int main() {
  CK(cudaSetDevice(0));
  int clock_khz; CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("SM clock (max) %d MHz\n", clock_khz / 1000);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t data_bytes = 64 << 20;
  uint8_t* data; CK(cudaMalloc(&data, data_bytes + 8448 + 3 * (LAMPORT_HEADER + data_bytes)));
  CK(cudaMemset(data, 0, data_bytes + 8448));
  fill_poison<<<256, 512>>>((uint16_t*)(data + data_bytes + 8448), 3 * (LAMPORT_HEADER + data_bytes) / 2);
  CK(cudaDeviceSynchronize());
  uint8_t* out; CK(cudaMalloc(&out, data_bytes));
  Control* ctl; CK(cudaHostAlloc(&ctl, 4096, cudaHostAllocMapped)); memset(ctl, 0, 4096);
  Control* dctl; CK(cudaHostGetDevicePointer(&dctl, ctl, 0));
  Case cases[] = {
    {"one-shot f32 8 B (scalar)", 0, ALG_ONE_SHOT, 2, 4},
    {"one-shot bf16 8 KiB (vectors)", 1, ALG_ONE_SHOT, 4096, 2},
    {"one-shot bf16 1 MiB", 1, ALG_ONE_SHOT, 524288, 2},
    {"two-shot f32 8 B", 0, ALG_TWO_SHOT, 2, 4},
    {"Lamport bf16 8 B (scalar)", 1, ALG_LAMPORT, 4, 2},
    {"Lamport bf16 8 KiB (vectors)", 1, ALG_LAMPORT, 4096, 2},
    {"barrier", 0, ALG_BARRIER, 0, 4},
    {"one-shot bf16 64 MiB", 1, ALG_ONE_SHOT, 32u << 20, 2},
    {"one-shot bf16 64 MiB, 2 blocks an SM", 1, ALG_ONE_SHOT, 32u << 20, 2, 264},
    {"two-shot bf16 64 MiB", 1, ALG_TWO_SHOT, 32u << 20, 2},
  };
  for (auto& c : cases) one(c, data, data_bytes, out, dctl, ctl, s);
  // The floor for the data: a device-to-device copy of the same bytes, 20 to a graph.
  for (size_t bytes : {(size_t)1 << 20, (size_t)64 << 20}) {
    float us = graph_us(s, [&] { CK(cudaMemcpyAsync(out, data, bytes, cudaMemcpyDeviceToDevice, s)); });
    printf("copy %6zu KiB                                  %6.2f us a call (events)  %7.1f GB/s read+written\n",
           bytes >> 10, us, 2.0 * bytes / us / 1000.0);
  }
  return 0;
}
