//! Element types and reduction operations, with NCCL's numeric values.

use half::{bf16, f16};

/// The element type of a collective, numbered as `ncclDataType_t` (NCCL and RCCL agree on
/// these values for every type listed here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    /// `ncclInt8`
    I8 = 0,
    /// `ncclUint8`
    U8 = 1,
    /// `ncclInt32`
    I32 = 2,
    /// `ncclUint32`
    U32 = 3,
    /// `ncclInt64`
    I64 = 4,
    /// `ncclUint64`
    U64 = 5,
    /// `ncclFloat16`
    F16 = 6,
    /// `ncclFloat32`
    F32 = 7,
    /// `ncclFloat64`
    F64 = 8,
    /// `ncclBfloat16`
    Bf16 = 9,
}

impl DataType {
    /// Every element type of the contract.
    pub const ALL: [DataType; 10] = [
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
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// The `ncclDataType_t` value.
    pub const fn nccl(self) -> i32 {
        self as i32
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ReduceOp {
    /// `ncclSum`
    Sum = 0,
    /// `ncclProd`
    Prod = 1,
    /// `ncclMax`
    Max = 2,
    /// `ncclMin`
    Min = 3,
    /// `ncclAvg` (NCCL >= 2.10)
    Avg = 4,
}

impl ReduceOp {
    /// Every reduction of the contract.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The `ncclRedOp_t` value.
    pub const fn nccl(self) -> i32 {
        self as i32
    }

    /// Short name, as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
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
/// Sealed: the set of types is the set NCCL and RCCL both reduce.
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
    // `Element` type (integers, IEEE floats, f16, bf16), so writes through the bytes are sound.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}
