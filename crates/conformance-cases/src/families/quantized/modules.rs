//! The modules of a fixture's tiny model (`conformance_layers` in its
//! config.json) and their exact-oracle arguments: read by the checkpoint
//! cases and by the switch cases that load a checkpoint.

use std::collections::BTreeMap;

use layers::checkpoint::{Checkpoint, LayerKind};
use oracle::Arg;
use serde_json::Value as Json;

use crate::case::CaseError;
use crate::exactness::Sent;

/// A module of the fixture's tiny model (`conformance_layers` in config.json).
#[derive(Debug, Clone)]
pub(super) struct LayerInfo {
    pub(super) kind: LayerKind,
    /// An `nn.Embedding` (quantized like a linear layer).
    pub(super) embedding: bool,
    pub(super) in_features: usize,
    pub(super) experts: usize,
}

/// The tiny model's modules by path, as the reference's model class reads
/// them from the config.
pub(super) fn layer_infos(
    checkpoint: &Checkpoint,
) -> Result<BTreeMap<String, LayerInfo>, CaseError> {
    let bad = |what: &str| CaseError::Harness(format!("config.json `conformance_layers`: {what}"));
    let layers = checkpoint
        .config()
        .get("conformance_layers")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("missing"))?;
    let mut infos = BTreeMap::new();
    for (path, d) in layers {
        let int = |key: &str| d.get(key).and_then(Json::as_u64).map(|v| v as usize);
        let kind = match d.get("kind").and_then(Json::as_str) {
            Some("linear" | "embedding") => LayerKind::Linear,
            Some("switch") => LayerKind::Switch,
            other => return Err(bad(&format!("{path}: kind {other:?}"))),
        };
        let in_features = int("in").ok_or_else(|| bad(&format!("{path}: no `in`")))?;
        infos.insert(
            path.clone(),
            LayerInfo {
                kind,
                embedding: d.get("kind").and_then(Json::as_str) == Some("embedding"),
                in_features,
                experts: int("experts").unwrap_or(0),
            },
        );
    }
    Ok(infos)
}

/// A loaded module's tensors for the exact oracle, and its kind
/// (`linear` or `switch`).
pub(super) fn module_args(
    p: &layers::quantized::QuantizedPayload,
    bias: Option<&mlx_rs::Array>,
    kind: &str,
    in_features: usize,
) -> Result<Vec<(&'static str, Arg)>, CaseError> {
    let mut args = crate::exactness::quantized::payload_args(p, bias, in_features)?;
    args.push(("kind", Arg::from(kind)));
    Ok(args)
}

/// The exact value of one loaded module's output on `x[:, :in]`.
pub(super) fn module_exact(
    s: &Sent,
    model: exact::Model,
) -> Result<exact::Exact, exact::ExactError> {
    let s = crate::exactness::quantized::sliced(s)?;
    match s.string("kind")? {
        "switch" => crate::exactness::quantized::switch(&s, model),
        _ => crate::exactness::quantized::linear(&s, model, "weight", false),
    }
}
