//! The whole Qwen3.5 text decoder: mlx-vlm 0.7.6's own model on a
//! checkpoint directory (glue `model_generate`, composed as `load_model`).

use std::collections::BTreeMap;
use std::path::Path;

use oracle::{HostTensor, Value};

use super::{fixed, tensor, Fields};
use crate::case::{CaseError, Ctx, Expected};

/// One greedy generation of the reference.
pub struct Generation {
    /// Logits of every prompt position `[P, vocab]`.
    pub prefill: Expected,
    /// Logits of every decode step `[steps, vocab]`.
    pub decode: Expected,
    /// The greedy tokens `[steps + 1]` (int32).
    pub tokens: Expected,
    /// Each KV cache's `[offset, keys.shape[2]]` at the end.
    pub kv_layout: Expected,
    /// Intermediates of the traced call, by point name.
    pub trace: Option<BTreeMap<String, HostTensor>>,
}

/// `model_generate`: `prompt` int32 `[1, P]` prefilled in chunks of
/// `chunk` (0: at once), then `steps` greedy decode steps; call
/// `trace_step` (0 = first prefill chunk; negative: none) traced.
pub fn generate(
    ctx: &Ctx,
    directory: &Path,
    prompt: &HostTensor,
    steps: usize,
    chunk: usize,
    trace_step: i64,
) -> Result<Generation, CaseError> {
    const F: &str = "model_generate";
    let params = vec![
        fixed("directory", directory.to_string_lossy().as_ref()),
        tensor("prompt", prompt),
        fixed("steps", steps),
        fixed("chunk", chunk),
        fixed("trace_step", trace_step),
    ];
    let value = ctx.call(F, params)?;
    let mut r = Fields::of(F, value)?;
    let trace = match r.value("trace")? {
        Value::None => None,
        Value::Dict(map) => Some(
            map.into_iter()
                .map(|(k, v)| match v {
                    Value::Tensor(t) => Ok((k, t)),
                    _ => Err(CaseError::Harness(format!(
                        "`{F}` trace point `{k}` is not an array"
                    ))),
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err(CaseError::Harness(format!("`{F}` trace is not a dict"))),
    };
    Ok(Generation {
        kv_layout: r.tensor("kv_layout")?,
        prefill: r.tensor("prefill")?,
        decode: r.tensor("decode")?,
        tokens: r.tensor("tokens")?,
        trace,
    })
}

/// `model_generate_lm`: the same greedy generation by mlx-lm 0.32.2's own
/// model of the checkpoint (`mlx_lm.models.qwen3_5` / `qwen3_5_moe`):
/// `(prefill, decode, tokens)` as [`generate`] returns them.
pub fn generate_lm(
    ctx: &Ctx,
    directory: &Path,
    prompt: &HostTensor,
    steps: usize,
    chunk: usize,
) -> Result<(Expected, Expected, Expected), CaseError> {
    const F: &str = "model_generate_lm";
    let params = vec![
        fixed("directory", directory.to_string_lossy().as_ref()),
        tensor("prompt", prompt),
        fixed("steps", steps),
        fixed("chunk", chunk),
    ];
    let value = ctx.call(F, params)?;
    let mut r = Fields::of(F, value)?;
    Ok((
        r.tensor("prefill")?,
        r.tensor("decode")?,
        r.tensor("tokens")?,
    ))
}

/// `model_generate_batch`: B requests of equal length at once (`prompt`
/// int32 `[B, P]`), `steps` greedy steps: `(prefill [B, P, V], decode [B,
/// steps, V], tokens [B, steps + 1])`.
pub fn generate_batch(
    ctx: &Ctx,
    directory: &Path,
    prompt: &HostTensor,
    steps: usize,
) -> Result<(Expected, Expected, Expected), CaseError> {
    const F: &str = "model_generate_batch";
    let params = vec![
        fixed("directory", directory.to_string_lossy().as_ref()),
        tensor("prompt", prompt),
        fixed("steps", steps),
    ];
    let value = ctx.call(F, params)?;
    let mut r = Fields::of(F, value)?;
    Ok((
        r.tensor("prefill")?,
        r.tensor("decode")?,
        r.tensor("tokens")?,
    ))
}
