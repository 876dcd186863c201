//! `quantized/accepted`, `float/accepted`: layer tensors the port once
//! refused while the reference's layer computes with them
//! (`crates/layers/REFUSALS.md`, "Gaps closed"): additive biases that
//! broadcast (a scalar, `[1]`, `[1, N]`, one row per input row, one that
//! widens the output), a quantized weight with a leading batch axis, a LoRA
//! `lora_b` of one output column, an integer weight in a float `Linear`,
//! and a per-expert bias `[E, 1]`.
//!
//! The reference holds exactly these tensors (its glue installs them on a
//! layer its own `__init__` built, as `load_weights` would without its
//! shape check); the port builds its layer from them with `new` (a
//! checkpoint still gets the strict shapes `load_weights(strict=True)`
//! gives). Affine 4-bit gs64, K 128, N 32, x `[2, K]` bf16 (f32 for the
//! float layers). Inputs and tensors are perturbed under `--perturb`.

use layers::dense::{Linear, SwitchLinear};
use layers::quantized::{LoraAdapter, QuantizedLinear};
use oracle::{DType, HostTensor};

use super::{activation, affine, host, layer_tensors, port, quantized_weight};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const K: usize = 128;
const N: usize = 32;
const E: usize = 4;

/// `(name, the reference's layer)`: what each accepted input feeds.
pub const ACCEPTED: &[(&str, &str)] = &[
    ("quantized/accepted/bias-scalar", QUANTIZED),
    ("quantized/accepted/bias-1", QUANTIZED),
    ("quantized/accepted/bias-1xN", QUANTIZED),
    ("quantized/accepted/bias-per-row-2xN", QUANTIZED),
    ("quantized/accepted/bias-widens-2x1xN", QUANTIZED),
    ("quantized/accepted/weight-batched-1xNxP", QUANTIZED),
    ("quantized/accepted/lora-b-rx1", LORA),
    ("float/accepted/linear-int32-weight", LINEAR),
    ("float/accepted/linear-bias-per-row-2xN", LINEAR),
    ("float/accepted/switch-bias-Ex1", SWITCH),
];

const QUANTIZED: &str = "mlx.nn.QuantizedLinear.__call__ holding the tensors (mlx 0.32.2)";
const LORA: &str = "mlx_lm.tuner.lora.LoRALinear.__call__ around mlx.nn.QuantizedLinear, holding the tensors (mlx-lm 0.32.2)";
const LINEAR: &str = "mlx.nn.Linear.__call__ holding the tensors (mlx 0.32.2)";
const SWITCH: &str =
    "mlx_lm.models.switch_layers.SwitchLinear.__call__ holding the tensors (mlx-lm 0.32.2)";

/// One case as data: its name in [`ACCEPTED`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptedCase {
    pub input: String,
}

impl Params for AcceptedCase {
    const BUILDER: &'static str = "quantized/accepted";
    fn build(self, name: String) -> Case {
        let (family, reference) = match ACCEPTED.iter().find(|a| a.0 == self.input) {
            Some(&(n, r)) => (n.split('/').next().unwrap_or("quantized"), r),
            None => ("quantized", QUANTIZED),
        };
        Case::must_equal(name, family, reference, move |ctx| run(ctx, &self.input))
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    ACCEPTED
        .iter()
        .map(|&(name, _)| described(name.to_owned(), &AcceptedCase { input: name.into() }))
        .collect()
}

fn run(ctx: &Ctx, input: &str) -> Result<CaseOutput, CaseError> {
    let tail = input.rsplit('/').next().unwrap_or(input);
    let mut inputs = ctx.inputs();
    match input.split('/').next() {
        Some("quantized") => quantized(ctx, &mut inputs, tail),
        Some("float") => float(ctx, &mut inputs, tail),
        _ => Err(CaseError::Harness(format!("no accepted input `{input}`"))),
    }
}

fn quantized(
    ctx: &Ctx,
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<CaseOutput, CaseError> {
    let payload = quantized_weight(inputs, affine(4, 64), DType::Bfloat16, &[N, K])?;
    let x = activation(inputs, DType::Bfloat16, &[2, K]);
    let bias_shape: Option<&[usize]> = match tail {
        "bias-scalar" => Some(&[]),
        "bias-1" => Some(&[1]),
        "bias-1xN" => Some(&[1, N]),
        "bias-per-row-2xN" => Some(&[2, N]),
        "bias-widens-2x1xN" => Some(&[2, 1, N]),
        "weight-batched-1xNxP" | "lora-b-rx1" => None,
        other => return Err(CaseError::Harness(format!("no accepted input `{other}`"))),
    };
    let bias = bias_shape.map(|s| activation(inputs, DType::Bfloat16, s));
    let mut tensors = layer_tensors(&payload, bias.as_ref())?;
    if tail == "weight-batched-1xNxP" {
        // One leading batch axis on weight, scales and biases alike.
        let batched = |t: &HostTensor| -> Result<HostTensor, CaseError> {
            let mut shape = vec![1];
            shape.extend(&t.shape);
            Ok(HostTensor::new(t.dtype, shape, t.bytes.clone())?)
        };
        tensors.weight = batched(&tensors.weight)?;
        tensors.scales = batched(&tensors.scales)?;
        tensors.biases = tensors.biases.as_ref().map(batched).transpose()?;
    }
    // lora_b [r, 1]: one output column, broadcast over the 32 outputs.
    let adapters: Vec<reference::quantized::Adapter> = if tail == "lora-b-rx1" {
        vec![reference::quantized::Adapter {
            lora_a: inputs.uniform(DType::Float32, &[K, 4], 0.1),
            lora_b: inputs.uniform(DType::Float32, &[4, 1], 0.1),
            scale: 2.0,
        }]
    } else {
        Vec::new()
    };
    let y = QuantizedLinear::from_arrays(
        tensors.weight.to_array(),
        tensors.scales.to_array(),
        tensors.biases.as_ref().map(HostTensor::to_array),
        tensors.spec,
        tensors.bias.as_ref().map(HostTensor::to_array),
    )
    .and_then(|mut layer| {
        for (i, a) in adapters.iter().enumerate() {
            let adapter =
                LoraAdapter::new(a.lora_a.to_array(), a.lora_b.to_array(), a.scale as f32)?;
            layer.attach_adapter(format!("a{i}"), adapter)?;
        }
        layer.forward(&x.to_array())
    })
    .map_err(port)?;
    let expected = if adapters.is_empty() {
        reference::quantized::quantized_linear_unchecked(ctx, &x, &tensors)?
    } else {
        reference::quantized::quantized_lora(ctx, &x, &tensors, &adapters)?
    };
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &expected);
    Ok(out)
}

fn float(
    ctx: &Ctx,
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<CaseOutput, CaseError> {
    let mut out = CaseOutput::new("mlx.core");
    match tail {
        "linear-int32-weight" | "linear-bias-per-row-2xN" => {
            let x = activation(inputs, DType::Float32, &[2, K]);
            let (weight, bias) = if tail == "linear-int32-weight" {
                (inputs.integers(DType::Int32, &[N, K], -8, 8), None)
            } else {
                (
                    activation(inputs, DType::Float32, &[N, K]),
                    Some(activation(inputs, DType::Float32, &[2, N])),
                )
            };
            let y = Linear::new(weight.to_array(), bias.as_ref().map(HostTensor::to_array))
                .and_then(|l| l.forward(&x.to_array()))
                .map_err(port)?;
            let expected =
                reference::quantized::float_linear_unchecked(ctx, &x, &weight, bias.as_ref())?;
            out.compare("y", &host(&y)?, &expected);
        }
        "switch-bias-Ex1" => {
            // x [B, L, K] and indices [B, L, top_k], driven as SwitchGLU drives
            // a projection (x expanded to [B, L, 1, 1, K], squeeze(-2) after).
            let x = activation(inputs, DType::Float32, &[1, 3, K]);
            let indices = inputs.integers(DType::Uint32, &[1, 3, 2], 0, E as i64);
            let weight = activation(inputs, DType::Float32, &[E, N, K]);
            let bias = activation(inputs, DType::Float32, &[E, 1]);
            let xa = x.to_array().expand_dims_axes(&[-2, -3])?;
            let y = SwitchLinear::new(weight.to_array(), Some(bias.to_array()))
                .and_then(|l| l.forward(&xa, &indices.to_array(), false))
                .map_err(port)?
                .squeeze_axes(&[-2])?;
            let expected = reference::quantized::float_switch_unchecked(
                ctx,
                &x,
                &indices,
                &weight,
                Some(&bias),
            )?;
            out.compare("y", &host(&y)?, &expected);
        }
        other => return Err(CaseError::Harness(format!("no accepted input `{other}`"))),
    }
    Ok(out)
}
