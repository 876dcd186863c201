//! Safe wrappers over `mlx_sys` for the mode-aware quantization ops.
//!
//! mlx-rs 0.33 hard-codes `mode = "affine"` in `quantize`, `dequantize`,
//! `quantized_matmul` and `gather_qmm`, and its `quantize` rejects any result
//! that is not three arrays, so the floating-point modes (`mxfp4`, `mxfp8`,
//! `nvfp4`) cannot go through it. This module calls the mlx-c functions of the
//! pinned MLX 0.32.2 directly, with the same argument order and defaults as the
//! Python bindings (`mlx.core.quantize`, `mlx.core.dequantize`,
//! `mlx.core.quantized_matmul`, `mlx.core.gather_qmm`).
//!
//! * [`Mode`]: the `mode=` string.
//! * [`MlxError`]: a failed call with MLX's own message. mlx-c's default
//!   error handler exits the process; [`install_error_handler`] replaces it
//!   once per process (see `ffi/error.rs` for how it chains to mlx-rs's).
//! * [`quantize`], [`dequantize`], [`quantized_matmul`], [`gather_qmm`].
//! * [`array_from_bytes`], [`array_from_owner`]: arrays from safetensors
//!   bytes or memory maps.
//!
//! Every other module of this crate that calls `mlx_sys` directly should go
//! through [`try_array`] (or call [`install_error_handler`] first) so there
//! is exactly one handler registration.

mod error;
mod from_bytes;
mod matmul;
mod mode;

pub use self::error::{install_error_handler, try_array, MlxError};
pub use self::from_bytes::{array_from_bytes, array_from_owner, dtype_size};
pub use self::matmul::{
    dequantize, dequantize_with_global_scale, gather_qmm, quantize, quantize_with_global_scale,
    quantized_matmul,
};
pub use self::mode::{Mode, UnknownMode};
