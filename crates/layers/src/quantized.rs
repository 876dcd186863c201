//! Quantized layers: [`QuantizedLinear`] (with [`LoraAdapter`]s) and
//! [`QuantizedSwitchLinear`], ported from the origin's `quantized-linear.ts`
//! and `quantized-switch-linear.ts` and conformed to the pinned reference:
//!
//! | here | reference (pinned) |
//! | --- | --- |
//! | [`QuantizedLinear::forward`] | `mlx.nn.QuantizedLinear.__call__` (mlx 0.32.2), then `mlx_lm.tuner.lora.LoRALinear.__call__` (mlx-lm 0.32.2) per adapter |
//! | [`QuantizedPayload::in_features`] | `QuantizedLinear._extra_repr` / `LoRALinear.from_base` (`packed * 32 // bits`) |
//! | [`QuantSpec::validate`] | the checks of `mlx.core.quantize` |
//! | [`QuantizedSwitchLinear::forward`] | `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__` (mlx-lm 0.32.2) |
//! | `from_checkpoint` constructors | `mlx_lm.utils.load_model` (`class_predicate`, `infer_quant_config`, `load_weights`) |
//!
//! Every constructor takes mlx-rs [`mlx_rs::Array`]s plus a [`QuantSpec`];
//! every forward returns `Result<Array, LayerError>` and never panics on bad
//! input.

mod error;
mod linear;
mod lora;
mod payload;
mod spec;
pub(crate) mod switch;

pub use crate::ffi::Mode;
pub use error::{LayerError, PayloadError, SpecError};
pub use linear::{Forward, QuantizedLinear};
pub use lora::LoraAdapter;
pub use payload::QuantizedPayload;
pub use spec::QuantSpec;
pub use switch::QuantizedSwitchLinear;
