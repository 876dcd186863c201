//! Quantized and float layers: glue module `quantized_*`, `dense`, `smoke`.
//! Activations, indices and every tensor of a layer are perturbable; the
//! quantization spec, expert counts and flags are constants.

use layers::quantized::QuantSpec;
use oracle::HostTensor;

use super::{fixed, list, one_array, opt_tensor, tensor, tensors, varied, Fields, Param, Perturb};
use crate::case::{CaseError, Ctx, Expected};
use crate::exactness::quantized as q;
use crate::exactness::Calls;

/// One quantized layer's tensors and spec, as the reference's layer holds
/// them (`weight` uint32 packed, `scales`, `biases` for affine only, the
/// additive `bias`).
#[derive(Debug, Clone)]
pub struct QuantizedTensors {
    pub weight: HostTensor,
    pub scales: HostTensor,
    pub biases: Option<HostTensor>,
    pub bias: Option<HostTensor>,
    pub spec: QuantSpec,
}

impl QuantizedTensors {
    fn params(&self) -> Vec<Param> {
        vec![
            tensor("weight", &self.weight),
            tensor("scales", &self.scales),
            opt_tensor("biases", self.biases.as_ref()),
            opt_tensor("bias", self.bias.as_ref()),
            fixed("mode", self.spec.mode.as_str()),
            fixed("bits", self.spec.bits),
            fixed("group_size", self.spec.group_size),
        ]
    }
}

/// One LoRA adapter: `lora_a` [K, r], `lora_b` [r, N], its scale (a Python
/// float, as a config's `scale` reaches the reference).
#[derive(Debug, Clone)]
pub struct Adapter {
    pub lora_a: HostTensor,
    pub lora_b: HostTensor,
    pub scale: f64,
}

fn adapter_params(adapters: &[Adapter]) -> [Param; 3] {
    [
        tensors("lora_a", adapters.iter().map(|a| &a.lora_a)),
        tensors("lora_b", adapters.iter().map(|a| &a.lora_b)),
        varied(
            "lora_scales",
            oracle::Arg::List(
                adapters
                    .iter()
                    .map(|a| oracle::Arg::from(a.scale))
                    .collect(),
            ),
            Perturb::Fixed,
        ),
    ]
}

/// `mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size,
/// bits)` (affine).
pub fn smoke_quantized_matmul(
    ctx: &Ctx,
    x: &HostTensor,
    w: &HostTensor,
    scales: &HostTensor,
    biases: &HostTensor,
    group_size: i32,
    bits: i32,
) -> Result<Expected, CaseError> {
    const F: &str = "smoke_quantized_matmul";
    let params = vec![
        tensor("x", x),
        tensor("w", w),
        tensor("scales", scales),
        tensor("biases", biases),
        fixed("group_size", group_size),
        fixed("bits", bits),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let exact = calls.exact(F, |s, m| q::linear(s, m, "w", false))?;
    Ok(one_array(F, value)?.with_exact(exact))
}

/// `mlx.nn.QuantizedLinear.__call__(x)` holding `layer` (the exact value
/// broadcasts any bias `x + bias` broadcasts, and takes a weight with
/// leading axes of 1: `quantized/accepted`).
pub fn quantized_linear(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    let (value, calls) = quantized_linear_call(ctx, x, layer)?;
    let exact = calls.exact(QUANTIZED_LINEAR, |s, m| q::linear(s, m, "weight", false))?;
    Ok(one_array(QUANTIZED_LINEAR, value)?.with_exact(exact))
}

const QUANTIZED_LINEAR: &str = "quantized_linear";

fn quantized_linear_call(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<(oracle::Value, Calls), CaseError> {
    let mut params = vec![tensor("x", x)];
    params.extend(layer.params());
    ctx.call_sent(QUANTIZED_LINEAR, params)
}

/// [`quantized_linear`] bit-compared only: for measurements that compare
/// the reference with itself (a finder's batched call against its calls
/// per row), where no output of the case is exact-checked.
pub fn quantized_linear_unchecked(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    one_array(QUANTIZED_LINEAR, quantized_linear_call(ctx, x, layer)?.0)
}

/// The reference layer (LoRA-wrapped when `adapters` is not empty) called
/// once per row of `x`, rows concatenated.
pub fn quantized_linear_rows(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
    adapters: &[Adapter],
) -> Result<Expected, CaseError> {
    let (value, calls) = quantized_linear_rows_call(ctx, x, layer, adapters)?;
    let exact = calls.exact(QUANTIZED_LINEAR_ROWS, |s, m| {
        q::linear(s, m, "weight", true)
    })?;
    Ok(one_array(QUANTIZED_LINEAR_ROWS, value)?.with_exact(exact))
}

const QUANTIZED_LINEAR_ROWS: &str = "quantized_linear_rows";

fn quantized_linear_rows_call(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
    adapters: &[Adapter],
) -> Result<(oracle::Value, Calls), CaseError> {
    let mut params = vec![tensor("x", x)];
    params.extend(layer.params());
    params.extend(adapter_params(adapters));
    ctx.call_sent(QUANTIZED_LINEAR_ROWS, params)
}

/// [`quantized_linear_rows`] bit-compared only: for measurements that
/// compare the reference with itself (a finder's batched calls against its
/// calls per row), where no output of the case is exact-checked.
pub fn quantized_linear_rows_unchecked(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    one_array(
        QUANTIZED_LINEAR_ROWS,
        quantized_linear_rows_call(ctx, x, layer, &[])?.0,
    )
}

/// `mlx_lm.tuner.lora.LoRALinear.__call__`, nested once per adapter.
pub fn quantized_lora(
    ctx: &Ctx,
    x: &HostTensor,
    layer: &QuantizedTensors,
    adapters: &[Adapter],
) -> Result<Expected, CaseError> {
    const F: &str = "quantized_lora";
    let mut params = vec![tensor("x", x)];
    params.extend(layer.params());
    params.extend(adapter_params(adapters));
    let (value, calls) = ctx.call_sent(F, params)?;
    let exact = calls.exact(F, |s, m| q::linear(s, m, "weight", true))?;
    Ok(one_array(F, value)?.with_exact(exact))
}

/// mlx-lm's `QuantizedSwitchLinear.__call__` driven as `SwitchGLU` drives
/// it (`global_scale=None` dropped from its `gather_qmm` call).
/// `expert0_views`: the reference's own layer holds stride-0 views of
/// expert 0 (the broadcast finding).
pub fn quantized_switch(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    layer: &QuantizedTensors,
    sort: bool,
    expert0_views: bool,
) -> Result<Expected, CaseError> {
    const F: &str = "quantized_switch";
    let mut params = switch_params(x, indices, layer);
    params.push(fixed("sort", sort));
    params.push(fixed("expert0_views", expert0_views));
    let (value, calls) = ctx.call_sent(F, params)?;
    // The layer's meaning: stride-0 views of expert 0 stand for expert 0
    // everywhere (the exact value reads them as such).
    let exact = calls.exact_if_defined(F, |s, m| {
        if s.bool("expert0_views")? {
            q::switch_expert0(s, m)
        } else {
            q::switch(s, m)
        }
    })?;
    Ok(one_array(F, value)?.with_exact(exact))
}

/// [`quantized_switch`] (unsorted, contiguous experts) bit-compared only:
/// for measurements that compare the reference with itself.
pub fn quantized_switch_unchecked(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    const F: &str = "quantized_switch";
    let mut params = switch_params(x, indices, layer);
    params.push(fixed("sort", false));
    params.push(fixed("expert0_views", false));
    one_array(F, ctx.call_sent(F, params)?.0)
}

/// The reference projection (as [`quantized_switch`], unsorted) called once
/// per token of `x` `[T.., D]` / `indices` `[T.., top_k]`, tokens
/// concatenated: what a rows-independent engine must reproduce.
pub fn quantized_switch_rows(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    const F: &str = QUANTIZED_SWITCH_ROWS;
    let params = switch_params(x, indices, layer);
    let (value, calls) = ctx.call_sent(F, params)?;
    let exact = calls.exact_if_defined(F, q::switch)?;
    Ok(one_array(F, value)?.with_exact(exact))
}

const QUANTIZED_SWITCH_ROWS: &str = "quantized_switch_rows";

/// [`quantized_switch_rows`] bit-compared only: for measurements that
/// compare the reference with itself (see
/// [`quantized_linear_rows_unchecked`]).
pub fn quantized_switch_rows_unchecked(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<Expected, CaseError> {
    let params = switch_params(x, indices, layer);
    one_array(
        QUANTIZED_SWITCH_ROWS,
        ctx.call_sent(QUANTIZED_SWITCH_ROWS, params)?.0,
    )
}

/// Expert `indices` into the stack `weight` ([E, ..]): `--perturb` keeps
/// each a valid expert ([`Perturb::ExpertIndex`]; flipping the lowest bit
/// of every index read past the stack with one expert, an ERROR on CUDA).
fn expert_indices(indices: &HostTensor, weight: &HostTensor) -> Param {
    let experts = weight.shape.first().copied().unwrap_or(0);
    varied("indices", indices.clone(), Perturb::ExpertIndex(experts))
}

/// `x`, `indices` and the layer's tensors: what every switch call sends.
fn switch_params(x: &HostTensor, indices: &HostTensor, layer: &QuantizedTensors) -> Vec<Param> {
    let mut params = vec![tensor("x", x), expert_indices(indices, &layer.weight)];
    params.extend(layer.params());
    params
}

/// What `QuantizedSwitchLinear.__call__` does exactly as pinned.
#[derive(Debug, Clone)]
pub enum AsPinned {
    /// It raised: the exception's type and first line.
    Raised { kind: String, message: String },
    /// It returned.
    Returned(Expected),
}

/// `QuantizedSwitchLinear.__call__` exactly as pinned (no shim).
pub fn quantized_switch_as_pinned(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    layer: &QuantizedTensors,
) -> Result<AsPinned, CaseError> {
    const F: &str = "quantized_switch_as_pinned";
    let params = switch_params(x, indices, layer);
    let mut r = Fields::of(F, ctx.call(F, params)?)?;
    Ok(if r.bool("raised")? {
        AsPinned::Raised {
            kind: r.string("type")?,
            message: r.string("message")?,
        }
    } else {
        AsPinned::Returned(r.tensor("y")?)
    })
}

/// `mlx.nn.Linear` holding `weight` [N, K] and `bias`, on x (the exact
/// value broadcasts any bias `addmm` broadcasts and reads an integer weight
/// as x's dtype: `float/accepted`).
pub fn float_linear(
    ctx: &Ctx,
    x: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
) -> Result<Expected, CaseError> {
    let (value, calls) = float_linear_call(ctx, x, weight, bias)?;
    let exact = calls.exact(FLOAT_LINEAR, q::float_linear)?;
    Ok(one_array(FLOAT_LINEAR, value)?.with_exact(exact))
}

const FLOAT_LINEAR: &str = "float_linear";

fn float_linear_call(
    ctx: &Ctx,
    x: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
) -> Result<(oracle::Value, Calls), CaseError> {
    let params = vec![
        tensor("x", x),
        tensor("weight", weight),
        opt_tensor("bias", bias),
    ];
    ctx.call_sent(FLOAT_LINEAR, params)
}

/// mlx-lm's `SwitchLinear` holding `weight` [E, N, K] and `bias` ([E, N],
/// or [E, 1] broadcast over the outputs), driven as `SwitchGLU` drives it.
pub fn float_switch(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    sort: bool,
) -> Result<Expected, CaseError> {
    let (value, calls) = float_switch_call(ctx, x, indices, weight, bias, sort)?;
    let exact = calls.exact_if_defined(FLOAT_SWITCH, q::float_switch)?;
    Ok(one_array(FLOAT_SWITCH, value)?.with_exact(exact))
}

const FLOAT_SWITCH: &str = "float_switch";

fn float_switch_call(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    sort: bool,
) -> Result<(oracle::Value, Calls), CaseError> {
    let params = vec![
        tensor("x", x),
        expert_indices(indices, weight),
        tensor("weight", weight),
        opt_tensor("bias", bias),
        fixed("sort", sort),
    ];
    ctx.call_sent(FLOAT_SWITCH, params)
}

/// The outputs of a list of results (`None` items kept as `None`).
pub(crate) fn opt_arrays(
    function: &'static str,
    value: oracle::Value,
) -> Result<Vec<Option<Expected>>, CaseError> {
    list(function, value)?
        .into_iter()
        .map(|v| match v {
            oracle::Value::None => Ok(None),
            other => one_array(function, other).map(Some),
        })
        .collect()
}

/// `nn.QuantizedEmbedding`'s lookup and `as_linear`.
#[derive(Debug)]
pub struct EmbeddingOut {
    pub lookup: Expected,
    pub logits: Expected,
}

/// An `nn.QuantizedEmbedding` holding `table` (its `bias` must be None):
/// `__call__(ids)` and `as_linear(x)`.
pub fn quantized_embedding(
    ctx: &Ctx,
    ids: &HostTensor,
    x: &HostTensor,
    table: &QuantizedTensors,
) -> Result<EmbeddingOut, CaseError> {
    const F: &str = "quantized_embedding";
    let params = vec![
        tensor("ids", ids),
        tensor("x", x),
        fixed("weight", table.weight.clone()),
        fixed("scales", table.scales.clone()),
        fixed("biases", table.biases.clone()),
        fixed("group_size", table.spec.group_size),
        fixed("bits", table.spec.bits),
        fixed("mode", table.spec.mode.as_str()),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let lookup = calls.exact(F, q::embedding_lookup)?;
    let logits = calls.exact(F, q::embedding_as_linear)?;
    let mut r = Fields::of(F, value)?;
    Ok(EmbeddingOut {
        lookup: r.tensor("lookup")?.with_exact(lookup),
        logits: r.tensor("logits")?.with_exact(logits),
    })
}

/// nvfp4 with a global scale on a linear weight.
#[derive(Debug)]
pub struct GlobalScaleOut {
    pub global_scale: Expected,
    pub weight: Expected,
    pub scales: Expected,
    pub dequantized: Expected,
    /// The pinned MLX's refusal of `quantized_matmul(..., global_scale=)`
    /// ("" if it ran).
    pub matmul_refused: String,
}

/// `mx.quantize(w, group_size, 4, "nvfp4", global_scale=max|w|)`, its
/// `mx.dequantize`, and the `quantized_matmul` attempt. `port_codes` (the
/// port's weight, scales and global scale) give the exact oracle the port's
/// own dequantization.
pub fn quantized_global_scale(
    ctx: &Ctx,
    w: &HostTensor,
    x: &HostTensor,
    group_size: i32,
    port_codes: [&HostTensor; 3],
) -> Result<GlobalScaleOut, CaseError> {
    const F: &str = "quantized_global_scale";
    let params = vec![
        varied("w", w.clone(), Perturb::EveryElementCoarse),
        fixed("x", x.clone()),
        fixed("group_size", group_size),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let mut r = Fields::of(F, value)?;
    let (global_scale, weight, scales) = (
        r.tensor("global_scale")?,
        r.tensor("weight")?,
        r.tensor("scales")?,
    );
    let dequantized = r.tensor("dequantized")?;
    // The exact dequantization of the reference's own codes (quantization
    // itself picks codes: not arithmetic to bound; the bits check it).
    // The port's side from the port's own codes (`port_codes`: weight,
    // scales, global scale), which differ under `--perturb`.
    let harness = |e: exact::ExactError| CaseError::Harness(format!("`{F}`: {e}"));
    let out = crate::exactness::float_of(dequantized.tensor()).map_err(harness)?;
    let of = |[w, s, g]: [&HostTensor; 3]| {
        q::dequantize_global_scale(w, s, g, i64::from(group_size), out, calls.model)
            .map(std::sync::Arc::new)
            .map_err(harness)
    };
    let exact = crate::exactness::ExactPair {
        reference: of([weight.tensor(), scales.tensor(), global_scale.tensor()])?,
        port: of(port_codes)?,
        variants: Vec::new(),
    };
    let global_scale = global_scale.with_exact(calls.exact(F, |s, m| q::max_abs(s, m, 1))?);
    Ok(GlobalScaleOut {
        global_scale,
        weight,
        scales,
        dequantized: dequantized.with_exact(exact),
        matmul_refused: r.string("matmul_refused")?,
    })
}

/// mlx-lm's `SwitchLinear.to_quantized(..., global_scale=True)`.
#[derive(Debug)]
pub struct SwitchGlobalScaleOut {
    pub weight: Expected,
    pub scales: Expected,
    pub global_scale: Expected,
    /// The pinned MLX's refusal of the layer's `__call__` ("" if it ran).
    pub call_refused: String,
}

/// `SwitchLinear(...)` holding `w` `[E, out, in]`, quantized with one nvfp4
/// global scale per expert, then called on `x` with `indices`.
pub fn quantized_switch_global_scale(
    ctx: &Ctx,
    w: &HostTensor,
    x: &HostTensor,
    indices: &HostTensor,
    group_size: i32,
) -> Result<SwitchGlobalScaleOut, CaseError> {
    const F: &str = "quantized_switch_global_scale";
    let params = vec![
        varied("w", w.clone(), Perturb::EveryElementCoarse),
        fixed("x", x.clone()),
        fixed("indices", indices.clone()),
        fixed("group_size", group_size),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let experts = w.shape.first().copied().unwrap_or(1);
    let exact = calls.exact(F, |s, m| q::max_abs(s, m, experts))?;
    let mut r = Fields::of(F, value)?;
    Ok(SwitchGlobalScaleOut {
        weight: r.tensor("weight")?,
        scales: r.tensor("scales")?,
        global_scale: r.tensor("global_scale")?.with_exact(exact),
        call_refused: r.string("call_refused")?,
    })
}
