//! The Gemma 4 vision tower's config as mlx-vlm 0.7.6 reads it for the 2-D
//! RoPE.
//!
//! The reference's steps (`mlx_vlm.utils.load_model`):
//! `config.setdefault("vision_config", {})`, `ModelConfig.from_dict(config)`
//! (`gemma4/config.py`; `model_type` defaults to `"gemma4"`), then
//! `update_module_configs`: `VisionConfig.from_dict(config["vision_config"])`
//! unless it is `null`. Every `VisionConfig` field has a default
//! (`head_dim` 64, 12 heads, 12 KV heads, hidden 768, patch 16) and
//! `__post_init__` sets `rope_parameters = {"rope_theta": 100.0,
//! "rope_type": "default"}` when it is absent or `null`.
//! `gemma4.vision.VisionAttention` then reads `head_dim` and
//! `rope_parameters["rope_theta"]` (a given `rope_parameters` without
//! `rope_theta` fails there with `KeyError`) and calls
//! `apply_multidimensional_rope(q, positions, rope_theta)`.

use std::path::Path;

use serde_json::{Map, Value};

use super::json::Obj;
use super::ConfigError;

/// `VisionConfig.rope_parameters["rope_theta"]`'s default (mlx-vlm 0.7.6).
pub const GEMMA4_VISION_DEFAULT_ROPE_THETA: f64 = 100.0;

/// What the 2-D RoPE reads from a Gemma 4 config's `vision_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4VisionConfig {
    /// Top-level `model_type` (default `"gemma4"`).
    pub model_type: String,
    /// `vision_config.hidden_size` (default 768).
    pub hidden_size: usize,
    /// `vision_config.num_attention_heads` (default 12).
    pub num_attention_heads: usize,
    /// `vision_config.num_key_value_heads` (default 12).
    pub num_key_value_heads: usize,
    /// `vision_config.head_dim` (default 64): the last axis the 2-D RoPE
    /// rotates.
    pub head_dim: usize,
    /// `vision_config.patch_size` (default 16).
    pub patch_size: usize,
    /// `vision_config.rope_parameters.rope_theta` (default 100.0): the
    /// `base_frequency` of `apply_multidimensional_rope`.
    pub rope_theta: f64,
    /// Keys the reference's defaults stood in for, dotted.
    pub defaults_used: Vec<String>,
}

impl Gemma4VisionConfig {
    /// Reads `path` (a model directory's `config.json`).
    ///
    /// # Errors
    /// Any [`ConfigError`], wrapped in [`ConfigError::InFile`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        super::from_file(path.as_ref(), Self::from_json)
    }

    /// Reads a parsed config.
    ///
    /// # Errors
    /// - [`ConfigError::ModelType`]: a `model_type` other than `gemma4`.
    /// - [`ConfigError::InvalidValue`]: `vision_config` is `null` (no
    ///   vision tower), `head_dim` 0, or a `rope_theta` that is NaN, not
    ///   positive, or zero in f32 (one beyond f32 is accepted, as the
    ///   reference accepts it).
    /// - [`ConfigError::MissingKey`]: a `rope_parameters` object without
    ///   `rope_theta`.
    /// - [`ConfigError::WrongType`] for any read key of the wrong type.
    pub fn from_json(config: &Map<String, Value>) -> Result<Self, ConfigError> {
        let root = Obj::root(config);
        let mut defaults_used = Vec::new();
        let model_type = match root.opt_str("model_type")? {
            Some(t) => t.to_string(),
            None => {
                defaults_used.push("model_type".to_string());
                "gemma4".to_string()
            }
        };
        if model_type != "gemma4" {
            return Err(ConfigError::ModelType {
                key: "model_type".into(),
                expected: "\"gemma4\"",
                got: model_type,
            });
        }
        let empty = Map::new();
        let vision_map =
            match config.get("vision_config") {
                None => &empty,
                Some(Value::Object(m)) => m,
                Some(Value::Null) => return Err(ConfigError::InvalidValue {
                    key: "vision_config".into(),
                    value: "null".into(),
                    why: "a text-only conversion has no vision tower (mlx-vlm skips it); use the \
                          full model's config"
                        .into(),
                }),
                Some(v) => return Err(root.wrong("vision_config", "an object", v)),
            };
        let vision = Obj {
            map: vision_map,
            prefix: "vision_config",
        };
        let mut field = |k: &str, default: usize| -> Result<usize, ConfigError> {
            Ok(match vision.opt_usize(k)? {
                Some(v) => v,
                None => {
                    defaults_used.push(vision.key(k));
                    default
                }
            })
        };
        let hidden_size = field("hidden_size", 768)?;
        let num_attention_heads = field("num_attention_heads", 12)?;
        let num_key_value_heads = field("num_key_value_heads", 12)?;
        let head_dim = field("head_dim", 64)?;
        let patch_size = field("patch_size", 16)?;
        if head_dim == 0 {
            return Err(ConfigError::InvalidValue {
                key: vision.key("head_dim"),
                value: "0".into(),
                why: "the 2-D RoPE needs at least one channel pair per axis".into(),
            });
        }
        let rope_theta = match vision.get("rope_parameters") {
            None | Some(Value::Null) => {
                defaults_used.push(vision.key("rope_parameters"));
                GEMMA4_VISION_DEFAULT_ROPE_THETA
            }
            Some(Value::Object(m)) => {
                let key = vision.key("rope_parameters");
                let rope = Obj {
                    map: m,
                    prefix: &key,
                };
                rope.require(
                    "rope_theta",
                    rope.opt_f64("rope_theta")?,
                    "gemma4.vision.VisionAttention reads rope_parameters[\"rope_theta\"] (KeyError)",
                )?
            }
            Some(v) => return Err(vision.wrong("rope_parameters", "an object or null", v)),
        };
        // The rotary's own check: NaN, not positive or zero in f32 gives
        // NaN angles; a base beyond f32 is computed as the reference computes it.
        if let Err(e) = crate::position::check_rope_base("rope_theta", rope_theta) {
            return Err(ConfigError::InvalidValue {
                key: vision.key("rope_parameters.rope_theta"),
                value: rope_theta.to_string(),
                why: e.to_string(),
            });
        }
        Ok(Gemma4VisionConfig {
            model_type,
            hidden_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            patch_size,
            rope_theta,
            defaults_used,
        })
    }
}
