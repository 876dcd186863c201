//! Model configurations read as the reference reads them: the Qwen3.5 text
//! config (mRoPE and rope-index parameters) and the Gemma 4 vision config
//! (2-D RoPE parameters), from a model directory's `config.json`.
//!
//! | item | mirrors (pinned reference) |
//! | --- | --- |
//! | [`Qwen3_5Config`] | `mlx_vlm.utils.load_model`'s config steps (`setdefault` of `text_config`/`vision_config`, `ModelConfig.from_dict`, `update_module_configs`) with `mlx_vlm.models.qwen3_5.config` (mlx-vlm 0.7.6) |
//! | [`Gemma4VisionConfig`] | the same steps with `mlx_vlm.models.gemma4.config.VisionConfig` (mlx-vlm 0.7.6), read by `gemma4.vision.VisionAttention` |
//!
//! Only the fields these layers use are kept; every other key is ignored,
//! as the reference's `from_dict` ignores keys its dataclass lacks.
//! Wherever the reference substitutes a default, the port substitutes the
//! same one and records it in `defaults_used`, so a caller can tell a real
//! value from a substituted one. Where the reference would fail (at load,
//! or later when the layer is built), the port returns a
//! [`ConfigError`] naming the key.

mod error;
mod gemma4_vision;
mod json;
mod qwen3_5;

pub use error::ConfigError;
pub use gemma4_vision::{Gemma4VisionConfig, GEMMA4_VISION_DEFAULT_ROPE_THETA};
pub use qwen3_5::{
    Qwen3_5Config, Qwen3_5RopeParameters, RopeTheta, QWEN3_5_DEFAULT_ROPE_PARAMETERS,
};

use std::path::Path;

use serde_json::{Map, Value};

/// Reads and parses `path` (a `config.json`) as a JSON object.
///
/// # Errors
/// [`ConfigError::Read`], [`ConfigError::Json`] or
/// [`ConfigError::NotAnObject`].
pub fn read_config_json(path: impl AsRef<Path>) -> Result<Map<String, Value>, ConfigError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_config_json(&bytes, path)
}

/// `parse(read_config_json(path))`, errors naming the file.
fn from_file<T>(
    path: &Path,
    parse: fn(&Map<String, Value>) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let map = read_config_json(path)?;
    parse(&map).map_err(|e| e.in_file(path))
}

/// Parses config bytes; `path` only names the source in errors.
///
/// # Errors
/// [`ConfigError::Json`] or [`ConfigError::NotAnObject`].
pub fn parse_config_json(bytes: &[u8], path: &Path) -> Result<Map<String, Value>, ConfigError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError::Json {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ConfigError::NotAnObject {
            path: path.to_path_buf(),
            got: json::kind(&other),
        }),
    }
}
