//! Case family `configs`: the real `config.json`s of `fixtures/configs/`
//! (see its README for each file's source), read by the port's config
//! readers (`layers::config`) and by mlx-vlm's own config classes, then
//! the layers built from them at the real dimensions and theta.
//!
//! | sub-family | port | reference |
//! | --- | --- | --- |
//! | `configs/qwen3_5/<model>/read` | `Qwen3_5Config::from_file` | `mlx_vlm.utils.load_model`'s config steps with `qwen3_5` / `qwen3_5_moe` `ModelConfig` (mlx-vlm 0.7.6) |
//! | `configs/qwen3_5/<model>/mrope/<dtype>` | `rope_index` with the config's tokens, `Mrope` from `Qwen3_5Config::mrope` | `get_rope_index` with that config, the attention's rotary built from its text_config |
//! | `configs/gemma4/<model>/read` | `Gemma4VisionConfig::from_file` | the same steps with `gemma4` `VisionConfig` |
//! | `configs/gemma4/<model>/rope2d/<dtype>` | `apply_multidimensional_rope` at the config's head_dim and theta | `mlx_vlm.models.gemma4.vision.apply_multidimensional_rope` with the theta `VisionAttention` reads |
//!
//! | `configs/qwen3_5/<model>/mlx-lm-vs-mlx-vlm` (finding) | — | mlx-vlm's `TextConfig` vs mlx-lm's `TextModelArgs` on the same file, and every theta the file writes |
//! | `configs/qwen3_5/<model>/quantization-keys` (finding, quantized conversions) | — | the block's keys as mlx-lm's loader reads them (as written) vs mlx-vlm's `ModelConfig.quantization` (renamed) |
//!
//! The Qwen3.5 configs of `fixtures/configs/quantized/` are read like
//! those of `qwen3_5/`. Their quantization blocks are checked by
//! `quantized/checkpoint` (fixtures written from them).

use std::path::PathBuf;

use oracle::DType;

use super::support::dtype_tag;
use crate::case::{Case, CaseError};
use crate::families::describe::{described, Described, Params};

pub mod gemma4;
pub mod qwen3_5;
pub mod refused;

/// The pieces the glue repeats from `mlx_vlm.utils` (which imports
/// transformers, absent from the reference environment).
const LOAD_MODEL_STEPS: &[&str] = &[
    "mlx_vlm.utils.load_model: config.setdefault(text_config/vision_config/audio_config)",
    "ModelConfig.from_dict",
    "mlx_vlm.utils.update_module_configs",
];

pub fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    cases.extend(qwen3_5::descriptions());
    cases.extend(gemma4::descriptions());
    cases.extend(refused::descriptions());
    cases
}

/// A config case as data: the file `fixtures/configs/<dir>/<model>/config.json`
/// (optionally edited by a named variant) and what is checked on it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigCase {
    /// The folder under `fixtures/configs`: `qwen3_5` or `quantized`
    /// (Qwen3.5 configs), `gemma4`.
    pub dir: String,
    /// The model's folder name.
    pub model: String,
    /// A named edit of the file (`configs/qwen3_5`'s variants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub check: ConfigCheck,
}

/// What a config case checks.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ConfigCheck {
    /// Must-equal: the config as read.
    Read,
    /// Must-equal: the model's position encoding (Qwen3.5: rope index and
    /// mRoPE; Gemma 4: vision 2D RoPE) at its dims, in `dtype`.
    Apply { dtype: DType },
    /// Finding (Qwen3.5): mlx-lm against mlx-vlm on the same file.
    MlxLmVsMlxVlm,
    /// Finding (quantized Qwen3.5): the quantization keys each library reads.
    QuantizationKeys,
}

impl Params for ConfigCase {
    const BUILDER: &'static str = "configs";
    fn build(self, name: String) -> Case {
        let path = match config_path(&self.dir, &self.model) {
            Ok(path) => path,
            Err(e) => return failing(name, e),
        };
        match self.dir.as_str() {
            "gemma4" => gemma4::build(name, path, self.variant, self.check),
            _ => qwen3_5::build(name, path, self.variant, self.check),
        }
    }
}

/// A case that reports why its description cannot be built.
fn failing(name: String, why: String) -> Case {
    Case::must_equal(name, "configs", "fixtures/configs", move |_| {
        Err(CaseError::Harness(why.clone()))
    })
}

/// `fixtures/configs/<dir>/<model>/config.json`, for a known `dir` and a
/// `model` that is one folder name (a description is data).
fn config_path(dir: &str, model: &str) -> Result<PathBuf, String> {
    if !["qwen3_5", "quantized", "gemma4"].contains(&dir) {
        return Err(format!(
            "config folder `{dir}`: one of qwen3_5, quantized, gemma4"
        ));
    }
    if model.is_empty() || model == "." || model == ".." || model.contains(['/', '\\']) {
        return Err(format!(
            "model `{model}`: one folder name under fixtures/configs/{dir}"
        ));
    }
    let path = crate::home::Home::get()
        .fixtures_dir()
        .join("configs")
        .join(dir)
        .join(model)
        .join("config.json");
    if !path.is_file() {
        return Err(format!(
            "no config `{model}` in fixtures/configs/{dir} ({} is not a file)",
            path.display()
        ));
    }
    Ok(path)
}

/// `fixtures/configs/<family>/<model>/config.json` for every model
/// directory of the family, sorted (empty when the folder is missing: the
/// registry then has no such cases and the README's fixture test fails).
fn models(family: &str) -> Vec<(String, PathBuf)> {
    let dir = crate::home::Home::get()
        .fixtures_dir()
        .join("configs")
        .join(family);
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        // A `config.json` that is not a readable file still makes cases,
        // which then fail with the reason (never a silent skip).
        .filter(|e| e.path().join("config.json").exists())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.path().join("config.json"),
            )
        })
        .collect();
    found.sort();
    found
}

/// The descriptions of one config: `<family>/<name>/read` and
/// `<family>/<name>/<apply>/<dtype>` for bf16 and f32.
fn register(
    cases: &mut Vec<Described>,
    family: &str,
    name: &str,
    config: &ConfigCase,
    apply_name: &str,
) {
    cases.push(described(
        format!("{family}/{name}/read"),
        &ConfigCase {
            check: ConfigCheck::Read,
            ..config.clone()
        },
    ));
    for dtype in [DType::Bfloat16, DType::Float32] {
        cases.push(described(
            format!("{family}/{name}/{apply_name}/{}", dtype_tag(dtype)),
            &ConfigCase {
                check: ConfigCheck::Apply { dtype },
                ..config.clone()
            },
        ));
    }
}

/// The most elements a config case builds for one input tensor (2^26:
/// 256 MiB of f32). A config's dims are the file's: a `head_dim` of 2^40
/// must be a harness error naming the dims, not an allocation abort.
const MAX_CASE_ELEMENTS: usize = 1 << 26;

/// `shape`, checked against [`MAX_CASE_ELEMENTS`]; `what` names the
/// config keys the dims come from.
fn case_shape(shape: &[usize], what: &str) -> Result<Vec<usize>, CaseError> {
    match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_CASE_ELEMENTS => Ok(shape.to_vec()),
        _ => Err(CaseError::Harness(format!(
            "the config's {what} make an input of shape {shape:?}, over the {MAX_CASE_ELEMENTS} \
             elements a case builds; check those keys (real models have head_dim 64-512 and at \
             most a few hundred heads)"
        ))),
    }
}

fn read_text(path: &PathBuf) -> Result<String, CaseError> {
    std::fs::read_to_string(path)
        .map_err(|e| CaseError::Harness(format!("{}: {e}", path.display())))
}

/// int64 values as a host tensor.
fn int64(values: &[i64]) -> oracle::HostTensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    oracle::HostTensor::new(oracle::DType::Int64, vec![values.len()], bytes)
        .expect("sized by construction")
}

/// f64 values as the int64 of their bits (as `reference::configs` returns
/// floats).
fn f64_bits(values: &[f64]) -> oracle::HostTensor {
    let bits: Vec<i64> = values.iter().map(|v| v.to_bits() as i64).collect();
    int64(&bits)
}

#[cfg(test)]
mod tests {
    use super::{case_shape, MAX_CASE_ELEMENTS};

    #[test]
    fn case_shape_refuses_dims_no_case_can_build() {
        assert_eq!(
            case_shape(&[1, 8, 42, 256], "k").unwrap(),
            vec![1, 8, 42, 256]
        );
        assert!(case_shape(&[MAX_CASE_ELEMENTS], "k").is_ok());
        let e = case_shape(&[1, 8, 42, 1 << 40], "text_config.head_dim").unwrap_err();
        assert!(e.to_string().contains("text_config.head_dim"), "{e}");
        // A product past usize::MAX is refused, not wrapped.
        assert!(case_shape(&[usize::MAX, 2], "k").is_err());
    }
}
