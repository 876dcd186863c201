//! One side's output against the exact value: how far, relative to the
//! bound, and where it is worst.

use serde::{Deserialize, Serialize};

use crate::Exact;

/// One side (port or reference) measured against an [`Exact`].
///
/// JSON has no NaN or infinity: those values travel as the strings
/// `"NaN"`, `"inf"` and `"-inf"` (an unwritten output holds NaN), so a
/// check survives a worker's answer and reads plainly in report.json.
///
/// A side of another element count than the definition (`computed_len`
/// set) compared no element: its JSON carries no `worst_*` fields, so
/// report.json names no element that does not exist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "SideRepr", from = "SideRepr")]
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
    /// Set when the computed output has another element count than the
    /// definition (an empty array, say): no element was compared, and
    /// `worst_index` names none.
    pub computed_len: Option<usize>,
}

/// [`Side`] as JSON: the worst element only where one was compared.
#[derive(Serialize, Deserialize)]
struct SideRepr {
    outside: usize,
    total: usize,
    #[serde(with = "nonfinite")]
    max_ratio: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    worst_index: Option<usize>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nonfinite_opt"
    )]
    worst_value: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nonfinite_opt"
    )]
    worst_exact: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nonfinite_opt"
    )]
    worst_bound: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    computed_len: Option<usize>,
}

impl From<Side> for SideRepr {
    fn from(s: Side) -> Self {
        let compared = s.computed_len.is_none();
        SideRepr {
            outside: s.outside,
            total: s.total,
            max_ratio: s.max_ratio,
            worst_index: compared.then_some(s.worst_index),
            worst_value: compared.then_some(s.worst_value),
            worst_exact: compared.then_some(s.worst_exact),
            worst_bound: compared.then_some(s.worst_bound),
            computed_len: s.computed_len,
        }
    }
}

impl From<SideRepr> for Side {
    fn from(r: SideRepr) -> Self {
        Side {
            outside: r.outside,
            total: r.total,
            max_ratio: r.max_ratio,
            worst_index: r.worst_index.unwrap_or(0),
            worst_value: r.worst_value.unwrap_or(f64::NAN),
            worst_exact: r.worst_exact.unwrap_or(0.0),
            worst_bound: r.worst_bound.unwrap_or(0.0),
            computed_len: r.computed_len,
        }
    }
}

mod nonfinite_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::nonfinite::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        struct W(#[serde(with = "super::nonfinite")] f64);
        Ok(Option::<W>::deserialize(d)?.map(|W(v)| v))
    }
}

/// f64 as a JSON number, or `"NaN"` / `"inf"` / `"-inf"`.
mod nonfinite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v.is_infinite() {
            s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
        } else {
            s.serialize_f64(*v)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is not a number"
                ))),
            },
        }
    }
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
            computed_len: Some(computed.len()),
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
        computed_len: None,
    };
    for (i, (&c, (&x, &b))) in computed
        .iter()
        .zip(exact.value.iter().zip(&exact.bound))
        .enumerate()
    {
        let err = (c - x).abs();
        // Where the definition itself is NaN or infinite (a NaN input, an
        // e4m3 NaN code), the same value is exact.
        let same = c == x || (c.is_nan() && x.is_nan());
        let ratio = if same || err == 0.0 {
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
        // A NaN definition (a NaN input) is met by NaN only.
        let n = exact(&[f64::NAN, f64::INFINITY], 0.1);
        assert!(check(&[f64::NAN, f64::INFINITY], &n).within());
        assert_eq!(check(&[0.0, 1.0], &n).outside, 2);
    }

    #[test]
    fn a_nan_check_survives_json() {
        let e = exact(&[1.0, 2.0], 0.1);
        let s = check(&[f64::NAN, 2.0], &e);
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains("\"NaN\"") && text.contains("\"inf\""),
            "{text}"
        );
        let back: Side = serde_json::from_str(&text).unwrap();
        assert!(back.worst_value.is_nan() && back.max_ratio.is_infinite());
        assert_eq!(back.outside, 1);
    }

    /// Issue 40, class 25: an output of another length (an empty array)
    /// compared no element, yet report.json named `worst_index` 0 and
    /// `worst_value` "NaN". Such a side carries `computed_len` and no worst
    /// element, and reads back the same.
    #[test]
    fn a_side_of_another_length_names_no_worst_element_in_json() {
        let e = exact(&[1.0, 2.0], 0.1);
        let s = check(&[], &e);
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"computed_len\":0"), "{text}");
        for key in ["worst_index", "worst_value", "worst_exact", "worst_bound"] {
            assert!(!text.contains(key), "{key} in {text}");
        }
        let back: Side = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (back.computed_len, back.total, back.outside),
            (Some(0), 2, 2)
        );
        // A side of the right length keeps every field, as before.
        let same = check(&[1.0, 2.5], &e);
        let text = serde_json::to_string(&same).unwrap();
        assert!(
            text.contains("\"worst_index\":1") && !text.contains("computed_len"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Side>(&text).unwrap(), same);
    }
}
