//! The quantization mode (`mode=` of the MLX quantization ops).

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;

/// A quantization mode of MLX 0.32.2 (`mlx::core::QuantizationMode`), spelled
/// as the Python `mode=` strings.
///
/// Only `Affine` stores zero points (`biases`); the three floating-point
/// modes store `uint8` scales and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `"affine"`: `w ≈ scales * q + biases` per group; scales and biases in
    /// the dtype of the quantized matrix.
    Affine,
    /// `"mxfp4"`: OCP MX fp4 (e2m1) elements, e8m0 (`uint8`) scale per 32.
    Mxfp4,
    /// `"mxfp8"`: OCP MX fp8 (e4m3) elements, e8m0 (`uint8`) scale per 32.
    Mxfp8,
    /// `"nvfp4"`: NVIDIA fp4 (e2m1) elements, e4m3 (`uint8`) scale per 16.
    Nvfp4,
}

impl Mode {
    /// Every mode, in the order of `mlx.nn.layers.quantized._defaults_for_mode`.
    pub const ALL: [Mode; 4] = [Mode::Affine, Mode::Mxfp4, Mode::Nvfp4, Mode::Mxfp8];

    /// The string MLX takes as `mode=`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Affine => "affine",
            Mode::Mxfp4 => "mxfp4",
            Mode::Mxfp8 => "mxfp8",
            Mode::Nvfp4 => "nvfp4",
        }
    }

    /// The same string, NUL-terminated for mlx-c.
    pub(super) const fn as_cstr(self) -> &'static CStr {
        match self {
            Mode::Affine => c"affine",
            Mode::Mxfp4 => c"mxfp4",
            Mode::Mxfp8 => c"mxfp8",
            Mode::Nvfp4 => c"nvfp4",
        }
    }

    /// `(group_size, bits)` used when either is `None`: mirrors
    /// `mlx.nn.layers.quantized._defaults_for_mode` (mlx 0.32.2), which
    /// agrees with `mx.quantize`'s own defaults: affine (64, 4), mxfp4 (32, 4),
    /// nvfp4 (16, 4), mxfp8 (32, 8).
    pub const fn defaults(self) -> (i32, i32) {
        match self {
            Mode::Affine => (64, 4),
            Mode::Mxfp4 => (32, 4),
            Mode::Nvfp4 => (16, 4),
            Mode::Mxfp8 => (32, 8),
        }
    }

    /// Whether the mode stores zero points (`biases`). Only affine does.
    pub const fn has_biases(self) -> bool {
        matches!(self, Mode::Affine)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `mode` string MLX does not know. The message is the one
/// `mlx.nn.layers.quantized._defaults_for_mode` raises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid quantization mode '{0}'. Valid modes are: affine, mxfp4, nvfp4, mxfp8.")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}
