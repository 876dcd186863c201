//! Raw bindings to mlx-c, built against the pinned MLX wheel's libmlx.
//!
//! Drop-in for crates.io `mlx-sys` 0.7.0 (mlx-rs 0.33 requires `=0.7.0`).
//! `float16_t` is a newtype over `u16` and `bfloat16_t` is `u16`, as mlx-rs
//! expects, on every target.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Directories a binary linking libmlx must find at run time (libmlx and
/// the embedded Python's libpython), as recorded by `cargo xtask setup`.
pub const RUNTIME_LIBRARY_DIRS: &str = env!("MLX_SYS_RUNTIME_DIRS");
/// Absolute path of the libmlx this crate was linked against.
pub const LINKED_LIBMLX: &str = env!("MLX_SYS_LINKED_LIBMLX");
/// MLX version of the wheel this crate was built against.
pub const LINKED_MLX_VERSION: &str = env!("MLX_SYS_MLX_VERSION");
