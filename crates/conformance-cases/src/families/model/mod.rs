//! `model/`: the whole Qwen3.5 text decoder, port against reference, bit
//! for bit: the port's [`layers::model::Model`] (built from the ported
//! layers) and mlx-vlm 0.7.6's own `qwen3_5` / `qwen3_5_moe` model, both on
//! a tiny checkpoint the reference wrote (`fixtures/checkpoints/
//! write_model_fixture.py`), greedy generation from the same prompt:
//!
//! * `prefill`: the logits of every prompt position (the chunks' logits
//!   concatenated when the prompt is prefilled in chunks);
//! * `decode`: the logits of every decode step (one token per call, each
//!   the argmax of the step before);
//! * `tokens`: the greedy tokens (must be equal).
//!
//! When an output parts, the case names the first call whose logits part
//! and, from both sides' intermediates of that call (the reference's
//! captured by wrappers around its own modules, the port's from its own
//! trace), the first point whose bits part: `call 3 (decode step 2):
//! layer 2 (linear_attention) · recurrence · [0, 0, 1, 17]`. Points are
//! compared in the order the port computes them, so the blame goes to the
//! operation that adds the difference (its inputs, earlier points, agree).

pub mod finding;
pub mod verify;

use std::path::PathBuf;

use layers::model::{Faults, LayerCache, Model, Trace};
use mlx_rs::ops::{concatenate, indexing::argmax_axis};
use mlx_rs::Array;
use oracle::{DType, HostTensor};

use super::describe::{described, Described, Params};
use super::support::host;
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::reference;

const FAMILY: &str = "model";
const REFERENCE: &str = "mlx_vlm.models.qwen3_5 / qwen3_5_moe (mlx-vlm 0.7.6): Model.sanitize, \
     LanguageModel.__call__ with make_cache()'s KVCache / ArraysCache, greedy argmax";
const GLUE_PIECES: &[&str] = &[
    "mx.load of the checkpoint's safetensors",
    "Model(ModelConfig) as load_model builds it",
    "Model.sanitize",
    "nn.quantize with load_model's class predicate",
    "load_weights(strict=True)",
    "LanguageModel.__call__ per prefill chunk and decode step",
];

/// The tiny checkpoints of this family (`fixtures/checkpoints/`).
pub const CHECKPOINTS: [&str; 2] = ["qwen3_5-tiny", "qwen3_5_moe-tiny"];

/// One greedy generation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCase {
    /// A directory of [`CHECKPOINTS`].
    pub checkpoint: String,
    /// Prompt tokens (seeded, below the vocabulary size).
    pub prompt_len: usize,
    /// Prefill chunk (0: the whole prompt in one call).
    pub chunk: usize,
    /// Greedy decode steps after the prompt.
    pub steps: usize,
    /// A fault planted in the port (the first-divergence tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

impl Params for ModelCase {
    const BUILDER: &'static str = "model";
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| run(ctx, &self))
            .glue_composed(GLUE_PIECES)
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut out = Vec::new();
    for checkpoint in CHECKPOINTS {
        // One-shot prefill (16 tokens: the MoE routes 64 rows, the sorted
        // switch path), then 32 greedy steps.
        out.push(described(
            format!("model/{checkpoint}/prefill16-decode32"),
            &ModelCase {
                checkpoint: checkpoint.into(),
                prompt_len: 16,
                chunk: 0,
                steps: 32,
                fault: None,
            },
        ));
        // Chunked prefill of 65 tokens in chunks of 32 (32, 32, then the
        // last token as a decode-shaped call), across a chunk of the
        // chunked recurrence (64) and the ops path.
        out.push(described(
            format!("model/{checkpoint}/prefill65-chunk32-decode32"),
            &ModelCase {
                checkpoint: checkpoint.into(),
                prompt_len: 65,
                chunk: 32,
                steps: 32,
                fault: None,
            },
        ));
    }
    out.extend(verify::descriptions());
    out.extend(finding::descriptions());
    out.extend(finding::block_descriptions());
    out.extend(finding::packages_descriptions());
    out.extend(finding::batch_descriptions());
    out
}

pub(crate) fn checkpoint_dir(name: &str) -> Result<PathBuf, CaseError> {
    if !CHECKPOINTS.contains(&name) {
        return Err(CaseError::Harness(format!(
            "model checkpoint `{name}` is none of {}",
            CHECKPOINTS.join(", ")
        )));
    }
    Ok(crate::home::Home::get()
        .fixtures_dir()
        .join("checkpoints")
        .join(name))
}

/// The named planted faults.
pub fn fault(name: &str) -> Result<Faults, CaseError> {
    let mut f = Faults::default();
    match name {
        "recurrent-state-bf16" => f.recurrent_state_bf16 = true,
        "gated-norm-eps" => f.gated_norm_eps_scale = Some(10.0),
        "conv-state-shift" => f.conv_state_shift = true,
        "kv-contiguous" => f.kv_contiguous = true,
        "verify-as-block" => f.verify_as_block = true,
        other => {
            return Err(CaseError::Harness(format!(
                "unknown fault `{other}` (recurrent-state-bf16, gated-norm-eps, conv-state-shift, kv-contiguous, verify-as-block)"
            )))
        }
    }
    Ok(f)
}

pub(crate) fn port_err(e: impl std::fmt::Display) -> CaseError {
    CaseError::port("layers::model", e)
}

/// The port's greedy generation, as the glue's `model_generate` runs the
/// reference; the calls' traces when `trace_call` names one.
pub struct PortGeneration {
    pub prefill: HostTensor,
    pub decode: HostTensor,
    pub tokens: HostTensor,
    /// Each KV cache's `[offset, capacity]` at the end.
    pub kv_layout: HostTensor,
    pub trace: Option<Trace>,
    pub algorithms: Vec<String>,
    /// Logits of each call (prefill chunks, then decode steps).
    pub calls: Vec<HostTensor>,
}

pub fn port_generate(
    model: &Model,
    prompt: &[i32],
    chunk: usize,
    steps: usize,
    trace_call: Option<usize>,
) -> Result<PortGeneration, CaseError> {
    let mut cache: Vec<LayerCache> = model.make_cache();
    let p = prompt.len();
    let chunk = if chunk == 0 { p } else { chunk.min(p) };
    let mut call = 0usize;
    let mut kept_trace = None;
    let mut algorithms = Vec::new();
    let mut calls = Vec::new();
    let mut run = |tokens: &[i32], cache: &mut Vec<LayerCache>| -> Result<Array, CaseError> {
        let ids = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        let mut trace = if trace_call == Some(call) {
            Trace::on()
        } else {
            Trace::off()
        };
        let logits = model.forward(&ids, cache, &mut trace).map_err(port_err)?;
        let mut arrays: Vec<&Array> = vec![&logits];
        for c in cache.iter() {
            arrays.extend(c.arrays());
        }
        mlx_rs::transforms::eval(arrays).map_err(port_err)?;
        for (at, which) in &trace.recurrences {
            algorithms.push(format!("call {call} {at}: {}", which.as_str()));
        }
        if trace.is_on() {
            kept_trace = Some(trace);
        }
        calls.push(host(&logits)?);
        call += 1;
        Ok(logits)
    };
    let mut prefill = Vec::new();
    for s in (0..p).step_by(chunk) {
        let logits = run(&prompt[s..(s + chunk).min(p)], &mut cache)?;
        prefill.push(logits.squeeze_axes(&[0]).map_err(port_err)?);
    }
    let prefill = concatenate(&prefill, 0).map_err(port_err)?;
    let argmax = |row: &Array| -> Result<i32, CaseError> {
        let t = argmax_axis(row, -1, None)
            .map_err(port_err)?
            .as_dtype(mlx_rs::Dtype::Int32)
            .map_err(port_err)?;
        t.try_item_exact::<i32>().map_err(port_err)
    };
    let last = prefill.index_last_row().map_err(port_err)?;
    let mut token = argmax(&last)?;
    let mut tokens = vec![token];
    let mut decode = Vec::new();
    for _ in 0..steps {
        let logits = run(&[token], &mut cache)?;
        let row = logits.reshape(&[-1]).map_err(port_err)?;
        token = argmax(&row)?;
        tokens.push(token);
        decode.push(row);
    }
    let decode = mlx_rs::ops::stack(&decode, 0).map_err(port_err)?;
    let n = tokens.len();
    let layout: Vec<i32> = cache
        .iter()
        .filter_map(|c| match c {
            LayerCache::Attention(kv) => Some([kv.offset() as i32, kv.capacity() as i32]),
            LayerCache::Linear(_) => None,
        })
        .flatten()
        .collect();
    let kv_layout = HostTensor::new(
        DType::Int32,
        vec![layout.len() / 2, 2],
        layout.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    Ok(PortGeneration {
        prefill: host(&prefill)?,
        decode: host(&decode)?,
        tokens: HostTensor::new(
            DType::Int32,
            vec![n],
            tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
        )
        .map_err(|e| CaseError::Harness(e.to_string()))?,
        kv_layout,
        trace: kept_trace,
        algorithms,
        calls,
    })
}

trait LastRow {
    fn index_last_row(&self) -> Result<Array, mlx_rs::error::Exception>;
}

impl LastRow for Array {
    fn index_last_row(&self) -> Result<Array, mlx_rs::error::Exception> {
        let n = self.shape()[0];
        layers::model::slice_axis(self, 0, n - 1, n)
            .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?
            .reshape(&[-1])
    }
}

/// The seeded prompt of a case: `prompt_len` token ids below the vocabulary.
pub(crate) fn prompt(ctx: &Ctx, len: usize, vocab: usize) -> Vec<i32> {
    let mut inputs = ctx.inputs();
    let raw = inputs.uniform(DType::Float32, &[len], 1.0);
    raw.bytes
        .chunks(4)
        .map(|b| {
            let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (((v + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as i32
        })
        .collect()
}

fn run(ctx: &Ctx, case: &ModelCase) -> Result<CaseOutput, CaseError> {
    if case.prompt_len == 0 {
        return Err(CaseError::Harness("prompt_len must be positive".into()));
    }
    let dir = checkpoint_dir(&case.checkpoint)?;
    let mut model = Model::load(&dir).map_err(port_err)?;
    if let Some(f) = &case.fault {
        model.faults = fault(f)?;
    }
    let prompt = prompt(ctx, case.prompt_len, model.config.vocab_size);
    let prompt_t = HostTensor::new(
        DType::Int32,
        vec![1, prompt.len()],
        prompt.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    let port = port_generate(&model, &prompt, case.chunk, case.steps, None)?;
    let reference = reference::model::generate(ctx, &dir, &prompt_t, case.steps, case.chunk, -1)?;
    let mut out = CaseOutput::new(summarise(&port.algorithms));
    out.compare("prefill_logits", &port.prefill, &reference.prefill);
    out.compare("decode_logits", &port.decode, &reference.decode);
    out.compare("tokens", &port.tokens, &reference.tokens);
    // Same bits on the CPU whatever the layout, but CUDA's SDPA picks its
    // kernel from the strides of the view it is handed.
    out.compare_derived(
        "kv_layout",
        &port.kv_layout,
        &reference.kv_layout,
        "the cache's offset and allocation follow from the token counts, constants of the case",
    );
    if !out.all_equal() && !ctx.perturbed() {
        let blame = first_divergence(
            ctx,
            &model,
            &dir,
            &prompt,
            &prompt_t,
            case,
            &port.calls,
            &reference,
        )?;
        out.path = format!("{} · first divergence: {blame}", out.path);
    }
    Ok(out)
}

/// Which recurrence ran where, compressed (`chunked ×N, ops ×M`).
fn summarise(algorithms: &[String]) -> String {
    let chunked = algorithms
        .iter()
        .filter(|a| a.ends_with("gated_delta_chunked"))
        .count();
    let ops = algorithms
        .iter()
        .filter(|a| a.ends_with("gated_delta_ops"))
        .count();
    format!("recurrence: gated_delta_chunked ×{chunked}, gated_delta_ops ×{ops}")
}

/// Names the first call and the first traced point where the two sides part.
#[allow(clippy::too_many_arguments)]
pub fn first_divergence(
    ctx: &Ctx,
    model: &Model,
    dir: &std::path::Path,
    prompt: &[i32],
    prompt_t: &HostTensor,
    case: &ModelCase,
    port_calls: &[HostTensor],
    reference: &reference::model::Generation,
) -> Result<String, CaseError> {
    // The reference's logits per call, cut from its outputs.
    let p = prompt.len();
    let chunk = if case.chunk == 0 {
        p
    } else {
        case.chunk.min(p)
    };
    let n_prefill = p.div_ceil(chunk);
    let pre = reference.prefill.tensor();
    let dec = reference.decode.tensor();
    let row_bytes = pre.bytes.len() / p.max(1);
    let mut first = None;
    for (i, port_call) in port_calls.iter().enumerate() {
        let ref_bytes: &[u8] = if i < n_prefill {
            let (s, e) = (i * chunk, ((i + 1) * chunk).min(p));
            &pre.bytes[s * row_bytes..e * row_bytes]
        } else {
            let s = i - n_prefill;
            dec.bytes
                .get(s * row_bytes..(s + 1) * row_bytes)
                .unwrap_or(&[])
        };
        if port_call.bytes != ref_bytes {
            first = Some(i);
            break;
        }
    }
    // Every call's logits agree (a layout or token difference): trace the
    // first call, whose points include each KV cache's layout.
    let call = first.unwrap_or(0);
    let what = if call < n_prefill {
        format!("call {call} (prefill chunk {call})")
    } else {
        format!("call {call} (decode step {})", call - n_prefill)
    };
    let port = port_generate(model, prompt, case.chunk, case.steps, Some(call))?;
    let traced =
        reference::model::generate(ctx, dir, prompt_t, case.steps, case.chunk, call as i64)?;
    let (Some(port_trace), Some(ref_trace)) = (port.trace, traced.trace) else {
        return Ok(format!("{what}: no trace"));
    };
    for point in &port_trace.points {
        let Some(expected) = ref_trace.get(&point.point) else {
            continue;
        };
        let got = host(&point.value)?;
        if got.dtype != expected.dtype || got.shape != expected.shape {
            return Ok(format!(
                "{what}: {} · {} {:?} against {} {:?}",
                label(model, &point.point),
                got.dtype.name(),
                got.shape,
                expected.dtype.name(),
                expected.shape
            ));
        }
        if got.bytes != expected.bytes {
            let size = got.dtype.size().max(1);
            let idx = got
                .bytes
                .chunks(size)
                .zip(expected.bytes.chunks(size))
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Ok(format!(
                "{what}: {} · {:?}",
                label(model, &point.point),
                unravel(idx, &got.shape)
            ));
        }
    }
    Ok(format!(
        "{what}: every captured point agrees (the difference is in a point not captured)"
    ))
}

/// `layers.2.recurrence` → `layer 2 (linear_attention) · recurrence`.
fn label(model: &Model, point: &str) -> String {
    let mut parts = point.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("layers"), Some(i), Some(op)) => {
            let kind = i
                .parse::<usize>()
                .ok()
                .and_then(|i| model.layers.get(i))
                .map_or("?", |l| l.mixer.kind());
            format!("layer {i} ({kind}) · {op}")
        }
        _ => point.to_owned(),
    }
}

fn unravel(mut idx: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for (o, d) in out.iter_mut().zip(shape.iter()).rev() {
        if *d > 0 {
            *o = idx % d;
            idx /= d;
        }
    }
    out
}
