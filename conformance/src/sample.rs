//! The element types with the host arithmetic the reference needs.

use unicomm_core::{bf16, f16, Element, F8E4M3, F8E5M2};

/// Element types with the host arithmetic the reference needs.
pub(crate) trait Sample: Element {
    /// The value `v` (small integers, exactly representable in every type).
    fn from_i64(v: i64) -> Self;
    /// The value as f64 (exact for every sample used).
    fn to_f64(self) -> f64;
    /// `v` wrapped into the type, as C's conversion to an unsigned type (and two's
    /// complement for signed) does. Floats convert.
    fn wrap(v: i128) -> Self;
    /// Whether the type is signed (integers) or a float.
    const SIGNED: bool;
    /// The 8-bit floats hold integers exactly only up to 8 (e5m2) or 16 (e4m3): sums use
    /// inputs in -1..=1, so that every partial sum of 8 ranks is exact.
    const NARROW: bool = false;
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

macro_rules! sample_fp8 {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            fn wrap(v: i128) -> Self { <$t>::from_f64(v as f64) }
            const SIGNED: bool = true;
            const NARROW: bool = true;
        }
    )*};
}
sample_fp8!(F8E4M3, F8E5M2);
