//! `quantized/refused`: quantized-linear inputs both sides refuse. Each case
//! quantizes a valid layer (affine 4-bit gs64, or mxfp4 4/32; K 128, N 32,
//! x `[2, K]` bf16), breaks one thing, and hands the broken tensors to the
//! port (`QuantizedLinear::from_arrays`, then `forward`) and to the
//! reference (`mlx.nn.QuantizedLinear` holding them, called on x).
//! (An affine layer without biases is not among them: the glue installs
//! the tensors it is given into a layer its own `__init__` built, which
//! has biases; the reference refuses a checkpoint without them at load.)
//!
//! Must-equal on "refused" (uint8 `[1]`): the port must return the
//! `PayloadError` / `LayerError` variant the case names and the reference
//! must raise with the text it names; each side's message is in the
//! report. The proof mode gives the reference the unbroken layer, which it
//! computes with, so "refused" must differ.

use layers::quantized::{Mode, QuantizedLinear};
use oracle::{DType, HostTensor};

use super::{activation, affine, host, layer_tensors, mode_default, quantized_weight};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use crate::reference::quantized::QuantizedTensors;

const FAMILY: &str = "quantized/refused";
const REFERENCE: &str = "mlx.nn.QuantizedLinear.__call__ holding the tensors (mlx 0.32.2)";
const K: usize = 128;
const N: usize = 32;

/// `(what is broken, the reference's message, the port's variant)`.
pub const BROKEN: &[(&str, &str, &str)] = &[
    ("weight-int32", "should be uint32", "WeightDtype"),
    (
        "biases-shape",
        "Scales and biases should have the same shape",
        "BiasesShape",
    ),
    ("scales-shape", "incompatible", "ScalesShape"),
    ("bias-shape", "broadcast_shapes", "BiasShape"),
    ("x-width", "does not match", "InputShape"),
    (
        "mxfp4-with-biases",
        "Biases must be null",
        "UnexpectedBiases",
    ),
];

/// One case as data: what is broken (one of [`BROKEN`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedCase {
    pub broken: String,
}

impl Params for RefusedCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| run(ctx, &self.broken))
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    BROKEN
        .iter()
        .map(|&(broken, _, _)| {
            described(
                format!("{FAMILY}/{broken}"),
                &RefusedCase {
                    broken: broken.into(),
                },
            )
        })
        .collect()
}

/// A tensor's bytes cut to `shape` along its last axis (a row-major prefix
/// of each row).
fn narrowed(t: &HostTensor, last: usize) -> Result<HostTensor, CaseError> {
    let width = *t.shape.last().unwrap_or(&1);
    let row_bytes = t.bytes.len() / (t.len() / width).max(1);
    let keep = row_bytes / width * last;
    let bytes = t
        .bytes
        .chunks(row_bytes)
        .flat_map(|row| row[..keep].to_vec())
        .collect();
    let mut shape = t.shape.clone();
    *shape.last_mut().expect("rank >= 1") = last;
    Ok(HostTensor::new(t.dtype, shape, bytes)?)
}

fn run(ctx: &Ctx, broken: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = BROKEN
        .iter()
        .find(|b| b.0 == broken)
        .ok_or_else(|| CaseError::Harness(format!("`{broken}` is none of {BROKEN:?}")))?;
    let mut inputs = ctx.inputs();
    let spec = if broken == "mxfp4-with-biases" {
        mode_default(Mode::Mxfp4)
    } else {
        affine(4, 64)
    };
    let payload = quantized_weight(&mut inputs, spec, DType::Bfloat16, &[N, K])?;
    let bias = activation(&mut inputs, DType::Bfloat16, &[N]);
    let x = activation(&mut inputs, DType::Bfloat16, &[2, K]);
    let valid = layer_tensors(&payload, Some(&bias))?;

    let mut bad = valid.clone();
    let mut bad_x = x.clone();
    match broken {
        "weight-int32" => bad.weight.dtype = DType::Int32,
        "biases-shape" => {
            let b = bad
                .biases
                .as_ref()
                .ok_or_else(|| CaseError::Harness("affine has biases".into()))?;
            bad.biases = Some(narrowed(b, b.shape[1] - 1)?);
        }
        "scales-shape" => {
            // One group too few, biases alike (they must match the scales).
            bad.scales = narrowed(&bad.scales, bad.scales.shape[1] - 1)?;
            bad.biases = bad
                .biases
                .as_ref()
                .map(|b| narrowed(b, b.shape[1] - 1))
                .transpose()?;
        }
        "bias-shape" => bad.bias = Some(activation(&mut inputs, DType::Bfloat16, &[N + 1])),
        "x-width" => bad_x = activation(&mut inputs, DType::Bfloat16, &[2, K + 64]),
        "mxfp4-with-biases" => {
            // Biases shaped like the scales, as affine would have them.
            bad.biases = Some(HostTensor::new(
                DType::Bfloat16,
                bad.scales.shape.clone(),
                vec![0; bad.scales.len() * 2],
            )?);
        }
        other => return Err(CaseError::Harness(format!("no breakage `{other}`"))),
    }

    let port_said = port_refusal(&bad, &bad_x, variant)?;
    let (given, given_x): (&QuantizedTensors, &HostTensor) = if ctx.perturbed() {
        (&valid, &x)
    } else {
        (&bad, &bad_x)
    };
    let reference = reference::refusal(
        reference::quantized::quantized_linear(ctx, given_x, given),
        expected,
    )?;
    crate::families::support::refusal_output(ctx, "mlx.core", port_said, reference)
}

/// The port on the broken tensors: `(1, message)` when it refuses with
/// `variant`; another refusal is the port raising where it should not.
fn port_refusal(
    t: &QuantizedTensors,
    x: &HostTensor,
    variant: &str,
) -> Result<(u8, String), CaseError> {
    let result = QuantizedLinear::from_arrays(
        t.weight.to_array(),
        t.scales.to_array(),
        t.biases.as_ref().map(HostTensor::to_array),
        t.spec,
        t.bias.as_ref().map(HostTensor::to_array),
    )
    .and_then(|layer| layer.forward(&x.to_array()));
    match result {
        Err(e) if crate::families::support::names_variant(&format!("{e:?}"), variant) => {
            Ok((1, e.to_string()))
        }
        Err(other) => Err(super::port(other)),
        Ok(y) => {
            // Evaluated: a lazy refusal would surface here.
            host(&y)?;
            Ok((0, "computed".to_owned()))
        }
    }
}
