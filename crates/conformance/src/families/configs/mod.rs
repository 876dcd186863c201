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
use crate::case::{Case, CaseError, CaseOutput, Ctx};

mod gemma4;
mod qwen3_5;

/// The pieces the glue repeats from `mlx_vlm.utils` (which imports
/// transformers, absent from the reference environment).
const LOAD_MODEL_STEPS: &[&str] = &[
    "mlx_vlm.utils.load_model: config.setdefault(text_config/vision_config/audio_config)",
    "ModelConfig.from_dict",
    "mlx_vlm.utils.update_module_configs",
];

pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(qwen3_5::cases());
    cases.extend(gemma4::cases());
    cases
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

/// A read case's run function.
type ReadRun<S> = fn(&Ctx, &S) -> Result<CaseOutput, CaseError>;
/// An apply case's run function (one per dtype).
type ApplyRun<S> = fn(&Ctx, &S, DType) -> Result<CaseOutput, CaseError>;

/// The cases of one config: `<family>/<model>/read` and
/// `<family>/<model>/<apply>/<dtype>` for bf16 and f32, all labelled with
/// the glue's repeated `load_model` steps.
fn register<S: Clone + Send + Sync + 'static>(
    cases: &mut Vec<Case>,
    family: &'static str,
    model: &str,
    source: S,
    read: (&'static str, ReadRun<S>),
    apply: (&'static str, &'static str, ApplyRun<S>),
) {
    let (read_reference, read_run) = read;
    let s = source.clone();
    cases.push(
        Case::must_equal(
            format!("{family}/{model}/read"),
            family,
            read_reference,
            move |ctx| read_run(ctx, &s),
        )
        .glue_composed(LOAD_MODEL_STEPS),
    );
    let (apply_name, apply_reference, apply_run) = apply;
    for dtype in [DType::Bfloat16, DType::Float32] {
        let s = source.clone();
        cases.push(
            Case::must_equal(
                format!("{family}/{model}/{apply_name}/{}", dtype_tag(dtype)),
                family,
                apply_reference,
                move |ctx| apply_run(ctx, &s, dtype),
            )
            .glue_composed(LOAD_MODEL_STEPS),
        );
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
