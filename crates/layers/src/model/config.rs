//! The fields of `text_config` the text decoder reads, as mlx-vlm 0.7.6's
//! `qwen3_5.config.TextConfig` / `qwen3_5_moe.config.TextConfig` give them.

use serde_json::{Map, Value};

use super::ModelError;
use crate::config::Qwen3_5Config;
use crate::position::MropeConfig;

/// The decoder's dimensions (dense `qwen3_5` or MoE `qwen3_5_moe`).
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub linear_num_value_heads: usize,
    pub linear_num_key_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub full_attention_interval: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// Dense MLP width (`qwen3_5`); `None` for MoE.
    pub intermediate_size: Option<usize>,
    /// `Some` for `qwen3_5_moe`.
    pub moe: Option<MoeConfig>,
    /// The rotary (partial, interleaved mRoPE), from the crate's config reader.
    pub mrope: MropeConfig,
}

/// The sparse MoE block's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
}

impl TextConfig {
    /// Reads a parsed `config.json` (top level with `text_config`).
    ///
    /// # Errors
    /// [`ModelError::Config`] from the crate's Qwen3.5 reader,
    /// [`ModelError::ConfigKey`] for a missing or mistyped key.
    pub fn from_json(config: &Map<String, Value>) -> Result<Self, ModelError> {
        let base = Qwen3_5Config::from_json(config)?;
        let text = config
            .get("text_config")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::ConfigKey {
                key: String::new(),
                problem: "missing or not an object".into(),
            })?;
        let usize_key = |key: &str| -> Result<usize, ModelError> {
            text.get(key)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::ConfigKey {
                    key: key.into(),
                    problem: "missing or not a non-negative integer".into(),
                })
        };
        let usize_or = |key: &str, default: usize| -> Result<usize, ModelError> {
            if text.get(key).is_none_or(Value::is_null) {
                Ok(default)
            } else {
                usize_key(key)
            }
        };
        let bool_or = |key: &str, default: bool| -> Result<bool, ModelError> {
            match text.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ModelError::ConfigKey {
                    key: key.into(),
                    problem: "not a bool".into(),
                }),
            }
        };
        let rms_norm_eps = text
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .ok_or_else(|| ModelError::ConfigKey {
                key: "rms_norm_eps".into(),
                problem: "missing or not a number".into(),
            })? as f32;
        let moe = if base.model_type == "qwen3_5_moe" {
            Some(MoeConfig {
                num_experts: usize_key("num_experts")?,
                num_experts_per_tok: usize_key("num_experts_per_tok")?,
                moe_intermediate_size: usize_key("moe_intermediate_size")?,
                shared_expert_intermediate_size: usize_key("shared_expert_intermediate_size")?,
            })
        } else {
            None
        };
        let intermediate_size = if moe.is_none() {
            Some(usize_key("intermediate_size")?)
        } else {
            None
        };
        // tie_word_embeddings: TextConfig's default is False; the top level
        // of a real config carries it too, and mlx-vlm reads text_config's.
        let tie_word_embeddings = bool_or("tie_word_embeddings", false)?;
        Ok(TextConfig {
            model_type: base.model_type.clone(),
            hidden_size: base.hidden_size,
            num_hidden_layers: base.num_hidden_layers,
            num_attention_heads: base.num_attention_heads,
            num_key_value_heads: base.num_key_value_heads,
            head_dim: base.head_dim,
            rms_norm_eps,
            vocab_size: usize_key("vocab_size")?,
            linear_num_value_heads: usize_key("linear_num_value_heads")?,
            linear_num_key_heads: usize_key("linear_num_key_heads")?,
            linear_key_head_dim: usize_key("linear_key_head_dim")?,
            linear_value_head_dim: usize_key("linear_value_head_dim")?,
            linear_conv_kernel_dim: usize_key("linear_conv_kernel_dim")?,
            full_attention_interval: usize_or("full_attention_interval", 4)?,
            tie_word_embeddings,
            attention_bias: bool_or("attention_bias", false)?,
            intermediate_size,
            moe,
            mrope: base.mrope()?,
        })
    }

    /// Whether layer `i` is a Gated DeltaNet layer (`(i + 1) %
    /// full_attention_interval != 0`), else gated full attention.
    pub fn is_linear(&self, i: usize) -> bool {
        !(i + 1).is_multiple_of(self.full_attention_interval)
    }

    /// `key_dim * 2 + value_dim`: the conv's channels.
    pub fn conv_dim(&self) -> usize {
        self.linear_key_head_dim * self.linear_num_key_heads * 2
            + self.linear_value_head_dim * self.linear_num_value_heads
    }
}
