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
//!
//! Every output is exact-checked like the plain layer's (the same kernel
//! model, Cpu and Gpu; `exact::matmul`): the math is the plain layer's,
//! only the layouts differ, and the exact value follows them (a bias
//! broadcast as `x + bias` / `addmm` broadcasts it, a weight with a leading
//! axis of 1, `lora_b` of one column broadcast over the outputs, an int32
//! weight read as float32, a bias `[E, 1]` broadcast over each expert's
//! outputs).

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

/// One quantized accepted input's tensors, drawn as the case draws them.
struct QuantizedInputs {
    x: HostTensor,
    tensors: super::QuantizedTensors,
    adapters: Vec<reference::quantized::Adapter>,
}

fn quantized_inputs(
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<QuantizedInputs, CaseError> {
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
    let adapters = if tail == "lora-b-rx1" {
        vec![reference::quantized::Adapter {
            lora_a: inputs.uniform(DType::Float32, &[K, 4], 0.1),
            lora_b: inputs.uniform(DType::Float32, &[4, 1], 0.1),
            scale: 2.0,
        }]
    } else {
        Vec::new()
    };
    Ok(QuantizedInputs {
        x,
        tensors,
        adapters,
    })
}

/// The port's layer built from the tensors, on x.
fn quantized_port(q: &QuantizedInputs) -> Result<HostTensor, CaseError> {
    let t = &q.tensors;
    let y = QuantizedLinear::from_arrays(
        t.weight.to_array(),
        t.scales.to_array(),
        t.biases.as_ref().map(HostTensor::to_array),
        t.spec,
        t.bias.as_ref().map(HostTensor::to_array),
    )
    .and_then(|mut layer| {
        for (i, a) in q.adapters.iter().enumerate() {
            let adapter =
                LoraAdapter::new(a.lora_a.to_array(), a.lora_b.to_array(), a.scale as f32)?;
            layer.attach_adapter(format!("a{i}"), adapter)?;
        }
        layer.forward(&q.x.to_array())
    })
    .map_err(port)?;
    host(&y)
}

fn quantized(
    ctx: &Ctx,
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<CaseOutput, CaseError> {
    let q = quantized_inputs(inputs, tail)?;
    let y = quantized_port(&q)?;
    let expected = if q.adapters.is_empty() {
        reference::quantized::quantized_linear(ctx, &q.x, &q.tensors)?
    } else {
        reference::quantized::quantized_lora(ctx, &q.x, &q.tensors, &q.adapters)?
    };
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &expected);
    Ok(out)
}

/// One float accepted input's tensors, drawn as the case draws them.
enum FloatInputs {
    Linear {
        x: HostTensor,
        weight: HostTensor,
        bias: Option<HostTensor>,
    },
    /// x [B, L, K] and indices [B, L, top_k], driven as SwitchGLU drives a
    /// projection (x expanded to [B, L, 1, 1, K], squeeze(-2) after).
    Switch {
        x: HostTensor,
        indices: HostTensor,
        weight: HostTensor,
        bias: HostTensor,
    },
}

fn float_inputs(
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<FloatInputs, CaseError> {
    Ok(match tail {
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
            FloatInputs::Linear { x, weight, bias }
        }
        "switch-bias-Ex1" => FloatInputs::Switch {
            x: activation(inputs, DType::Float32, &[1, 3, K]),
            indices: inputs.integers(DType::Uint32, &[1, 3, 2], 0, E as i64),
            weight: activation(inputs, DType::Float32, &[E, N, K]),
            bias: activation(inputs, DType::Float32, &[E, 1]),
        },
        other => return Err(CaseError::Harness(format!("no accepted input `{other}`"))),
    })
}

fn float_port(f: &FloatInputs) -> Result<HostTensor, CaseError> {
    let y = match f {
        FloatInputs::Linear { x, weight, bias } => {
            Linear::new(weight.to_array(), bias.as_ref().map(HostTensor::to_array))
                .and_then(|l| l.forward(&x.to_array()))
                .map_err(port)?
        }
        FloatInputs::Switch {
            x,
            indices,
            weight,
            bias,
        } => {
            let xa = x.to_array().expand_dims_axes(&[-2, -3])?;
            SwitchLinear::new(weight.to_array(), Some(bias.to_array()))
                .and_then(|l| l.forward(&xa, &indices.to_array(), false))
                .map_err(port)?
                .squeeze_axes(&[-2])?
        }
    };
    host(&y)
}

fn float(
    ctx: &Ctx,
    inputs: &mut crate::inputs::Inputs,
    tail: &str,
) -> Result<CaseOutput, CaseError> {
    let f = float_inputs(inputs, tail)?;
    let y = float_port(&f)?;
    let expected = match &f {
        FloatInputs::Linear { x, weight, bias } => {
            reference::quantized::float_linear(ctx, x, weight, bias.as_ref())?
        }
        FloatInputs::Switch {
            x,
            indices,
            weight,
            bias,
        } => reference::quantized::float_switch(ctx, x, indices, weight, Some(bias), false)?,
    };
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &expected);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use exact::{Exact, ExactError, Model};
    use oracle::Arg;

    use super::*;
    use crate::exactness::faults::{inject_all, FaultKind, Variant};
    use crate::exactness::{quantized as q, ExactCheck, ExactClass, ExactPair, Sent};
    use crate::inputs::Inputs;

    type ExactFn = fn(&Sent, Model) -> Result<Exact, ExactError>;

    /// The glue's arguments for an accepted input (as the reference
    /// receives them), MLX's output for it (the port's layer on this
    /// machine's CPU: the same kernels, bit-equal to the reference in the
    /// suite), and the exact value's function.
    fn drawn(seed: u64, name: &str) -> (HostTensor, Sent, ExactFn) {
        let tail = name.rsplit('/').next().unwrap();
        let mut inputs = Inputs::new(seed);
        let opt = |t: Option<&HostTensor>| t.cloned().map_or(Arg::None, Arg::Tensor);
        if name.starts_with("quantized/") {
            let qi = quantized_inputs(&mut inputs, tail).unwrap();
            let t = &qi.tensors;
            let mut args = vec![
                ("x", Arg::Tensor(qi.x.clone())),
                ("weight", Arg::Tensor(t.weight.clone())),
                ("scales", Arg::Tensor(t.scales.clone())),
                ("biases", opt(t.biases.as_ref())),
                ("bias", opt(t.bias.as_ref())),
                ("mode", Arg::from(t.spec.mode.as_str())),
                ("bits", Arg::from(t.spec.bits)),
                ("group_size", Arg::from(t.spec.group_size)),
            ];
            let lora = !qi.adapters.is_empty();
            let list = |f: fn(&reference::quantized::Adapter) -> Arg| {
                Arg::List(qi.adapters.iter().map(f).collect())
            };
            args.push(("lora_a", list(|a| Arg::Tensor(a.lora_a.clone()))));
            args.push(("lora_b", list(|a| Arg::Tensor(a.lora_b.clone()))));
            args.push(("lora_scales", list(|a| Arg::from(a.scale))));
            let f: ExactFn = if lora {
                |s, m| q::linear(s, m, "weight", true)
            } else {
                |s, m| q::linear(s, m, "weight", false)
            };
            (quantized_port(&qi).unwrap(), Sent::new(args), f)
        } else {
            let fi = float_inputs(&mut inputs, tail).unwrap();
            let y = float_port(&fi).unwrap();
            match fi {
                FloatInputs::Linear { x, weight, bias } => {
                    let args = vec![
                        ("x", Arg::Tensor(x)),
                        ("weight", Arg::Tensor(weight)),
                        ("bias", opt(bias.as_ref())),
                    ];
                    (y, Sent::new(args), q::float_linear)
                }
                FloatInputs::Switch {
                    x,
                    indices,
                    weight,
                    bias,
                } => {
                    let args = vec![
                        ("x", Arg::Tensor(x)),
                        ("indices", Arg::Tensor(indices)),
                        ("weight", Arg::Tensor(weight)),
                        ("bias", Arg::Tensor(bias)),
                        ("sort", Arg::Bool(false)),
                    ];
                    (y, Sent::new(args), q::float_switch)
                }
            }
        }
    }

    /// Issue 41: every `quantized/accepted` and `float/accepted` output
    /// (broadcast biases, a batched weight, lora_b of one column, an int32
    /// weight, an expert bias [E, 1]) is within the plain layer's exact
    /// bound over 32 seeds on MLX's CPU kernels (ratio < 1), and every
    /// fault of the catalogue that applies is flagged, at every seed.
    #[test]
    fn accepted_layouts_are_within_the_exact_bound_and_planted_faults_are_flagged() {
        let mut worst = 0f64;
        let mut planted = 0;
        for seed in 0..32u64 {
            for &(name, _) in ACCEPTED {
                let (y, sent, f) = drawn(seed, name);
                let e = f(&sent, Model::Cpu).unwrap();
                assert_eq!(e.shape, y.shape, "{name}");
                // The Gpu model takes the same layouts (no harness error
                // on a GPU run).
                assert_eq!(f(&sent, Model::Gpu).unwrap().shape, y.shape, "{name}");
                let variants = FaultKind::ALL
                    .into_iter()
                    .filter_map(|kind| {
                        let value = f(&kind.mutate(&sent)?, Model::Cpu).ok()?.value;
                        Some(Variant { kind, value })
                    })
                    .collect();
                let pair = ExactPair {
                    reference: Arc::new(e.clone()),
                    port: Arc::new(e),
                    variants,
                };
                let c = ExactCheck::measure(&y, &y, &pair, true);
                let at = format!("seed {seed} {name}");
                assert_eq!(c.class, ExactClass::Within, "{at}: {}", c.line("y"));
                assert!(c.informative, "{at}");
                worst = worst.max(c.reference.max_ratio);
                for fault in inject_all("y", &y, &pair) {
                    assert!(fault.flagged, "{at}: {fault:?}");
                    planted += 1;
                }
            }
        }
        println!("worst ratio {worst}, {planted} faults flagged");
        assert!(worst < 1.0 && planted > 0);
    }
}
