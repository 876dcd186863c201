//! What can go wrong building or running the Qwen3.5 text model.

use thiserror::Error;

use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::ffi::MlxError;
use crate::position::PositionError;
use crate::quantized::LayerError;

/// An error of [`super::Model`]: loading, or a forward step.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The checkpoint directory could not be read or is inconsistent.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// `config.json` is not a Qwen3.5 config the reference would load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A quantized layer refused its tensors or its input.
    #[error(transparent)]
    Layer(#[from] LayerError),
    /// The rotary embedding refused its inputs.
    #[error(transparent)]
    Position(#[from] PositionError),
    /// MLX rejected a call (through the crate's mlx-c wrappers).
    #[error(transparent)]
    Ffi(#[from] MlxError),
    /// MLX rejected a call (through mlx-rs).
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// A `text_config` key is missing or has the wrong type.
    #[error("config.json: text_config.{key}: {problem} (fix: give it as mlx-vlm 0.7.6's TextConfig reads it)")]
    ConfigKey { key: String, problem: String },
    /// A tensor the model needs is not in the checkpoint.
    #[error("checkpoint {dir}: no tensor `{name}` (needed by {module}); fix: write the checkpoint with the reference's save (language_model.* names) or the Hugging Face names")]
    MissingTensor {
        dir: String,
        name: String,
        module: String,
    },
    /// A tensor has another shape than the module it loads into.
    #[error("checkpoint tensor `{name}`: shape {actual:?}, the module expects {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<i32>,
        actual: Vec<i32>,
    },
    /// A request this port does not run (and what to do instead).
    #[error("{what}: not supported by this port: {why}")]
    Unsupported { what: String, why: String },
    /// The inputs do not fit the model or its cache.
    #[error("input: {0}")]
    Input(String),
}
