//! The typed boundary to the reference: one Rust function per glue function
//! (`crates/oracle/python/reference_glue/`), with typed arguments and a
//! typed result. Families never name a glue function, build an argument
//! list or read a result by key; they call these.
//!
//! Each function marks which of its arguments the proof mode perturbs
//! ([`Perturb`]): under `--perturb` every must-equal output must then
//! differ from the port's, or be declared derived by its case
//! ([`crate::case::CaseOutput::compare_derived`]).
//!
//! - [`quantized`]: quantized and float linear / switch layers, smoke.
//! - [`checkpoint`]: `mx.load` of safetensors, `load_model` checkpoints.
//! - [`position`]: mRoPE, rope index and decode positions, 2-D RoPE.
//! - [`attention`]: the decode step.
//! - [`configs`]: real `config.json`s read by mlx-vlm's config classes.
//! - [`adapters`]: LoRA adapter directories, written, loaded and fused by
//!   mlx-lm and mlx-vlm.
//! - [`selftest`]: the transfer round trip and a Python error.
//! - [`bench`]: the reference side of the Rust/Python benchmarks.

pub mod adapters;
pub mod attention;
pub mod bench;
pub mod checkpoint;
pub mod configs;
pub mod model;
pub mod position;
pub mod quantized;
pub mod selftest;

use std::collections::BTreeMap;

use oracle::{Arg, DType, HostTensor, Value};

use crate::case::{CaseError, Expected};

/// How the proof mode (`--perturb`) changes one argument. The change is
/// small and keeps the call valid, so the reference computes a real result
/// from a different input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perturb {
    /// Never perturbed: a constant of the case (a mode, a path, a flag).
    Fixed,
    /// A tensor: the lowest bit of every element flipped (one unit in the
    /// last place of every float; an empty tensor gets another float dtype,
    /// which must show in the output's dtype). A list: each item.
    EveryElement,
    /// A tensor: the lowest bit of element 0 only (a mask, where flipping
    /// every element would mask every token).
    FirstElement,
    /// An integer: plus this.
    Add(i64),
    /// A float: the next float32 above it.
    NextUp,
    /// A float dtype name: another float dtype.
    OtherDtype,
    /// A tensor: the top mantissa bit of every float element flipped (a
    /// change of up to half the value; the lowest bit of integers), for
    /// outputs that round a one-ulp change away (quantization codes and
    /// scales).
    EveryElementCoarse,
    /// A JSON text (a `config.json`): every integer plus 8 and every
    /// float to the next float32 above it, so every number the reader
    /// keeps (and every value computed from them) moves.
    JsonNumbers,
    /// A list of integers (an `mrope_section`): one moved from its last
    /// non-zero entry to entry 0 (to entry 1 when that is entry 0), so the
    /// sum stays and the later sections, which the interleaved selector
    /// reads, shrink; a list of such lists: each that has one to move.
    MoveOne,
}

/// One keyword argument of a glue call.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: &'static str,
    pub value: Arg,
    pub perturb: Perturb,
}

/// A constant argument.
pub(crate) fn fixed(name: &'static str, value: impl Into<Arg>) -> Param {
    Param {
        name,
        value: value.into(),
        perturb: Perturb::Fixed,
    }
}

/// A perturbable argument.
pub(crate) fn varied(name: &'static str, value: impl Into<Arg>, perturb: Perturb) -> Param {
    Param {
        name,
        value: value.into(),
        perturb,
    }
}

/// A perturbable tensor argument (every element).
pub(crate) fn tensor(name: &'static str, t: &HostTensor) -> Param {
    varied(name, t.clone(), Perturb::EveryElement)
}

/// An optional perturbable tensor argument (`None` when absent).
pub(crate) fn opt_tensor(name: &'static str, t: Option<&HostTensor>) -> Param {
    varied(name, t.cloned(), Perturb::EveryElement)
}

/// A list of perturbable tensors.
pub(crate) fn tensors<'a>(
    name: &'static str,
    ts: impl IntoIterator<Item = &'a HostTensor>,
) -> Param {
    varied(
        name,
        Arg::List(ts.into_iter().map(|t| Arg::from(t.clone())).collect()),
        Perturb::EveryElement,
    )
}

/// A list of integers.
pub(crate) fn ints(values: &[usize]) -> Arg {
    Arg::List(values.iter().map(|&v| Arg::from(v)).collect())
}

/// Applies `how` to `value`; the error says what did not fit.
pub fn perturb(value: Arg, how: Perturb) -> Result<Arg, String> {
    Ok(match (how, value) {
        (Perturb::Fixed, v) => v,
        (_, Arg::None) => Arg::None,
        (Perturb::EveryElement, Arg::Tensor(t)) => Arg::Tensor(flip_every_element(&t)),
        (Perturb::EveryElement, Arg::List(items)) => Arg::List(
            items
                .into_iter()
                .map(|a| perturb(a, Perturb::EveryElement))
                .collect::<Result<_, _>>()?,
        ),
        (Perturb::EveryElementCoarse, Arg::Tensor(t)) => Arg::Tensor(flip_top_mantissa(&t)),
        (Perturb::EveryElementCoarse, Arg::List(items)) => Arg::List(
            items
                .into_iter()
                .map(|a| perturb(a, Perturb::EveryElementCoarse))
                .collect::<Result<_, _>>()?,
        ),
        (Perturb::JsonNumbers, Arg::Str(s)) => {
            let mut v: serde_json::Value =
                serde_json::from_str(&s).map_err(|e| format!("not JSON: {e}"))?;
            bump_numbers(&mut v);
            Arg::Str(v.to_string())
        }
        (Perturb::FirstElement, Arg::Tensor(t)) if t.is_empty() => {
            Arg::Tensor(other_float_dtype(&t))
        }
        (Perturb::FirstElement, Arg::Tensor(mut t)) => {
            t.bytes[0] ^= 1;
            Arg::Tensor(t)
        }
        (Perturb::Add(n), Arg::Int(v)) => Arg::Int(v + n),
        (Perturb::NextUp, Arg::Float(v)) => Arg::Float(f64::from(next_up(v as f32))),
        (Perturb::OtherDtype, Arg::Str(s)) => Arg::Str(
            match s.as_str() {
                "bfloat16" => "float16",
                "float16" | "float32" => "bfloat16",
                other => return Err(format!("`{other}` is not a float dtype name")),
            }
            .to_owned(),
        ),
        (Perturb::MoveOne, Arg::List(items)) if items.iter().all(|a| matches!(a, Arg::List(_))) => {
            // A list of sections: each, except those with nothing to move.
            Arg::List(
                items
                    .into_iter()
                    .map(|a| perturb(a.clone(), Perturb::MoveOne).or(Ok::<_, String>(a)))
                    .collect::<Result<_, _>>()?,
            )
        }
        (Perturb::MoveOne, Arg::List(mut items)) => {
            let at = items
                .iter()
                .rposition(|a| matches!(a, Arg::Int(v) if *v > 0))
                .ok_or("no non-zero entry to move one from")?;
            let next = usize::from(at == 0);
            if let Arg::Int(v) = &mut items[at] {
                *v -= 1;
            }
            match &mut items[next] {
                Arg::Int(v) => *v += 1,
                _ => return Err("a list of integers is needed".into()),
            }
            Arg::List(items)
        }
        (how, v) => return Err(format!("{how:?} does not apply to {v:?}")),
    })
}

/// Every number of a JSON value: integers + 8, floats to the next float32.
fn bump_numbers(v: &mut serde_json::Value) {
    use serde_json::Value as J;
    match v {
        J::Number(n) => {
            *v = if let Some(i) = n.as_i64() {
                J::from(i + 8)
            } else {
                J::from(f64::from(next_up(n.as_f64().unwrap_or(0.0) as f32)))
            }
        }
        J::Array(items) => items.iter_mut().for_each(bump_numbers),
        J::Object(map) => map.values_mut().for_each(bump_numbers),
        _ => {}
    }
}

/// The top mantissa bit of every float element flipped (bit 0 of
/// integers).
fn flip_top_mantissa(t: &HostTensor) -> HostTensor {
    if t.is_empty() {
        return other_float_dtype(t);
    }
    let mut out = t.clone();
    let size = t.dtype.size();
    // (byte within the element, mask) of the top mantissa bit, little-endian.
    let (byte, mask) = match t.dtype {
        DType::Float32 => (2, 0x40),
        DType::Bfloat16 => (0, 0x40),
        DType::Float16 => (1, 0x02),
        _ => (0, 0x01),
    };
    for i in (0..out.bytes.len()).step_by(size) {
        out.bytes[i + byte] ^= mask;
    }
    out
}

/// The next float32 above `v` (towards +infinity).
fn next_up(v: f32) -> f32 {
    if v.is_nan() || v == f32::INFINITY {
        return v;
    }
    if v == 0.0 {
        return f32::from_bits(1);
    }
    let bits = v.to_bits();
    f32::from_bits(if v > 0.0 { bits + 1 } else { bits - 1 })
}

/// The lowest bit of every element flipped; an empty tensor gets another
/// float dtype.
fn flip_every_element(t: &HostTensor) -> HostTensor {
    if t.is_empty() {
        return other_float_dtype(t);
    }
    let mut out = t.clone();
    let size = t.dtype.size();
    for i in (0..out.bytes.len()).step_by(size) {
        out.bytes[i] ^= 1;
    }
    out
}

/// An empty tensor of the same shape in another float dtype (bf16 → f16;
/// f16, f32 → bf16; others unchanged).
fn other_float_dtype(t: &HostTensor) -> HostTensor {
    let dtype = match t.dtype {
        DType::Bfloat16 => DType::Float16,
        DType::Float16 | DType::Float32 => DType::Bfloat16,
        _ => return t.clone(),
    };
    HostTensor::new(dtype, t.shape.clone(), Vec::new()).unwrap_or_else(|_| t.clone())
}

/// Reference text as a uint8 array, so names and sources compare like bits.
fn text(t: &str) -> Expected {
    let bytes = t.as_bytes().to_vec();
    Expected::from_reference(
        HostTensor::new(DType::Uint8, vec![bytes.len()], bytes).expect("sized by construction"),
    )
}

/// Reference integers as an int32 array.
fn int32(values: &[i32]) -> Expected {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Expected::from_reference(
        HostTensor::new(DType::Int32, vec![values.len()], bytes).expect("sized by construction"),
    )
}

/// A result that must be one array.
pub(crate) fn one_array(function: &'static str, value: Value) -> Result<Expected, CaseError> {
    match value {
        Value::Tensor(t) => Ok(Expected::from_reference(t)),
        other => Err(CaseError::Harness(format!(
            "`{function}` returned {}, not one array",
            kind(&other)
        ))),
    }
}

/// A result that must be a list.
pub(crate) fn list(function: &'static str, value: Value) -> Result<Vec<Value>, CaseError> {
    match value {
        Value::List(items) => Ok(items),
        other => Err(CaseError::Harness(format!(
            "`{function}` returned {}, not a list",
            kind(&other)
        ))),
    }
}

/// What kind of value came back (for messages; never the whole value).
fn kind(v: &Value) -> String {
    match v {
        Value::Tensor(t) => format!("an array {} {:?}", t.dtype.name(), t.shape),
        Value::Int(i) => format!("the int {i}"),
        Value::Float(f) => format!("the float {f}"),
        Value::Bool(b) => format!("the bool {b}"),
        Value::Str(s) => format!("the string {s:?}"),
        Value::None => "None".into(),
        Value::List(l) => format!("a list of {}", l.len()),
        Value::Dict(d) => format!("a dict with keys {:?}", d.keys().collect::<Vec<_>>()),
    }
}

/// A dict result, read field by field inside this module only.
pub(crate) struct Fields {
    function: &'static str,
    map: BTreeMap<String, Value>,
}

impl Fields {
    pub(crate) fn of(function: &'static str, value: Value) -> Result<Self, CaseError> {
        match value {
            Value::Dict(map) => Ok(Self { function, map }),
            other => Err(CaseError::Harness(format!(
                "`{function}` returned {}, not a dict",
                kind(&other)
            ))),
        }
    }
    fn missing(&self, key: &str, got: &Option<Value>, want: &str) -> CaseError {
        CaseError::Harness(format!(
            "`{}` result `{key}` is {}, not {want}",
            self.function,
            got.as_ref().map_or_else(|| "missing".to_owned(), kind)
        ))
    }
    pub(crate) fn value(&mut self, key: &str) -> Result<Value, CaseError> {
        self.map
            .remove(key)
            .ok_or_else(|| self.missing(key, &None, "present"))
    }
    pub(crate) fn tensor(&mut self, key: &str) -> Result<Expected, CaseError> {
        match self.map.remove(key) {
            Some(Value::Tensor(t)) => Ok(Expected::from_reference(t)),
            got => Err(self.missing(key, &got, "an array")),
        }
    }
    pub(crate) fn opt_tensor(&mut self, key: &str) -> Result<Option<Expected>, CaseError> {
        match self.map.remove(key) {
            Some(Value::Tensor(t)) => Ok(Some(Expected::from_reference(t))),
            Some(Value::None) | None => Ok(None),
            got => Err(self.missing(key, &got, "an array or None")),
        }
    }
    pub(crate) fn string(&mut self, key: &str) -> Result<String, CaseError> {
        match self.map.remove(key) {
            Some(Value::Str(s)) => Ok(s),
            got => Err(self.missing(key, &got, "a string")),
        }
    }
    pub(crate) fn bool(&mut self, key: &str) -> Result<bool, CaseError> {
        match self.map.remove(key) {
            Some(Value::Bool(b)) => Ok(b),
            got => Err(self.missing(key, &got, "a bool")),
        }
    }
    pub(crate) fn strings(&mut self, key: &str) -> Result<Vec<String>, CaseError> {
        match self.map.remove(key) {
            Some(Value::List(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s),
                    other => Err(CaseError::Harness(format!(
                        "`{}` result `{key}` holds {}, not strings",
                        self.function,
                        kind(&other)
                    ))),
                })
                .collect(),
            got => Err(self.missing(key, &got, "a list of strings")),
        }
    }
    /// The remaining entries (for name → value maps).
    pub(crate) fn into_entries(self) -> BTreeMap<String, Value> {
        self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_perturbation_changes_its_argument() {
        let t = HostTensor::new(
            DType::Float32,
            vec![2],
            [1f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .unwrap();
        let Arg::Tensor(p) = perturb(Arg::from(t.clone()), Perturb::EveryElement).unwrap() else {
            panic!()
        };
        assert_ne!(p.bytes[0..4], t.bytes[0..4]);
        assert_ne!(p.bytes[4..8], t.bytes[4..8]);
        let Arg::Tensor(p) = perturb(Arg::from(t.clone()), Perturb::FirstElement).unwrap() else {
            panic!()
        };
        assert_ne!(p.bytes[0..4], t.bytes[0..4]);
        assert_eq!(p.bytes[4..8], t.bytes[4..8]);
        assert!(matches!(
            perturb(Arg::Int(3), Perturb::Add(2)),
            Ok(Arg::Int(5))
        ));
        assert!(
            matches!(perturb(Arg::Float(1e7), Perturb::NextUp), Ok(Arg::Float(v)) if v == 10000001.0)
        );
        let Arg::List(s) = perturb(ints(&[0, 11, 10]), Perturb::MoveOne).unwrap() else {
            panic!()
        };
        assert!(matches!(s[..], [Arg::Int(1), Arg::Int(11), Arg::Int(9)]));
        let Arg::List(s) = perturb(ints(&[1, 0, 0]), Perturb::MoveOne).unwrap() else {
            panic!()
        };
        assert!(matches!(s[..], [Arg::Int(0), Arg::Int(1), Arg::Int(0)]));
        assert!(
            matches!(perturb(Arg::from("bfloat16"), Perturb::OtherDtype), Ok(Arg::Str(s)) if s == "float16")
        );
        let empty = HostTensor::new(DType::Bfloat16, vec![0, 4], vec![]).unwrap();
        let Arg::Tensor(p) = perturb(Arg::from(empty), Perturb::EveryElement).unwrap() else {
            panic!()
        };
        assert_eq!(p.dtype, DType::Float16);
        assert!(perturb(Arg::Int(1), Perturb::NextUp).is_err());
    }
}

/// How a reference call ended, for a refusal case: it raised with the
/// message the case expects, or it computed.
#[derive(Debug)]
pub struct Refusal {
    /// uint8 `[1]`: 1 if the reference raised, 0 if it computed (the
    /// must-equal output of a refusal case; the proof mode hands the
    /// reference an input it computes on, so it must differ).
    pub refused: Expected,
    /// The reference's exception line (`RuntimeError: …`) up to the end of
    /// the text the case expects, or `computed`.
    pub message: String,
    /// Whether the reference raised (the value of `refused`).
    pub raised: bool,
}

/// What `result` (a reference call) says about refusing. A raise whose
/// traceback does not contain `expected` is returned as the error it is:
/// the case then errors instead of counting another failure as the
/// refusal it expects.
pub fn refusal<T>(result: Result<T, CaseError>, expected: &str) -> Result<Refusal, CaseError> {
    // An empty text would match any exception.
    if expected.trim().is_empty() {
        return Err(CaseError::Harness(
            "a refusal case needs the text the reference's exception must hold (empty given)"
                .into(),
        ));
    }
    // With `--candidate`, the flag's counterpart is whether the candidate
    // raised on the same call.
    let flag = |v: u8| Expected::raised_flag(v == 1);
    match result {
        Ok(_) => Ok(Refusal {
            refused: flag(0),
            message: "computed".into(),
            raised: false,
        }),
        Err(CaseError::Reference(oracle::OracleError::Python { traceback, .. }))
            if traceback.contains(expected) =>
        {
            // The exception line up to the end of the expected text: what
            // follows may vary run to run (a set's order), and the message
            // is pinned with the case.
            let last = traceback.trim_end().lines().last().unwrap_or("").trim();
            let message = match last.find(expected) {
                Some(at) => last[..at + expected.len()].to_owned(),
                None => {
                    let kind = last.split(':').next().unwrap_or(last);
                    format!("{kind}: ... {expected}")
                }
            };
            Ok(Refusal {
                refused: flag(1),
                message,
                raised: true,
            })
        }
        Err(e) => Err(e),
    }
}
