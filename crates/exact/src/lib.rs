//! The exact-math oracle: each layer's mathematical definition computed on
//! the host in float64, sharing no code with MLX, plus an error bound per
//! output element derived from where MLX's kernels round.
//!
//! The bit comparison (port vs reference) cannot see a kernel that
//! computes the wrong thing for both sides: they run the same libmlx. This
//! crate can: both sides must each lie within [`Exact::bound`] of
//! [`Exact::value`].
//!
//! # How a bound is derived
//! Every value is carried as a [`Tracked`]: its exact value (float64) and a
//! rigorous bound on how far a kernel's computed value can be from it,
//! under the standard model of floating-point arithmetic: a rounding to a
//! format with unit roundoff `u` (half an ulp at 1: bf16 2^-8, f16 2^-11,
//! f32 2^-24) and smallest subnormal spacing `2 eta` moves `v` by at most
//! `u |v| + eta`. Operations propagate bounds exactly as written in
//! [`Tracked`]; a *kernel model* ([`Model`]) says where the kernel rounds
//! (which dtype each intermediate is held in, in which order sums run).
//! Each op's module documents its model with the MLX kernel it reads.
//! Float64 evaluation of the exact value itself is covered by a relative
//! slack of 2^-40 of the magnitudes involved ([`F64_SLACK`]).
//!
//! A bound is never tuned to make outputs pass: an output outside it means
//! the kernel does not compute the definition (a zeroed or stale output,
//! a stride ignored, a scale used raw), or the model misses a rounding
//! point, which is then a finding to explain.
//!
//! # Scope
//! Arithmetic ops only: dequantization (affine, mxfp4, nvfp4, mxfp8),
//! quantized and float matmul, the MoE gather, the LoRA residual, the
//! embedding lookup and tied `lm_head`, RoPE / mRoPE / 2-D RoPE, and the
//! attention decode step. Out of scope (no arithmetic to bound; the bit
//! comparison is the whole check there): rope-index positions
//! (`get_rope_index`), position selectors, spec resolution, config reads,
//! safetensors reads, kernel source text and launch parameters,
//! quantization itself (`mx.quantize` picks codes: rounding decisions, not
//! a value to bound).

pub mod attention;
pub mod check;
mod exp_bound;
pub mod formats;
pub mod interval;
pub mod matmul;
pub mod rope;
pub mod sdpa_cpu;
pub mod tracked;

pub use check::{check, Side};
pub use formats::{dequantize, Format, QuantizedMatrix};
pub use tracked::Tracked;

use serde::Serialize;

/// Relative slack for float64 evaluation of the exact value (2^-40 of the
/// magnitudes summed): far below any kernel dtype's rounding.
pub const F64_SLACK: f64 = 1.0 / (1u64 << 40) as f64;

/// `2^e` exactly, as a constant (`powi` is a call on the exact oracle's
/// hottest paths: every rounding asks for `u` and `eta`).
const fn pow2(e: i32) -> f64 {
    assert!(e > -1023 && e < 1024);
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// A floating-point format a kernel rounds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Float {
    Bfloat16,
    Float16,
    Float32,
}

impl Float {
    /// Unit roundoff: half an ulp of 1 (round to nearest even).
    #[inline]
    pub fn u(self) -> f64 {
        match self {
            Float::Bfloat16 => pow2(-8),
            Float::Float16 => pow2(-11),
            Float::Float32 => pow2(-24),
        }
    }
    /// Half the smallest subnormal spacing (the absolute error of rounding
    /// near zero, underflow included).
    #[inline]
    pub fn eta(self) -> f64 {
        match self {
            Float::Bfloat16 => pow2(-134),
            Float::Float16 => pow2(-25),
            Float::Float32 => pow2(-150),
        }
    }
    /// The largest finite value (beyond it a rounding overflows: no bound).
    pub fn max(self) -> f64 {
        match self {
            Float::Bfloat16 => f64::from(half::bf16::MAX),
            Float::Float16 => f64::from(half::f16::MAX),
            Float::Float32 => f64::from(f32::MAX),
        }
    }
    /// From an `mlx.core` dtype name (`bfloat16`, `float16`, `float32`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "bfloat16" => Some(Float::Bfloat16),
            "float16" => Some(Float::Float16),
            "float32" => Some(Float::Float32),
            _ => None,
        }
    }
    /// The wider of two formats (MLX's type promotion among floats:
    /// bf16 with f16 promotes to f32).
    pub fn promote(self, other: Float) -> Float {
        match (self, other) {
            (a, b) if a == b => a,
            _ => Float::Float32,
        }
    }
}

/// Where a backend's kernels round (see each op's module for what it reads
/// from MLX's kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// MLX's CPU kernels: scalar loops in the activation dtype, summing in
    /// index order (x86-64 has no SIMD path: `simd::max_size` is 1), or the
    /// SIMD path in float32; the bound covers both.
    Cpu,
    /// GPU kernels (Metal, CUDA): tiles with float32 accumulators in any
    /// order, dequantized weights and per-group partials held in the
    /// activation dtype, the output rounded once; plus CUDA `qmv`'s
    /// per-thread accumulators in the activation dtype (codes under 8
    /// bits) and TF32 operands for float32 matmuls (`matmul`'s module doc).
    Gpu,
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Model::Cpu => "cpu",
            Model::Gpu => "gpu",
        })
    }
}

/// The exact value of one output and its bound, element by element
/// (row-major, the output's shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Exact {
    /// The op, as reports name it (`quantized_matmul`, `rope`, ...).
    pub op: &'static str,
    /// The kernel model the bound was derived under.
    pub model: Model,
    pub shape: Vec<usize>,
    pub value: Vec<f64>,
    pub bound: Vec<f64>,
}

impl Exact {
    /// From tracked values (their bounds, plus the float64 slack of each
    /// element's magnitude).
    pub fn from_tracked(op: &'static str, model: Model, shape: Vec<usize>, t: &[Tracked]) -> Self {
        Exact {
            op,
            model,
            shape,
            value: t.iter().map(|v| v.v).collect(),
            bound: t.iter().map(|v| v.e + F64_SLACK * v.mag).collect(),
        }
    }
}

/// Why an exact value could not be computed (the inputs do not describe
/// the op); the harness reports it as its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactError(pub String);

impl std::fmt::Display for ExactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exact oracle: {}", self.0)
    }
}

impl std::error::Error for ExactError {}

/// The prefix of an [`ExactError`] saying the definition has no value for
/// these inputs (an expert index out of range, as `--perturb` can make
/// one): no exact check, rather than a harness error.
const UNDEFINED: &str = "undefined: ";

impl ExactError {
    /// The op's definition has no value for these inputs.
    pub fn undefined(what: impl std::fmt::Display) -> Self {
        ExactError(format!("{UNDEFINED}{what}"))
    }
    pub fn is_undefined(&self) -> bool {
        self.0.starts_with(UNDEFINED)
    }
}

/// Shorthand for an [`ExactError`].
pub(crate) fn err<T>(what: impl Into<String>) -> Result<T, ExactError> {
    Err(ExactError(what.into()))
}
