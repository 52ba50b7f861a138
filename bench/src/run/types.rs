//! The element type of a run chosen at run time: one instantiation per type.

/// `$body` with `$t` the element type of `$dtype` (the sweep is generic over it).
macro_rules! by_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DataType::F32 => {
                type $t = f32;
                $body
            }
            DataType::F64 => {
                type $t = f64;
                $body
            }
            DataType::F16 => {
                type $t = f16;
                $body
            }
            DataType::Bf16 => {
                type $t = bf16;
                $body
            }
            DataType::I8 => {
                type $t = i8;
                $body
            }
            DataType::U8 => {
                type $t = u8;
                $body
            }
            DataType::I32 => {
                type $t = i32;
                $body
            }
            DataType::U32 => {
                type $t = u32;
                $body
            }
            DataType::I64 => {
                type $t = i64;
                $body
            }
            DataType::U64 => {
                type $t = u64;
                $body
            }
            DataType::F8E4M3 => {
                type $t = unicomm::F8E4M3;
                $body
            }
            DataType::F8E5M2 => {
                type $t = unicomm::F8E5M2;
                $body
            }
        }
    };
}
pub(crate) use by_type;
