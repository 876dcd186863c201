//! `model/.../finding-chunked-vs-one-shot`: where the reference parts from
//! itself. The same prompt prefilled in one call and in chunks (32, 32,
//! then the last token as a decode-shaped call) by mlx-vlm's own model:
//! the prefill recurrence runs `gated_delta_chunked` over other chunk
//! boundaries and the last token through `gated_delta_ops`, the MoE sorts
//! other row sets, SDPA sees other query counts. Measured: how many prompt
//! positions' logits differ in bits, the largest difference in bf16 ulp,
//! whether the greedy continuations agree; and whether the port parts from
//! itself in exactly the same way (it must: it mirrors each call).
//!
//! `…/finding-token-by-token-vs-one-shot/prefill16` is the same with every
//! prompt token its own call (chunks of 1: the decode-shaped path at every
//! position). `…/finding-block-vs-single-steps/prefill16-k{4,8}`: the
//! reference's one call of k drafted tokens after the prompt, as a
//! speculative verifier sends them, against its k single decode steps.
//! All run in the deep tier (another schedule of a whole model).

use layers::model::Model;
use oracle::{DType, HostTensor};
use serde_json::json;

use super::{checkpoint_dir, port_err, port_generate, prompt};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkedFinding {
    pub checkpoint: String,
    pub prompt_len: usize,
    pub chunk: usize,
    pub steps: usize,
}

impl Params for ChunkedFinding {
    const BUILDER: &'static str = "model-chunked-finding";
    fn build(self, name: String) -> Case {
        Case::finding(name, super::FAMILY, super::REFERENCE, move |ctx| {
            run(ctx, &self)
        })
        .glue_composed(super::GLUE_PIECES)
        .deep()
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut out = Vec::new();
    for c in super::CHECKPOINTS {
        out.push(described(
            format!("model/{c}/finding-chunked-vs-one-shot/prefill65-chunk32"),
            &ChunkedFinding {
                checkpoint: c.into(),
                prompt_len: 65,
                chunk: 32,
                steps: 8,
            },
        ));
        out.push(described(
            format!("model/{c}/finding-token-by-token-vs-one-shot/prefill16"),
            &ChunkedFinding {
                checkpoint: c.into(),
                prompt_len: 16,
                chunk: 1,
                steps: 8,
            },
        ));
    }
    out
}

/// The prefill's call sizes: `32, 32, 1`, or `1 ×16` when there are many.
fn chunk_list(len: usize, chunk: usize) -> String {
    let chunk = chunk.clamp(1, len.max(1));
    let sizes: Vec<usize> = (0..len).step_by(chunk).map(|s| chunk.min(len - s)).collect();
    if sizes.len() > 4 && sizes.iter().all(|&s| s == chunk) {
        format!("{chunk} ×{}", sizes.len())
    } else {
        sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// bf16 rows: (rows differing, max ulp over all elements).
fn relation(a: &HostTensor, b: &HostTensor, rows: usize) -> Result<(usize, u32), CaseError> {
    if a.dtype != DType::Bfloat16 || a.bytes.len() != b.bytes.len() || rows == 0 {
        return Err(CaseError::Harness(
            "logits are not two bf16 tables of one shape".into(),
        ));
    }
    let row = a.bytes.len() / rows;
    let mut differing = 0;
    let mut max_ulp = 0u32;
    for (ra, rb) in a.bytes.chunks(row).zip(b.bytes.chunks(row)) {
        if ra != rb {
            differing += 1;
        }
        for (x, y) in ra.chunks(2).zip(rb.chunks(2)) {
            let key = |v: u16| -> i32 {
                let v = v as i32;
                if v & 0x8000 != 0 {
                    -(v & 0x7fff)
                } else {
                    v
                }
            };
            let (x, y) = (
                u16::from_le_bytes([x[0], x[1]]),
                u16::from_le_bytes([y[0], y[1]]),
            );
            max_ulp = max_ulp.max((key(x) - key(y)).unsigned_abs());
        }
    }
    Ok((differing, max_ulp))
}

fn run(ctx: &Ctx, f: &ChunkedFinding) -> Result<CaseOutput, CaseError> {
    let dir = checkpoint_dir(&f.checkpoint)?;
    let model = Model::load(&dir).map_err(port_err)?;
    let tokens = prompt(ctx, f.prompt_len, model.config.vocab_size);
    let prompt_t = HostTensor::new(
        DType::Int32,
        vec![1, tokens.len()],
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    let one = reference::model::generate(ctx, &dir, &prompt_t, f.steps, 0, -1)?;
    let chunked = reference::model::generate(ctx, &dir, &prompt_t, f.steps, f.chunk, -1)?;
    let (ref_rows, ref_ulp) =
        relation(one.prefill.tensor(), chunked.prefill.tensor(), f.prompt_len)?;
    let ref_tokens_equal = one.tokens.tensor().bytes == chunked.tokens.tensor().bytes;
    let port_one = port_generate(&model, &tokens, 0, f.steps, None)?;
    let port_chunked = port_generate(&model, &tokens, f.chunk, f.steps, None)?;
    let (port_rows, port_ulp) = relation(&port_one.prefill, &port_chunked.prefill, f.prompt_len)?;
    let port_tokens_equal = port_one.tokens.bytes == port_chunked.tokens.bytes;
    let mut out = CaseOutput::new(format!(
        "one-shot (gated_delta_chunked over {}) against chunks {}",
        f.prompt_len,
        chunk_list(f.prompt_len, f.chunk)
    ));
    out.digest("port one-shot prefill", &port_one.prefill);
    out.digest("port chunked prefill", &port_chunked.prefill);
    out.digest("reference one-shot prefill", one.prefill.tensor());
    out.digest("reference chunked prefill", chunked.prefill.tensor());
    Ok(out.with_finding(json!({
        "reference": {
            "prompt positions whose logits differ": ref_rows,
            "of": f.prompt_len,
            "max bf16 ulp": ref_ulp,
            "greedy tokens equal": ref_tokens_equal,
        },
        "port parts from itself the same way": port_rows == ref_rows
            && port_ulp == ref_ulp
            && port_tokens_equal == ref_tokens_equal,
    })))
}

/// The reference's own block call of k drafted tokens (as a speculative
/// verifier would send them: one `LanguageModel.__call__` of k tokens
/// after the prompt) against its k single greedy decode steps fed the same
/// tokens.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockFinding {
    pub checkpoint: String,
    pub prompt_len: usize,
    pub k: usize,
}

impl Params for BlockFinding {
    const BUILDER: &'static str = "model-block-finding";
    fn build(self, name: String) -> Case {
        Case::finding(name, super::FAMILY, super::REFERENCE, move |ctx| {
            run_block(ctx, &self)
        })
        .glue_composed(super::GLUE_PIECES)
        .deep()
    }
}

pub fn block_descriptions() -> Vec<Described> {
    let mut out = Vec::new();
    for c in super::CHECKPOINTS {
        for k in [4, 8] {
            out.push(described(
                format!("model/{c}/finding-block-vs-single-steps/prefill16-k{k}"),
                &BlockFinding {
                    checkpoint: c.into(),
                    prompt_len: 16,
                    k,
                },
            ));
        }
    }
    out
}

fn ids(t: &[i32]) -> Result<HostTensor, CaseError> {
    HostTensor::new(
        DType::Int32,
        vec![1, t.len()],
        t.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))
}

fn run_block(ctx: &Ctx, f: &BlockFinding) -> Result<CaseOutput, CaseError> {
    if f.prompt_len == 0 || f.k == 0 || f.k > f.prompt_len {
        return Err(CaseError::Harness(
            "need 0 < k <= prompt_len (the block is the second chunk)".into(),
        ));
    }
    let dir = checkpoint_dir(&f.checkpoint)?;
    let model = Model::load(&dir).map_err(port_err)?;
    let mut tokens = prompt(ctx, f.prompt_len, model.config.vocab_size);
    let single = reference::model::generate(ctx, &dir, &ids(&tokens)?, f.k, 0, -1)?;
    let greedy = single.tokens.tensor();
    if greedy.dtype != DType::Int32 || greedy.bytes.len() < 4 * f.k {
        return Err(CaseError::Harness("greedy tokens are not k int32 ids".into()));
    }
    tokens.extend(
        greedy.bytes[..4 * f.k]
            .chunks(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    // The prompt, then the k drafts as the second chunk: one k-token call.
    let block = reference::model::generate(ctx, &dir, &ids(&tokens)?, 1, f.prompt_len, -1)?;
    let b = block.prefill.tensor();
    let row = b.bytes.len() / (f.prompt_len + f.k).max(1);
    let block_rows = HostTensor::new(
        b.dtype,
        vec![f.k, b.shape.last().copied().unwrap_or(0)],
        b.bytes[row * f.prompt_len..].to_vec(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    let (rows, ulp) = relation(&block_rows, single.decode.tensor(), f.k)?;
    let mut out = CaseOutput::new(format!(
        "one call of {} drafted tokens against {} single decode steps",
        f.k, f.k
    ));
    out.digest("reference block logits", &block_rows);
    out.digest("reference single-step logits", single.decode.tensor());
    Ok(out.with_finding(json!({
        "reference": {
            "drafted positions whose logits differ": rows,
            "of": f.k,
            "max bf16 ulp": ulp,
        },
        "the port's verify": "Model::verify equals the single steps (the must-equal model/<checkpoint>/verify-k* cases)",
    })))
}

/// mlx-lm 0.32.2's own `qwen3_5` / `qwen3_5_moe` model against mlx-vlm
/// 0.7.6's on the same checkpoint: the same prompt, the same greedy loop.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackagesFinding {
    pub checkpoint: String,
    pub prompt_len: usize,
    pub steps: usize,
}

impl Params for PackagesFinding {
    const BUILDER: &'static str = "model-packages-finding";
    fn build(self, name: String) -> Case {
        Case::finding(name, super::FAMILY, super::REFERENCE, move |ctx| {
            run_packages(ctx, &self)
        })
        .glue_composed(&[
            "mlx_lm.models.qwen3_5 / qwen3_5_moe Model (ModelArgs.from_dict, sanitize, make_cache)",
            "mx.gather_qmm with mlx-lm's global_scale=None dropped (mlx 0.32.2 has no such argument)",
            "the load and greedy loop the model/ cases run for mlx-vlm",
        ])
        .deep()
    }
}

pub fn packages_descriptions() -> Vec<Described> {
    super::CHECKPOINTS
        .iter()
        .map(|c| {
            described(
                format!("model/{c}/finding-mlx-lm-vs-mlx-vlm/prefill16-decode8"),
                &PackagesFinding {
                    checkpoint: (*c).into(),
                    prompt_len: 16,
                    steps: 8,
                },
            )
        })
        .collect()
}

fn run_packages(ctx: &Ctx, f: &PackagesFinding) -> Result<CaseOutput, CaseError> {
    let dir = checkpoint_dir(&f.checkpoint)?;
    let model = Model::load(&dir).map_err(port_err)?;
    let tokens = prompt(ctx, f.prompt_len, model.config.vocab_size);
    let prompt_t = ids(&tokens)?;
    let vlm = reference::model::generate(ctx, &dir, &prompt_t, f.steps, 0, -1)?;
    let (prefill, decode, greedy) =
        reference::model::generate_lm(ctx, &dir, &prompt_t, f.steps, 0)?;
    let (prefill_rows, prefill_ulp) =
        relation(vlm.prefill.tensor(), prefill.tensor(), f.prompt_len)?;
    let decode_rows = if decode.tensor().bytes.len() == vlm.decode.tensor().bytes.len() {
        Some(relation(vlm.decode.tensor(), decode.tensor(), f.steps)?)
    } else {
        None
    };
    let mut out = CaseOutput::new("mlx-lm 0.32.2's model against mlx-vlm 0.7.6's, same weights");
    out.digest("mlx-vlm prefill", vlm.prefill.tensor());
    out.digest("mlx-lm prefill", prefill.tensor());
    out.digest("mlx-vlm tokens", vlm.tokens.tensor());
    out.digest("mlx-lm tokens", greedy.tensor());
    Ok(out.with_finding(json!({
        "prompt positions whose logits differ": prefill_rows,
        "of": f.prompt_len,
        "max bf16 ulp (prefill)": prefill_ulp,
        "decode steps whose logits differ": decode_rows.map(|r| r.0),
        "greedy tokens equal": vlm.tokens.tensor().bytes == greedy.tensor().bytes,
    })))
}

/// Two requests of equal length in one batch (B = 2, one prefill call, then
/// steps of both rows) against each request alone, with mlx-vlm's own model.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFinding {
    pub checkpoint: String,
    pub prompt_len: usize,
    pub steps: usize,
}

impl Params for BatchFinding {
    const BUILDER: &'static str = "model-batch-finding";
    fn build(self, name: String) -> Case {
        Case::finding(name, super::FAMILY, super::REFERENCE, move |ctx| {
            run_batch(ctx, &self)
        })
        .glue_composed(super::GLUE_PIECES)
        .deep()
    }
}

pub fn batch_descriptions() -> Vec<Described> {
    super::CHECKPOINTS
        .iter()
        .map(|c| {
            described(
                format!("model/{c}/finding-batch-of-two-vs-alone/prefill16-decode8"),
                &BatchFinding {
                    checkpoint: (*c).into(),
                    prompt_len: 16,
                    steps: 8,
                },
            )
        })
        .collect()
}

/// Row `b` of a `[B, ..]` tensor, as a tensor of the remaining shape.
fn batch_row(t: &HostTensor, b: usize) -> Result<HostTensor, CaseError> {
    let rows = t.shape.first().copied().unwrap_or(0);
    if b >= rows || rows == 0 {
        return Err(CaseError::Harness(format!("no batch row {b} in {:?}", t.shape)));
    }
    let per = t.bytes.len() / rows;
    HostTensor::new(t.dtype, t.shape[1..].to_vec(), t.bytes[b * per..(b + 1) * per].to_vec())
        .map_err(|e| CaseError::Harness(e.to_string()))
}

fn run_batch(ctx: &Ctx, f: &BatchFinding) -> Result<CaseOutput, CaseError> {
    let dir = checkpoint_dir(&f.checkpoint)?;
    let model = Model::load(&dir).map_err(port_err)?;
    // Two seeded prompts: the halves of this case's 2P seeded tokens.
    let first = prompt(ctx, 2 * f.prompt_len, model.config.vocab_size);
    let (a, b) = first.split_at(f.prompt_len);
    let both = HostTensor::new(
        DType::Int32,
        vec![2, f.prompt_len],
        first.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    let (prefill, decode, tokens) = reference::model::generate_batch(ctx, &dir, &both, f.steps)?;
    let mut rows = Vec::new();
    let mut out = CaseOutput::new("one batch of two requests against each request alone");
    for (i, request) in [a, b].into_iter().enumerate() {
        let alone = reference::model::generate(ctx, &dir, &ids(request)?, f.steps, 0, -1)?;
        let p = batch_row(prefill.tensor(), i)?;
        let d = batch_row(decode.tensor(), i)?;
        let t = batch_row(tokens.tensor(), i)?;
        let (prefill_rows, prefill_ulp) = relation(&p, alone.prefill.tensor(), f.prompt_len)?;
        let decode_rows = if d.bytes.len() == alone.decode.tensor().bytes.len() {
            Some(relation(&d, alone.decode.tensor(), f.steps)?.0)
        } else {
            None
        };
        out.digest(&format!("request {i} in the batch, prefill"), &p);
        out.digest(&format!("request {i} alone, prefill"), alone.prefill.tensor());
        rows.push(json!({
            "prompt positions whose logits differ": prefill_rows,
            "max bf16 ulp (prefill)": prefill_ulp,
            "decode steps whose logits differ": decode_rows,
            "greedy tokens equal": t.bytes == alone.tokens.tensor().bytes,
        }));
    }
    Ok(out.with_finding(json!({
        "of": { "prompt positions": f.prompt_len, "decode steps": f.steps },
        "requests": rows,
    })))
}
