//! Case family `quantized`: the quantized layers of crate `layers` against
//! the pinned reference (mlx 0.32.2, mlx-lm 0.32.2).
//!
//! | sub-family | port | reference |
//! | --- | --- | --- |
//! | `quantized/linear` | `QuantizedLinear::forward` | `mlx.nn.QuantizedLinear.__call__` |
//! | `quantized/lora` | adapters, `exchange_payload` | `mlx_lm.tuner.lora.LoRALinear.__call__` |
//! | `quantized/rows` | `Forward::RowsIndependent` | the reference layer called once per row |
//! | `quantized/switch` | `QuantizedSwitchLinear::forward` | `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__` |
//! | `quantized/checkpoint` | `Checkpoint` + `resolve_quant_spec` + `from_checkpoint` | `mlx_lm.utils.load_model` |
//!
//! Weights are quantized once, by the port (`ffi::quantize` through
//! [`QuantizedPayload::quantize`]), and the very same packed tensors are
//! sent to the reference, which installs them in its own layer objects
//! (built by their own `__init__`). The activation `x` is always the first
//! tensor argument, and its element 0 is set to a large value so that the
//! perturbation proof (one flipped low bit of it) reaches the output.
//!
//! The glue functions live in the `# --- quantized families` section of
//! `crates/oracle/python/reference_glue.py`; the checkpoint fixtures and the
//! script that writes them in `fixtures/checkpoints/`.

use std::path::PathBuf;

use layers::quantized::{Mode, QuantSpec, QuantizedPayload};
use mlx_rs::Array;
use oracle::{compare, Arg, Comparison, DType, HostTensor, Value};

use crate::case::{Case, CaseError};
use crate::inputs::Inputs;

mod checkpoint;
mod float;
mod linear;
mod lora;
mod rows;
mod switch;

pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(linear::cases());
    cases.extend(lora::cases());
    cases.extend(rows::cases());
    cases.extend(switch::cases());
    cases.extend(checkpoint::cases());
    cases.extend(float::cases());
    cases
}

/// `mlx.nn.QuantizedLinear.__call__`, cited by several sub-families.
const QUANTIZED_LINEAR: &str = "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2)";

/// The float dtypes activations are tested in.
const FLOAT_DTYPES: [DType; 3] = DType::FLOATS;

/// Short dtype name for case names.
fn dtype_tag(dtype: DType) -> &'static str {
    dtype.tag()
}

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

/// A port error as a case error.
fn port(e: impl std::fmt::Display) -> CaseError {
    CaseError::Port(e.to_string())
}

/// Copies an mlx-rs array to the host.
fn host(a: &Array) -> Result<HostTensor, CaseError> {
    Ok(HostTensor::from_array(a)?)
}

/// Element 0 of every activation: large against the others (uniform in
/// `[-1, 1)`), so that `x[0] * w[j, 0]` is of the order of the output and a
/// flip of its lowest bit (the perturbation proof) changes the output bits
/// even in float32, where a one-ulp change of a small term is absorbed by
/// the rounding of the sum.
const FIRST: f32 = 32.0;

/// Seeded activations: uniform in `[-1, 1)` with element 0 set to [`FIRST`].
fn activation(inputs: &mut Inputs, dtype: DType, shape: &[usize]) -> HostTensor {
    let mut x = inputs.uniform(dtype, shape, 1.0);
    if !x.bytes.is_empty() {
        set_element(&mut x, 0, FIRST);
    }
    x
}

/// Overwrites element `i` of a float tensor with `v` rounded to its dtype.
fn set_element(t: &mut HostTensor, i: usize, v: f32) {
    let at = i * t.dtype.size();
    match t.dtype {
        DType::Float32 => t.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes()),
        DType::Bfloat16 => {
            t.bytes[at..at + 2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())
        }
        DType::Float16 => {
            t.bytes[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
        }
        other => panic!("set_element needs a float tensor, got {other:?}"),
    }
}

/// A seeded `[out, in]` float matrix quantized by the port.
fn quantized_weight(
    inputs: &mut Inputs,
    spec: QuantSpec,
    dtype: DType,
    leading: &[usize],
) -> Result<QuantizedPayload, CaseError> {
    let w = inputs.uniform(dtype, leading, 1.0);
    QuantizedPayload::quantize(&w.to_array(), spec).map_err(port)
}

/// `weight, scales, biases` (None for the modes without zero points) as
/// glue arguments.
fn payload_args(p: &QuantizedPayload) -> Result<[Arg; 3], CaseError> {
    Ok([
        Arg::from(host(p.weight())?),
        Arg::from(host(p.scales())?),
        match p.biases() {
            Some(b) => Arg::from(host(b)?),
            None => Arg::None,
        },
    ])
}

/// `mode, bits, group_size` as glue arguments.
fn spec_args(spec: QuantSpec) -> [Arg; 3] {
    [
        Arg::from(spec.mode.as_str()),
        Arg::from(spec.bits),
        Arg::from(spec.group_size),
    ]
}

/// An optional host tensor as a glue argument.
fn opt_arg(t: &Option<HostTensor>) -> Arg {
    t.clone().map_or(Arg::None, Arg::from)
}

/// The measured relation between two port results, deterministic and
/// small: equal or not, how many elements differ, the largest distance in
/// ulp, and where the first difference is.
fn relation(a: &HostTensor, b: &HostTensor) -> serde_json::Value {
    match compare(a, b) {
        Comparison::Equal => serde_json::json!({
            "equal": true, "differing": 0, "total": a.len(), "max_ulp": 0,
        }),
        Comparison::Differs(d) => serde_json::json!({
            "equal": false, "differing": d.count, "total": d.total, "max_ulp": d.max_ulp,
            "first_index": d.first_index,
        }),
        other => serde_json::json!({ "equal": false, "mismatch": other.summary() }),
    }
}

/// The dict a glue function returned.
fn dict(
    value: Value,
    function: &str,
) -> Result<std::collections::BTreeMap<String, Value>, CaseError> {
    match value {
        Value::Dict(map) => Ok(map),
        other => Err(CaseError::Harness(format!(
            "`{function}` returned {other:?}, not a dict"
        ))),
    }
}

/// The checkpoint fixtures written by `fixtures/checkpoints/write_fixture.py`
/// (under the workspace's or the bundle's `fixtures/`, see `crate::home`).
fn fixture_dir(name: &str) -> PathBuf {
    crate::home::Home::get()
        .fixtures_dir()
        .join("checkpoints")
        .join(name)
}
