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

#![deny(unsafe_code)]

use std::fmt;

/// The contract this suite checks, for the expansion of [`conformance_suite!`].
#[doc(hidden)]
pub use unicomm_core;

mod call_options;
mod exact;
mod exchange;
mod expert;
mod expert_engine;
mod expert_fp8;
mod expert_packed;
mod graphs;
mod groups;
mod one_sided;
mod recorded;
mod reference;
mod refusals;
mod runner;
mod sample;
mod sleep;
mod symmetric;
mod symmetric_agree;
mod table;
mod var;

pub use call_options::{call_options, portable_options};
pub use exchange::{all_to_all_v_refused, symmetric_all_to_all_v};
pub use expert::{expert_dispatch_combine, expert_dispatch_combine_masked};
pub use expert_engine::{expert_engine_matches_the_kernels, EngineRun};
pub use expert_fp8::{expert_dispatch_fp8, expert_dispatch_fp8_in};
pub use expert_packed::expert_dispatch_combine_packed;
pub use graphs::{
    capture_cycles, capture_panic_leaves_the_stream_eager, captured_copy_engine_replays,
    captured_step_replays, graph_inputs_written_between_replays,
};
pub use groups::{
    run_groups, run_groups_on_rank, run_groups_on_rank_refusing, run_groups_refusing,
};
pub use one_sided::{one_sided_in_graph, one_sided_put_signal};
pub use recorded::every_kind_of_work_is_recorded_once;
pub use refusals::{group_check_refused_by_design, refused_by_design};
pub use sleep::sleep_mode_and_properties;
pub use symmetric::{
    device_api_all_reduce, rms_norm_reference, symmetric_all_reduce, symmetric_rms_norm, Small,
    ALGORITHMS,
};
pub use symmetric_agree::{
    lamport_count_zero_sequence, symmetric_disagreement, symmetric_disagreement_ending,
    Disagreement,
};

use unicomm_core::{bf16, f16, Collective, Comm, DataType, Error, ReduceOp, F8E4M3, F8E5M2};

use reference::{Expected, Sample};
use runner::run_typed;

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

impl Coll {
    /// Every collective of the suite, in its order.
    pub const ALL: [Coll; 8] = [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::SendRecv,
        Coll::Barrier,
    ];
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
    /// Exactly this many elements (per rank, for the per-rank collectives), as property
    /// tests draw them.
    Exactly(usize),
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
    /// Registered for the automatic policy (`register_auto`), which picks a path per call.
    Auto,
}

impl Reg {
    /// Registered collectively (every rank at once): windows and automatic registrations.
    pub fn is_collective(self) -> bool {
        matches!(self, Reg::Window | Reg::Auto)
    }
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

/// A failed case: what differed, or which call failed, with the error where one was
/// returned (so an expected vendor difference is matched on its variant, not its text).
#[derive(Debug)]
pub struct Failure(pub String, pub Option<Box<unicomm_core::Error>>);

impl Failure {
    /// A failure described by `message` alone (wrong data, a broken harness).
    pub fn msg(message: impl Into<String>) -> Self {
        Failure(message.into(), None)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<unicomm_core::Error> for Failure {
    fn from(e: unicomm_core::Error) -> Self {
        Failure(format!("error: {e}"), Some(Box::new(e)))
    }
}

/// What a collective supports: the one table the suite follows (the rstest tables of
/// [`crate::conformance_suite!`] list exactly these, and [`run_case`] refuses the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// An in-place form exists.
    pub in_place: bool,
    /// Buffers may be symmetric windows (and registered for the automatic policy).
    pub windows: bool,
    /// It takes a reduction.
    pub reduces: bool,
}

impl Coll {
    /// What this collective supports.
    pub const fn support(self) -> Support {
        let (in_place, windows, reduces) = match self {
            Coll::AllReduce => (true, true, true),
            Coll::ReduceScatter | Coll::Reduce => (true, false, true),
            Coll::AllGather => (true, true, false),
            Coll::AllToAll => (false, true, false),
            Coll::Broadcast => (true, false, false),
            Coll::SendRecv => (false, false, false),
            Coll::Barrier => (false, false, false),
        };
        Support {
            in_place,
            windows,
            reduces,
        }
    }
}

/// Runs one case in every mode the harness gives for it.
pub fn run_case<H: Harness>(h: &H, case: Case) -> std::result::Result<(), Failure> {
    let support = case.coll.support();
    if case.place == Place::In && !support.in_place {
        return Err(Failure::msg(format!(
            "{:?} has no in-place form",
            case.coll
        )));
    }
    if case.reg.is_collective() && !support.windows {
        return Err(Failure::msg(format!(
            "{:?} is not tested in windows",
            case.coll
        )));
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
        DataType::F8E4M3 => run_modes::<F8E4M3, H>(h, &case),
        DataType::F8E5M2 => run_modes::<F8E5M2, H>(h, &case),
    }
}

/// The suite's subset for worlds of one rank per process (every process runs it in this
/// order): every collective, five types (f32, bf16, i64, u8, f8e4m3), every count, in and
/// out of place, unregistered, registered and (where the collective takes them) in windows.
pub fn process_subset(world: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for coll in Coll::ALL {
        let s = coll.support();
        for dtype in [
            DataType::F32,
            DataType::Bf16,
            DataType::I64,
            DataType::U8,
            DataType::F8E4M3,
        ] {
            for count in [Count::Zero, Count::One, Count::Odd, Count::Large] {
                for place in [Place::Out, Place::In] {
                    if place == Place::In && !s.in_place {
                        continue;
                    }
                    for reg in [Reg::None, Reg::Buffer, Reg::Window] {
                        if reg == Reg::Window && !s.windows {
                            continue;
                        }
                        v.push(Case {
                            coll,
                            dtype,
                            op: if s.reduces {
                                ReduceOp::Sum
                            } else {
                                ReduceOp::Max
                            },
                            count,
                            place,
                            reg,
                            world,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Runs one case on this process's rank alone (one rank per process: every process of the
/// world calls it with the same cases in the same order); checks this rank's output.
///
/// With `unsupported`, the case passes only if the backend refuses it as `Unsupported` (a
/// documented difference of the library the backend is or stands for:
/// [`refused_by_design`]).
pub fn run_case_on_rank<C: Collective>(
    comm: &Comm<C>,
    case: Case,
    unsupported: bool,
) -> std::result::Result<(), Failure> {
    if comm.world_size() != case.world {
        return Err(Failure::msg(format!(
            "a rank of a world of {} given a case for {}",
            comm.world_size(),
            case.world
        )));
    }
    fn one<T: Sample, C: Collective>(
        comm: &Comm<C>,
        case: &Case,
    ) -> std::result::Result<(), Failure> {
        let exp = Expected::<T>::new(case);
        run_typed::<T, C>(std::slice::from_ref(comm), case, &exp, Mode::ThreadPerRank)
            .map_err(|Failure(e, err)| Failure(format!("{case:?}: {e}"), err))
    }
    let r = match case.dtype {
        DataType::F32 => one::<f32, C>(comm, &case),
        DataType::F64 => one::<f64, C>(comm, &case),
        DataType::F16 => one::<f16, C>(comm, &case),
        DataType::Bf16 => one::<bf16, C>(comm, &case),
        DataType::I8 => one::<i8, C>(comm, &case),
        DataType::U8 => one::<u8, C>(comm, &case),
        DataType::I32 => one::<i32, C>(comm, &case),
        DataType::U32 => one::<u32, C>(comm, &case),
        DataType::I64 => one::<i64, C>(comm, &case),
        DataType::U64 => one::<u64, C>(comm, &case),
        DataType::F8E4M3 => one::<F8E4M3, C>(comm, &case),
        DataType::F8E5M2 => one::<F8E5M2, C>(comm, &case),
    };
    match (unsupported, r) {
        (false, r) => r,
        (true, Err(Failure(_, Some(e)))) if matches!(*e, Error::Unsupported { .. }) => Ok(()),
        (true, Err(e)) => Err(Failure::msg(format!("{case:?}: expected Unsupported: {e}"))),
        (true, Ok(())) => Err(Failure::msg(format!(
            "{case:?}: expected Unsupported, but it ran"
        ))),
    }
}

fn run_modes<T: Sample, H: Harness>(h: &H, case: &Case) -> std::result::Result<(), Failure> {
    let exp = Expected::<T>::new(case);
    for &mode in h.modes(case) {
        h.with_comms(case.world, &mut |comms| {
            if comms.len() != case.world {
                return Err(Failure::msg(format!(
                    "harness gave {} communicators for a world of {}",
                    comms.len(),
                    case.world
                )));
            }
            let r = run_typed::<T, H::C>(comms, case, &exp, mode);
            match (h.unsupported(case), r) {
                (false, r) => r,
                // Refused, as documented (one thread driving every rank stops at the first).
                (true, Err(Failure(_, Some(e)))) if matches!(*e, Error::Unsupported { .. }) => {
                    Ok(())
                }
                (true, Err(e)) => Err(Failure::msg(format!(
                    "expected Unsupported on every rank: {e}"
                ))),
                (true, Ok(())) => Err(Failure::msg("expected Unsupported, but it ran")),
            }
            .map_err(|Failure(e, err)| Failure(format!("{case:?} in {mode:?}: {e}"), err))
        })?;
    }
    Ok(())
}
