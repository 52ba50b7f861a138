//! The rstest tables of the suite, one per collective, following [`super::Coll::support`].

/// Expands to the rstest tables of the suite for a harness expression. The calling crate
/// needs `rstest` as a dev-dependency.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:ident) => {
        mod conformance {
            use $crate::unicomm_core::{DataType, ReduceOp};
            use $crate::{run_case, Case, Coll, Count, Place, Reg};

            // One out-of-line body for the ~20k generated cases: inlined into each of them, the
            // mock's optimised test binary took 130 s to build on 2 cores instead of 72 s.
            #[inline(never)]
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
                if let Err(e) = run_case(&super::$harness, case) {
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
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
                #[values(Reg::None, Reg::Buffer, Reg::Window, Reg::Auto)] reg: Reg,
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Reg::None, Reg::Buffer, Reg::Window, Reg::Auto)] reg: Reg,
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
                )]
                dtype: DataType,
                #[values(Count::Zero, Count::One, Count::Odd, Count::Large)] count: Count,
                #[values(Place::Out, Place::In)] place: Place,
                #[values(Reg::None, Reg::Buffer, Reg::Window, Reg::Auto)] reg: Reg,
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
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
                    DataType::U64,
                    DataType::F8E4M3,
                    DataType::F8E5M2
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
