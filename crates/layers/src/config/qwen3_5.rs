//! The Qwen3.5 config as mlx-vlm 0.7.6 reads it for the text model's rotary
//! and the rope index.
//!
//! The reference's steps (`mlx_vlm.utils.load_model`):
//!
//! 1. `config.setdefault("text_config", config.pop("llm_config", {}))`,
//!    `config.setdefault("vision_config", {})`;
//! 2. `ModelConfig.from_dict(config)` (`qwen3_5/config.py`, or
//!    `qwen3_5_moe/config.py`): `model_type` is required; `image_token_id`
//!    248056, `video_token_id` 248057 and `vision_start_token_id` 248045
//!    are the defaults;
//! 3. `update_module_configs`: `TextConfig.from_dict(config["text_config"])`
//!    (every dataclass field without a default is required: `TypeError`
//!    otherwise) and `VisionConfig.from_dict(config["vision_config"])` unless
//!    it is `null` (all fields defaulted; `spatial_merge_size` 2;
//!    `deepstack_visual_indexes` must be empty: `ValueError`).
//!
//! `TextConfig.__post_init__` renames `rope_parameters["rope_type"]` to
//! `"type"` and requires `mrope_section`, `type`, `rope_theta` and
//! `partial_rotary_factor` in a non-empty `rope_parameters`. An absent
//! `rope_parameters` takes the dataclass default
//! [`QWEN3_5_DEFAULT_ROPE_PARAMETERS`], whose `rope_theta` is 100000: **a
//! config that spells its rope as `rope_scaling` plus a top-level
//! `rope_theta` (the pre-`rope_parameters` HF form) silently gets theta
//! 100000 and sections `[11, 11, 10]`** (finding, reference). The port does
//! the same and lists `rope_parameters` in
//! [`Qwen3_5Config::defaults_used`].
//!
//! The attention then builds `Qwen3_5RotaryEmbedding(int(head_dim *
//! rope_parameters["partial_rotary_factor"]), base=rope_parameters["rope_theta"],
//! mrope_section=rope_parameters["mrope_section"])`: `head_dim` defaults to
//! `None` in `TextConfig` and fails there (`TypeError`), so the port
//! requires it. `mrope_interleaved` is not read by the reference (Qwen3.5's
//! rotary is always interleaved); it is kept for display.

use std::path::Path;

use serde_json::{Map, Value};

use super::json::Obj;
use super::ConfigError;
use crate::position::{MropeConfig, VisionTokens};

/// `rope_theta` as the file writes it: the reference keeps a JSON integer
/// as a Python `int` and a float as a `float`; both reach MLX as the same
/// float32 base (`inv_freq` is computed from `base ** (…)` in float32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeTheta {
    /// An integer (`10000000`).
    Int(i64),
    /// A float (`10000000.0`).
    Float(f64),
}

impl RopeTheta {
    /// The value as f64.
    pub fn as_f64(self) -> f64 {
        match self {
            RopeTheta::Int(i) => i as f64,
            RopeTheta::Float(f) => f,
        }
    }
}

/// The rotary parameters of the text model (`TextConfig.rope_parameters`
/// after `__post_init__`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3_5RopeParameters {
    /// `type` (or `rope_type`, renamed by the reference). The reference
    /// only checks that the key is present and never reads its value (the
    /// rotary is always interleaved): a value that is not a string is kept
    /// as its JSON text.
    pub rope_type: String,
    /// `rope_theta`.
    pub rope_theta: RopeTheta,
    /// `partial_rotary_factor`.
    pub partial_rotary_factor: f64,
    /// `mrope_section` (t, h, w frequencies).
    pub mrope_section: Vec<usize>,
    /// `mrope_interleaved`, when present as a bool (not read by the
    /// reference, so a value of another type is accepted and kept as
    /// `None`).
    pub mrope_interleaved: Option<bool>,
}

/// `TextConfig.rope_parameters`' default (mlx-vlm 0.7.6, both
/// `qwen3_5` and `qwen3_5_moe`): type `default`, sections `[11, 11, 10]`,
/// theta 100000 (an integer), partial rotary factor 0.25.
pub const QWEN3_5_DEFAULT_ROPE_PARAMETERS: (&str, i64, f64, [usize; 3]) =
    ("default", 100_000, 0.25, [11, 11, 10]);

/// What the layers read from a Qwen3.5 (dense `qwen3_5` or MoE
/// `qwen3_5_moe`) config.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3_5Config {
    /// Top-level `model_type`.
    pub model_type: String,
    /// `text_config.hidden_size`.
    pub hidden_size: usize,
    /// `text_config.num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `text_config.num_attention_heads`.
    pub num_attention_heads: usize,
    /// `text_config.num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `text_config.head_dim`.
    pub head_dim: usize,
    /// `text_config.rope_parameters` (or its default).
    pub rope: Qwen3_5RopeParameters,
    /// `image_token_id` (default 248056).
    pub image_token_id: i32,
    /// `video_token_id` (default 248057).
    pub video_token_id: i32,
    /// `vision_start_token_id` (default 248045).
    pub vision_start_token_id: i32,
    /// `vision_config.spatial_merge_size` (default 2); `None` when
    /// `vision_config` is `null` (text-only conversions).
    pub spatial_merge_size: Option<usize>,
    /// Keys the reference's defaults stood in for, dotted.
    pub defaults_used: Vec<String>,
}

/// `TextConfig`'s fields without a default, in declaration order.
fn required_text_fields(model_type: &str) -> &'static [&'static str] {
    const DENSE: &[&str] = &[
        "model_type",
        "hidden_size",
        "intermediate_size",
        "linear_num_value_heads",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "num_hidden_layers",
        "num_attention_heads",
        "rms_norm_eps",
        "vocab_size",
        "num_key_value_heads",
        "max_position_embeddings",
    ];
    const MOE: &[&str] = &[
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "linear_num_value_heads",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "num_experts",
        "num_experts_per_tok",
        "shared_expert_intermediate_size",
        "moe_intermediate_size",
        "rms_norm_eps",
        "vocab_size",
        "num_key_value_heads",
        "max_position_embeddings",
    ];
    if model_type == "qwen3_5_moe" {
        MOE
    } else {
        DENSE
    }
}

const MISSING_REQUIRED: &str =
    "mlx-vlm's TextConfig has no default for it (TypeError when the model loads)";

impl Qwen3_5Config {
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
    /// - [`ConfigError::MissingKey`]: `model_type`, `text_config` (or a
    ///   field `TextConfig` requires), `text_config.head_dim`.
    /// - [`ConfigError::ModelType`]: not `qwen3_5` / `qwen3_5_moe`.
    /// - [`ConfigError::WrongType`] for any read key of the wrong type.
    /// - [`ConfigError::RopeParametersIncomplete`], and
    ///   [`ConfigError::InvalidValue`] for an empty or null
    ///   `rope_parameters`, a non-empty `deepstack_visual_indexes`, or
    ///   values that build no valid rotary (see [`Qwen3_5Config::mrope`]).
    pub fn from_json(config: &Map<String, Value>) -> Result<Self, ConfigError> {
        let root = Obj::root(config);
        let mut defaults_used = Vec::new();
        let model_type = root.require(
            "model_type",
            root.opt_str("model_type")?,
            "mlx-vlm's ModelConfig requires it (and load_model picks the model class by it)",
        )?;
        if !matches!(model_type, "qwen3_5" | "qwen3_5_moe") {
            return Err(ConfigError::ModelType {
                key: "model_type".into(),
                expected: "\"qwen3_5\" or \"qwen3_5_moe\"",
                got: model_type.to_string(),
            });
        }

        // Step 1: text_config, else llm_config, else {}.
        let (text_key, text_value) = match (config.get("text_config"), config.get("llm_config")) {
            (Some(v), _) => ("text_config", Some(v)),
            (None, Some(v)) => ("llm_config", Some(v)),
            (None, None) => ("text_config", None),
        };
        let empty = Map::new();
        let text_map = match text_value {
            None => &empty,
            Some(Value::Object(m)) => m,
            Some(v) => return Err(root.wrong(text_key, "an object", v)),
        };
        let text = Obj {
            map: text_map,
            prefix: "text_config",
        };
        for field in required_text_fields(model_type) {
            if text.get(field).is_none() {
                return Err(ConfigError::MissingKey {
                    key: text.key(field),
                    reference: MISSING_REQUIRED,
                });
            }
        }
        let hidden_size = text.require(
            "hidden_size",
            text.opt_usize("hidden_size")?,
            MISSING_REQUIRED,
        )?;
        let num_hidden_layers = text.require(
            "num_hidden_layers",
            text.opt_usize("num_hidden_layers")?,
            MISSING_REQUIRED,
        )?;
        let num_attention_heads = text.require(
            "num_attention_heads",
            text.opt_usize("num_attention_heads")?,
            MISSING_REQUIRED,
        )?;
        let num_key_value_heads = text.require(
            "num_key_value_heads",
            text.opt_usize("num_key_value_heads")?,
            MISSING_REQUIRED,
        )?;
        let head_dim = match text.get("head_dim") {
            None | Some(Value::Null) => {
                return Err(ConfigError::MissingKey {
                    key: text.key("head_dim"),
                    reference: "TextConfig defaults it to None and Qwen3_5Attention fails on \
                                int(None * partial_rotary_factor) (TypeError)",
                })
            }
            Some(_) => text.opt_usize("head_dim")?.unwrap_or_default(),
        };
        let rope = match text.get("rope_parameters") {
            None => {
                defaults_used.push(text.key("rope_parameters"));
                let (t, theta, factor, section) = QWEN3_5_DEFAULT_ROPE_PARAMETERS;
                Qwen3_5RopeParameters {
                    rope_type: t.into(),
                    rope_theta: RopeTheta::Int(theta),
                    partial_rotary_factor: factor,
                    mrope_section: section.to_vec(),
                    mrope_interleaved: None,
                }
            }
            Some(v) => rope_parameters(&text, v)?,
        };

        // Step 2: the top-level token ids.
        let mut id = |k: &str, default: i32| -> Result<i32, ConfigError> {
            Ok(match root.opt_i32(k)? {
                Some(v) => v,
                None => {
                    defaults_used.push(k.to_string());
                    default
                }
            })
        };
        let image_token_id = id("image_token_id", 248_056)?;
        let video_token_id = id("video_token_id", 248_057)?;
        let vision_start_token_id = id("vision_start_token_id", 248_045)?;

        // Step 3: vision_config (absent = {}, null = no vision model).
        let spatial_merge_size = match config.get("vision_config") {
            Some(Value::Null) => None,
            None => {
                defaults_used.push("vision_config.spatial_merge_size".into());
                Some(2)
            }
            Some(Value::Object(vision)) => {
                let vision = Obj {
                    map: vision,
                    prefix: "vision_config",
                };
                if let Some(v) = vision.get("deepstack_visual_indexes") {
                    let non_empty = match v {
                        Value::Array(a) => !a.is_empty(),
                        Value::Null => false,
                        _ => return Err(vision.wrong("deepstack_visual_indexes", "a list", v)),
                    };
                    if non_empty {
                        return Err(ConfigError::InvalidValue {
                            key: vision.key("deepstack_visual_indexes"),
                            value: v.to_string(),
                            why: "mlx-vlm's Qwen3.5 VisionConfig raises ValueError (deepstack is \
                                  disabled for qwen3.5); remove it or make it []"
                                .into(),
                        });
                    }
                }
                match vision.opt_usize("spatial_merge_size")? {
                    Some(s) => Some(s),
                    None => {
                        defaults_used.push(vision.key("spatial_merge_size"));
                        Some(2)
                    }
                }
            }
            Some(v) => return Err(root.wrong("vision_config", "an object or null", v)),
        };

        let parsed = Qwen3_5Config {
            model_type: model_type.to_string(),
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rope,
            image_token_id,
            video_token_id,
            vision_start_token_id,
            spatial_merge_size,
            defaults_used,
        };
        parsed.mrope()?;
        Ok(parsed)
    }

    /// The text attention's rotary: `int(head_dim * partial_rotary_factor)`
    /// rotated channels, `rope_theta`, `mrope_section`
    /// ([`MropeConfig::qwen3_5`]), validated.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] naming `text_config.rope_parameters`
    /// when [`MropeConfig::validate`] refuses it (sections too short, a
    /// theta that is NaN, not positive or zero in f32). An odd rotary dim
    /// and an infinite theta are accepted, as the reference computes them.
    pub fn mrope(&self) -> Result<MropeConfig, ConfigError> {
        let mrope = MropeConfig::qwen3_5(
            self.head_dim,
            self.rope.partial_rotary_factor,
            self.rope.rope_theta.as_f64(),
            self.rope.mrope_section.clone(),
        );
        mrope.validate().map_err(|e| ConfigError::InvalidValue {
            key: "text_config.rope_parameters".into(),
            value: format!(
                "{{rope_theta: {}, partial_rotary_factor: {}, mrope_section: {:?}}} with head_dim {}",
                self.rope.rope_theta.as_f64(),
                self.rope.partial_rotary_factor,
                self.rope.mrope_section,
                self.head_dim
            ),
            why: e.to_string(),
        })?;
        Ok(mrope)
    }

    /// The rope index's special tokens and merge size.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] when `vision_config` is `null` (the
    /// reference's `get_rope_index` fails on `None.spatial_merge_size`).
    pub fn vision_tokens(&self) -> Result<VisionTokens, ConfigError> {
        let spatial_merge_size =
            self.spatial_merge_size
                .ok_or_else(|| {
                    ConfigError::InvalidValue {
            key: "vision_config".into(),
            value: "null".into(),
            why: "a text-only conversion has no vision model; the rope index of a prompt with \
                  images or videos needs vision_config.spatial_merge_size"
                .into(),
        }
                })?;
        if spatial_merge_size == 0 {
            // The reference reads it, then get_rope_index divides by it.
            return Err(ConfigError::InvalidValue {
                key: "vision_config.spatial_merge_size".into(),
                value: "0".into(),
                why: "get_rope_index divides the image and video grids by it (ZeroDivisionError \
                      in the reference); use the vision tower's merge size (2 for Qwen3.5)"
                    .into(),
            });
        }
        Ok(VisionTokens {
            image_token_id: self.image_token_id,
            video_token_id: self.video_token_id,
            vision_start_token_id: self.vision_start_token_id,
            spatial_merge_size,
        })
    }
}

/// `TextConfig.__post_init__`'s handling of a given `rope_parameters`.
fn rope_parameters(text: &Obj<'_>, v: &Value) -> Result<Qwen3_5RopeParameters, ConfigError> {
    let key = text.key("rope_parameters");
    let map = match v {
        Value::Object(m) if !m.is_empty() => m,
        Value::Object(_) | Value::Null => {
            return Err(ConfigError::InvalidValue {
                key,
                value: v.to_string(),
                why: "an empty rope_parameters skips mlx-vlm's check and Qwen3_5Attention then \
                      fails on rope_parameters[\"partial_rotary_factor\"]; give the four keys or \
                      remove it for the defaults"
                    .into(),
            })
        }
        _ => return Err(text.wrong("rope_parameters", "an object", v)),
    };
    let rope = Obj { map, prefix: &key };
    // `type` wins over `rope_type` when both are present (the rename only
    // happens when `type` is absent).
    let type_key = if rope.get("type").is_some() {
        "type"
    } else {
        "rope_type"
    };
    let mut missing: Vec<&'static str> = Vec::new();
    for (k, present) in [
        ("mrope_section", rope.get("mrope_section").is_some()),
        (
            "partial_rotary_factor",
            rope.get("partial_rotary_factor").is_some(),
        ),
        ("rope_theta", rope.get("rope_theta").is_some()),
        ("type", rope.get(type_key).is_some()),
    ] {
        if !present {
            missing.push(k);
        }
    }
    if !missing.is_empty() {
        return Err(ConfigError::RopeParametersIncomplete { key, missing });
    }
    let rope_type = match rope.get(type_key) {
        Some(Value::String(s)) => s.clone(),
        // Never read by the reference: any value loads there.
        Some(other) => other.to_string(),
        None => unreachable!("checked above"),
    };
    let rope_theta = match rope.get("rope_theta") {
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => match n.as_i64() {
            Some(i) => RopeTheta::Int(i),
            None => {
                return Err(rope.wrong(
                    "rope_theta",
                    "a number that fits int64",
                    &Value::Number(n.clone()),
                ))
            }
        },
        Some(Value::Number(n)) => RopeTheta::Float(n.as_f64().unwrap_or(f64::NAN)),
        // A Python bool is an int: `True ** x` is 1 (and `False` 0, which
        // the rotary's base check then refuses, as its NaN angles deserve).
        Some(Value::Bool(b)) => RopeTheta::Int(i64::from(*b)),
        Some(other) => return Err(rope.wrong("rope_theta", "a number", other)),
        None => unreachable!("checked above"),
    };
    let partial_rotary_factor = rope.opt_f64("partial_rotary_factor")?.unwrap_or_default();
    let mrope_section = rope.opt_usize_list("mrope_section")?.unwrap_or_default();
    let mrope_interleaved = rope.get("mrope_interleaved").and_then(Value::as_bool);
    Ok(Qwen3_5RopeParameters {
        rope_type,
        rope_theta,
        partial_rotary_factor,
        mrope_section,
        mrope_interleaved,
    })
}
