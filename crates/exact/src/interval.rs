//! Interval emulation of a kernel whose rounding points are known: each
//! value the kernel holds is enclosed in `[lo, hi]`, and each operation
//! maps enclosures to an enclosure of its result.
//!
//! # Why it is rigorous
//! Round to nearest (even) is monotone non-decreasing, and so are `+`, a
//! product by a positive value, `exp`; a value the kernel holds in format
//! `f` is a fixed point of `RN_f`. So if the kernel's operand lies in
//! `[lo, hi]`, its `RN_f(op(operand))` lies in `[RN_f(op(lo)),
//! RN_f(op(hi))]` for monotone `op` (swapped for a decreasing one; a
//! product by an interval takes the extreme endpoint products). The
//! float32 operations here run in Rust's `f32` (IEEE, to nearest even),
//! the very operation the kernel performs on those endpoints. Where the
//! model does not know an operation's order or its function's exact
//! result (a float32 dot product in blocks, MLX's `exp`, `cos`), the
//! enclosure is the real interval the worst-case bound of that step gives
//! (`gamma_n(u32)` of the magnitudes, the function's error), widened
//! outward by [`OUTWARD`] for float64's own rounding, and the kernel's
//! float32 result lies in it, hence in `RN_32` of its endpoints.
//!
//! An enclosure that collapses to one point is the kernel's value bit for
//! bit; most do, because a bound far below half an ulp of the stored
//! format rarely straddles a rounding boundary. The bound an output gets is
//! its enclosure's distance from the definition (`max(|lo − v|, |hi −
//! v|)`), taken only where it is below the worst-case bound (both hold).

use crate::Float;

/// Relative widening of an enclosure computed in float64 (far above
/// float64's rounding of the few operations behind an endpoint).
pub const OUTWARD: f64 = 1.0 / (1u64 << 48) as f64;

/// A closed interval enclosing one value a kernel holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iv {
    pub lo: f64,
    pub hi: f64,
}

impl Iv {
    /// One known value.
    pub fn point(v: f64) -> Self {
        Iv { lo: v, hi: v }
    }
    /// `[lo, hi]` widened outward by [`OUTWARD`] of its magnitude (an
    /// enclosure computed in float64).
    pub fn real(lo: f64, hi: f64) -> Self {
        let m = lo.abs().max(hi.abs()) * OUTWARD;
        Iv {
            lo: lo - m,
            hi: hi + m,
        }
    }
    pub fn is_point(self) -> bool {
        self.lo == self.hi
    }
    /// The largest distance of a point of the interval from `v`.
    pub fn distance(self, v: f64) -> f64 {
        (self.lo - v).abs().max((self.hi - v).abs())
    }
    /// Whether both endpoints are finite.
    pub fn finite(self) -> bool {
        self.lo.is_finite() && self.hi.is_finite()
    }
    /// The value stored in `f` (round to nearest even, monotone).
    pub fn round(self, f: Float) -> Self {
        Iv {
            lo: crate::formats::round_to(self.lo, f),
            hi: crate::formats::round_to(self.hi, f),
        }
    }
    /// A float32 operation's result then stored in `t` (MLX's `T`
    /// operators compute in float32 and round back to `T`).
    pub fn round32_then(self, t: Float) -> Self {
        self.round(Float::Float32).round(t)
    }
    /// `self * o` for float32 operands (each endpoint a float32 value): the
    /// exact products (float64 holds a product of two float32 values
    /// exactly), their extremes, not yet rounded.
    #[allow(clippy::should_implement_trait)]
    pub fn mul(self, o: Iv) -> Self {
        let p = [
            self.lo * o.lo,
            self.lo * o.hi,
            self.hi * o.lo,
            self.hi * o.hi,
        ];
        Iv {
            lo: p.iter().cloned().fold(f64::INFINITY, f64::min),
            hi: p.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        }
    }
    /// `self + o`, exact endpoints (float32 endpoints: rounded to float32
    /// by the caller, which is the kernel's float32 `+` on them).
    pub fn add_f32(self, o: Iv) -> Self {
        Iv {
            lo: f64::from(self.lo as f32 + o.lo as f32),
            hi: f64::from(self.hi as f32 + o.hi as f32),
        }
    }
    /// `self - o` in float32, rounded to nearest.
    pub fn sub_f32(self, o: Iv) -> Self {
        Iv {
            lo: f64::from(self.lo as f32 - o.hi as f32),
            hi: f64::from(self.hi as f32 - o.lo as f32),
        }
    }
    /// The largest magnitude of a point.
    pub fn mag(self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value between two bf16 neighbours' midpoint and one of them: the
    /// enclosure rounds to that one point; straddling the midpoint gives
    /// both neighbours.
    #[test]
    fn rounding_an_enclosure_keeps_the_value_and_collapses_when_it_can() {
        let a = 1.0 + 2f64.powi(-9) * 0.5;
        let iv = Iv::real(a - 1e-6, a + 1e-6).round(Float::Bfloat16);
        assert!(iv.is_point() && iv.lo == 1.0, "{iv:?}");
        let mid = 1.0 + 2f64.powi(-8);
        let iv = Iv::real(mid - 1e-6, mid + 1e-6).round(Float::Bfloat16);
        assert_eq!((iv.lo, iv.hi), (1.0, 1.0 + 2f64.powi(-7)));
        // The sum in float32 of the endpoints encloses the float32 sum.
        let x = Iv::point(f64::from(1.0f32));
        let y = Iv::point(f64::from(1e-8f32));
        assert_eq!(x.add_f32(y).lo, 1.0);
    }
}
