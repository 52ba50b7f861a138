//! The conformance suite every backend passes: real data through every collective, checked
//! against a host reference computed here, independently of any backend.
//!
//! A backend's test crate instantiates it with [`crate::conformance_suite!`], which expands to
//! rstest tables over element types x reductions x counts (0, 1, odd, 1 Mi) x in/out of place
//! x registration (none, buffer, window) x world sizes (1, 2, 3, 4, 8). Every case runs in
//! each [`Mode`] the [`Harness`] offers.
//!
//! Reference semantics (NCCL's): integer sum/prod wrap; integer avg is the wrapped sum
//! divided by the world size, truncated toward zero; float results are exact for the
//! small-integer data used here, except avg, which is checked against the exact mean with a
//! tolerance of a few units in the last place (NCCL pre-multiplies by `1/n`).

use std::fmt;

use crate::{
    bf16, f16, Buffer, Collective, Comm, DataType, DeviceStream, Element, ReduceOp, Result,
};

/// How ranks are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One thread per rank (NCCL's pthread mode).
    ThreadPerRank,
    /// One thread drives every rank, each collective issued for all ranks inside one group.
    SingleThread,
}

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    /// all_reduce
    AllReduce,
    /// broadcast from the last rank
    Broadcast,
    /// reduce to the middle rank
    Reduce,
    /// all_gather
    AllGather,
    /// reduce_scatter
    ReduceScatter,
    /// all_to_all
    AllToAll,
    /// a ring of grouped send/recv
    SendRecv,
    /// barrier
    Barrier,
}

/// The case's element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// No elements.
    Zero,
    /// One element (per rank, for the per-rank collectives).
    One,
    /// An odd count: 1001.
    Odd,
    /// 1 Mi elements in each buffer (per-rank collectives: 1 Mi / world per rank, rounded down).
    Large,
}

/// Registration of the case's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    /// Plain buffers.
    None,
    /// `ncclCommRegister` on send and receive buffers.
    Buffer,
    /// Symmetric windows for send and receive buffers.
    Window,
}

/// In place or out of place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Separate send and receive buffers.
    Out,
    /// One buffer (NCCL's in-place layout).
    In,
}

/// One case of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The collective.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Count.
    pub count: Count,
    /// Placement.
    pub place: Place,
    /// Registration.
    pub reg: Reg,
    /// Ranks.
    pub world: usize,
}

/// What a harness runs on a world's communicators: one case in one mode.
pub type CaseFn<'a, C> = dyn FnMut(&[Comm<C>]) -> std::result::Result<(), Failure> + 'a;

/// How a backend's tests make communicators.
pub trait Harness: Sync {
    /// The backend.
    type C: Collective;
    /// Runs `f` on `world` communicators of one world, in rank order. The harness may keep
    /// them across cases (GPU communicators take long to create) and must not run two
    /// cases on the same communicators at once. A machine that cannot provide them returns
    /// the error (for example `NoDevice`), which fails the case: nothing is skipped.
    fn with_comms(
        &self,
        world: usize,
        f: &mut CaseFn<'_, Self::C>,
    ) -> std::result::Result<(), Failure>;
    /// Whether the backend refuses `case` as `Unsupported`, by design and documented (a
    /// behaviour that differs by vendor). Such a case passes only if every rank gets
    /// `Unsupported`; default: none.
    fn unsupported(&self, case: &Case) -> bool {
        let _ = case;
        false
    }

    /// The modes to run `case` in (default: both).
    fn modes(&self, case: &Case) -> &'static [Mode] {
        let _ = case;
        &[Mode::ThreadPerRank, Mode::SingleThread]
    }
}

/// A failed case: what differed, or which call failed.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Self {
        Failure(format!("error: {e}"))
    }
}

/// Element types with the host arithmetic the reference needs.
pub trait Sample: Element {
    /// The value `v` (small integers, exactly representable in every type).
    fn from_i64(v: i64) -> Self;
    /// The value as f64 (exact for every sample used).
    fn to_f64(self) -> f64;
    /// `v` wrapped into the type, as C's conversion to an unsigned type (and two's
    /// complement for signed) does. Floats convert.
    fn wrap(v: i128) -> Self;
    /// Whether the type is signed (integers) or a float.
    const SIGNED: bool;
}

macro_rules! sample_int {
    ($($t:ty, $s:expr;)*) => {$(
        impl Sample for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn wrap(v: i128) -> Self { v as $t }
            const SIGNED: bool = $s;
        }
    )*};
}
sample_int!(i8, true; u8, false; i32, true; u32, false; i64, true; u64, false;);

impl Sample for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn wrap(v: i128) -> Self {
        v as f32
    }
    const SIGNED: bool = true;
}
impl Sample for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn wrap(v: i128) -> Self {
        v as f64
    }
    const SIGNED: bool = true;
}
impl Sample for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn wrap(v: i128) -> Self {
        f16::from_f64(v as f64)
    }
    const SIGNED: bool = true;
}
impl Sample for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn wrap(v: i128) -> Self {
        bf16::from_f64(v as f64)
    }
    const SIGNED: bool = true;
}

/// Input element `i` of rank `r`, chosen so that every reference result is exact: sums of
/// at most 8 values in -3..=3 (0..=6 unsigned), products of 1, 2 or -1, max/min over
/// -5..=5 (0..=10 unsigned).
fn input<T: Sample>(op: ReduceOp, r: usize, i: usize) -> i64 {
    let h = (r as i64) * 7 + (i as i64) * 3 + (i as i64 / 13);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            if T::SIGNED {
                h % 7 - 3
            } else {
                h % 7
            }
        }
        ReduceOp::Prod => match h % 4 {
            0 | 1 => 1,
            2 => 2,
            _ if T::SIGNED => -1,
            _ => 1,
        },
        ReduceOp::Max | ReduceOp::Min => {
            if T::SIGNED {
                (h * 5) % 11 - 5
            } else {
                (h * 5) % 11
            }
        }
    }
}

/// The reference reduction of `vals` (one per rank), computed in i128 and converted once,
/// wrapping as the type does. Float averages are checked by [`check_value`] instead.
fn reference<T: Sample>(op: ReduceOp, vals: &[i64]) -> T {
    let n = vals.len() as i128;
    match op {
        ReduceOp::Sum => T::wrap(vals.iter().map(|&v| v as i128).sum()),
        ReduceOp::Prod => {
            // Integer products wrap at every step, as the type does; the float samples are
            // exact (at most 2^8).
            vals.iter().fold(T::wrap(1), |acc, &v| {
                T::wrap((acc.to_f64() as i128).wrapping_mul(v as i128))
            })
        }
        ReduceOp::Max => T::wrap(vals.iter().copied().max().unwrap_or(0) as i128),
        ReduceOp::Min => T::wrap(vals.iter().copied().min().unwrap_or(0) as i128),
        ReduceOp::Avg => {
            // NCCL's SumPostDiv: the sum wraps in the type, then divides, truncating.
            let wrapped = T::wrap(vals.iter().map(|&v| v as i128).sum()).to_f64() as i128;
            T::wrap(wrapped / n)
        }
    }
}

/// The exact expected value, or for float averages the exact mean and its tolerance.
fn reference_or_tolerance<T: Sample>(
    op: ReduceOp,
    vals: &[i64],
) -> std::result::Result<T, (f64, f64)> {
    if op == ReduceOp::Avg && T::DTYPE.is_float() {
        // NCCL pre-multiplies each input by 1/n (rounded) and sums: 2n-1 roundings of values
        // of magnitude < 4, each within half an ulp, so within 4*n*eps of the exact mean.
        let n = vals.len() as f64;
        let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / n;
        let eps = match T::DTYPE {
            DataType::F16 => (-10f64).exp2(),
            DataType::Bf16 => (-7f64).exp2(),
            DataType::F32 => (-23f64).exp2(),
            _ => (-52f64).exp2(),
        };
        return Err((mean, 4.0 * n * eps));
    }
    Ok(reference::<T>(op, vals))
}

const SENTINEL: i64 = 9;

fn sentinel<T: Sample>() -> T {
    T::from_i64(SENTINEL)
}

/// Elements per rank's chunk and total buffer lengths for a case.
struct Shape {
    /// The count the collective is called with (per peer for the per-rank collectives).
    count: usize,
    send_len: usize,
    recv_len: usize,
}

fn shape(case: &Case) -> Shape {
    let w = case.world;
    let base = match case.count {
        Count::Zero => 0,
        Count::One => 1,
        Count::Odd => 1001,
        Count::Large => 1 << 20,
    };
    let per_rank = |n: usize| if case.count == Count::Large { n / w } else { n };
    match case.coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Shape {
            count: base,
            send_len: base,
            recv_len: base,
        },
        Coll::Barrier => Shape {
            count: 0,
            send_len: 0,
            recv_len: 0,
        },
        Coll::AllGather => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c,
                recv_len: c * w,
            }
        }
        Coll::ReduceScatter => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c * w,
                recv_len: c,
            }
        }
        Coll::AllToAll => {
            let c = per_rank(base);
            Shape {
                count: c,
                send_len: c * w,
                recv_len: c * w,
            }
        }
    }
}

fn root(case: &Case) -> usize {
    match case.coll {
        Coll::Broadcast => case.world - 1,
        Coll::Reduce => case.world / 2,
        _ => 0,
    }
}

/// What rank `r` starts with in its send buffer (in place: in its one buffer).
fn send_data<T: Sample>(case: &Case, exp: &Expected<T>, r: usize) -> Vec<T> {
    let s = shape(case);
    let input = |_: ReduceOp, r: usize, i: usize| exp.inputs[r][i] as i64;
    let op = ReduceOp::Sum;
    match (case.coll, case.place) {
        // In place, the rank's input is its chunk of the larger buffer; the rest is sentinel.
        (Coll::AllGather, Place::In) => (0..s.recv_len)
            .map(|i| {
                if i / s.count.max(1) == r && s.count > 0 {
                    T::from_i64(input(op, r, i))
                } else {
                    sentinel()
                }
            })
            .collect(),
        _ => (0..s.send_len)
            .map(|i| T::from_i64(input(op, r, i)))
            .collect(),
    }
}

fn reduces(c: Coll) -> bool {
    matches!(c, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
}

/// The inputs of every rank and the reduced values, computed once per case.
struct Expected<T> {
    /// `inputs[k][i]`: element `i` of rank `k`'s input (as in `input`, which stays in
    /// -5..=10).
    inputs: Vec<Vec<i8>>,
    /// For the reducing collectives, element `i` of the reduction over every rank's
    /// element `i`, computed once and reused by every rank.
    reduced: Vec<T>,
    /// For float averages instead: the exact means, and the tolerance.
    means: Vec<f64>,
    tol: f64,
}

impl<T: Sample> Expected<T> {
    fn new(case: &Case) -> Self {
        let s = shape(case);
        let op = if reduces(case.coll) {
            case.op
        } else {
            ReduceOp::Sum
        };
        let len = s.send_len.max(s.recv_len);
        let inputs: Vec<Vec<i8>> = (0..case.world)
            .map(|k| (0..len).map(|i| input::<T>(op, k, i) as i8).collect())
            .collect();
        let mut e = Expected {
            inputs,
            reduced: Vec::new(),
            means: Vec::new(),
            tol: 0.0,
        };
        if !reduces(case.coll) {
            return e;
        }
        let mut vals = vec![0i64; case.world];
        for i in 0..s.send_len {
            for (k, v) in vals.iter_mut().enumerate() {
                *v = e.inputs[k][i] as i64;
            }
            match reference_or_tolerance::<T>(op, &vals) {
                Ok(want) => e.reduced.push(want),
                Err((mean, tol)) => {
                    e.means.push(mean);
                    e.tol = tol;
                }
            }
        }
        e
    }

    /// Checks a reduced element against the reduction of every rank's element `src`.
    fn reduced(&self, src: usize, got: T) -> std::result::Result<(), String> {
        if let Some(&want) = self.reduced.get(src) {
            return expect(got, want);
        }
        let mean = self.means[src];
        if (got.to_f64() - mean).abs() <= self.tol {
            Ok(())
        } else {
            Err(format!("got {got:?}, want {mean} within {:e}", self.tol))
        }
    }
}

/// Checks rank `r`'s output against the reference.
fn verify<T: Sample>(
    case: &Case,
    exp: &Expected<T>,
    r: usize,
    out: &[T],
) -> std::result::Result<(), String> {
    let s = shape(case);
    let w = case.world;
    let inp = |rank: usize, i: usize| exp.inputs[rank][i] as i64;
    let bad = |i: usize, e: String| Err(format!("rank {r}, element {i}: {e}"));
    for (i, &got) in out.iter().enumerate() {
        let res = match case.coll {
            Coll::AllReduce => exp.reduced(i, got),
            Coll::Reduce => {
                if r == root(case) {
                    exp.reduced(i, got)
                } else if case.place == Place::In {
                    // Non-root buffers are inputs only and stay as they were.
                    expect(got, T::from_i64(inp(r, i)))
                } else {
                    expect(got, sentinel())
                }
            }
            Coll::Broadcast => expect(got, T::from_i64(inp(root(case), i))),
            Coll::AllGather => {
                let (k, j) = (i / s.count, i % s.count);
                // In place the source chunk k of rank k sits at index i of its buffer.
                let idx = if case.place == Place::In { i } else { j };
                expect(got, T::from_i64(inp(k, idx)))
            }
            Coll::ReduceScatter => {
                let base = if case.place == Place::In {
                    r * s.count
                } else {
                    0
                };
                if case.place == Place::In && (i < base || i >= base + s.count) {
                    // Outside this rank's chunk the buffer keeps its input.
                    expect(got, T::from_i64(inp(r, i)))
                } else {
                    exp.reduced(r * s.count + (i - base), got)
                }
            }
            Coll::AllToAll => {
                let (p, j) = (i / s.count, i % s.count);
                expect(got, T::from_i64(inp(p, r * s.count + j)))
            }
            Coll::SendRecv => {
                let from = (r + w - 1) % w;
                expect(got, T::from_i64(inp(from, i)))
            }
            Coll::Barrier => Ok(()),
        };
        if let Err(e) = res {
            return bad(i, e);
        }
    }
    Ok(())
}

fn expect<T: Sample>(got: T, want: T) -> std::result::Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got:?}, want {want:?}"))
    }
}

/// The buffers of one rank, registered as the case asks.
enum Held<'c, T: Element, C: Collective> {
    Plain(Buffer<T, C>),
    Reg(crate::Registered<'c, T, C>),
    Win(crate::Window<'c, T, C>),
}

impl<'c, T: Element, C: Collective> Held<'c, T, C> {
    fn slice(&mut self) -> &mut dyn HeldSlice<T, C> {
        match self {
            Held::Plain(b) => b,
            Held::Reg(b) => b,
            Held::Win(b) => b,
        }
    }
    fn release(self, comm: &'c Comm<C>) -> Result<()> {
        match self {
            Held::Plain(_) => Ok(()),
            Held::Reg(r) => comm.deregister(r).map(drop),
            Held::Win(w) => comm.deregister_window(w).map(drop),
        }
    }
}

/// Object-safe access to any held buffer.
trait HeldSlice<T: Element, C: Collective> {
    fn view(&self) -> crate::View<'_, T, C>;
    fn view_mut(&mut self) -> crate::ViewMut<'_, T, C>;
}
impl<T: Element, C: Collective, B: crate::DeviceSliceMut<T, C>> HeldSlice<T, C> for B {
    fn view(&self) -> crate::View<'_, T, C> {
        crate::DeviceSlice::view(self)
    }
    fn view_mut(&mut self) -> crate::ViewMut<'_, T, C> {
        crate::DeviceSliceMut::view_mut(self)
    }
}

fn hold<'c, T: Element, C: Collective>(
    comm: &'c Comm<C>,
    buf: Buffer<T, C>,
    reg: Reg,
) -> Result<Held<'c, T, C>> {
    Ok(match reg {
        Reg::None => Held::Plain(buf),
        Reg::Buffer => Held::Reg(comm.register(buf)?),
        Reg::Window => Held::Win(comm.register_window(buf)?),
    })
}

/// Per-rank state of a case.
struct Rank<'c, T: Element, C: Collective> {
    comm: &'c Comm<C>,
    stream: C::Stream,
    send: Option<Held<'c, T, C>>,
    recv: Held<'c, T, C>,
}

fn setup<'c, T: Sample, C: Collective>(
    comm: &'c Comm<C>,
    case: &Case,
    exp: &Expected<T>,
) -> Result<Rank<'c, T, C>> {
    let s = shape(case);
    let r = comm.rank();
    let stream = comm.create_stream()?;
    let (send, recv) = match case.place {
        Place::Out => {
            let mut send = comm.alloc::<T>(s.send_len)?;
            send.copy_from_host(&send_data::<T>(case, exp, r), &stream)?;
            let mut recv = comm.alloc::<T>(s.recv_len)?;
            recv.copy_from_host(&vec![sentinel::<T>(); s.recv_len], &stream)?;
            (Some(send), recv)
        }
        Place::In => {
            let len = s.send_len.max(s.recv_len);
            let mut buf = comm.alloc::<T>(len)?;
            buf.copy_from_host(&send_data::<T>(case, exp, r), &stream)?;
            (None, buf)
        }
    };
    // Copies must land before registration in case the backend registers eagerly.
    stream.synchronize()?;
    let send = send.map(|b| hold(comm, b, case.reg)).transpose()?;
    let recv = hold(comm, recv, case.reg)?;
    Ok(Rank {
        comm,
        stream,
        send,
        recv,
    })
}

fn launch<T: Sample, C: Collective>(rk: &mut Rank<'_, T, C>, case: &Case) -> Result<()> {
    let (c, st) = (rk.comm, &rk.stream);
    let w = case.world;
    let r = c.rank();
    let recv = rk.recv.slice();
    match (case.coll, rk.send.as_mut()) {
        (Coll::Barrier, _) => c.barrier(st),
        (Coll::SendRecv, Some(send)) => c.group(|| {
            c.send(&send.slice().view(), (r + 1) % w, st)?;
            c.recv(&mut recv.view_mut(), (r + w - 1) % w, st)
        }),
        (Coll::SendRecv, None) => Err(crate::Error::invalid(
            "case",
            "send/recv is out of place only",
        )),
        (coll, Some(send)) => {
            let sv = send.slice().view();
            let mut rv = recv.view_mut();
            match coll {
                Coll::AllReduce => c.all_reduce(&sv, &mut rv, case.op, st),
                Coll::Broadcast => c.broadcast(&sv, &mut rv, root(case), st),
                Coll::Reduce => c.reduce(&sv, &mut rv, case.op, root(case), st),
                Coll::AllGather => c.all_gather(&sv, &mut rv, st),
                Coll::ReduceScatter => c.reduce_scatter(&sv, &mut rv, case.op, st),
                Coll::AllToAll => c.all_to_all(&sv, &mut rv, st),
                Coll::SendRecv | Coll::Barrier => Ok(()),
            }
        }
        (coll, None) => {
            let mut b = recv.view_mut();
            match coll {
                Coll::AllReduce => c.all_reduce_in_place(&mut b, case.op, st),
                Coll::Broadcast => c.broadcast_in_place(&mut b, root(case), st),
                Coll::Reduce => c.reduce_in_place(&mut b, case.op, root(case), st),
                Coll::AllGather => c.all_gather_in_place(&mut b, st),
                Coll::ReduceScatter => c.reduce_scatter_in_place(&mut b, case.op, st),
                Coll::AllToAll => Err(crate::Error::invalid(
                    "case",
                    "all_to_all is out of place only",
                )),
                Coll::SendRecv | Coll::Barrier => Ok(()),
            }
        }
    }
}

fn check_output<T: Sample, C: Collective>(
    rk: &mut Rank<'_, T, C>,
    case: &Case,
    exp: &Expected<T>,
) -> std::result::Result<(), Failure> {
    rk.stream.synchronize()?;
    let out = rk.recv.slice().view().copy_to_host(&rk.stream)?;
    verify::<T>(case, exp, rk.comm.rank(), &out).map_err(Failure)
}

fn release<T: Sample, C: Collective>(mut rk: Rank<'_, T, C>) -> std::result::Result<(), Failure> {
    if let Some(s) = rk.send.take() {
        s.release(rk.comm)?;
    }
    rk.recv.release(rk.comm)?;
    Ok(())
}

/// Runs `f` on one scoped thread per communicator and collects the results in rank order.
fn per_rank<'c, C: Collective, R: Send>(
    comms: &'c [Comm<C>],
    f: impl Fn(&'c Comm<C>) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}

fn run_typed<T: Sample, C: Collective>(
    comms: &[Comm<C>],
    case: &Case,
    exp: &Expected<T>,
    mode: Mode,
) -> std::result::Result<(), Failure> {
    let outcome: Vec<std::result::Result<(), Failure>> = match mode {
        Mode::ThreadPerRank => per_rank(comms, |c| -> std::result::Result<(), Failure> {
            let mut rk = setup::<T, C>(c, case, exp)?;
            launch(&mut rk, case)?;
            check_output(&mut rk, case, exp)?;
            release(rk)
        })
        .into_iter()
        .map(|r| r.unwrap_or_else(|_| Err(Failure("a rank thread panicked".into()))))
        .collect(),
        Mode::SingleThread => {
            // Window registration is collective, so setup runs per rank; every collective is
            // then issued by this one thread for all ranks inside one group.
            let ranks: Vec<Rank<'_, T, C>> = if case.reg == Reg::Window {
                let mut v = Vec::new();
                for r in per_rank(comms, |c| setup::<T, C>(c, case, exp)) {
                    v.push(r.map_err(|_| Failure("a setup thread panicked".into()))??);
                }
                v
            } else {
                comms
                    .iter()
                    .map(|c| setup::<T, C>(c, case, exp))
                    .collect::<Result<_>>()?
            };
            let mut ranks = ranks;
            comms[0].group(|| ranks.iter_mut().try_for_each(|rk| launch(rk, case)))?;
            let mut out: Vec<_> = ranks
                .iter_mut()
                .map(|rk| check_output(rk, case, exp))
                .collect();
            // Window deregistration is collective too: one thread per rank.
            let released: Vec<_> = if case.reg == Reg::Window {
                std::thread::scope(|s| {
                    let hs: Vec<_> = ranks
                        .into_iter()
                        .map(|rk| s.spawn(move || release(rk)))
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(Failure("a release thread panicked".into()))
                            })
                        })
                        .collect()
                })
            } else {
                ranks.into_iter().map(release).collect()
            };
            for (o, r) in out.iter_mut().zip(released) {
                if o.is_ok() {
                    *o = r;
                }
            }
            out
        }
    };
    let errors: Vec<String> = outcome
        .into_iter()
        .enumerate()
        .filter_map(|(r, o)| o.err().map(|e| format!("rank {r}: {e}")))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Failure(errors.join("; ")))
    }
}

/// Runs one case in every mode the harness gives for it.
pub fn run_case<H: Harness>(h: &H, case: Case) -> std::result::Result<(), Failure> {
    if case.place == Place::In && matches!(case.coll, Coll::AllToAll | Coll::SendRecv) {
        return Err(Failure(format!("{:?} has no in-place form", case.coll)));
    }
    match case.dtype {
        DataType::F32 => run_modes::<f32, H>(h, &case),
        DataType::F64 => run_modes::<f64, H>(h, &case),
        DataType::F16 => run_modes::<f16, H>(h, &case),
        DataType::Bf16 => run_modes::<bf16, H>(h, &case),
        DataType::I8 => run_modes::<i8, H>(h, &case),
        DataType::U8 => run_modes::<u8, H>(h, &case),
        DataType::I32 => run_modes::<i32, H>(h, &case),
        DataType::U32 => run_modes::<u32, H>(h, &case),
        DataType::I64 => run_modes::<i64, H>(h, &case),
        DataType::U64 => run_modes::<u64, H>(h, &case),
    }
}

fn run_modes<T: Sample, H: Harness>(h: &H, case: &Case) -> std::result::Result<(), Failure> {
    let exp = Expected::<T>::new(case);
    for &mode in h.modes(case) {
        h.with_comms(case.world, &mut |comms| {
            if comms.len() != case.world {
                return Err(Failure(format!(
                    "harness gave {} communicators for a world of {}",
                    comms.len(),
                    case.world
                )));
            }
            let r = run_typed::<T, H::C>(comms, case, &exp, mode);
            match (h.unsupported(case), r) {
                (false, r) => r,
                // Refused, as documented (one thread driving every rank stops at the first).
                (true, Err(Failure(e)))
                    if e.contains("is unsupported") && !e.contains(", element ") =>
                {
                    Ok(())
                }
                (true, Err(e)) => Err(Failure(format!("expected Unsupported on every rank: {e}"))),
                (true, Ok(())) => Err(Failure("expected Unsupported, but it ran".into())),
            }
            .map_err(|e| Failure(format!("{case:?} in {mode:?}: {e}")))
        })?;
    }
    Ok(())
}

/// Expands to the rstest tables of the suite for a harness expression. The calling crate
/// needs `rstest` as a dev-dependency.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance::{run_case, Case, Coll, Count, Place, Reg};
            use $crate::{DataType, ReduceOp};

            fn run(
                coll: Coll,
                dtype: DataType,
                op: ReduceOp,
                count: Count,
                place: Place,
                reg: Reg,
                world: usize,
            ) {
                let case = Case {
                    coll,
                    dtype,
                    op,
                    count,
                    place,
                    reg,
                    world,
                };
                if let Err(e) = run_case(&$harness, case) {
                    panic!("{e}");
                }
            }

            #[::rstest::rstest]
            fn all_reduce(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(
                    ReduceOp::Sum,
                    ReduceOp::Prod,
                    ReduceOp::Max,
                    ReduceOp::Min,
                    ReduceOp::Avg
                )]
                op: ReduceOp,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer, Reg::Window)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(Coll::AllReduce, dtype, op, count, place, reg, world)
            }

            #[::rstest::rstest]
            fn reduce_scatter(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(
                    ReduceOp::Sum,
                    ReduceOp::Prod,
                    ReduceOp::Max,
                    ReduceOp::Min,
                    ReduceOp::Avg
                )]
                op: ReduceOp,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(Coll::ReduceScatter, dtype, op, count, place, reg, world)
            }

            #[::rstest::rstest]
            fn reduce(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(
                    ReduceOp::Sum,
                    ReduceOp::Prod,
                    ReduceOp::Max,
                    ReduceOp::Min,
                    ReduceOp::Avg
                )]
                op: ReduceOp,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(Coll::Reduce, dtype, op, count, place, reg, world)
            }

            #[::rstest::rstest]
            fn all_to_all(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Reg::None, Reg::Buffer, Reg::Window)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(
                    Coll::AllToAll,
                    dtype,
                    ReduceOp::Sum,
                    count,
                    Place::Out,
                    reg,
                    world,
                )
            }

            #[::rstest::rstest]
            fn all_gather(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer, Reg::Window)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(
                    Coll::AllGather,
                    dtype,
                    ReduceOp::Sum,
                    count,
                    place,
                    reg,
                    world,
                )
            }

            #[::rstest::rstest]
            fn broadcast(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(
                    Coll::Broadcast,
                    dtype,
                    ReduceOp::Sum,
                    count,
                    place,
                    reg,
                    world,
                )
            }

            #[::rstest::rstest]
            fn send_recv(
                #[values(
                    DataType::F32,
                    DataType::F64,
                    DataType::F16,
                    DataType::Bf16,
                    DataType::I8,
                    DataType::U8,
                    DataType::I32,
                    DataType::U32,
                    DataType::I64,
                    DataType::U64
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Reg::None, Reg::Buffer)] reg: Reg,
                #[values(1, 2, 3, 4, 8)] world: usize,
            ) {
                run(
                    Coll::SendRecv,
                    dtype,
                    ReduceOp::Sum,
                    count,
                    Place::Out,
                    reg,
                    world,
                )
            }

            #[::rstest::rstest]
            fn barrier(#[values(1, 2, 3, 4, 8)] world: usize) {
                run(
                    Coll::Barrier,
                    DataType::F32,
                    ReduceOp::Sum,
                    Count::Zero,
                    Place::Out,
                    Reg::None,
                    world,
                )
            }
        }
    };
}
