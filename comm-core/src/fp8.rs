//! The OCP 8-bit floats as collectives' elements: [`F8E4M3`] (e4m3fn: no infinity, NaN at
//! all ones, 448 its largest finite value) and [`F8E5M2`] (IEEE-like: infinities, 57344 its
//! largest finite value). Each wraps the `float8` crate's type of the same name, whose
//! conversions are right (every one of the 256 patterns of each is tested below against the
//! OCP definition) but whose constants are not (`float8` 0.7: `F8E4M3::MAX` 416,
//! `F8E5M2::MAX` 49152, `F8E5M2::INFINITY` 57344): these types' constants are OCP's, and
//! `From` converts to and from `float8`'s for code that holds those.

use std::fmt;

macro_rules! fp8 {
    ($(#[$doc:meta])* $t:ident, $max:expr, $min:expr, $nan:expr) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, PartialOrd)]
        pub struct $t(float8::$t);

        impl $t {
            /// Zero.
            pub const ZERO: $t = $t::from_bits(0x00);
            /// One.
            pub const ONE: $t = $t(float8::$t::ONE);
            /// The largest finite value (OCP's).
            pub const MAX: $t = $t::from_bits($max);
            /// The most negative finite value (OCP's).
            pub const MIN: $t = $t::from_bits($min);
            /// A NaN.
            pub const NAN: $t = $t::from_bits($nan);

            /// The value of these bits.
            pub const fn from_bits(bits: u8) -> $t {
                $t(float8::$t::from_bits(bits))
            }
            /// Its bits.
            pub const fn to_bits(self) -> u8 {
                self.0.to_bits()
            }
            /// `x` rounded to nearest (even), saturating as `float8` does.
            pub fn from_f32(x: f32) -> $t {
                $t(float8::$t::from_f32(x))
            }
            /// `x` rounded to nearest (even), saturating as `float8` does.
            pub fn from_f64(x: f64) -> $t {
                $t(float8::$t::from_f64(x))
            }
            /// Its value (exact).
            pub fn to_f32(self) -> f32 {
                self.0.to_f32()
            }
            /// Its value (exact).
            pub fn to_f64(self) -> f64 {
                self.0.to_f64()
            }
            /// Whether it is a NaN.
            pub fn is_nan(self) -> bool {
                self.to_f64().is_nan()
            }
        }

        impl From<float8::$t> for $t {
            fn from(x: float8::$t) -> $t {
                $t(x)
            }
        }

        impl From<$t> for float8::$t {
            fn from(x: $t) -> float8::$t {
                x.0
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    };
}

fp8!(
    /// OCP e4m3fn, as NCCL's `ncclFloat8e4m3` holds it: no infinity, NaN at all ones.
    F8E4M3,
    0x7E,
    0xFE,
    0x7F
);
fp8!(
    /// OCP e5m2, as NCCL's `ncclFloat8e5m2` holds it: infinities and NaNs as IEEE's.
    F8E5M2,
    0x7B,
    0xFB,
    0x7E
);

impl F8E5M2 {
    /// Positive infinity.
    pub const INFINITY: F8E5M2 = F8E5M2::from_bits(0x7C);
    /// Negative infinity.
    pub const NEG_INFINITY: F8E5M2 = F8E5M2::from_bits(0xFC);
}

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

    /// The types' constants are OCP's (float8 0.7's own are not: its e4m3 MAX is 416, its
    /// e5m2 MAX 49152 and INFINITY 57344, re-exported as unicomm's three times over).
    #[test]
    fn the_limits_are_ocps() {
        assert_eq!(F8E4M3::MAX.to_f64(), 448.0);
        assert_eq!(F8E4M3::MIN.to_f64(), -448.0);
        assert!(F8E4M3::NAN.is_nan());
        assert_eq!(F8E5M2::MAX.to_f64(), 57344.0);
        assert_eq!(F8E5M2::MIN.to_f64(), -57344.0);
        assert_eq!(F8E5M2::INFINITY.to_f64(), f64::INFINITY);
        assert_eq!(F8E5M2::NEG_INFINITY.to_f64(), f64::NEG_INFINITY);
        assert!(F8E5M2::NAN.is_nan());
        assert_eq!(F8E4M3::ONE.to_f64(), 1.0);
        // What float8 0.7 says, so that a fixed release is noticed here.
        assert_eq!(float8::F8E4M3::MAX.to_f64(), 416.0);
        assert_eq!(float8::F8E5M2::MAX.to_f64(), 49152.0);
    }
}
