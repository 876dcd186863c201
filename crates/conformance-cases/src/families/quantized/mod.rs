//! Case family `quantized`: the quantized layers of crate `layers` against
//! the pinned reference (mlx 0.32.2, mlx-lm 0.32.2).
//!
//! | sub-family | port | reference |
//! | --- | --- | --- |
//! | `quantized/linear` | `QuantizedLinear::forward` | `mlx.nn.QuantizedLinear.__call__` |
//! | `quantized/lora` | adapters, `exchange_payload` | `mlx_lm.tuner.lora.LoRALinear.__call__` |
//! | `quantized/rows` | `Forward::RowsIndependent` | the reference layer called once per row |
//! | `quantized/rows-regime` | the shipped `RowsRegime`: chunked rows-independent linear and switch forwards, and its finder | the reference called once per row / token; its batched call against that |
//! | `quantized/switch` | `QuantizedSwitchLinear::forward` | `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__` |
//! | `quantized/checkpoint` | `Checkpoint` + `resolve_quant_spec` + `from_checkpoint` | `mlx_lm.utils.load_model` |
//! | `quantized/embedding` | `QuantizedEmbedding::{lookup, as_linear}` | `mlx.nn.QuantizedEmbedding.__call__`, `.as_linear` |
//! | `quantized/global-scale` | nvfp4 global scale: payload, switch quantize, refused forwards | `mx.quantize`/`mx.dequantize(global_scale=)`, `SwitchLinear.to_quantized(global_scale=True)` |
//! | `quantized/adapters` | `AdapterSet::open`, `lora::fuse` | `mlx_lm.tuner.utils.load_adapters`, `mlx_vlm.trainer.utils.apply_lora_layers`, `LoRALinear.fuse` |
//!
//! Weights are quantized once, by the port (`ffi::quantize` through
//! [`QuantizedPayload::quantize`]), and the very same packed tensors are
//! sent to the reference, which installs them in its own layer objects
//! (built by their own `__init__`). The proof mode perturbs the activation
//! and every tensor of the layer (see `crate::reference::quantized`).
//!
//! The reference side is `crate::reference::{quantized, checkpoint}`; the
//! checkpoint fixtures and the script that writes them are in
//! `fixtures/checkpoints/`.

use std::path::PathBuf;

use layers::quantized::{Mode, QuantSpec, QuantizedPayload};
use oracle::{DType, HostTensor};

use super::support::{dtype_tag, host, port};
use crate::case::CaseError;
use crate::inputs::Inputs;
use crate::reference::quantized::QuantizedTensors;
use crate::relation::Relation;

pub mod accepted;
pub mod adapters;
pub mod checkpoint;
pub mod embedding;
#[cfg(test)]
mod exact_faults;
pub mod float;
pub mod global_scale;
pub mod linear;
pub mod lora;
mod modules;
pub mod refused;
pub mod rows;
pub mod rows_regime;
pub mod switch;

pub fn descriptions() -> Vec<crate::families::describe::Described> {
    let mut cases = Vec::new();
    cases.extend(linear::descriptions());
    cases.extend(lora::descriptions());
    cases.extend(rows::descriptions());
    cases.extend(rows_regime::descriptions());
    cases.extend(switch::descriptions());
    cases.extend(checkpoint::descriptions());
    cases.extend(float::descriptions());
    cases.extend(embedding::descriptions());
    cases.extend(global_scale::descriptions());
    cases.extend(adapters::descriptions());
    cases.extend(refused::descriptions());
    cases.extend(accepted::descriptions());
    cases
}

/// `mlx.nn.QuantizedLinear.__call__`, cited by several sub-families.
const QUANTIZED_LINEAR: &str = "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2)";

/// The float dtypes activations are tested in.
const FLOAT_DTYPES: [DType; 3] = DType::FLOATS;

/// A spec the reference accepts (panics otherwise: a registry typo).
fn spec(mode: Mode, bits: i32, group_size: i32) -> QuantSpec {
    QuantSpec::new(mode, bits, group_size).expect("a spec mx.quantize accepts")
}

fn affine(bits: i32, group_size: i32) -> QuantSpec {
    spec(Mode::Affine, bits, group_size)
}

/// The default spec of a mode (mxfp4 4/32, mxfp8 8/32, nvfp4 4/16).
fn mode_default(mode: Mode) -> QuantSpec {
    QuantSpec::defaults(mode)
}

/// Every `(mode, bits, group_size)` `mx.quantize` accepts (mlx 0.32.2):
/// affine bits {2,3,4,5,6,8} x group {32,64,128}, mxfp4 4/32, mxfp8 8/32,
/// nvfp4 4/16.
fn all_specs() -> Vec<QuantSpec> {
    let mut specs = Vec::new();
    for bits in [2, 3, 4, 5, 6, 8] {
        for group_size in [32, 64, 128] {
            specs.push(affine(bits, group_size));
        }
    }
    specs.extend([Mode::Mxfp4, Mode::Mxfp8, Mode::Nvfp4].map(mode_default));
    specs
}

/// The specs one case per mode covers.
fn mode_specs() -> [QuantSpec; 4] {
    [
        affine(4, 64),
        mode_default(Mode::Mxfp4),
        mode_default(Mode::Mxfp8),
        mode_default(Mode::Nvfp4),
    ]
}

/// The base input width of a spec: three groups, so never a multiple of a
/// larger power of two than the group size (96 for group 32, 48 for nvfp4's
/// 16, 192 for 64, 384 for 128), and `K * bits` a multiple of 32 for every
/// bit width.
fn base_k(spec: QuantSpec) -> usize {
    3 * spec.group_size as usize
}

/// Seeded activations: uniform in `[-1, 1)`.
fn activation(inputs: &mut Inputs, dtype: DType, shape: &[usize]) -> HostTensor {
    inputs.uniform(dtype, shape, 1.0)
}

/// A seeded `[out, in]` float matrix quantized by the port.
fn quantized_weight(
    inputs: &mut Inputs,
    spec: QuantSpec,
    dtype: DType,
    leading: &[usize],
) -> Result<QuantizedPayload, CaseError> {
    let w = inputs.uniform(dtype, leading, 1.0);
    quantize(&w.to_array(), spec)
}

/// The port's quantization of a case's float weight. MLX's own quantize
/// raising ([`LayerError::Mlx`]: `mx.quantize` refusing the weight, e.g.
/// nvfp4 with an odd number of 16-element groups) is the reference's
/// library refusing it, since the reference quantizes with the same
/// primitive: a harness error (the explorer's `Error`, a finding about
/// MLX), not the port raising where the reference computes.
fn quantize(w: &mlx_rs::Array, spec: QuantSpec) -> Result<QuantizedPayload, CaseError> {
    QuantizedPayload::quantize(w, spec).map_err(|e| match e {
        layers::quantized::LayerError::Mlx(e) => CaseError::Harness(format!(
            "mx.quantize (MLX itself, which the reference quantizes with too) refused the weight: {e}"
        )),
        e => port(e),
    })
}

/// A payload and an additive bias as the reference's layer receives them.
fn layer_tensors(
    p: &QuantizedPayload,
    bias: Option<&HostTensor>,
) -> Result<QuantizedTensors, CaseError> {
    Ok(QuantizedTensors {
        weight: host(p.weight())?,
        scales: host(p.scales())?,
        biases: p.biases().map(host).transpose()?,
        bias: bias.cloned(),
        spec: p.spec(),
    })
}

/// The measured relation between two port results (the one vocabulary of
/// [`crate::relation`]).
fn relation(a: &HostTensor, b: &HostTensor) -> serde_json::Value {
    Relation::of(a, b).json()
}

/// The checkpoint fixtures written by `fixtures/checkpoints/write_fixture.py`
/// (under the workspace's or the bundle's `fixtures/`, see `crate::home`).
/// The directory of checkpoint fixture `name` (one of
/// `checkpoint::FIXTURES`: a description names it as data).
fn fixture_dir(name: &str) -> Result<PathBuf, crate::case::CaseError> {
    if !checkpoint::FIXTURES.contains(&name) {
        return Err(crate::case::CaseError::Harness(format!(
            "checkpoint fixture `{name}` is none of {}",
            checkpoint::FIXTURES.join(", ")
        )));
    }
    Ok(crate::home::Home::get()
        .fixtures_dir()
        .join("checkpoints")
        .join(name))
}
