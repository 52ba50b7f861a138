//! Reduction kernels with NCCL's semantics (see `unicomm_core::ReduceOp`).

#![allow(
    unsafe_code,
    reason = "the mock's host memory and shared mappings, read and written as device memory"
)]

use unicomm_core::{bf16, f16, DataType, ReduceOp, Scalar, F8E4M3, F8E5M2};

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

// Half types and the 8-bit floats compute in f64 and round once: exact for every sum and
// product of two of them, hence the correctly rounded result that `__hadd`/`__hmul` give on
// the GPU.
macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { <$t>::from_f64(a.to_f64() + b.to_f64()) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { <$t>::from_f64(a.to_f64() * b.to_f64()) }
            // NCCL's rule for every float type, as `fmaxf`/`__hmax` do and Rust's f32/f64
            // `max`: a NaN operand loses to a number, wherever it stands.
            #[inline(always)] fn max(a: Self, b: Self) -> Self {
                if a.to_f64().is_nan() || b > a { b } else { a }
            }
            #[inline(always)] fn min(a: Self, b: Self) -> Self {
                if a.to_f64().is_nan() || b < a { b } else { a }
            }
            #[inline(always)] fn premul(x: Self, world: usize) -> Self {
                let scale = <$t>::from_f64(1.0 / world as f64);
                <$t>::from_f64(x.to_f64() * scale.to_f64())
            }
            #[inline(always)] fn postdiv(x: Self, _: usize) -> Self { x }
        }
    )*};
}
half_arith!(f16, bf16, F8E4M3, F8E5M2);

/// The value of `s` as a `T` (the caller checked that `T` is its element type).
fn scalar<T: Arith>(s: &Scalar) -> T {
    let mut buf = [0u8; 8];
    let b = s.bytes();
    buf[..b.len()].copy_from_slice(b);
    const { assert!(std::mem::size_of::<T>() <= 8) };
    // SAFETY: `buf` holds 8 >= size_of::<T>() initialised bytes (checked at compile time),
    // every bit pattern is a valid value of every element type, and the read is unaligned.
    unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<T>()) }
}

/// `out[i] = op(srcs[0][i], srcs[1][i], ...)` for `count` elements, and the same result
/// copied to every `also[k]` block by block, while it is still in cache. A pre-multiplied
/// sum takes `scales[k]` for `srcs[k]` (every source's rank's own scalar).
///
/// # Safety
/// `out`, every `srcs[k]` and every `also[k]` point to `count` valid, aligned elements of
/// `dtype`; `out` may equal `srcs[0]` (in-place) but overlaps no other source; `also[k]`
/// may equal `srcs[k+1]` (a peer's in-place buffer: each block is read before it is
/// written) but overlaps nothing else; nothing else accesses `out` or `also` during the
/// call, and nothing else writes the sources.
#[expect(
    clippy::too_many_arguments,
    reason = "one kernel, its sources, destinations and scalars"
)]
pub(crate) unsafe fn reduce(
    dtype: DataType,
    op: ReduceOp,
    world: usize,
    out: *mut u8,
    srcs: &[*const u8],
    count: usize,
    also: &[*mut u8],
    scales: &[Scalar],
) {
    macro_rules! go {
        ($t:ty) => {
            // SAFETY: forwarded from this function's contract.
            unsafe { reduce_t::<$t>(op, world, out.cast(), srcs, count, also, scales) }
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
        DataType::F8E4M3 => go!(F8E4M3),
        DataType::F8E5M2 => go!(F8E5M2),
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
    also: &[*mut u8],
    scales: &[Scalar],
) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let pre = matches!(op, ReduceOp::PreMulSum(_));
    if pre && scales.len() != srcs.len() {
        // The callers pass one scalar per source; nothing is written without them.
        return;
    }
    let scale: Vec<T> = scales.iter().map(scalar::<T>).collect();
    let first = first.cast::<T>();
    // The block is reduced in this cache-resident buffer, then streamed to every
    // destination: the destinations are written once, without being read first.
    let mut tmp: Vec<T> = Vec::with_capacity(BLOCK.min(count));
    let mut start = 0;
    while start < count {
        let len = BLOCK.min(count - start);
        // SAFETY: the first source holds `count` valid elements; nobody writes it now (in
        // place, it is `out`, which only this call writes, after this read).
        let s0 = unsafe { std::slice::from_raw_parts(first.add(start), len) };
        tmp.clear();
        tmp.extend_from_slice(s0);
        let o = &mut tmp[..];
        if op == ReduceOp::Avg {
            o.iter_mut().for_each(|x| *x = T::premul(*x, world));
        }
        if pre {
            o.iter_mut().for_each(|x| *x = T::prod(*x, scale[0]));
        }
        for (k, &src) in rest.iter().enumerate() {
            // SAFETY: a source of `count` valid elements, not written during this block.
            let s = unsafe { std::slice::from_raw_parts(src.cast::<T>().add(start), len) };
            match op {
                ReduceOp::Sum => combine(o, s, T::sum),
                ReduceOp::Prod => combine(o, s, T::prod),
                ReduceOp::Max => combine(o, s, T::max),
                ReduceOp::Min => combine(o, s, T::min),
                ReduceOp::Avg => combine(o, s, |a, b| T::sum(a, T::premul(b, world))),
                ReduceOp::PreMulSum(_) => {
                    let c = scale[k + 1];
                    combine(o, s, |a, b| T::sum(a, T::prod(b, c)))
                }
            }
        }
        if op == ReduceOp::Avg {
            o.iter_mut().for_each(|x| *x = T::postdiv(*x, world));
        }
        let bytes = len * std::mem::size_of::<T>();
        for dst in std::iter::once(out.cast::<u8>()).chain(also.iter().copied()) {
            // SAFETY: every destination holds `count` elements; this block of it was read
            // already if it is also a source; no one else touches it now.
            unsafe {
                stream_copy(
                    dst.add(start * std::mem::size_of::<T>()),
                    o.as_ptr().cast(),
                    bytes,
                )
            };
        }
        start += len;
    }
    store_fence();
}

/// Copies with non-temporal stores where the CPU has them (x86-64: SSE2, always there),
/// so large destinations are not read into the cache before being overwritten.
///
/// # Safety
/// `dst` and `src` are valid for `n` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(16).min(n);
    // SAFETY: within the `n` bytes of both ranges (contract).
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 16 <= n {
            let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
            // `dst + i` is 16-byte aligned (after the head).
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
            i += 16;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded from the contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// Orders the non-temporal stores before what follows (the barrier that publishes them).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod nan_tests {
    use super::*;

    fn check<T: Arith + PartialEq + std::fmt::Debug>(nan: T, one: T) {
        for (a, b) in [(nan, one), (one, nan)] {
            assert_eq!(T::max(a, b), one, "max({a:?}, {b:?})");
            assert_eq!(T::min(a, b), one, "min({a:?}, {b:?})");
        }
    }

    /// Max and min with a NaN give the number whichever side the NaN is on, for every
    /// float type (the half types and the 8-bit floats returned the NaN on one side).
    #[test]
    fn a_nan_loses_to_a_number_in_max_and_min_of_every_float_type() {
        check(f32::NAN, 1.0f32);
        check(f64::NAN, 1.0f64);
        check(f16::NAN, f16::from_f64(1.0));
        check(bf16::NAN, bf16::from_f64(1.0));
        check(F8E4M3::from_f64(f64::NAN), F8E4M3::from_f64(1.0));
        check(F8E5M2::from_f64(f64::NAN), F8E5M2::from_f64(1.0));
    }
}
