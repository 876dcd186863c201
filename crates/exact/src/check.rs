//! One side's output against the exact value: how far, relative to the
//! bound, and where it is worst.

use serde::{Deserialize, Serialize};

use crate::Exact;

/// One side (port or reference) measured against an [`Exact`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// Elements whose error exceeds their bound (a NaN or infinity where
    /// the exact value is finite always does).
    pub outside: usize,
    pub total: usize,
    /// The largest `|computed - exact| / bound` (0 when every element is
    /// exact; infinite for a non-finite value or a zero bound exceeded).
    pub max_ratio: f64,
    /// Row-major index of the worst element, its computed value, the
    /// exact value and its bound.
    pub worst_index: usize,
    pub worst_value: f64,
    pub worst_exact: f64,
    pub worst_bound: f64,
}

impl Side {
    pub fn within(&self) -> bool {
        self.outside == 0
    }
}

/// Measures `computed` (the output's elements as float64, row-major)
/// against `exact`. A length mismatch is every element outside.
pub fn check(computed: &[f64], exact: &Exact) -> Side {
    let total = exact.value.len();
    if computed.len() != total {
        return Side {
            outside: total.max(computed.len()),
            total,
            max_ratio: f64::INFINITY,
            worst_index: 0,
            worst_value: f64::NAN,
            worst_exact: exact.value.first().copied().unwrap_or(0.0),
            worst_bound: exact.bound.first().copied().unwrap_or(0.0),
        };
    }
    let mut side = Side {
        outside: 0,
        total,
        max_ratio: 0.0,
        worst_index: 0,
        worst_value: computed.first().copied().unwrap_or(0.0),
        worst_exact: exact.value.first().copied().unwrap_or(0.0),
        worst_bound: exact.bound.first().copied().unwrap_or(0.0),
    };
    for (i, (&c, (&x, &b))) in computed
        .iter()
        .zip(exact.value.iter().zip(&exact.bound))
        .enumerate()
    {
        let err = (c - x).abs();
        let ratio = if err == 0.0 {
            0.0
        } else if !err.is_finite() || b == 0.0 {
            f64::INFINITY
        } else {
            err / b
        };
        if ratio > 1.0 || (ratio.is_nan()) {
            side.outside += 1;
        }
        if ratio > side.max_ratio || (ratio.is_infinite() && !side.max_ratio.is_infinite()) {
            side.max_ratio = ratio;
            side.worst_index = i;
            side.worst_value = c;
            side.worst_exact = x;
            side.worst_bound = b;
        }
    }
    side
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;

    fn exact(v: &[f64], b: f64) -> Exact {
        Exact {
            op: "t",
            model: Model::Cpu,
            shape: vec![v.len()],
            value: v.to_vec(),
            bound: vec![b; v.len()],
        }
    }

    #[test]
    fn outside_counts_and_the_worst_element_is_named() {
        let e = exact(&[1.0, 2.0, 3.0], 0.1);
        let s = check(&[1.05, 2.5, 3.0], &e);
        assert_eq!(s.outside, 1);
        assert_eq!(s.worst_index, 1);
        assert!((s.max_ratio - 5.0).abs() < 1e-12);
        assert!(check(&[1.0, 2.0, 3.0], &e).within());
        assert_eq!(check(&[1.0, f64::NAN, 3.0], &e).outside, 1);
        assert_eq!(check(&[1.0], &e).outside, 3);
    }
}
