//! The contract's values as the C API numbers them (`ncclDataType_t`, `ncclRedOp_t`,
//! `NCCL_VERSION_CODE`): written here once, so the contract (`unicomm-core`) knows no
//! vendor's codes. NCCL and RCCL agree on every value listed.

use unicomm_core::{DataType, ReduceOp, Version};

/// A contract value's code in the C API: `nccl()` where this trait is in scope.
pub trait NcclCode {
    /// The C type's value.
    type Code;
    /// The value the library takes.
    fn nccl(self) -> Self::Code;
}

impl NcclCode for DataType {
    type Code = i32;
    /// The `ncclDataType_t` value.
    #[inline]
    fn nccl(self) -> i32 {
        match self {
            DataType::I8 => 0,
            DataType::U8 => 1,
            DataType::I32 => 2,
            DataType::U32 => 3,
            DataType::I64 => 4,
            DataType::U64 => 5,
            DataType::F16 => 6,
            DataType::F32 => 7,
            DataType::F64 => 8,
            DataType::Bf16 => 9,
            DataType::F8E4M3 => 10,
            DataType::F8E5M2 => 11,
        }
    }
}

impl NcclCode for ReduceOp {
    type Code = Option<i32>;
    /// The built-in `ncclRedOp_t` value; `None` for [`ReduceOp::PreMulSum`], a custom
    /// operation the backend creates on the communicator.
    #[inline]
    fn nccl(self) -> Option<i32> {
        match self {
            ReduceOp::Sum => Some(0),
            ReduceOp::Prod => Some(1),
            ReduceOp::Max => Some(2),
            ReduceOp::Min => Some(3),
            ReduceOp::Avg => Some(4),
            ReduceOp::PreMulSum(_) => None,
        }
    }
}

/// Decodes `ncclGetVersion`'s integer (`NCCL_VERSION_CODE`): `major*10000+minor*100+patch`
/// from 2.9 on, `major*1000+minor*100+patch` before.
pub const fn version_of_code(code: i32) -> Version {
    let code = if code < 0 { 0 } else { code as u32 };
    if code >= 20900 {
        Version::new(code / 10000, (code % 10000) / 100, code % 100)
    } else {
        Version::new(code / 1000, (code % 1000) / 100, code % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nccl.h's values (`ncclInt8` = 0 ... `ncclFloat8e5m2` = 11; `ncclSum` = 0 ...
    /// `ncclAvg` = 4) and both version encodings.
    #[test]
    fn the_codes_are_nccl_hs() {
        use DataType::*;
        let want = [
            I8, U8, I32, U32, I64, U64, F16, F32, F64, Bf16, F8E4M3, F8E5M2,
        ];
        let codes: Vec<i32> = want.iter().map(|t| t.nccl()).collect();
        assert_eq!(codes, (0..12).collect::<Vec<_>>());
        assert!(DataType::ALL.iter().all(|t| want.contains(t)));
        let ops: Vec<_> = ReduceOp::ALL.iter().map(|o| o.nccl()).collect();
        assert_eq!(ops, [Some(0), Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(version_of_code(23203), Version::new(2, 32, 3));
        assert_eq!(version_of_code(2708), Version::new(2, 7, 8));
    }
}
