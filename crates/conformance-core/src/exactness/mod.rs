//! The second oracle's hook: each numeric reference wrapper attaches the
//! exact value of its output (from [`exact`], float64, no MLX), computed
//! from the arguments the reference actually received ([`Sent`]), and
//! [`crate::case::CaseOutput::compare`] measures both sides against it.
//!
//! Separate from the bit verdict, which it never changes: a must-equal
//! output is bit-compared as before, and additionally each side is either
//! within the derived bound of the exact value or not. A reference outside
//! its bound is its own class ([`ExactClass::ReferenceOutside`]): the
//! reference computes the wrong thing there.

use std::sync::Arc;

use exact::{Exact, ExactError, Float, Model, Side};
use oracle::{Arg, DType, HostTensor};
use serde::{Deserialize, Serialize};

use crate::error::CaseError;
use layers::Backend;

/// The kernel model of a backend (where its kernels round; see
/// [`exact::Model`]).
pub fn model_of(backend: Backend) -> Model {
    match backend {
        Backend::Cpu => Model::Cpu,
        Backend::Metal | Backend::Cuda => Model::Gpu,
    }
}

/// The keyword arguments of one glue call, by name: what the reference
/// received (perturbed under `--perturb`) or what the port was given.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    args: Vec<(&'static str, Arg)>,
}

impl Sent {
    pub fn new(args: Vec<(&'static str, Arg)>) -> Self {
        Self { args }
    }
    /// These arguments with `name` set to `value` (replaced if present).
    pub fn with(&self, name: &'static str, value: Arg) -> Sent {
        let mut args: Vec<_> = self
            .args
            .iter()
            .filter(|(n, _)| *n != name)
            .cloned()
            .collect();
        args.push((name, value));
        Sent::new(args)
    }
    fn get(&self, name: &str) -> Result<&Arg, ExactError> {
        self.args
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a)
            .ok_or_else(|| ExactError(format!("no argument `{name}`")))
    }
    /// A tensor argument.
    pub fn tensor(&self, name: &str) -> Result<&HostTensor, ExactError> {
        match self.get(name)? {
            Arg::Tensor(t) => Ok(t),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a tensor",
                short(other)
            ))),
        }
    }
    /// An optional tensor argument (`None` when passed as None or not
    /// passed: the glue's default).
    pub fn opt_tensor(&self, name: &str) -> Result<Option<&HostTensor>, ExactError> {
        if !self.args.iter().any(|(n, _)| *n == name) {
            return Ok(None);
        }
        match self.get(name)? {
            Arg::Tensor(t) => Ok(Some(t)),
            Arg::None => Ok(None),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a tensor",
                short(other)
            ))),
        }
    }
    /// A list of tensors.
    pub fn tensors(&self, name: &str) -> Result<Vec<&HostTensor>, ExactError> {
        match self.get(name)? {
            Arg::List(items) => items
                .iter()
                .map(|a| match a {
                    Arg::Tensor(t) => Ok(t),
                    other => Err(ExactError(format!("`{name}` holds {}", short(other)))),
                })
                .collect(),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a list",
                short(other)
            ))),
        }
    }
    pub fn int(&self, name: &str) -> Result<i64, ExactError> {
        match self.get(name)? {
            Arg::Int(i) => Ok(*i),
            other => Err(ExactError(format!(
                "`{name}` is {}, not an int",
                short(other)
            ))),
        }
    }
    pub fn float(&self, name: &str) -> Result<f64, ExactError> {
        match self.get(name)? {
            Arg::Float(f) => Ok(*f),
            Arg::Int(i) => Ok(*i as f64),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a float",
                short(other)
            ))),
        }
    }
    pub fn floats(&self, name: &str) -> Result<Vec<f64>, ExactError> {
        match self.get(name)? {
            Arg::List(items) => items
                .iter()
                .map(|a| match a {
                    Arg::Float(f) => Ok(*f),
                    Arg::Int(i) => Ok(*i as f64),
                    other => Err(ExactError(format!("`{name}` holds {}", short(other)))),
                })
                .collect(),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a list",
                short(other)
            ))),
        }
    }
    pub fn ints(&self, name: &str) -> Result<Vec<i64>, ExactError> {
        match self.get(name)? {
            Arg::List(items) => items
                .iter()
                .map(|a| match a {
                    Arg::Int(i) => Ok(*i),
                    other => Err(ExactError(format!("`{name}` holds {}", short(other)))),
                })
                .collect(),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a list",
                short(other)
            ))),
        }
    }
    pub fn string(&self, name: &str) -> Result<&str, ExactError> {
        match self.get(name)? {
            Arg::Str(s) => Ok(s),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a string",
                short(other)
            ))),
        }
    }
    pub fn bool(&self, name: &str) -> Result<bool, ExactError> {
        match self.get(name)? {
            Arg::Bool(b) => Ok(*b),
            other => Err(ExactError(format!(
                "`{name}` is {}, not a bool",
                short(other)
            ))),
        }
    }
}

/// An argument's kind, for messages (never a whole tensor).
fn short(a: &Arg) -> String {
    match a {
        Arg::Tensor(t) => format!("a {} tensor {:?}", t.dtype.name(), t.shape),
        Arg::List(items) => format!("a list of {}", items.len()),
        Arg::Int(i) => format!("the int {i}"),
        Arg::Float(f) => format!("the float {f}"),
        Arg::Bool(b) => format!("the bool {b}"),
        Arg::Str(s) => format!("the string {s:?}"),
        Arg::None => "None".into(),
    }
}

/// What one glue call's arguments were, on both sides: `reference` is what
/// the reference received; `port` is what the port computed from (the
/// same outside `--perturb`).
#[derive(Debug, Clone)]
pub struct Calls {
    pub reference: Sent,
    /// `None` outside `--perturb` (then the port's inputs are `reference`).
    pub port: Option<Sent>,
    pub model: Model,
}

/// The exact values an output is measured against: one per side (the same
/// `Arc` outside `--perturb`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExactPair {
    pub reference: Arc<Exact>,
    pub port: Arc<Exact>,
    /// Only when the hooks inject faults (`CallHooks::injects_faults`): the
    /// reference's exact value under each input fault that applies
    /// ([`faults::FaultKind::mutate`]).
    pub variants: Vec<faults::Variant>,
}

impl ExactPair {
    /// One exact value for both sides (no fault variants).
    pub fn same(e: Arc<Exact>) -> Self {
        ExactPair {
            reference: e.clone(),
            port: e,
            variants: Vec::new(),
        }
    }
}

/// Whether the running case's hooks inject faults into reference outputs.
fn injecting() -> bool {
    crate::scope::current(|hooks| hooks.injects_faults())
}

/// The exact values (output `index` of `f`) of each input fault that
/// applies to `sent` and that `f` can compute.
fn variants_of(
    sent: &Sent,
    model: Model,
    f: impl Fn(&Sent, Model) -> Result<Vec<Exact>, ExactError>,
) -> Vec<Vec<faults::Variant>> {
    let mut per_output: Vec<Vec<faults::Variant>> = Vec::new();
    for kind in faults::FaultKind::ALL {
        let Some(faulty) = kind.mutate(sent) else {
            continue;
        };
        let Ok(exacts) = f(&faulty, model) else {
            continue;
        };
        per_output.resize_with(per_output.len().max(exacts.len()), Vec::new);
        for (i, e) in exacts.into_iter().enumerate() {
            per_output[i].push(faults::Variant {
                kind,
                value: e.value,
            });
        }
    }
    per_output
}

impl Calls {
    /// Computes the exact value from each side's arguments with `f` (once
    /// outside `--perturb`). An argument the op cannot be computed from is
    /// a harness error naming the function.
    pub fn exact(
        &self,
        function: &str,
        f: impl Fn(&Sent, Model) -> Result<Exact, ExactError>,
    ) -> Result<ExactPair, CaseError> {
        self.exact_if_defined(function, f)?.ok_or_else(|| {
            CaseError::Harness(format!(
                "`{function}`: the exact oracle has no value for these inputs"
            ))
        })
    }

    /// Like [`Calls::exact`], `None` where either side's definition has no
    /// value ([`ExactError::undefined`]: an expert index out of range):
    /// the output is then not exact-checked.
    pub fn exact_if_defined(
        &self,
        function: &str,
        f: impl Fn(&Sent, Model) -> Result<Exact, ExactError>,
    ) -> Result<Option<ExactPair>, CaseError> {
        let run = |s: &Sent| match f(s, self.model) {
            Ok(e) => Ok(Some(Arc::new(e))),
            Err(e) if e.is_undefined() => Ok(None),
            Err(e) => Err(CaseError::Harness(format!("`{function}`: {e}"))),
        };
        let Some(reference) = run(&self.reference)? else {
            return Ok(None);
        };
        let port = match &self.port {
            Some(p) => match run(p)? {
                Some(p) => p,
                None => return Ok(None),
            },
            None => reference.clone(),
        };
        let variants = if injecting() {
            variants_of(&self.reference, self.model, |s, m| Ok(vec![f(s, m)?]))
                .pop()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(Some(ExactPair {
            reference,
            port,
            variants,
        }))
    }
}

impl Calls {
    /// Several outputs' exact values computed together from each side's
    /// arguments (one decode gives four outputs): one pair per output.
    pub fn exact_all(
        &self,
        function: &str,
        f: impl Fn(&Sent, Model) -> Result<Vec<Exact>, ExactError>,
    ) -> Result<Vec<ExactPair>, CaseError> {
        let wrap = |e: ExactError| CaseError::Harness(format!("`{function}`: {e}"));
        let reference: Vec<Arc<Exact>> = f(&self.reference, self.model)
            .map_err(wrap)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let port = match &self.port {
            Some(p) => f(p, self.model)
                .map_err(wrap)?
                .into_iter()
                .map(Arc::new)
                .collect(),
            None => reference.clone(),
        };
        if port.len() != reference.len() {
            return Err(CaseError::Harness(format!(
                "`{function}`: the sides' exact outputs differ in number"
            )));
        }
        let mut variants = if injecting() {
            variants_of(&self.reference, self.model, &f)
        } else {
            Vec::new()
        };
        variants.resize_with(reference.len(), Vec::new);
        Ok(reference
            .into_iter()
            .zip(port)
            .zip(variants)
            .map(|((reference, port), variants)| ExactPair {
                reference,
                port,
                variants,
            })
            .collect())
    }

    /// Like [`Calls::exact`], with `extra` arguments added to each side's
    /// (what the reference built from a file, as the port loaded it: the
    /// read itself is outside this oracle's scope and bit-compared).
    pub fn exact_with(
        &self,
        function: &str,
        extra: &[(&'static str, Arg)],
        f: impl Fn(&Sent, Model) -> Result<Exact, ExactError>,
    ) -> Result<Option<ExactPair>, CaseError> {
        // The extra arguments replace any of the same name.
        let add = |s: &Sent| {
            extra
                .iter()
                .fold(s.clone(), |s, (name, value)| s.with(name, value.clone()))
        };
        Calls {
            reference: add(&self.reference),
            port: self.port.as_ref().map(add),
            model: self.model,
        }
        .exact_if_defined(function, f)
    }
}

/// The first `cols` columns of a row-major tensor `[.., C]` (`x[..., :cols]`).
pub fn first_columns(t: &HostTensor, cols: usize) -> Result<HostTensor, ExactError> {
    let c = *t
        .shape
        .last()
        .ok_or_else(|| ExactError("a scalar has no columns".into()))?;
    if cols > c {
        return Err(ExactError(format!("{cols} columns of a tensor of {c}")));
    }
    let size = t.dtype.size();
    let bytes = t
        .bytes
        .chunks(c * size)
        .flat_map(|row| row[..cols * size].iter().copied())
        .collect();
    let mut shape = t.shape.clone();
    *shape.last_mut().expect("checked") = cols;
    HostTensor::new(t.dtype, shape, bytes).map_err(|e| ExactError(e.to_string()))
}

/// A float tensor's elements as float64 (exact: every bf16, f16 and f32 is
/// a float64).
pub fn values(t: &HostTensor) -> Vec<f64> {
    (0..t.len()).map(|i| t.value(i)).collect()
}

/// The rounding format of a float dtype.
pub fn float_of(t: &HostTensor) -> Result<Float, ExactError> {
    float_dtype(t.dtype)
}

pub fn float_dtype(d: DType) -> Result<Float, ExactError> {
    Float::from_name(d.name())
        .ok_or_else(|| ExactError(format!("dtype {} is not a float dtype", d.name())))
}

/// How an output relates to its exact value and bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExactClass {
    /// Both sides within the bound.
    Within,
    /// The reference is outside its bound: the reference computes the
    /// wrong thing here (the port with it when bit-equal).
    ReferenceOutside,
    /// The port outside, the reference within: a port bug (its FAIL shows
    /// it too).
    PortOutside,
}

impl ExactClass {
    pub fn word(self) -> &'static str {
        match self {
            ExactClass::Within => "within",
            ExactClass::ReferenceOutside => "REFERENCE OUTSIDE BOUND",
            ExactClass::PortOutside => "port outside bound",
        }
    }
    /// [`ExactClass::word`], the checked side called `side` (the word for
    /// what stood for the port in this run, as in [`ExactCheck::line_as`]).
    pub fn word_as(self, side: &str) -> String {
        match self {
            ExactClass::PortOutside => format!("{side} outside bound"),
            _ => self.word().to_owned(),
        }
    }
}

/// One output measured against the exact oracle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExactCheck {
    /// The op (`quantized_matmul`, `rope`, ...), and the kernel model its
    /// bound was derived under.
    pub op: String,
    pub model: Model,
    pub class: ExactClass,
    pub port: Side,
    pub reference: Side,
    /// Whether port and reference were bit-equal (a reference outside the
    /// bound with a bit-equal port is one fact, not two).
    pub bit_equal: bool,
    /// Whether the bound can tell an output from zeros: some element's
    /// exact value exceeds its bound. An uninformative check (the bound
    /// wider than every value: e.g. attention after bf16 CPU projections)
    /// cannot fail on a zeroed output, so reports count it apart from
    /// `within`.
    pub informative: bool,
}

impl ExactCheck {
    pub fn measure(
        port: &HostTensor,
        reference: &HostTensor,
        pair: &ExactPair,
        bit_equal: bool,
    ) -> Self {
        let p = exact::check(&values(port), &pair.port);
        let r = exact::check(&values(reference), &pair.reference);
        let class = if !r.within() {
            ExactClass::ReferenceOutside
        } else if !p.within() {
            ExactClass::PortOutside
        } else {
            ExactClass::Within
        };
        let e = &pair.reference;
        let informative =
            e.value.is_empty() || e.value.iter().zip(&e.bound).any(|(v, b)| v.abs() > *b);
        ExactCheck {
            op: pair.reference.op.to_owned(),
            model: pair.reference.model,
            class,
            port: p,
            reference: r,
            bit_equal,
            informative,
        }
    }
    /// One line for a report row: the class, the worst ratio and element.
    pub fn line(&self, output: &str) -> String {
        self.line_as(output, "port")
    }
    /// report.md's "worst element | ratio" cells of the "Outside the
    /// exact bound" table, for the side the class names.
    pub fn worst_cells(&self) -> String {
        let s = match self.class {
            ExactClass::PortOutside => &self.port,
            _ => &self.reference,
        };
        // No element was compared (another element count): none is named,
        // and the ratio is not a measure of any element.
        if let Some(n) = s.computed_len {
            return format!(
                "{n} elements where the definition has {}: no element compared | —",
                s.total
            );
        }
        format!(
            "flat [{}] = {} vs exact {} ± {:.3e} ({} of {} outside) | {:.3}",
            s.worst_index,
            s.worst_value,
            s.worst_exact,
            s.worst_bound,
            s.outside,
            s.total,
            s.max_ratio,
        )
    }
    /// [`ExactCheck::line`], the checked side called `side` (the word
    /// for what stood for the port in this run).
    pub fn line_as(&self, output: &str, side: &str) -> String {
        let (who, s) = match self.class {
            ExactClass::PortOutside => (side, &self.port),
            _ => ("reference", &self.reference),
        };
        let tail = match self.class {
            ExactClass::Within => String::new(),
            ExactClass::ReferenceOutside if self.bit_equal => {
                format!(" (the {side} is bit-equal to it: the same fact)")
            }
            ExactClass::ReferenceOutside => format!(
                " ({side}: {} of {} outside)",
                self.port.outside, self.port.total
            ),
            ExactClass::PortOutside => format!(" (a {side} bug: its FAIL shows it too)"),
        };
        let word = match self.class {
            ExactClass::PortOutside => format!("{side} outside bound"),
            c => c.word().to_owned(),
        };
        // A NaN definition (a NaN input) is met by NaN only.
        let nan = if s.worst_exact.is_nan() {
            " (the definition is NaN there: a NaN input; only NaN is within)"
        } else {
            ""
        };
        // Another element count than the definition's: no element was
        // compared, so none is named (an empty array has no index [0]).
        if let Some(n) = s.computed_len {
            return format!(
                "{output}: {} [{} model {}]: {who} has {n} elements where the definition has {}: no element compared{tail}",
                word,
                self.op,
                self.model,
                s.total,
            );
        }
        format!(
            "{output}: {} [{} model {}]: {who} {} of {} outside, worst at flat index [{}] = {} vs exact {} (bound {:.3e}, {:.3}x){nan}{tail}",
            word,
            self.op,
            self.model,
            s.outside,
            s.total,
            s.worst_index,
            s.worst_value,
            s.worst_exact,
            s.worst_bound,
            s.max_ratio,
        )
    }
}

#[cfg(test)]
mod line_tests {
    use super::*;

    /// Issue 40, class 25: the line for an empty substituted array named a
    /// "flat index [0]" that does not exist.
    #[test]
    fn an_output_of_another_length_names_no_element() {
        let e = exact::Exact {
            op: "quantized_matmul",
            model: exact::Model::Cpu,
            shape: vec![2],
            value: vec![1.0, 2.0],
            bound: vec![0.1, 0.1],
        };
        let check = ExactCheck {
            op: "quantized_matmul".into(),
            model: exact::Model::Cpu,
            class: ExactClass::PortOutside,
            port: exact::check(&[], &e),
            reference: exact::check(&[1.0, 2.0], &e),
            bit_equal: false,
            informative: true,
        };
        let line = check.line("y");
        assert!(!line.contains("flat index"), "{line}");
        assert!(
            line.contains("port has 0 elements where the definition has 2"),
            "{line}"
        );
        // report.md's table says the same as the console line (it named
        // "flat [0] = NaN ... (2 of 2 outside)").
        let cells = check.worst_cells();
        assert!(!cells.contains("flat") && !cells.contains("NaN"), "{cells}");
        assert!(
            cells.contains("0 elements where the definition has 2: no element compared"),
            "{cells}"
        );
        let within = exact::check(&[1.0, 2.0], &e);
        assert_eq!(within.computed_len, None);
    }
}

pub mod faults;
pub mod quantized;
