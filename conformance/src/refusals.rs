//! The cases a backend refuses by design, as the suite expects them: the documented
//! differences of the NCCL API's libraries, which the mock standing for a library refuses
//! too. A case listed here passes only as `Unsupported` on every rank; any other case only
//! by running right.

use unicomm_core::{DataType, ReduceOp};

use crate::{Case, Coll, Count, Place, Reg};

/// Whether `case` is refused by design on a backend whose capabilities say `fp8_reduce`:
///
/// - an in-place all-gather in a symmetric window whose per-rank chunk is not a multiple of
///   4 bytes: NCCL 2.27-2.28's symmetric kernel corrupts such chunks (measured on 2x H200,
///   NCCL 2.28.9), so it is refused on every NCCL-API backend and the mock standing for one;
/// - a float average or a pre-multiplied sum of fp8 on one rank: NCCL's one-rank path has
///   no such kernel (measured on 1x H200, `ncclInvalidArgument`);
/// - every reduction of the 8-bit floats where the target does not reduce them (NCCL before
///   2.24.3, a GPU below sm90, RCCL whose MI300 encoding is FNUZ).
pub fn refused_by_design(case: &Case, fp8_reduce: bool) -> bool {
    let chunk = match case.count {
        Count::Zero => 0,
        Count::One => 1,
        Count::Odd => 1001,
        Count::Large => (1 << 20) / case.world,
        Count::Exactly(n) => n,
    };
    let window_gather = case.coll == Coll::AllGather
        && case.place == Place::In
        && case.reg == Reg::Window
        && case.world > 1
        && !(chunk * case.dtype.size()).is_multiple_of(4);
    let reduces = matches!(
        case.coll,
        Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter
    );
    window_gather
        || (case.world == 1 && reduces && one_rank_fp8_premul(case.dtype, case.op))
        || (!fp8_reduce && case.dtype.is_fp8() && reduces)
}

fn one_rank_fp8_premul(dtype: DataType, op: ReduceOp) -> bool {
    dtype.is_fp8() && matches!(op, ReduceOp::Avg | ReduceOp::PreMulSum(_))
}

/// Whether the process-group check named `check` is refused by design on a world of `world`
/// ranks of a backend whose capabilities say `fp8_reduce`: the fp8 pre-multiplied sum on one
/// rank (NCCL's one-rank path) and wherever fp8 is not reduced.
pub fn group_check_refused_by_design(check: &str, world: usize, fp8_reduce: bool) -> bool {
    check == "pre-multiplied sum f8e4m3" && (world == 1 || !fp8_reduce)
}
