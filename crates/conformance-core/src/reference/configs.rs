//! Real model configurations: mlx-vlm's config classes reading a
//! `config.json` (as `mlx_vlm.utils.load_model` does), and the layers built
//! from what they read. The config text is perturbable
//! ([`Perturb::JsonNumbers`]); tensors too.

use oracle::{DType, HostTensor, Value};

use super::{fixed, list, tensor, varied, Fields, Param, Perturb};
use crate::case::{CaseError, Ctx, Expected};
use crate::reference::position::{rope2d_exact, MropeExact, Prompt, RotaryArgs};

/// A float result as the bits of its f64 (int64), so it compares like any
/// other output.
fn f64_bits(function: &'static str, values: Value) -> Result<Expected, CaseError> {
    Expected::derived(&values, |values| {
        let Value::List(items) = values else {
            return Err(format!(
                "`{function}` returned {values:?}, not a list of floats"
            ));
        };
        let bits = items
            .iter()
            .map(|v| match v {
                Value::Float(f) => Ok(f.to_bits()),
                Value::Int(i) => Ok((*i as f64).to_bits()),
                other => Err(format!("`{function}` returned {other:?} for a float")),
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let bytes = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        HostTensor::new(DType::Int64, vec![bits.len()], bytes).map_err(|e| e.to_string())
    })
    .map_err(CaseError::Harness)
}

fn config(config_text: &str) -> Param {
    varied("config_text", config_text.to_owned(), Perturb::JsonNumbers)
}

/// What mlx-vlm's Qwen3.5 config classes read.
#[derive(Debug)]
pub struct Qwen3_5Read {
    /// int64 [head_dim, rotary dims, image, video, vision_start token ids,
    /// spatial_merge_size, heads, kv heads, hidden_size, layers].
    pub fields: Expected,
    pub mrope_section: Expected,
    /// int64 bits of the f64s [rope_theta, partial_rotary_factor].
    pub floats: Expected,
    /// int64 [1]: 1 when `rope_theta` is a JSON integer.
    pub theta_is_int: Expected,
}

/// `_config_model(config_text)` of a Qwen3.5 config, then the fields the
/// text attention and the rope index read.
pub fn config_qwen3_5(ctx: &Ctx, config_text: &str) -> Result<Qwen3_5Read, CaseError> {
    const F: &str = "config_qwen3_5";
    let mut r = Fields::of(F, ctx.call(F, vec![config(config_text)])?)?;
    Ok(Qwen3_5Read {
        fields: r.tensor("fields")?,
        mrope_section: r.tensor("mrope_section")?,
        floats: f64_bits(F, r.value("floats")?)?,
        theta_is_int: r.tensor("theta_is_int")?,
    })
}

/// What mlx-lm's Qwen3.5 model args read from the same config.
#[derive(Debug)]
pub struct Qwen3_5MlxLmRead {
    /// int64 [head_dim, rotary dims].
    pub fields: Expected,
    /// int64 bits of the f64s [rope_theta, partial_rotary_factor].
    pub floats: Expected,
    /// `rope_scaling`'s type (what `initialize_rope` builds).
    pub rope_type: String,
}

/// `mlx_lm.models.<model_type>.ModelArgs` then `qwen3_5.TextModelArgs` of
/// the config: what mlx-lm's attention builds its rotary from.
pub fn config_qwen3_5_mlx_lm(ctx: &Ctx, config_text: &str) -> Result<Qwen3_5MlxLmRead, CaseError> {
    const F: &str = "config_qwen3_5_mlx_lm";
    // Findings only: the config stays fixed.
    let mut r = Fields::of(
        F,
        ctx.call(F, vec![fixed("config_text", config_text.to_owned())])?,
    )?;
    Ok(Qwen3_5MlxLmRead {
        fields: r.tensor("fields")?,
        floats: f64_bits(F, r.value("floats")?)?,
        rope_type: r.string("rope_type")?,
    })
}

/// A quantization block's keys, as written (what mlx-lm's loader looks
/// module paths up in) and as mlx-vlm's `ModelConfig` leaves them.
#[derive(Debug)]
pub struct QuantizationKeys {
    pub written: Vec<String>,
    pub mlx_vlm: Vec<String>,
}

/// `config_quantization_keys(config_text)`.
pub fn config_quantization_keys(
    ctx: &Ctx,
    config_text: &str,
) -> Result<QuantizationKeys, CaseError> {
    const F: &str = "config_quantization_keys";
    let mut r = Fields::of(
        F,
        ctx.call(F, vec![fixed("config_text", config_text.to_owned())])?,
    )?;
    Ok(QuantizationKeys {
        written: r.strings("written")?,
        mlx_vlm: r.strings("mlx_vlm")?,
    })
}

/// The rope index and mRoPE apply, with the config's tokens and rotary.
#[derive(Debug)]
pub struct Qwen3_5Mrope {
    pub path: String,
    pub q: Expected,
    pub k: Expected,
    pub position_ids: Expected,
    pub rope_deltas: Expected,
}

/// `get_rope_index` with the config as the model's config, then the text
/// attention's rotary (built from the config) on q and k.
pub fn config_qwen3_5_mrope(
    ctx: &Ctx,
    config_text: &str,
    q: &HostTensor,
    k: &HostTensor,
    prompt: Prompt,
    path: &str,
) -> Result<Qwen3_5Mrope, CaseError> {
    const F: &str = "config_qwen3_5_mrope";
    // The config stays fixed here: q and k are what the proof perturbs.
    let mut params = vec![
        fixed("config_text", config_text.to_owned()),
        tensor("q", q),
        tensor("k", k),
    ];
    params.extend(prompt.params());
    params.push(fixed("path", path));
    let (value, calls) = ctx.call_sent(F, params)?;
    let rotary = qwen3_5_rotary(ctx, config_text)?;
    let mut r = Fields::of(F, value)?;
    let path = r.string("path")?;
    let position_ids = r.tensor("position_ids")?;
    let exact = MropeExact::new(F, &calls, &path, position_ids.tensor().clone(), false)?
        .with_rotary(rotary);
    Ok(Qwen3_5Mrope {
        q: r.tensor("q")?.with_exact(exact.rotated(&calls, "q")?),
        k: r.tensor("k")?.with_exact(exact.rotated(&calls, "k")?),
        path,
        position_ids,
        rope_deltas: r.tensor("rope_deltas")?,
    })
}

/// For the exact oracle: the rotary the reference's config classes read
/// from the (fixed) config text, by the reference's own `config_qwen3_5`
/// (the read itself is bit-compared by the `configs/` read cases).
fn qwen3_5_rotary(ctx: &Ctx, config_text: &str) -> Result<RotaryArgs, CaseError> {
    const F: &str = "config_qwen3_5";
    let mut r = Fields::of(
        F,
        ctx.call(F, vec![fixed("config_text", config_text.to_owned())])?,
    )?;
    let fields = r.tensor("fields")?.into_tensor();
    let section = r.tensor("mrope_section")?.into_tensor();
    let theta = floats(F, r.value("floats")?)?;
    let (Some(&rope_theta), true) = (theta.first(), fields.len() > 1) else {
        return Err(CaseError::Harness(format!("`{F}` read no rotary")));
    };
    Ok(RotaryArgs {
        rotary_dim: fields.value(1) as usize,
        rope_theta,
        mrope_section: (0..section.len())
            .map(|i| section.value(i) as usize)
            .collect(),
    })
}

/// A list of Python floats.
fn floats(function: &'static str, values: Value) -> Result<Vec<f64>, CaseError> {
    list(function, values)?
        .into_iter()
        .map(|v| match v {
            Value::Float(f) => Ok(f),
            Value::Int(i) => Ok(i as f64),
            other => Err(CaseError::Harness(format!(
                "`{function}` returned {other:?} for a float"
            ))),
        })
        .collect()
}

/// What mlx-vlm's Gemma 4 vision config reads.
#[derive(Debug)]
pub struct Gemma4VisionRead {
    /// int64 [head_dim, heads, kv heads, hidden_size, patch_size].
    pub fields: Expected,
    /// int64 bits of the f64 [rope_theta].
    pub floats: Expected,
}

/// `_config_model(config_text).vision_config`'s fields.
pub fn config_gemma4_vision(ctx: &Ctx, config_text: &str) -> Result<Gemma4VisionRead, CaseError> {
    const F: &str = "config_gemma4_vision";
    let mut r = Fields::of(F, ctx.call(F, vec![config(config_text)])?)?;
    Ok(Gemma4VisionRead {
        fields: r.tensor("fields")?,
        floats: f64_bits(F, r.value("floats")?)?,
    })
}

/// `gemma4.vision.apply_multidimensional_rope(inputs, positions,
/// rope_theta)` with the config's theta.
pub fn config_gemma4_rope2d(
    ctx: &Ctx,
    config_text: &str,
    inputs: &HostTensor,
    positions: &HostTensor,
) -> Result<Expected, CaseError> {
    const F: &str = "config_gemma4_rope2d";
    let params = vec![
        fixed("config_text", config_text.to_owned()),
        tensor("inputs", inputs),
        fixed("positions", positions.clone()),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let theta = gemma4_rope_theta(ctx, config_text)?;
    let exact = calls.exact(F, |sent, model| rope2d_exact(sent, theta, model))?;
    Ok(super::one_array(F, value)?.with_exact(exact))
}

/// For the exact oracle: the vision `rope_theta` the reference's config
/// classes read from the (fixed) config text, by its own
/// `config_gemma4_vision`.
fn gemma4_rope_theta(ctx: &Ctx, config_text: &str) -> Result<f64, CaseError> {
    const F: &str = "config_gemma4_vision";
    let mut r = Fields::of(
        F,
        ctx.call(F, vec![fixed("config_text", config_text.to_owned())])?,
    )?;
    floats(F, r.value("floats")?)?
        .first()
        .copied()
        .ok_or_else(|| CaseError::Harness(format!("`{F}` read no rope_theta")))
}
