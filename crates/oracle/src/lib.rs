//! The oracle: the pinned Python reference, embedded in this process.
//!
//! - [`tensor`]: [`HostTensor`], the dtype + shape + raw bytes that cross
//!   between mlx-rs and Python unchanged.
//! - [`interpreter`]: [`Oracle`], one embedded CPython (3.11 to 3.13) with the
//!   reference submodules imported without running the packages' `__init__`.
//! - [`compare`]: bit-for-bit comparison with a structured result.
//! - [`guards`]: exactly one libmlx mapped; Python's MLX is the linked one.

pub mod compare;
pub mod guards;
pub mod interpreter;
pub mod tensor;

pub use compare::{compare, Comparison, Difference};
pub use interpreter::{Arg, Oracle, OracleError, Value};
pub use tensor::{DType, HostTensor, TensorError};
