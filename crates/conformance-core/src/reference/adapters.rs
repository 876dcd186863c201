//! LoRA adapter directories written by each library's own training save
//! code, then loaded (and fused) by its own loader. The write is never
//! perturbed (both sides read the same files); the activation of the load
//! is.

use std::path::Path;

use oracle::{Arg, HostTensor, Value};

use super::{fixed, list, tensor, Fields, Param};
use crate::case::{CaseError, Ctx, Expected};

/// Which library writes and loads the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Library {
    /// mlx-lm 0.32.2.
    MlxLm,
    /// mlx-vlm 0.7.6, `lora_parameters` format.
    MlxVlm,
    /// mlx-vlm 0.7.6, legacy `{rank, alpha}` format (`LoRaLayer`).
    MlxVlmLegacy,
}

impl Library {
    pub fn as_str(self) -> &'static str {
        match self {
            Library::MlxLm => "mlx-lm",
            Library::MlxVlm => "mlx-vlm",
            Library::MlxVlmLegacy => "mlx-vlm-legacy",
        }
    }
}

/// The tiny model both sides agree on: `blocks` blocks holding a linear
/// module `[outs[i], ins[i]]` at each dotted `keys[i]`.
#[derive(Debug, Clone)]
pub struct TinyModel<'a> {
    pub blocks: usize,
    pub keys: &'a [&'a str],
    pub ins: &'a [usize],
    pub outs: &'a [usize],
}

fn strings(items: impl IntoIterator<Item = impl Into<String>>) -> Arg {
    Arg::List(items.into_iter().map(|s| Arg::Str(s.into())).collect())
}

fn dims(values: &[usize]) -> Arg {
    super::ints(values)
}

impl TinyModel<'_> {
    fn params(&self) -> [Param; 2] {
        [
            fixed("blocks", self.blocks),
            fixed("keys", strings(self.keys.iter().copied())),
        ]
    }
}

/// One adapted module's trained matrices.
#[derive(Debug, Clone)]
pub struct Trained {
    pub path: String,
    pub lora_a: HostTensor,
    pub lora_b: HostTensor,
}

/// Writes `directory` as `library` does after training (never perturbed).
#[allow(clippy::too_many_arguments)]
pub fn adapters_write(
    ctx: &Ctx,
    library: Library,
    directory: &Path,
    model: &TinyModel,
    rank: usize,
    scale: f64,
    alpha: f64,
    num_layers: usize,
    trained: &[Trained],
) -> Result<(), CaseError> {
    const F: &str = "adapters_write";
    let mut params = vec![
        fixed("library", library.as_str()),
        fixed("directory", directory.display().to_string()),
    ];
    params.extend(model.params());
    params.push(fixed("ins", dims(model.ins)));
    params.push(fixed("outs", dims(model.outs)));
    params.push(fixed("rank", rank));
    params.push(fixed("scale", scale));
    params.push(fixed("alpha", alpha));
    params.push(fixed("num_layers", num_layers));
    params.push(fixed(
        "paths",
        strings(trained.iter().map(|t| t.path.clone())),
    ));
    params.push(fixed(
        "lora_a",
        Arg::List(
            trained
                .iter()
                .map(|t| Arg::from(t.lora_a.clone()))
                .collect(),
        ),
    ));
    params.push(fixed(
        "lora_b",
        Arg::List(
            trained
                .iter()
                .map(|t| Arg::from(t.lora_b.clone()))
                .collect(),
        ),
    ));
    match ctx.call(F, params)? {
        Value::None => Ok(()),
        other => Err(CaseError::Harness(format!(
            "`{F}` returned {other:?}, not None"
        ))),
    }
}

/// The base layer at each key (the same in every block).
#[derive(Debug, Clone)]
pub struct BaseLayers<'a> {
    pub weights: &'a [HostTensor],
    pub scales: &'a [HostTensor],
    pub biases: &'a [Option<HostTensor>],
    pub group_size: i32,
    pub bits: i32,
    pub mode: &'static str,
}

/// Per adapted module: the output, the fused module's output (None where
/// the library's fuse raised), and the first fuse failure.
#[derive(Debug)]
pub struct Applied {
    pub y: Vec<Expected>,
    pub y_fused: Vec<Option<Expected>>,
    pub fuse_refused: String,
    /// What each side computed from (the case adds each module's base
    /// tensors and adapter, for the exact oracle on `y`).
    pub calls: crate::exactness::Calls,
}

/// Loads `directory` with `library`'s loader into the tiny model with
/// quantized base layers, then runs and fuses each of `paths` on `x`.
pub fn adapters_apply(
    ctx: &Ctx,
    library: Library,
    directory: &Path,
    model: &TinyModel,
    base: &BaseLayers,
    paths: &[String],
    x: &HostTensor,
) -> Result<Applied, CaseError> {
    const F: &str = "adapters_apply";
    let mut params = vec![
        fixed("library", library.as_str()),
        fixed("directory", directory.display().to_string()),
    ];
    params.extend(model.params());
    params.push(fixed(
        "weights",
        Arg::List(base.weights.iter().map(|t| Arg::from(t.clone())).collect()),
    ));
    params.push(fixed(
        "scales",
        Arg::List(base.scales.iter().map(|t| Arg::from(t.clone())).collect()),
    ));
    params.push(fixed(
        "biases",
        Arg::List(
            base.biases
                .iter()
                .map(|t| t.clone().map_or(Arg::None, Arg::from))
                .collect(),
        ),
    ));
    params.push(fixed("group_size", base.group_size));
    params.push(fixed("bits", base.bits));
    params.push(fixed("mode", base.mode));
    params.push(fixed("paths", strings(paths.iter().cloned())));
    params.push(tensor("x", x));
    let (value, calls) = ctx.call_sent(F, params)?;
    let mut r = Fields::of(F, value)?;
    let y = list(F, r.value("y")?)?
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => Ok(Expected::from_reference(t)),
            other => Err(CaseError::Harness(format!("`{F}` y holds {other:?}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let y_fused = list(F, r.value("y_fused")?)?
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => Ok(Some(Expected::from_reference(t))),
            Value::None => Ok(None),
            other => Err(CaseError::Harness(format!("`{F}` y_fused holds {other:?}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Applied {
        y,
        y_fused,
        fuse_refused: r.string("fuse_refused")?,
        calls,
    })
}
