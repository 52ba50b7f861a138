//! The limits of the OCP 8-bit floats, right: `float8` 0.7's `F8E4M3::MAX` is 416 (OCP
//! e4m3fn's largest finite value is 448, bit pattern 0x7E), its `F8E4M3::INFINITY` is 448
//! (e4m3fn has no infinity), its `F8E5M2::MAX` is 49152 (e5m2's is 57344, 0x7B) and its
//! `F8E5M2::INFINITY` is 57344 (e5m2's infinity is 0x7C). Its conversions are right (every
//! one of the 256 patterns of each is tested against the OCP definition below): use these
//! constants instead of the types' own.

use float8::{F8E4M3, F8E5M2};

/// e4m3fn's largest finite value, 448.
pub const E4M3_MAX: F8E4M3 = F8E4M3::from_bits(0x7E);
/// e4m3fn's most negative finite value, -448.
pub const E4M3_MIN: F8E4M3 = F8E4M3::from_bits(0xFE);
/// e4m3fn's NaN (it has no infinity).
pub const E4M3_NAN: F8E4M3 = F8E4M3::from_bits(0x7F);
/// e5m2's largest finite value, 57344.
pub const E5M2_MAX: F8E5M2 = F8E5M2::from_bits(0x7B);
/// e5m2's most negative finite value, -57344.
pub const E5M2_MIN: F8E5M2 = F8E5M2::from_bits(0xFB);
/// e5m2's positive infinity.
pub const E5M2_INFINITY: F8E5M2 = F8E5M2::from_bits(0x7C);
/// e5m2's negative infinity.
pub const E5M2_NEG_INFINITY: F8E5M2 = F8E5M2::from_bits(0xFC);
/// A NaN of e5m2.
pub const E5M2_NAN: F8E5M2 = F8E5M2::from_bits(0x7E);

#[cfg(test)]
mod tests {
    use super::*;

    /// OCP's definition: `bias`, `mant` mantissa bits; e4m3fn has NaN at all ones and no
    /// infinity, e5m2 IEEE-like special values at the largest exponent.
    fn ocp(bits: u8, mant: u32, bias: i32, fn_style: bool) -> f64 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from(bits & 0x7F) >> mant;
        let m = f64::from(u32::from(bits) & ((1 << mant) - 1));
        let top = (1i32 << (7 - mant)) - 1;
        if fn_style && e == top && m == f64::from((1u32 << mant) - 1) {
            return f64::NAN;
        }
        if !fn_style && e == top {
            return if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        let scale = f64::from(1u32 << mant);
        if e == 0 {
            sign * m / scale * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + m / scale) * 2f64.powi(e - bias)
        }
    }

    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a == b
    }

    #[test]
    fn every_e4m3_pattern_decodes_as_ocp_defines_it() {
        for b in 0..=255u8 {
            let want = ocp(b, 3, 7, true);
            let got = F8E4M3::from_bits(b).to_f64();
            assert!(same(got, want), "{b:#04x}: {got} != {want}");
            if !want.is_nan() {
                assert_eq!(F8E4M3::from_f64(want).to_f64(), want, "{b:#04x} round trip");
            }
        }
    }

    #[test]
    fn every_e5m2_pattern_decodes_as_ocp_defines_it() {
        for b in 0..=255u8 {
            let want = ocp(b, 2, 15, false);
            let got = F8E5M2::from_bits(b).to_f64();
            assert!(same(got, want), "{b:#04x}: {got} != {want}");
            if want.is_finite() {
                assert_eq!(F8E5M2::from_f64(want).to_f64(), want, "{b:#04x} round trip");
            }
        }
    }

    #[test]
    fn the_limits_are_ocps() {
        assert_eq!(E4M3_MAX.to_f64(), 448.0);
        assert_eq!(E4M3_MIN.to_f64(), -448.0);
        assert!(E4M3_NAN.to_f64().is_nan());
        assert_eq!(E5M2_MAX.to_f64(), 57344.0);
        assert_eq!(E5M2_MIN.to_f64(), -57344.0);
        assert_eq!(E5M2_INFINITY.to_f64(), f64::INFINITY);
        assert_eq!(E5M2_NEG_INFINITY.to_f64(), f64::NEG_INFINITY);
        assert!(E5M2_NAN.to_f64().is_nan());
        // What float8 0.7 says, so that a fixed release is noticed here.
        assert_eq!(F8E4M3::MAX.to_f64(), 416.0);
        assert_eq!(F8E5M2::MAX.to_f64(), 49152.0);
    }
}
