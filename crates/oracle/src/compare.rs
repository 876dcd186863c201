//! Bit-for-bit comparison.
//!
//! Dtype and shape are checked first, then every element's raw bits. Equal
//! bits are equal; anything else differs. **NaN policy:** NaNs are compared
//! by their bits too, so two NaNs with different payloads or signs differ,
//! and `+0.0` differs from `-0.0`. A port that is bit-identical never needs
//! more.

use serde::{Deserialize, Serialize};

use crate::tensor::{DType, HostTensor};

/// One element as both sides see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElementValue {
    /// Decimal value (floats decoded from their bits); a NaN or infinity
    /// as `"NaN"` / `"inf"` / `"-inf"`, so it survives JSON (a worker's
    /// answer, report.json) instead of becoming `null`.
    #[serde(with = "nonfinite")]
    pub value: f64,
    /// Raw bits, `0x`-prefixed hex, zero-padded to the dtype's width.
    pub bits: String,
}

/// f64 as a JSON number, or `"NaN"` / `"inf"` / `"-inf"` (a `null`, as an
/// older writer wrote a non-finite value, reads as NaN).
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
        Null(()),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Null(()) => Ok(f64::NAN),
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

/// How two tensors differ element-wise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// Elements whose bits differ.
    pub count: usize,
    /// Elements compared.
    pub total: usize,
    /// First differing element, as a multi-dimensional index (row-major).
    pub first_index: Vec<usize>,
    /// The implementation's (Rust port's) value there.
    pub actual: ElementValue,
    /// The reference's value there.
    pub expected: ElementValue,
    /// Largest distance in units in the last place over all differing
    /// elements (for integers: the largest absolute difference).
    pub max_ulp: u64,
    /// Float outputs: the largest difference over all differing finite
    /// elements in units in the last place *at the output's scale* (the
    /// spacing of the dtype at the reference's largest magnitude), so a
    /// one-ulp difference near zero does not read as thousands of ulp.
    /// `None` for integers, an all-zero or non-finite reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ulp_at_scale: Option<f64>,
}

/// The outcome of comparing an implementation output with the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Comparison {
    Equal,
    DtypeMismatch {
        actual: DType,
        expected: DType,
    },
    ShapeMismatch {
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    Differs(Difference),
}

impl Comparison {
    pub fn is_equal(&self) -> bool {
        matches!(self, Comparison::Equal)
    }
    /// One line for a report table.
    pub fn summary(&self) -> String {
        match self {
            Comparison::Equal => "equal".into(),
            Comparison::DtypeMismatch { actual, expected } => {
                format!("dtype {} != reference {}", actual.name(), expected.name())
            }
            Comparison::ShapeMismatch { actual, expected } => {
                format!("shape {actual:?} != reference {expected:?}")
            }
            Comparison::Differs(d) => d.line("differ", "", "vs reference"),
        }
    }
}

impl Difference {
    /// One line: `{count}/{total} {what}; first at {index}: {actual_label}{value}
    /// ({bits}) {between} {value} ({bits}); max {ulp} ulp`.
    pub fn line(&self, what: &str, actual_label: &str, between: &str) -> String {
        format!(
            "{}/{} {what}; first at {:?}: {actual_label}{} ({}) {between} {} ({}); max {} ulp",
            self.count,
            self.total,
            self.first_index,
            self.actual.value,
            self.actual.bits,
            self.expected.value,
            self.expected.bits,
            self.max_ulp
        )
    }
}

/// Compares `actual` (the port) with `expected` (the reference) bit for bit.
pub fn compare(actual: &HostTensor, expected: &HostTensor) -> Comparison {
    if actual.dtype != expected.dtype {
        return Comparison::DtypeMismatch {
            actual: actual.dtype,
            expected: expected.dtype,
        };
    }
    if actual.shape != expected.shape {
        return Comparison::ShapeMismatch {
            actual: actual.shape.clone(),
            expected: expected.shape.clone(),
        };
    }
    if actual.bytes == expected.bytes {
        return Comparison::Equal;
    }
    let dtype = actual.dtype;
    let mut count = 0;
    let mut first = None;
    let mut max_ulp = 0;
    for i in 0..actual.len() {
        let (a, e) = (actual.bits(i), expected.bits(i));
        if a != e {
            count += 1;
            first.get_or_insert(i);
            max_ulp = max_ulp.max(ulp_distance(dtype, a, e));
        }
    }
    let i = first.expect("byte buffers differ, so some element differs");
    let max_ulp_at_scale = ulp_at_scale(actual, expected);
    let element = |t: &HostTensor| ElementValue {
        value: t.value(i),
        bits: format!("0x{:0width$x}", t.bits(i), width = dtype.size() * 2),
    };
    Comparison::Differs(Difference {
        count,
        total: actual.len(),
        first_index: unravel(i, &actual.shape),
        actual: element(actual),
        expected: element(expected),
        max_ulp,
        max_ulp_at_scale,
    })
}

/// [`Difference::max_ulp_at_scale`]: the largest |actual − expected| over
/// finite differing elements, in the dtype's spacing at the reference's
/// largest finite magnitude.
fn ulp_at_scale(actual: &HostTensor, expected: &HostTensor) -> Option<f64> {
    let mantissa = match actual.dtype {
        DType::Bfloat16 => 7,
        DType::Float16 => 10,
        DType::Float32 => 23,
        _ => return None,
    };
    let scale = (0..expected.len())
        .map(|i| expected.value(i).abs())
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    if scale == 0.0 {
        return None;
    }
    let spacing = 2f64.powi(scale.log2().floor() as i32 - mantissa);
    (0..actual.len())
        .filter(|&i| actual.bits(i) != expected.bits(i))
        .map(|i| (actual.value(i) - expected.value(i)).abs())
        .filter(|d| d.is_finite())
        .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))))
        .map(|d| d / spacing)
}

/// Row-major flat index to a multi-dimensional index.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

/// Distance in representable values between two bit patterns.
///
/// Floats map to a monotonic integer line (negative values mirrored), so
/// `+0` and `-0` are one apart and adjacent floats are one apart. NaN
/// payloads are compared by the same rule (they sit beyond infinity).
pub fn ulp_distance(dtype: DType, a: u64, b: u64) -> u64 {
    let width = dtype.size() as u32 * 8;
    let ordered = |x: u64| -> i128 {
        if !dtype.is_float() {
            return match dtype {
                DType::Int32 => x as u32 as i32 as i128,
                DType::Int64 => x as i64 as i128,
                _ => x as i128,
            };
        }
        let sign = 1u64 << (width - 1);
        let magnitude = (x & (sign - 1)) as i128;
        if x & sign != 0 {
            -magnitude - 1
        } else {
            magnitude
        }
    };
    (ordered(a) - ordered(b)).unsigned_abs() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(values: &[f32], shape: &[usize]) -> HostTensor {
        let bytes = values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect();
        HostTensor::new(DType::Bfloat16, shape.to_vec(), bytes).unwrap()
    }

    /// Issue 42: a one-ulp difference near zero is thousands of ulp of
    /// its own value but well under one ulp at the output's scale.
    #[test]
    fn the_ulp_at_the_outputs_scale_is_reported_beside_the_ulp() {
        let tiny = half::bf16::from_bits(half::bf16::from_f32(1e-3).to_bits() + 1).to_f32();
        let a = bf16(&[1e-3, 64.0], &[2]);
        let b = bf16(&[tiny, 64.0], &[2]);
        let Comparison::Differs(d) = compare(&a, &b) else {
            panic!()
        };
        assert_eq!(d.max_ulp, 1);
        let at_scale = d.max_ulp_at_scale.unwrap();
        assert!(at_scale > 0.0 && at_scale < 0.01, "{at_scale}");
        let a = bf16(&[0.0, 128.0], &[2]);
        let b = bf16(&[-0.0, 64.0], &[2]);
        let Comparison::Differs(d) = compare(&a, &b) else {
            panic!()
        };
        // 64 apart at scale 64 (spacing 0.5): 128 ulp at scale.
        assert_eq!(d.max_ulp_at_scale, Some(128.0));
        let ints = HostTensor::new(DType::Int32, vec![1], 1i32.to_le_bytes().to_vec()).unwrap();
        let other = HostTensor::new(DType::Int32, vec![1], 2i32.to_le_bytes().to_vec()).unwrap();
        let Comparison::Differs(d) = compare(&ints, &other) else {
            panic!()
        };
        assert_eq!(d.max_ulp_at_scale, None);
    }

    /// Issue 40, class 14: a NaN first difference serialised as `null`,
    /// so a worker's answer could not be read back (ERROR, not FAIL) and
    /// in-process and worker runs disagreed.
    #[test]
    fn non_finite_values_survive_json() {
        let a = bf16(&[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &[4]);
        let b = bf16(&[1.0, 2.0, 3.0, 4.0], &[4]);
        let c = compare(&a, &b);
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"NaN\""), "{json}");
        let back: Comparison = serde_json::from_str(&json).unwrap();
        let (Comparison::Differs(d), Comparison::Differs(e)) = (&c, &back) else {
            panic!("{c:?}");
        };
        assert!(e.actual.value.is_nan());
        assert_eq!(d.actual.bits, e.actual.bits);
        assert_eq!(d.first_index, e.first_index);
        for (v, text) in [(f64::INFINITY, "\"inf\""), (f64::NEG_INFINITY, "\"-inf\"")] {
            let ev = ElementValue {
                value: v,
                bits: "0x0".into(),
            };
            let j = serde_json::to_string(&ev).unwrap();
            assert!(j.contains(text), "{j}");
            assert_eq!(serde_json::from_str::<ElementValue>(&j).unwrap(), ev);
        }
        // An older writer's null reads as NaN.
        let old: ElementValue =
            serde_json::from_str(r#"{"value": null, "bits": "0x7fc0"}"#).unwrap();
        assert!(old.value.is_nan());
    }

    #[test]
    fn equal_bits_are_equal() {
        let a = bf16(&[1.0, -2.5, 0.0, 3.0], &[2, 2]);
        assert_eq!(compare(&a, &a.clone()), Comparison::Equal);
    }

    #[test]
    fn first_difference_is_reported_with_index_and_bits() {
        let a = bf16(&[1.0, -2.5, 0.0, 3.0], &[2, 2]);
        let mut b = a.clone();
        b.bytes[6] ^= 1; // lowest mantissa bit of element [1, 1]
        let Comparison::Differs(d) = compare(&a, &b) else {
            panic!("must differ")
        };
        assert_eq!(d.count, 1);
        assert_eq!(d.first_index, vec![1, 1]);
        assert_eq!(d.max_ulp, 1);
        assert_eq!(d.actual.bits, "0x4040");
        assert_eq!(d.expected.bits, "0x4041");
    }

    #[test]
    fn signed_zeros_differ_by_one_ulp() {
        let a = bf16(&[0.0], &[1]);
        let b = bf16(&[-0.0], &[1]);
        let Comparison::Differs(d) = compare(&a, &b) else {
            panic!("must differ")
        };
        assert_eq!(d.max_ulp, 1);
    }

    #[test]
    fn shape_and_dtype_mismatch_are_their_own_outcomes() {
        let a = bf16(&[1.0, 2.0], &[2]);
        let b = bf16(&[1.0, 2.0], &[1, 2]);
        assert!(matches!(compare(&a, &b), Comparison::ShapeMismatch { .. }));
        let c = HostTensor::new(DType::Float16, vec![2], a.bytes.clone()).unwrap();
        assert!(matches!(compare(&a, &c), Comparison::DtypeMismatch { .. }));
    }

    proptest::proptest! {
        #[test]
        fn ulp_is_symmetric_and_zero_only_on_equal_bits(a: u32, b: u32) {
            let d = ulp_distance(DType::Float32, a as u64, b as u64);
            proptest::prop_assert_eq!(d, ulp_distance(DType::Float32, b as u64, a as u64));
            proptest::prop_assert_eq!(d == 0, a == b);
        }
    }
}
