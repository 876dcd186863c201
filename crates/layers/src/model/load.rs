//! `Model::load`: the checkpoint through the crate's reader, with mlx-vlm
//! 0.7.6's load-time rules (`qwen3_5.Model.sanitize` /
//! `qwen3_5_moe.Model.sanitize`, `utils.load_model`):
//!
//! * names: `model.language_model.X` → `language_model.model.X`,
//!   `lm_head` → `language_model.lm_head` (a checkpoint already in MLX
//!   names is read as written); `mtp.*` tensors are ignored; a tied model
//!   ignores `lm_head.weight`;
//! * `conv1d.weight` with a last axis other than 1 (PyTorch layout) is moved
//!   to `[C, K, 1]`;
//! * the RMSNorm weights (`input_layernorm`, `post_attention_layernorm`,
//!   `model.norm`, `q_norm`, `k_norm`; not the gated norm) get `+ 1.0`
//!   when the checkpoint is in Hugging Face form (a name outside
//!   `language_model.`, or any unsanitized conv1d weight);
//! * a module is quantized when the checkpoint's quantization config and
//!   tensors say so (the crate's `resolve_quant_spec`), else float; dtypes
//!   are kept as stored (`A_log` stays float32 when written so: the
//!   reference's `cast_predicate` at conversion).

use mlx_rs::ops::swap_axes;
use mlx_rs::Array;

use crate::checkpoint::Checkpoint;

use super::ops::weak_scalar;
use super::ModelError;

const NORM_WEIGHT_SUFFIXES: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// The checkpoint seen through the reference's sanitize.
pub(super) struct Weights {
    checkpoint: Checkpoint,
    shift_norms: bool,
}

impl Weights {
    pub(super) fn new(checkpoint: Checkpoint) -> Result<Self, ModelError> {
        let mut shift_norms = false;
        for name in checkpoint.tensor_names() {
            if name.contains("mtp.") || !name.contains("conv1d.weight") {
                continue;
            }
            let info = checkpoint.tensor_info(name)?;
            if info.shape.last() != Some(&1) {
                shift_norms = true;
            }
        }
        Ok(Weights {
            checkpoint,
            shift_norms,
        })
    }

    pub(super) fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// The stored module path of sanitized module `path`, found by its
    /// `suffix` tensor.
    pub(super) fn module_name(&self, path: &str, suffix: &str) -> Result<String, ModelError> {
        let candidates = stored_candidates(path);
        for c in &candidates {
            if self.checkpoint.contains(&format!("{c}.{suffix}")) {
                return Ok(c.clone());
            }
        }
        Err(ModelError::MissingTensor {
            dir: self.checkpoint.dir().display().to_string(),
            name: format!("{path}.{suffix}"),
            module: path.to_owned(),
        })
    }

    /// Tensor `{path}.{suffix}`, sanitized, checked against `shape`.
    pub(super) fn tensor(
        &self,
        path: &str,
        suffix: &str,
        shape: &[i32],
    ) -> Result<Array, ModelError> {
        let stored = self.module_name(path, suffix)?;
        let name = format!("{stored}.{suffix}");
        let mut value = self.checkpoint.array(&name)?;
        let key = format!("{path}.{suffix}");
        if key.contains("conv1d.weight") && value.shape().last() != Some(&1) {
            value = swap_axes(&value, 1, 2)?;
        }
        if value.ndim() == 1
            && NORM_WEIGHT_SUFFIXES.iter().any(|s| key.ends_with(s))
            && (self.shift_norms || !name.starts_with("language_model."))
        {
            value = value.add(weak_scalar(1.0, value.dtype())?)?;
        }
        if value.shape() != shape {
            return Err(ModelError::TensorShape {
                name,
                expected: shape.to_vec(),
                actual: value.shape().to_vec(),
            });
        }
        Ok(value)
    }

    /// [`Weights::tensor`] when present.
    pub(super) fn optional(
        &self,
        path: &str,
        suffix: &str,
        shape: &[i32],
    ) -> Result<Option<Array>, ModelError> {
        match self.module_name(path, suffix) {
            Ok(_) => self.tensor(path, suffix, shape).map(Some),
            Err(ModelError::MissingTensor { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Where sanitized `path` may be stored: as written, or in Hugging Face
/// names (`sanitize_key` read backwards).
fn stored_candidates(path: &str) -> Vec<String> {
    let mut out = vec![path.to_owned()];
    if let Some(rest) = path.strip_prefix("language_model.model.") {
        out.push(format!("model.language_model.{rest}"));
    } else if let Some(rest) = path.strip_prefix("language_model.lm_head") {
        out.push(format!("lm_head{rest}"));
    }
    out
}
