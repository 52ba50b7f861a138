//! How much an all_to_all slows a concurrent kernel (the copy-engine path's reason to
//! exist: no SMs): NCCL's SM-based
//! all_to_all against unicomm's copy-engine path, same window buffers, one thread per GPU.
//!
//! Per GPU, a kernel on its own stream (a compute-bound FMA loop, or a memory-bound stream
//! copy of 2 x 256 MiB) runs alone, then while all_to_all of `--bytes` per rank runs
//! back to back on the communicator's stream. Reported: the kernel's time per launch alone
//! and under each path (device events), and the all_to_all's bus bandwidth alone and under
//! the kernel. `overlap [--bytes N] [--iters N]` on a machine with 2+ GPUs.

use std::ffi::c_void;
use std::sync::{Arc, Barrier};

use cudarc::driver::{result, sys, CudaStream};
use unicomm_core::{Comm, DeviceStream};
use unicomm_nccl::NcclComm;

/// Two kernels in PTX (sm_90 and later JIT them): `busy` runs `iters` dependent FMAs per
/// thread (compute-bound); `copy` is a grid-stride y[i] = 1.0000001 * x[i] over `n` floats
/// (memory-bound).
const PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry busy(.param .u64 p, .param .u32 iters)
{
  .reg .pred %p;
  .reg .b32 %r<8>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [iters];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  cvt.rn.f32.s32 %f1, %r5;
  mov.f32 %f2, 0f3F800000;
  mov.u32 %r6, 0;
LOOP:
  fma.rn.f32 %f1, %f1, 0f3F7FFFFF, %f2;
  add.u32 %r6, %r6, 1;
  setp.lt.u32 %p, %r6, %r1;
  @%p bra LOOP;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.s32 %rd3, %r5, 4;
  add.u64 %rd2, %rd2, %rd3;
  st.global.f32 [%rd2], %f1;
  ret;
}
.visible .entry copy(.param .u64 x, .param .u64 y, .param .u64 n)
{
  .reg .pred %p;
  .reg .b32 %r<6>;
  .reg .f32 %f<3>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  ld.param.u64 %rd3, [n];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  cvt.u64.u32 %rd4, %r4;
  mov.u32 %r5, %nctaid.x;
  mul.wide.u32 %rd5, %r5, %r2;
LOOP2:
  setp.ge.u64 %p, %rd4, %rd3;
  @%p bra DONE;
  shl.b64 %rd6, %rd4, 2;
  add.u64 %rd7, %rd1, %rd6;
  ld.global.f32 %f1, [%rd7];
  mul.f32 %f2, %f1, 0f3F800001;
  add.u64 %rd8, %rd2, %rd6;
  st.global.f32 [%rd8], %f2;
  add.u64 %rd4, %rd4, %rd5;
  bra LOOP2;
DONE:
  ret;
}
"#;

const GRID: u32 = 132 * 8;
const BLOCK: u32 = 256;
const COPY_ELEMS: usize = 64 << 20; // 256 MiB of f32 per array

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kernel {
    Compute,
    Memory,
}

struct Gpu {
    stream: Arc<CudaStream>,
    busy: sys::CUfunction,
    copy: sys::CUfunction,
    out: sys::CUdeviceptr,
    x: sys::CUdeviceptr,
    y: sys::CUdeviceptr,
}

impl Gpu {
    fn new(c: &Comm<NcclComm>) -> anyhow::Result<Self> {
        let ctx = unicomm_nccl::cuda()?.context(c.backend().device())?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream()?;
        let src = std::ffi::CString::new(PTX)?;
        // SAFETY: a NUL-terminated PTX image; the context is current on this thread.
        let module = unsafe { result::module::load_data(src.as_ptr() as *const c_void) }?;
        // SAFETY: the module just loaded; both entries exist in the PTX above.
        let busy =
            unsafe { result::module::get_function(module, std::ffi::CString::new("busy")?) }?;
        // SAFETY: as above.
        let copy =
            unsafe { result::module::get_function(module, std::ffi::CString::new("copy")?) }?;
        // SAFETY: plain device allocations on the current context, freed at the end of the
        // process (the example runs once).
        let (out, x, y) = unsafe {
            (
                result::malloc_sync((GRID * BLOCK) as usize * 4)?,
                result::malloc_sync(COPY_ELEMS * 4)?,
                result::malloc_sync(COPY_ELEMS * 4)?,
            )
        };
        Ok(Gpu {
            stream,
            busy,
            copy,
            out,
            x,
            y,
        })
    }

    fn launch(&self, k: Kernel, iters: u32) -> anyhow::Result<()> {
        let n = COPY_ELEMS as u64;
        let (mut out, mut x, mut y, mut it, mut nn) = (self.out, self.x, self.y, iters, n);
        let (f, mut params): (_, Vec<*mut c_void>) = match k {
            Kernel::Compute => (
                self.busy,
                vec![
                    &mut out as *mut _ as *mut c_void,
                    &mut it as *mut _ as *mut c_void,
                ],
            ),
            Kernel::Memory => (
                self.copy,
                vec![
                    &mut x as *mut _ as *mut c_void,
                    &mut y as *mut _ as *mut c_void,
                    &mut nn as *mut _ as *mut c_void,
                ],
            ),
        };
        // SAFETY: the parameters match the PTX entry's (u64 pointer, u32) or (u64, u64, u64),
        // live across the call (the driver copies them); the buffers hold GRID*BLOCK and
        // COPY_ELEMS floats.
        unsafe {
            result::launch_kernel(
                f,
                (GRID, 1, 1),
                (BLOCK, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }?;
        Ok(())
    }

    /// Milliseconds of `reps` launches, by events on the kernel's stream.
    fn time(
        &self,
        k: Kernel,
        iters: u32,
        reps: usize,
    ) -> anyhow::Result<(sys::CUevent, sys::CUevent)> {
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        // Events on this context's stream, never destroyed (a handful per run).
        let (a, b) = (result::event::create(flags)?, result::event::create(flags)?);
        // SAFETY: a live event and stream.
        unsafe { result::event::record(a, self.stream.cu_stream()) }?;
        for _ in 0..reps {
            self.launch(k, iters)?;
        }
        // SAFETY: as above.
        unsafe { result::event::record(b, self.stream.cu_stream()) }?;
        Ok((a, b))
    }
}

fn ms(ev: (sys::CUevent, sys::CUevent)) -> anyhow::Result<f64> {
    // SAFETY: two recorded events of one context, both complete (the caller synchronized).
    Ok(unsafe { result::event::elapsed(ev.0, ev.1) }? as f64)
}

fn arg(name: &str, default: usize) -> anyhow::Result<usize> {
    let a: Vec<String> = std::env::args().collect();
    match a.iter().position(|x| x == name) {
        Some(i) => Ok(a
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let bytes = arg("--bytes", 256 << 20)?;
    let iters = arg("--iters", 40)?;
    let comms: Vec<Comm<NcclComm>> = unicomm_nccl::local_comms(None)?
        .into_iter()
        .map(Comm::from_backend)
        .collect();
    let w = comms.len();
    anyhow::ensure!(w >= 2, "needs 2 or more GPUs, found {w}");
    let caps = comms[0].capabilities();
    println!(
        "# overlap: {w} GPUs, NCCL {} at {}; all_to_all {bytes} B per rank x {iters}, kernel grid {GRID}x{BLOCK}",
        caps.version, caps.library_path
    );
    println!(
        "# {:>8} {:>10} | {:>12} {:>12} {:>9} | {:>12} {:>12} {:>9}",
        "kernel",
        "path",
        "kernel_ms",
        "alone_ms",
        "slowdown",
        "a2a_busbw",
        "alone_busbw",
        "a2a_slow"
    );
    let barrier = Barrier::new(w);
    let rows: Vec<anyhow::Result<Vec<String>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || rank(c, bytes, iters, barrier))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    });
    // Rank 0's lines (each rank measures its own GPU; the others' are in their results).
    for (r, lines) in rows.into_iter().enumerate() {
        for l in lines? {
            println!("  rank {r} {l}");
        }
    }
    for c in comms {
        c.finalize()?;
    }
    Ok(())
}

fn rank(
    c: &Comm<NcclComm>,
    bytes: usize,
    iters: usize,
    barrier: &Barrier,
) -> anyhow::Result<Vec<String>> {
    let w = c.world_size();
    let gpu = Gpu::new(c)?;
    let st = c.create_stream()?;
    c.set_copy_engine(true)?;
    let elems = bytes / 4;
    let send = c.register_window(c.alloc::<f32>(elems)?)?;
    let mut recv = c.register_window(c.alloc::<f32>(elems)?)?;
    // How the copy-engine path orders the ranks (UNICOMM_CE_SYNC): "ce/signals" or
    // "ce/barrier" in the table.
    let ce_label = format!(
        "ce/{}",
        c.backend().copy_engine_sync().map_or("?", |s| s.name())
    );
    let a2a_busbw = |t_ms: f64| (bytes as f64 / (t_ms / 1e3)) / 1e9 * (w - 1) as f64 / w as f64;
    // The comm loop: `iters` back-to-back all_to_alls, timed by markers on its stream.
    let comm_loop = |recv: &mut unicomm_core::Window<'_, f32, NcclComm>| -> anyhow::Result<(unicomm_core::Marker, unicomm_core::Marker)> {
        let a = st.record()?;
        for _ in 0..iters {
            c.all_to_all(&send, recv, &st)?;
        }
        Ok((a, st.record()?))
    };
    // Calibrate: the kernel's launches cover about the comm loop's duration.
    c.set_copy_engine(false)?;
    barrier.wait();
    let (a, b) = comm_loop(&mut recv)?;
    st.synchronize()?;
    let loop_ms = a.elapsed_ms(&b)?;
    let mut out = Vec::new();
    for kernel in [Kernel::Compute, Kernel::Memory] {
        let kiters = 20_000u32;
        gpu.launch(kernel, kiters)?;
        let one = gpu.time(kernel, kiters, 3)?;
        gpu.stream.synchronize()?;
        let per = ms(one)? / 3.0;
        let reps = ((loop_ms / per).ceil() as usize).clamp(3, 10_000);
        // The kernel alone.
        let alone = gpu.time(kernel, kiters, reps)?;
        gpu.stream.synchronize()?;
        let k_alone = ms(alone)? / reps as f64;
        for (path, ce) in [("nccl", false), (ce_label.as_str(), true)] {
            c.set_copy_engine(ce)?;
            // Warm-up: the path's lazy set-up (the copy engines' side stream) is not timed.
            barrier.wait();
            comm_loop(&mut recv)?;
            st.synchronize()?;
            // The all_to_all alone.
            barrier.wait();
            let (a, b) = comm_loop(&mut recv)?;
            st.synchronize()?;
            let c_alone = a.elapsed_ms(&b)? / iters as f64;
            // Both at once.
            barrier.wait();
            let k = gpu.time(kernel, kiters, reps)?;
            let (a, b) = comm_loop(&mut recv)?;
            st.synchronize()?;
            gpu.stream.synchronize()?;
            let k_conc = ms(k)? / reps as f64;
            let c_conc = a.elapsed_ms(&b)? / iters as f64;
            out.push(format!(
                "{:>8} {:>10} | {:>12.4} {:>12.4} {:>8.3}x | {:>12.1} {:>12.1} {:>8.3}x",
                format!("{kernel:?}").to_lowercase(),
                path,
                k_conc,
                k_alone,
                k_conc / k_alone,
                a2a_busbw(c_conc),
                a2a_busbw(c_alone),
                c_conc / c_alone
            ));
        }
    }
    c.set_copy_engine(false)?;
    barrier.wait();
    c.deregister_window(send)?;
    c.deregister_window(recv)?;
    Ok(out)
}
