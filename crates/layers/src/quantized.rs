//! Quantized layers: [`QuantizedLinear`] (with [`LoraAdapter`]s) and
//! [`QuantizedSwitchLinear`], ported from the origin's `quantized-linear.ts`
//! and `quantized-switch-linear.ts` and conformed to the pinned reference:
//!
//! | here | reference (pinned) |
//! | --- | --- |
//! | [`QuantizedLinear::forward`] | `mlx.nn.QuantizedLinear.__call__` (mlx 0.32.2), then `mlx_lm.tuner.lora.LoRALinear.__call__` (mlx-lm 0.32.2) per adapter |
//! | [`QuantizedPayload::in_features`] | `QuantizedLinear._extra_repr` / `LoRALinear.from_base` (`packed * 32 // bits`) |
//! | [`QuantSpec::validate`] | the checks of `mlx.core.quantize` |
//! | [`QuantizedSwitchLinear::forward`], [`QuantizedSwitchLinear::forward_routed`] | `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__` (mlx-lm 0.32.2) |
//! | [`ExpertIndices::top_k`] | `mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]` in `mlx_lm.models.qwen3_moe` / `qwen3_next` (mlx-lm 0.32.2) |
//! | [`QuantizedEmbedding::lookup`], [`QuantizedEmbedding::as_linear`] | `mlx.nn.QuantizedEmbedding.__call__`, `.as_linear` (mlx 0.32.2) |
//! | [`QuantizedPayload::quantize_with_global_scale`] | `mlx.core.quantize(..., global_scale=)` (mlx 0.32.2) |
//! | [`QuantizedPayload::quantize_experts_with_global_scale`] | `mlx_lm.models.switch_layers._quantize_experts` (mlx-lm 0.32.2) |
//! | [`lora::fuse`], [`AdapterSet`] | `mlx_lm.tuner.lora.LoRALinear.fuse`, `mlx_lm.tuner.utils.load_adapters`, `mlx_vlm.trainer.utils.apply_lora_layers` |
//! | `from_checkpoint` constructors | `mlx_lm.utils.load_model` (`class_predicate`, `infer_quant_config`, `load_weights`) |
//!
//! Every constructor takes mlx-rs [`mlx_rs::Array`]s plus a [`QuantSpec`];
//! every forward returns `Result<Array, LayerError>` and never panics on bad
//! input.

mod adapters;
mod embedding;
mod error;
mod linear;
pub mod lora;
mod payload;
pub mod rows_regime;
mod spec;
pub(crate) mod switch;

pub use crate::ffi::Mode;
pub use adapters::{
    lora_scale_from_alpha, AdapterError, AdapterFormat, AdapterSet, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
};
pub use embedding::QuantizedEmbedding;
pub use error::{LayerError, PayloadError, SpecError};
pub(crate) use linear::{check_bias_exact, check_bias_last_axis};
pub use linear::{Forward, QuantizedLinear};
pub use lora::LoraAdapter;
pub use payload::QuantizedPayload;
pub use rows_regime::{RowsCall, RowsLimit, RowsRegime};
pub use spec::QuantSpec;
pub use switch::{ExpertIndices, QuantizedSwitchLinear};
