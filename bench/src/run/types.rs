//! The element type of a run chosen at run time: one instantiation per type.

/// `$body` with `$t` the element type of `$dtype` (the sweep is generic over it).
macro_rules! by_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        by_type!(@arms $dtype, $t, $body;
            F32 f32, F64 f64, F16 f16, Bf16 bf16, I8 i8, U8 u8, I32 i32, U32 u32, I64 i64,
            U64 u64, F8E4M3 unicomm::F8E4M3, F8E5M2 unicomm::F8E5M2)
    };
    (@arms $dtype:expr, $t:ident, $body:expr; $($v:ident $ty:ty),*) => {
        match $dtype {
            $(DataType::$v => {
                type $t = $ty;
                $body
            })*
        }
    };
}
pub(crate) use by_type;
