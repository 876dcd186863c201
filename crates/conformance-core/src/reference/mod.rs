//! The typed boundary to the reference: one Rust function per glue function
//! (`crates/oracle/python/reference_glue/`), with typed arguments and a
//! typed result. Cases never name a glue function, build an argument
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

use oracle::{DType, HostTensor, Value};

use crate::case::{CaseError, Expected};

// The arguments of a call and how the proof mode perturbs them live below
// the case context (`crate::param`), which sends them.
pub(crate) use crate::param::{fixed, ints, opt_tensor, tensor, tensors, varied};
pub use crate::param::{perturb, Param, Perturb};

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
    use oracle::Arg;

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
        // Expert indices stay experts: 0 <-> 1, 2 kept of 3; of one
        // expert, 0 stays (1 is no expert there: it becomes 0).
        let idx = HostTensor::new(
            DType::Uint32,
            vec![4],
            [0u32, 1, 2, 1]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        )
        .unwrap();
        let moved = |experts| match perturb(Arg::from(idx.clone()), Perturb::ExpertIndex(experts)) {
            Ok(Arg::Tensor(p)) => (0..4).map(|i| p.value(i) as u32).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(moved(3), vec![1, 0, 2, 0]);
        assert_eq!(moved(4), vec![1, 0, 3, 0]);
        assert_eq!(moved(1), vec![0, 0, 2, 0]);
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
    // With a substitute, the flag's counterpart is whether it raised on
    // the same call.
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
