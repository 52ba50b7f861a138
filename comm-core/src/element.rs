//! Element types and reduction operations, with NCCL's numeric values.

#![allow(
    unsafe_code,
    reason = "views of element slices as bytes, and the cycle counter"
)]

use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// The element type of a collective (each named by the C API's type it is; the backends
/// number them as their library does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclInt8`
    I8,
    /// `ncclUint8`
    U8,
    /// `ncclInt32`
    I32,
    /// `ncclUint32`
    U32,
    /// `ncclInt64`
    I64,
    /// `ncclUint64`
    U64,
    /// `ncclFloat16`
    F16,
    /// `ncclFloat32`
    F32,
    /// `ncclFloat64`
    F64,
    /// `ncclBfloat16`
    Bf16,
    /// `ncclFloat8e4m3` (NCCL >= 2.24; RCCL's `ncclFp8E4M3`, whose MI300 encoding differs:
    /// see docs/rocm.md): OCP e4m3, as [`F8E4M3`] holds it.
    F8E4M3,
    /// `ncclFloat8e5m2` (NCCL >= 2.24): OCP e5m2, as [`F8E5M2`] holds it.
    F8E5M2,
}

impl DataType {
    /// Every element type of the contract.
    pub const ALL: [DataType; 12] = [
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
        DataType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16
                | DataType::Bf16
                | DataType::F32
                | DataType::F64
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }

    /// Whether the type is one of the 8-bit floats, which NCCL reduces from 2.24 on (and
    /// only on sm90 or newer); moving them is moving bytes, which any version does.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DataType::F8E4M3 | DataType::F8E5M2)
    }

    /// Short name, as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction, numbered as `ncclRedOp_t`.
///
/// Semantics follow NCCL: integer `Sum`/`Prod` wrap; `Avg` on integers is the wrapped sum
/// divided by the world size, truncated toward zero (NCCL's `SumPostDiv`); `Avg` on floats
/// multiplies every input by `1/world_size` rounded to the element type, then sums
/// (NCCL's `PreMulSum`), so float averages can differ from `sum / n` in the last bits.
/// [`ReduceOp::PreMulSum`] multiplies each rank's input by that rank's own scalar (rounded
/// to the element type, as the product is) and sums: NCCL's `ncclRedOpCreatePreMulSum`
/// (NCCL >= 2.11, RCCL since ROCm 5.2), which the backends create and cache themselves.
///
/// `repr(u8)`: its tag a byte of its own, in declaration order, so that a backend's
/// conversion to its library's code is the tag itself (no table read on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// `ncclSum`
    Sum,
    /// `ncclProd`
    Prod,
    /// `ncclMax`
    Max,
    /// `ncclMin`
    Min,
    /// `ncclAvg` (NCCL >= 2.10)
    Avg,
    /// `sum(scalar_r * input_r)`, each rank `r` passing its own scalar, of the collective's
    /// element type ([`ReduceOp::pre_mul_sum`]).
    PreMulSum(Scalar),
}

/// One value of an element type, held by its bytes (what `ncclRedOpCreatePreMulSum` reads
/// from host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scalar {
    dtype: DataType,
    bits: [u8; 8],
}

impl Scalar {
    /// The scalar `x`.
    pub fn new<T: Element>(x: T) -> Self {
        let mut bits = [0u8; 8];
        let b = as_bytes(std::slice::from_ref(&x));
        bits[..b.len()].copy_from_slice(b);
        Scalar {
            dtype: T::DTYPE,
            bits,
        }
    }
    /// The scalar of `dtype` held by `bytes` (`dtype.size()` of them, host order).
    pub fn from_bytes(dtype: DataType, bytes: &[u8]) -> Option<Self> {
        if bytes.len() != dtype.size() {
            return None;
        }
        let mut bits = [0u8; 8];
        bits[..bytes.len()].copy_from_slice(bytes);
        Some(Scalar { dtype, bits })
    }
    /// Its element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    /// Its bytes in host order (`dtype().size()` of them).
    pub fn bytes(&self) -> &[u8] {
        &self.bits[..self.dtype.size()]
    }
    /// The value as `T`, when `T` is its element type.
    pub fn get<T: Element>(&self) -> Option<T> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let mut x = T::ZERO;
        as_bytes_mut(std::slice::from_mut(&mut x)).copy_from_slice(self.bytes());
        Some(x)
    }
}

impl ReduceOp {
    /// Every built-in reduction of the contract (not [`ReduceOp::PreMulSum`], which carries
    /// a value).
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// A sum of every rank's input multiplied by that rank's `scale`, which has the
    /// collective's element type (NCCL's `ncclRedOpCreatePreMulSum` with a host scalar).
    pub fn pre_mul_sum<T: Element>(scale: T) -> Self {
        ReduceOp::PreMulSum(Scalar::new(scale))
    }

    /// The reduction without its per-rank value: what every rank must agree on (each rank
    /// of a pre-multiplied sum passes its own scalar).
    pub fn shape(self) -> ReduceOp {
        match self {
            ReduceOp::PreMulSum(s) => ReduceOp::PreMulSum(Scalar {
                dtype: s.dtype,
                bits: [0; 8],
            }),
            op => op,
        }
    }

    /// Short name, as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type that can be an element of a collective: plain old data with a NCCL data type.
///
/// Sealed: the set of types is the set NCCL and RCCL both name (the 8-bit floats reduce
/// only where the library and device can, see [`DataType::is_fp8`]).
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static
{
    /// The matching NCCL data type.
    const DTYPE: DataType;
    /// The zero of the type (used to initialise allocations on the host).
    const ZERO: Self;
}

macro_rules! element {
    ($($t:ty => $d:ident, $z:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            const ZERO: Self = $z;
        }
    )*};
}

element! {
    f32 => F32, 0.0;
    f64 => F64, 0.0;
    f16 => F16, f16::ZERO;
    bf16 => Bf16, bf16::ZERO;
    i8 => I8, 0;
    u8 => U8, 0;
    i32 => I32, 0;
    u32 => U32, 0;
    i64 => I64, 0;
    u64 => U64, 0;
    F8E4M3 => F8E4M3, F8E4M3::ZERO;
    F8E5M2 => F8E5M2, F8E5M2::ZERO;
}

/// Views a slice of elements as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: every `Element` is a padding-free plain-old-data type (sealed list above), so
    // all of its bytes are initialised; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// Views a mutable slice of elements as bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; moreover every bit pattern is a valid value of every
    // `Element` type (integers, IEEE floats, f16, bf16, the 8-bit floats), so writes through the bytes are sound.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}
