//! MLX inference layers on mlx-rs, ported from the seed TypeScript and
//! conformed bit for bit to the pinned Python reference (mlx 0.32.2,
//! mlx-lm 0.32.2, mlx-vlm 0.7.6, mlx-optiq 0.7.7).
//!
//! **This crate never depends on Python or pyo3.** The oracle crate checks
//! it from outside.

pub mod backend;
pub mod checkpoint;
pub mod dense;
pub mod ffi;
pub mod position;
pub mod quantized;

pub use backend::Backend;
