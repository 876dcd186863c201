//! A value and a rigorous bound on a kernel's error in computing it.

/// An exact value `v` (float64), a bound `e` on `|computed - v|`, and `mag`,
/// the sum of magnitudes that went into `v` (for the float64 slack).
///
/// Propagation (first-order terms and their products, no approximation):
/// - `a + b`: `e = ea + eb`;
/// - `a * b`: `e = |a| eb + |b| ea + ea eb`;
/// - rounding to a format `f`: `e' = e + u_f (|v| + e) + eta_f`
///   (the computed value lies within `e` of `v`, and rounding moves it by
///   at most `u_f` of its own magnitude plus `eta_f`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tracked {
    pub v: f64,
    pub e: f64,
    pub mag: f64,
}

impl Tracked {
    /// An input value, exactly what the kernel reads.
    pub fn exact(v: f64) -> Self {
        Tracked {
            v,
            e: 0.0,
            mag: v.abs(),
        }
    }
    pub fn zero() -> Self {
        Tracked::exact(0.0)
    }
    // Methods, not `std::ops` impls: chains read in the kernel's order
    // (`x.mul(w).round(t)`) and every rounding stays an explicit call.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, o: Tracked) -> Self {
        Tracked {
            v: self.v + o.v,
            e: self.e + o.e,
            mag: self.mag + o.mag,
        }
    }
    #[allow(clippy::should_implement_trait)]
    pub fn mul(self, o: Tracked) -> Self {
        Tracked {
            v: self.v * o.v,
            e: self.v.abs() * o.e + o.v.abs() * self.e + self.e * o.e,
            mag: self.mag * o.mag,
        }
    }
    /// Multiplied by an exact constant.
    pub fn scale(self, c: f64) -> Self {
        Tracked {
            v: self.v * c,
            e: self.e * c.abs(),
            mag: self.mag * c.abs(),
        }
    }
    /// Rounded to `f`. A value known exactly (`e == 0`) is rounded for
    /// real and its error is exactly what the rounding moved it (0 when
    /// representable; the larger of rounding directly and through float32);
    /// otherwise the standard model's bound.
    pub fn round(self, f: crate::Float) -> Self {
        let e = if self.e == 0.0 {
            // Directly, or through float32 first (a kernel computing in
            // float32 and storing in `f` rounds twice).
            let direct = crate::formats::round_to(self.v, f);
            let twice = crate::formats::round_to(f64::from(self.v as f32), f);
            (direct - self.v).abs().max((twice - self.v).abs())
        } else {
            self.e + f.u() * (self.v.abs() + self.e) + f.eta()
        };
        Tracked { e, ..self }
    }
    /// Rounded to `f` when `Some`.
    pub fn round_opt(self, f: Option<crate::Float>) -> Self {
        match f {
            Some(f) => self.round(f),
            None => self,
        }
    }
    /// Plus an error term (an order-independent sum's rounding, say).
    pub fn widen(self, extra: f64) -> Self {
        Tracked {
            e: self.e + extra,
            ..self
        }
    }
}

/// gamma_n = n u / (1 - n u): the classic bound on summing n + 1 terms in
/// any order (or a product of n roundings), relative to the sum of
/// magnitudes. Infinite when n u >= 1 (no bound).
pub fn gamma(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    if nu >= 1.0 {
        f64::INFINITY
    } else {
        nu / (1.0 - nu)
    }
}

/// A sum of tracked terms in an order the model does not know, each
/// partial sum held in `f` (a tree or a sequence: any order is covered):
/// the terms' own errors plus gamma_{n-1}(u_f) of the sum of their
/// magnitudes (|value| + error).
pub fn sum_any_order(terms: &[Tracked], f: crate::Float) -> Tracked {
    let mut v = 0.0;
    let mut e = 0.0;
    let mut mag = 0.0;
    let mut abs = 0.0;
    for t in terms {
        v += t.v;
        e += t.e;
        mag += t.mag;
        abs += t.v.abs() + t.e;
    }
    let n = terms.len().saturating_sub(1);
    Tracked {
        v,
        e: e + gamma(n, f.u()) * abs + n as f64 * f.eta(),
        mag,
    }
}

/// A sum in index order, each partial sum rounded to `f` (MLX's CPU loops:
/// `sum += term` in the activation dtype), starting from an exact zero.
pub fn sum_in_order(terms: impl IntoIterator<Item = Tracked>, f: crate::Float) -> Tracked {
    let mut s = Tracked::zero();
    for t in terms {
        s = s.add(t).round(f);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Float;

    #[test]
    fn rounding_moves_a_value_within_its_bound() {
        // 1 + 2^-9 rounds to 1 in bf16: error 2^-9 <= u (|v|) = 2^-8.
        let t = Tracked::exact(1.0 + 2f64.powi(-9)).round(Float::Bfloat16);
        assert!(t.e >= 2f64.powi(-9));
        assert!(t.e < 2f64.powi(-7));
    }

    #[test]
    fn an_in_order_bf16_sum_bounds_the_real_bf16_sum() {
        let terms: Vec<f64> = (0..200)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
            .collect();
        let mut computed = half::bf16::ZERO;
        for t in &terms {
            let p = half::bf16::from_f64(*t);
            computed = half::bf16::from_f32(f32::from(computed) + f32::from(p));
        }
        let tracked = sum_in_order(
            terms
                .iter()
                .map(|t| Tracked::exact(*t).round(Float::Bfloat16)),
            Float::Bfloat16,
        );
        let err = (f64::from(computed) - tracked.v).abs();
        assert!(err <= tracked.e, "{err} > {}", tracked.e);
    }

    #[test]
    fn gamma_is_infinite_past_one() {
        assert!(gamma(300, 2f64.powi(-8)).is_infinite());
        assert!(gamma(10, 2f64.powi(-24)) < 1e-6);
    }
}
