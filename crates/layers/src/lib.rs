//! MLX inference layers on mlx-rs, ported from a TypeScript original ("the
//! origin" in these docs) and conformed bit for bit to the pinned Python
//! reference (mlx 0.32.2, mlx-lm 0.32.2, mlx-vlm 0.7.6, mlx-optiq 0.7.7).
//!
//! **This crate never depends on Python or pyo3.** The oracle crate checks
//! it from outside.
//!
//! # Features
//!
//! * `test-support` (off by default): helpers for tests and measurement,
//!   not for users. The checkpoint writer (`checkpoint::{RawTensor,
//!   write_safetensors, write_arrays, write_model_dir}`, fixtures in
//!   safetensors and model-directory form) and the host `inv_freq`
//!   emulations (`position::{inv_freq_host_f32, inv_freq_host_f64}`). This
//!   crate's tests and the conformance suite enable it.

pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod dense;
pub mod ffi;
pub mod model;
pub mod position;
pub mod quantized;
mod shape;

pub use backend::Backend;
