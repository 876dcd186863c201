//! The error of MLX's `exp` (and the trig functions RoPE reads) per model:
//! what the attention bounds (`attention`) and the emulated CPU fallback
//! (`sdpa_cpu`) both assume of it.

use crate::{Float, Model};

/// Rounding errors of the exp and trig functions per model (the attention
/// module doc derives them).
pub(crate) fn eps_exp(model: Model) -> f64 {
    match model {
        Model::Cpu => 2f64.powi(-21),
        Model::Gpu => 2f64.powi(-20),
    }
}

/// MLX's CPU `simd::exp` (`cpu/simd/math.h`, every CPU `exp`: unary ops and
/// the softmax's main loop) scales its argument by the float constant
/// `1.442695f` and rounds: `2^{x c'(1 + u)}` is `e^x` times at most
/// `e^{|x| K}`, `K = ln 2 (|c' - log2 e| + c' u32)` (about 1.2 u32).
pub(crate) fn exp_arg_k() -> f64 {
    // MLX's own float literal for log2(e), not the exact constant.
    #[allow(clippy::approx_constant)]
    let c = f64::from(1.442_695_f32);
    std::f64::consts::LN_2 * ((c - std::f64::consts::LOG2_E).abs() + c * Float::Float32.u())
}

/// The absolute error of that `exp` near underflow (it flushes below -88
/// and builds `2^ipart` from the bits: at most `2^-125`).
pub(crate) const EXP_ABS: f64 = 2.350_988_701_644_575_e-38;
