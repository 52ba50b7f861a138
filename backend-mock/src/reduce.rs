//! Reduction kernels with NCCL's semantics (see `comm_core::ReduceOp`).

use comm_core::{bf16, f16, DataType, ReduceOp};

/// Elements reduced per block: the output block stays in L1 while every source is added.
const BLOCK: usize = 4096;

trait Arith: Copy {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    /// Float types: `(x * scale)` rounded to the type (NCCL's PreMulSum); integers: identity.
    fn premul(x: Self, world: usize) -> Self;
    /// Integer types: truncating division by the world size (NCCL's SumPostDiv); floats:
    /// identity.
    fn postdiv(x: Self, world: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)] fn premul(x: Self, _: usize) -> Self { x }
            // Divided in i128: truncation toward zero, and no overflow or division by zero
            // however large the world is relative to the type.
            #[inline(always)] fn postdiv(x: Self, world: usize) -> Self {
                (x as i128 / world.max(1) as i128) as $t
            }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { a.max(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)] fn premul(x: Self, world: usize) -> Self {
                x * ((1.0f64 / world as f64) as $t)
            }
            #[inline(always)] fn postdiv(x: Self, _: usize) -> Self { x }
        }
    )*};
}
float_arith!(f32, f64);

// Half types compute in f64 and round once: exact for every sum and product of two halves,
// hence the correctly rounded result that `__hadd`/`__hmul` give on the GPU.
macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { <$t>::from_f64(a.to_f64() + b.to_f64()) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { <$t>::from_f64(a.to_f64() * b.to_f64()) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn premul(x: Self, world: usize) -> Self {
                let scale = <$t>::from_f64(1.0 / world as f64);
                <$t>::from_f64(x.to_f64() * scale.to_f64())
            }
            #[inline(always)] fn postdiv(x: Self, _: usize) -> Self { x }
        }
    )*};
}
half_arith!(f16, bf16);

/// `out[i] = op(srcs[0][i], srcs[1][i], ...)` for `count` elements.
///
/// # Safety
/// `out` and every `srcs[k]` point to `count` valid, aligned elements of `dtype`; `out` may
/// equal `srcs[0]` (in-place) but overlaps no other source; nothing else accesses `out`
/// during the call, and nothing writes the sources.
pub(crate) unsafe fn reduce(
    dtype: DataType,
    op: ReduceOp,
    world: usize,
    out: *mut u8,
    srcs: &[*const u8],
    count: usize,
) {
    macro_rules! go {
        ($t:ty) => {
            // SAFETY: forwarded from this function's contract.
            unsafe { reduce_t::<$t>(op, world, out.cast(), srcs, count) }
        };
    }
    match dtype {
        DataType::F32 => go!(f32),
        DataType::F64 => go!(f64),
        DataType::F16 => go!(f16),
        DataType::Bf16 => go!(bf16),
        DataType::I8 => go!(i8),
        DataType::U8 => go!(u8),
        DataType::I32 => go!(i32),
        DataType::U32 => go!(u32),
        DataType::I64 => go!(i64),
        DataType::U64 => go!(u64),
    }
}

#[inline(always)]
fn combine<T: Arith>(o: &mut [T], s: &[T], f: impl Fn(T, T) -> T) {
    for (o, &s) in o.iter_mut().zip(s) {
        *o = f(*o, s);
    }
}

unsafe fn reduce_t<T: Arith>(
    op: ReduceOp,
    world: usize,
    out: *mut T,
    srcs: &[*const u8],
    count: usize,
) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let first = first.cast::<T>();
    let mut start = 0;
    while start < count {
        let len = BLOCK.min(count - start);
        // SAFETY: per the contract, `out[start..start+len]` is valid and exclusively ours.
        let o = unsafe { std::slice::from_raw_parts_mut(out.add(start), len) };
        if first != out.cast_const() {
            // SAFETY: a distinct source of `count` valid elements.
            let s = unsafe { std::slice::from_raw_parts(first.add(start), len) };
            o.copy_from_slice(s);
        }
        if op == ReduceOp::Avg {
            o.iter_mut().for_each(|x| *x = T::premul(*x, world));
        }
        for &src in rest {
            // SAFETY: a source distinct from `out`, `count` valid elements, not written now.
            let s = unsafe { std::slice::from_raw_parts(src.cast::<T>().add(start), len) };
            match op {
                ReduceOp::Sum => combine(o, s, T::sum),
                ReduceOp::Prod => combine(o, s, T::prod),
                ReduceOp::Max => combine(o, s, T::max),
                ReduceOp::Min => combine(o, s, T::min),
                ReduceOp::Avg => combine(o, s, |a, b| T::sum(a, T::premul(b, world))),
            }
        }
        if op == ReduceOp::Avg {
            o.iter_mut().for_each(|x| *x = T::postdiv(*x, world));
        }
        start += len;
    }
}
