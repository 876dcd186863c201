//! `model/<checkpoint>/verify-k{4,8}/prefill16`: speculative decoding
//! equals greedy. After the prompt, the port checks k drafted tokens in
//! one rows-independent verify ([`layers::model::Model::verify`]: the
//! linears, experts and lm_head over the k rows in the chunks the
//! backend's measured `RowsRegime` allows, each token then through the
//! conv, the recurrence and SDPA as its own step). Its k logits rows must
//! be the bits of the reference's k single greedy decode steps, fed the
//! same tokens (the drafts are the reference's own greedy tokens, so every
//! draft is accepted when the rows agree).

use layers::model::{LayerCache, Model};
use mlx_rs::Array;
use oracle::{DType, HostTensor};

use super::{checkpoint_dir, port_err, prompt, GLUE_PIECES, REFERENCE};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::families::support::host;
use crate::reference;

/// One verify of `k` drafted tokens after a one-shot prefill.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyCase {
    pub checkpoint: String,
    pub prompt_len: usize,
    /// Drafted tokens checked in one verify.
    pub k: usize,
    /// A fault planted in the port (tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

impl Params for VerifyCase {
    const BUILDER: &'static str = "model-verify";
    fn build(self, name: String) -> Case {
        Case::must_equal(name, super::FAMILY, REFERENCE, move |ctx| run(ctx, &self))
            .glue_composed(GLUE_PIECES)
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut out = Vec::new();
    for c in super::CHECKPOINTS {
        for k in [4, 8] {
            out.push(described(
                format!("model/{c}/verify-k{k}/prefill16"),
                &VerifyCase {
                    checkpoint: c.into(),
                    prompt_len: 16,
                    k,
                    fault: None,
                },
            ));
        }
    }
    out
}

fn run(ctx: &Ctx, case: &VerifyCase) -> Result<CaseOutput, CaseError> {
    if case.prompt_len == 0 || case.k == 0 {
        return Err(CaseError::Harness(
            "prompt_len and k must be positive".into(),
        ));
    }
    let dir = checkpoint_dir(&case.checkpoint)?;
    let mut model = Model::load(&dir).map_err(port_err)?;
    if let Some(f) = &case.fault {
        model.faults = super::fault(f)?;
    }
    let tokens = prompt(ctx, case.prompt_len, model.config.vocab_size);
    let prompt_t = HostTensor::new(
        DType::Int32,
        vec![1, tokens.len()],
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .map_err(|e| CaseError::Harness(e.to_string()))?;
    // The reference: prefill, then k single greedy steps.
    let reference = reference::model::generate(ctx, &dir, &prompt_t, case.k, 0, -1)?;
    let greedy = reference.tokens.tensor();
    if greedy.dtype != DType::Int32 || greedy.bytes.len() < 4 * case.k {
        return Err(CaseError::Harness(
            "the reference's greedy tokens are not k int32 ids".into(),
        ));
    }
    let drafts: Vec<i32> = greedy.bytes[..4 * case.k]
        .chunks(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // The port: the same prefill, then one verify of the k drafts.
    let mut cache: Vec<LayerCache> = model.make_cache();
    let ids = Array::from_slice(&tokens, &[1, tokens.len() as i32]);
    let mut trace = layers::model::Trace::off();
    let prefill = model
        .forward(&ids, &mut cache, &mut trace)
        .and_then(|l| Ok(l.squeeze_axes(&[0])?))
        .map_err(port_err)?;
    let drafted = Array::from_slice(&drafts, &[1, case.k as i32]);
    let verified = model
        .verify(&drafted, &mut cache)
        .and_then(|l| Ok(l.squeeze_axes(&[0])?))
        .map_err(port_err)?;
    let mut out = CaseOutput::new(format!(
        "Model::verify of {} drafts against {} single decode steps",
        case.k, case.k
    ));
    out.compare("prefill_logits", &host(&prefill)?, &reference.prefill);
    out.compare("verify_logits", &host(&verified)?, &reference.decode);
    Ok(out)
}
