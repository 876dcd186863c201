//! A reference call's arguments as the typed boundary marks them
//! ([`Param`]: a name, a value, and how the proof mode perturbs it), and
//! the perturbations themselves. Below both the case context, which sends
//! them, and [`crate::reference`], which builds them.

use oracle::{Arg, DType, HostTensor};

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
    /// A tensor of expert indices into this many experts: the lowest bit
    /// of each index flipped where the result is still an expert (`0 <->
    /// 1`, `2 <-> 3`, ...; the last of an odd count kept), so the call
    /// stays valid by construction. With one expert nothing can move; the
    /// case's other arguments (activations, weights) move the output.
    ExpertIndex(usize),
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
        (Perturb::ExpertIndex(experts), Arg::Tensor(t)) => {
            Arg::Tensor(flip_expert_indices(&t, experts)?)
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

/// Each index `i` of an integer tensor to `i ^ 1` where that is below
/// `experts` ([`Perturb::ExpertIndex`]).
fn flip_expert_indices(t: &HostTensor, experts: usize) -> Result<HostTensor, String> {
    let size = t.dtype.size();
    if !matches!(t.dtype, DType::Int32 | DType::Uint32 | DType::Int64) {
        return Err(format!("expert indices of dtype {}", t.dtype.name()));
    }
    let mut out = t.clone();
    for chunk in out.bytes.chunks_mut(size) {
        let mut raw = [0u8; 8];
        raw[..size].copy_from_slice(chunk);
        let i = u64::from_le_bytes(raw);
        if usize::try_from(i ^ 1).is_ok_and(|j| j < experts) {
            chunk[0] ^= 1;
        }
    }
    Ok(out)
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
