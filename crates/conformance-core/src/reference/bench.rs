//! The reference side of the Rust/Python benchmarks (`benches/`): seconds
//! per forward, timed inside Python after one warm-up. Benchmarks run
//! outside cases, so these take the [`Oracle`] itself; nothing is perturbed.

use oracle::{Arg, HostTensor, Oracle, OracleError, Value};

use super::ints;
use super::position::Rotary;
use super::quantized::{Adapter, QuantizedTensors};

/// Which reference layer `quantized_bench` times.
#[derive(Debug, Clone, Copy)]
pub enum QuantizedLayer<'a> {
    /// `nn.QuantizedLinear` (LoRA-wrapped when `adapters` is not empty).
    Linear { adapters: &'a [Adapter] },
    /// `QuantizedSwitchLinear` driven as `SwitchGLU` drives it, unsorted.
    Switch { indices: &'a HostTensor },
}

fn seconds(function: &str, value: Value) -> Result<f64, OracleError> {
    match value {
        Value::Float(s) => Ok(s),
        other => Err(OracleError::Unsupported {
            case: "bench".into(),
            function: function.into(),
            what: format!("{other:?} instead of seconds"),
        }),
    }
}

/// Seconds per forward of the reference layer holding `tensors` on `x`.
pub fn quantized_bench(
    oracle: &Oracle,
    x: &HostTensor,
    tensors: &QuantizedTensors,
    layer: QuantizedLayer,
    iterations: usize,
) -> Result<f64, OracleError> {
    const F: &str = "quantized_bench";
    let (kind, adapters, indices): (&str, &[Adapter], Arg) = match layer {
        QuantizedLayer::Linear { adapters } => ("linear", adapters, Arg::None),
        QuantizedLayer::Switch { indices } => ("switch", &[], Arg::from(indices.clone())),
    };
    let list = |f: &dyn Fn(&Adapter) -> Arg| Arg::List(adapters.iter().map(f).collect());
    let kwargs = [
        ("kind", Arg::from(kind)),
        ("x", Arg::from(x.clone())),
        ("weight", Arg::from(tensors.weight.clone())),
        ("scales", Arg::from(tensors.scales.clone())),
        ("biases", Arg::from(tensors.biases.clone())),
        ("mode", Arg::from(tensors.spec.mode.as_str())),
        ("bits", Arg::from(tensors.spec.bits)),
        ("group_size", Arg::from(tensors.spec.group_size)),
        ("iterations", Arg::from(iterations)),
        ("lora_a", list(&|a| Arg::from(a.lora_a.clone()))),
        ("lora_b", list(&|a| Arg::from(a.lora_b.clone()))),
        ("lora_scales", list(&|a| Arg::from(a.scale))),
        ("indices", indices),
    ];
    seconds(F, oracle.call("bench/quantized", F, &[], &kwargs)?)
}

/// Seconds per `MRoPERotaryEmbedding.apply_rotary(q, k, position_ids)`.
pub fn position_bench_mrope(
    oracle: &Oracle,
    q: &HostTensor,
    k: &HostTensor,
    position_ids: &HostTensor,
    rotary: Rotary,
    iterations: usize,
) -> Result<f64, OracleError> {
    const F: &str = "position_bench_mrope";
    let kwargs = [
        ("q", Arg::from(q.clone())),
        ("k", Arg::from(k.clone())),
        ("position_ids", Arg::from(position_ids.clone())),
        ("head_dim", Arg::from(rotary.head_dim)),
        (
            "partial_rotary_factor",
            Arg::from(rotary.partial_rotary_factor),
        ),
        ("rope_theta", Arg::from(rotary.rope_theta)),
        ("mrope_section", ints(rotary.mrope_section)),
        ("iterations", Arg::from(iterations)),
    ];
    seconds(F, oracle.call("bench/position", F, &[], &kwargs)?)
}

/// Seconds per `apply_multidimensional_rope(inputs, positions,
/// base_frequency)`.
pub fn position_bench_rope2d(
    oracle: &Oracle,
    inputs: &HostTensor,
    positions: &HostTensor,
    base_frequency: f64,
    iterations: usize,
) -> Result<f64, OracleError> {
    const F: &str = "position_bench_rope2d";
    let kwargs = [
        ("inputs", Arg::from(inputs.clone())),
        ("positions", Arg::from(positions.clone())),
        ("base_frequency", Arg::from(base_frequency)),
        ("iterations", Arg::from(iterations)),
    ];
    seconds(F, oracle.call("bench/position", F, &[], &kwargs)?)
}

/// The decode-step stack both sides of `benches/serving.rs` build: `layers`
/// layers of Qwen3.5-sized quantized projections (see the glue's
/// `decode_bench` for the graph).
#[derive(Debug, Clone, Copy)]
pub struct DecodeStack<'a> {
    /// `dense` (gate/up/down MLP) or `moe` (router + switch projections).
    pub kind: &'a str,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
    pub moe_intermediate: usize,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub mrope_section: &'a [usize],
    /// The decoded token's position (all three mRoPE axes).
    pub position: i32,
    pub spec: layers::quantized::QuantSpec,
    /// `bfloat16`, `float16` or `float32`.
    pub dtype: &'a str,
    pub seed: u64,
}

/// Seconds per decode step of the reference stack.
pub fn decode_bench(
    oracle: &Oracle,
    s: &DecodeStack,
    iterations: usize,
) -> Result<f64, OracleError> {
    const F: &str = "decode_bench";
    let kwargs = [
        ("kind", Arg::from(s.kind)),
        ("layers", Arg::from(s.layers)),
        ("hidden", Arg::from(s.hidden)),
        ("heads", Arg::from(s.heads)),
        ("kv_heads", Arg::from(s.kv_heads)),
        ("head_dim", Arg::from(s.head_dim)),
        ("intermediate", Arg::from(s.intermediate)),
        ("experts", Arg::from(s.experts)),
        ("top_k", Arg::from(s.top_k)),
        ("moe_intermediate", Arg::from(s.moe_intermediate)),
        ("partial_rotary_factor", Arg::from(s.partial_rotary_factor)),
        ("rope_theta", Arg::from(s.rope_theta)),
        ("mrope_section", ints(s.mrope_section)),
        ("position", Arg::from(s.position)),
        ("mode", Arg::from(s.spec.mode.as_str())),
        ("bits", Arg::from(s.spec.bits)),
        ("group_size", Arg::from(s.spec.group_size)),
        ("dtype", Arg::from(s.dtype)),
        ("seed", Arg::from(s.seed as i64)),
        ("iterations", Arg::from(iterations)),
    ];
    seconds(F, oracle.call("bench/serving", F, &[], &kwargs)?)
}

/// The reference model's timings (`model_bench` in the glue): seconds of
/// `prefill`, `decode`, and `block_{k}` / `steps_{k}` for each k of `ks`.
pub fn model_bench(
    oracle: &Oracle,
    directory: &std::path::Path,
    prompt: &HostTensor,
    ks: &[usize],
    iterations: usize,
) -> Result<std::collections::BTreeMap<String, f64>, OracleError> {
    const F: &str = "model_bench";
    let kwargs = [
        ("directory", Arg::from(directory.to_string_lossy().as_ref())),
        ("prompt", Arg::from(prompt.clone())),
        ("ks", ints(ks)),
        ("iterations", Arg::from(iterations)),
    ];
    match oracle.call("bench/model", F, &[], &kwargs)? {
        Value::Dict(map) => map
            .into_iter()
            .map(|(k, v)| Ok((k, seconds(F, v)?)))
            .collect(),
        other => Err(OracleError::Unsupported {
            case: "bench".into(),
            function: F.into(),
            what: format!("{other:?} instead of a dict of seconds"),
        }),
    }
}
