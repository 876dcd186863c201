//! The attention decode step (mlx-lm's `Glm4Attention` on a `KVCache`, one
//! token per call): exact values and bounds of the attention output before
//! `o_proj` (`attn`), the layer output (`y`) and the token's cached keys and
//! values.
//!
//! # The definition (float64)
//! Per token `t` of `x` `[T, hidden]`, at position `pos = L0 + t` (the cache
//! offset; `L0` prefilled tokens):
//! ```text
//! q, k, v = x W_q^T, x W_k^T, x W_v^T          (W dequantized exactly)
//! q_h, k_g = rope(q_h, pos), rope(k_g, pos)    (first rotary_dims channels,
//!     non-traditional: channel i pairs with i + rotary_dims/2,
//!     theta_i = pos * rope_base^(-2i / rotary_dims))
//! K_g, V_g = cache keys / values of KV head g (prefill, then each token's)
//! s_j = scale * q_h . K_g[j],   scale = head_dim^-0.5, g = h / (n_heads / n_kv_heads)
//! p = softmax(s)   (no mask: one query row attends to the whole cache)
//! attn_h = sum_j p_j V_g[j];    y = attn W_o^T
//! ```
//! The softmax is evaluated exactly in float64 (max-shifted exponentials).
//!
//! # Bounds, step by step
//! Every kernel value is bounded against the definition, with the errors of
//! its inputs propagated (the cache holds the kernel's own earlier keys).
//!
//! **Projections** q/k/v: [`crate::matmul::quantized_matmul`] (its model).
//! `o_proj` reads the computed `attn`, whose error is carried: the same
//! affine model as `matmul.rs` on tracked inputs ([`crate::matmul::quantized_matmul_tracked`];
//! with exact inputs it reproduces `quantized_matmul` exactly, a test checks).
//!
//! **RoPE** (CPU: `mlx/fast.cpp`'s `rope` fallback, every op an MLX op):
//! `c = f32(logf(base) / half)`, `a_i = f32(-i * c)`, `inv_i = expf(a_i)`,
//! `theta_i = f32(pos * inv_i)` (`pos` exact below 2^24), `exp` being MLX's
//! `simd::exp` (argument times `1.442695f`, rounded: a relative error
//! `e^{K |a|}`, K ~ 1.2 u32, see [`exp_arg_k`]), `cos`/`sin` in
//! float32 then cast to the activation dtype `T`; then
//! `T(T(x1 cos) - T(x2 sin))`, `T(T(x1 sin) + T(x2 cos))`. So
//! `|dc| <= |ln f32(base) - ln base| / half + 2^-23 |ln base| / half + u(...)`,
//! `|da_i| = i |dc| + u |a_i|`, `|dinv_i| <= inv_i (e^{|da_i|}(1 + eps_exp) - 1)`,
//! `|dtheta_i| <= pos |dinv_i| + u (theta_i + pos |dinv_i|)` (K |a_i| is in `da_i`), and the float32
//! cosine is within `min(2, |dtheta|) + eps_trig` of `cos(theta)` (cos and sin
//! are 1-Lipschitz). `eps_exp = 2^-21` (4 ulp: the polynomial of
//! `simd::exp` measured within 2 ulp by test
//! `mlx_cpu_exp_polynomial_is_within_eps_exp`; glibc's `expf` within 1),
//! `eps_trig = 2^-21` absolute (4 ulp of 1; `rope.rs` measured MLX's Cephes
//! `sincos` under 1 ulp of 1 to 1e5). Large positions
//! matter: at `pos` 65540, `theta_1` carries ~1e-2 rad of float32 error, which
//! the bound propagates into the rotated values.
//! Gpu (Metal `rope.metal`: `exp2(-d * log2(base))`, `fast::cos`/`fast::sin`
//! of a float32 theta, one rounding to `T`; CUDA `rope.cu` likewise): the same
//! chain with `eps_exp = 2^-20` and `eps_trig = 2^-13 + |theta| 2^-22`
//! (fast sin/cos: absolute 2^-13 as Metal's fast-math table gives for reduced
//! arguments, plus a range reduction error proportional to |theta|; this is
//! an assumption read from documentation, not measured). The CPU model's
//! three roundings to `T` are counted too (they bound the one GPU rounding).
//! This module has its own minimal partial RoPE: `rope.rs` models mlx-vlm's
//! `compute_inv_freq` (`1 / base ** (arange / dim)`, MLX `Power`) on exact
//! inputs, while `mx.fast.rope`'s fallback computes `exp(-i ln(base) / half)`
//! and the q / k rotated here carry the projections' errors.
//!
//! **Scores** (CPU: the SDPA fallback of `mlx/fast.cpp`:
//! `q = multiply(array(scale, T), q)` rounds the scale and the product to
//! `T`; `scores = matmul(q, k^T)`: `simd_gemm<T, float>` (or BNNS on macOS),
//! products and sums in float32 in block order, one rounding to `T`):
//! `|ds_j| <= sum_d (|q~_d| |dk_jd| + |k_jd| |dq~_d| + |dq~_d||dk_jd|)
//!  plus gamma_D(u32) sum_d (|q~_d| + |dq~_d|)(|k_jd| + |dk_jd|)`, then the
//! rounding to `T`. Gpu (Metal `sdpa_vector` / `sdpa_vector_2pass_*`, CUDA
//! `sdpa_vector*`: scale and products in float32, `simd_sum`, no rounding
//! of scores to `T`; CUDA folds `log2 e` into the scale; the unfused
//! fallback as on CPU): the CPU chain is counted (it bounds the fused one).
//! A float32 SDPA on a GPU has no fused kernel at some shapes (CUDA: cuDNN
//! takes only float16 / bfloat16, `sdpa_vector` only head_dim 64 / 96 / 128
//! and fewer than 4 query rows), and MLX then runs it as ops whose float32
//! matmuls read their operands as TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32` while
//! `MLX_ENABLE_TF32` is on, its default). Measured on an H200
//! (`fixtures/gpu-runs/h200-2026-12-03/sdpa-float32/`): float32 SDPA with 2
//! or more query rows at head_dim 8, 16 and 64 is 0.7 to 1.1 TF32 units
//! (2^-11) from float64, and 3 float32 units with `MLX_ENABLE_TF32=0`; the
//! explorer's "float32 SDPA outside its bound at head_dim 8, L 2" was this
//! model missing TF32, not a kernel fault. So for float32 under the Gpu model
//! q~, k, the weights and v are each read as TF32 (`matmul::tf32_round`: one
//! TF32 ulp relative) before the chains below.
//!
//! **Softmax of perturbed scores** (rigorous, not first order): with
//! `|s^_j - s_j| <= ds_j`, `p'_j = softmax(s^)_j` satisfies
//! `p'_j / p_j = e^{s^_j - s_j} / sum_k p_k e^{s^_k - s_k}`, so
//! `e^{-ds_j} / D+ <= p'_j / p_j <= e^{ds_j} / D-`, `D± = sum_k p_k e^{±ds_k}`.
//!
//! **Softmax kernel** on the computed scores. CPU (`softmax.cpp`,
//! `precise=True` for bf16/f16 inputs: AccT = float32): the max `m^` is
//! exact; `x_j = f32(s^_j - m^)` (relative u32; `|x_j| <= m - s_j + ds_j +
//! max ds`), `e_j = exp(x_j)` (`simd::exp` on x86-64, `std::exp` in arm64's
//! tail; so `e_j / e^{s^_j - m^}` lies in
//! `[e^{-(u+K)|x_j|}(1 - eps_exp), e^{(u+K)|x_j|}(1 + eps_exp)]`, plus
//! `2^-125` absolute at underflow), the normalizer
//! summed in float32 (index order, or SIMD lanes: any order,
//! `gamma_{n-1}(u32)` of the positive terms), `1 / Z` and `e_j * (1 / Z)`
//! each rounded to float32, the weight rounded to `T`.
//! Gpu (fused online softmax): each weight is a product of the direct
//! `exp(s^_j - new_max)` and up to `R = ceil(n / 32) + 3` rescaling factors
//! `exp(max_old - max_new)` (one per loop step of a simdgroup / warp, the
//! cross-simdgroup, 2-pass and final combines), each `fast::exp` within
//! `2^-23 (3 + 2|x|)` relative (Metal's fast-math table; CUDA's `exp2f` is
//! within 2 ulp and its `log2 e`-scaled argument within `u |x|`), the
//! arguments summing to at most `|x_j|`, and each multiply rounded
//! (`(1 + u32)^{2R + 4}`); the normalizer likewise, then divided once. The
//! CPU chain (the unfused fallback, the weight held in `T` as cuDNN's P
//! tile is) is multiplied in: every source named is counted.
//!
//! **Output** `attn_d = sum_j p^_j v^_jd`: with `r_j` the relative weight
//! error from the two steps above, `|d attn_d| <= sum_j r_j p_j |v_jd| +
//! p_j (1 + r_j) |dv_jd| + g sum_j p_j (1 + r_j)(|v_jd| + |dv_jd|)`, then the
//! rounding to `T`; `g = gamma_n(u32)` (CPU `simd_gemm`: products and sums in
//! float32, any order), plus `u_T` on Gpu (the 2-pass kernels hold their
//! per-block partials in `T`).
//!
//! Float64 evaluation of the definition (exp, the normalizer, the dot
//! products, cos of large arguments) is covered by explicit `gamma(., 2^-53)`
//! terms added to each bound.
//!
//! # Emulated on enclosures (x86-64 CPU, issue 41)
//! The bounds above hold for any kernel order, but after bf16 projections
//! of head_dim 256 they are wider than every `attn` and `y` value: the
//! projections' own bf16 accumulation moves q and k by up to ~5%, and the
//! worst case over every such move is vacuous. On x86-64 the CPU computes
//! q, k, v with the scalar loops that `matmul`'s module doc emulates bit
//! for bit, so those values are *known*, not merely bounded; the rest of
//! the step runs MLX ops whose rounding points the steps above name. So
//! [`decode_m1`] (model Cpu, one dtype `T` throughout) also runs the whole
//! step on enclosures ([`crate::interval`]: each value the kernel holds
//! lies in `[lo, hi]`, rounding to nearest is monotone, each step maps
//! enclosures to an enclosure):
//! - q, k, v: [`crate::matmul::cpu_affine_enclosure`] on the exact `x`
//!   (points: the emulated scalar loop);
//! - RoPE: cos / sin in float32 within the RoPE step's error `e` of the
//!   definition, so in `[RN32(c − e), RN32(c + e)]`, cast to `T`; then
//!   `T(T(x1 c) − T(x2 s))` and `T(T(x1 s) + T(x2 c))`, each float32
//!   operation done in `f32` on the endpoints;
//! - scores: `T(T(scale) q)`, then each dot product over D as the real
//!   interval of the exact products' sums widened by `gamma_D(u32)` of
//!   their magnitudes (`simd_gemm`'s block order is not assumed) and
//!   float64's `gamma_{D+1}(2^-53)`, rounded to `T`;
//! - softmax (precise): `x = f32(s − max)` on the endpoints; MLX's `exp`
//!   within `e^{±K|x|}(1 ± eps_exp)` and `±2^-125` (the Softmax step's
//!   factors: `e^{x(1+K)}` and `e^{x(1−K)}` are increasing in `x`, so the
//!   endpoints map to endpoints), rounded to float32; the normalizer in
//!   any order (`gamma_{n−1}(u32)` of the upper sum), its float32
//!   reciprocal, the float32 product, the weight in `T`;
//! - output: `p · v` as the scores' dot products, in `T`; `y` the affine
//!   scalar loop on the `attn` enclosures.
//!
//! Each output's interval `[v − e, v + e]` (the worst case) is intersected
//! with its enclosure; the [`Tracked`] of an output then holds the
//! intersection's midpoint and half-width (both intervals hold the
//! kernel's value under the model, so the intersection does, and it is
//! never wider than the worst case). Evidence that the model is the
//! kernel's: the reference's outputs land on their enclosures (ratio
//! 1 − 2e-9 for `attn` at the default seed), and
//! `the_cpu_attention_decode_stays_within_its_enclosure_over_many_seeds`
//! (conformance-cases) runs MLX's CPU decode over many seeds. Were MLX's
//! CPU path to change (a float32 accumulator in the projections, another
//! softmax), its outputs would land outside: the oracle then reports the
//! reference outside, never a wrong pass. The Gpu model uses what the
//! attention read (next section).
//!
//! # attn given what it read (Gpu model)
//! On a GPU the projections' order is not emulated, so q and k are only
//! bounded (CUDA's `qmv` holds its accumulators in bf16) and the worst
//! case is vacuous again. But the reference glue records what the
//! attention itself read: q_proj's outputs (a wrapper that returns them
//! unchanged) and the keys and values the step cached (its own outputs,
//! the cache rows SDPA reads). Given those exact values
//! ([`DecodeInputs::read`]) only RoPE of the query and the SDPA remain, and
//! [`gpu_sdpa_row_iv`] runs them on enclosures over every GPU path of MLX
//! 0.32 that may compute them, hulled:
//! - RoPE: the fused kernel (`rope.cu` / `rope.metal`: float32 cos / sin
//!   within the Gpu RoPE step's error, `x1 c − x2 s` with two float32
//!   roundings, one rounding to `T`), hulled with the unfused ops of the
//!   CPU section (which is what lets a CPU run test the model);
//! - the unfused ops (CUDA's fallback at head_dim 256: no `sdpa_vector`,
//!   no cuDNN above 128): `T(T(scale) q)`, scores a float32 gemm in any
//!   order rounded to `T`, the precise softmax with CUDA's online
//!   normalizer and `__expf` (each numerator within the factors of
//!   [`gpu_exp_factors`]: the CPU chain times the fused chain of
//!   [`sdpa_row`]), `e (1/Z)` or `e / Z` (two float32 roundings), the
//!   weights in `T`, the second gemm in any order rounded to `T`;
//! - the fused kernels (Metal `sdpa_vector` and its 2-pass variant, CUDA
//!   `sdpa_vector`, cuDNN): `f32(scale) q` in float32, scores in float32 in
//!   any order, the same numerator factors, each numerator held in `T`
//!   once at most (cuDNN's P tile; the 2-pass kernels' unnormalized
//!   partials, `static_cast<T>(o)`), `sum e v` in any order over the
//!   normalizer, one rounding to `T`. The unfused path is left out where
//!   both GPUs run a fused kernel ([`gpu_may_run_unfused`], read from both
//!   backends' `use_fallback`).
//!
//! The numerators are taken against a fixed shift `m*` (the largest
//! score's upper end): the kernel's max `m_k` differs from it by a common
//! factor `e^{m* − m_k}` that cancels exactly in `e_j / sum e_k`, and the
//! kernel's `f32(s_j − m_k)` and `exp` errors are relative, at most those
//! of an argument of magnitude `m* − lo(s_j)`. So no interval grows with
//! the max's own uncertainty.
//!
//! The recorded query is not an output: it must itself lie within q_proj's
//! bound of the definition (the Gpu qmm bound on `x`), or the reference is
//! wrong upstream of `attn`, and that head's `attn` is then marked outside
//! (bound 0 at the definition's value). The keys and values are checked
//! outputs. So the step stays covered: `attn` within the SDPA's enclosure
//! given q, K, V; q within q_proj's bound; K and V within theirs; `y` given
//! `attn`. The port's side under `--perturb` has no records and keeps the
//! worst case. A float32 SDPA keeps [`sdpa_row`]'s bound (TF32 operands are
//! not modelled on enclosures). The same enclosure narrows the
//! `attention/sdpa` family's Gpu rows ([`tighten_gpu_sdpa_row`]: its inputs
//! are exact). Evidence: the CPU's `attn` lies within the Gpu enclosure
//! over many seeds (`the_cpu_attention_decode_stays_within_its_enclosure_over_many_seeds`:
//! ratio 0.25, mean bound 7% of |attn|, none informative without the
//! records), and the H200's under `fixtures/gpu-runs/`.
//!
//! # attn given what it read, x86-64 CPU (windows above 8192 keys)
//! The enclosures above carry the keys' RoPE and the whole float64
//! definition (the Tracked SDPA over every key: +12 s, +29 s and +65 s on
//! CPU at the suite's windows of 8198, 32770 and 65540 keys), and at 65540
//! keys the any-order float32 normalizer and `p · v` bounds
//! (`gamma_n(u32)`) are wider than the values. So for windows longer than
//! the harness's `EXACT_MAX_KV` the Cpu model on x86-64 evaluates neither:
//! [`decode_m1_attn_given_read`] takes what the attention read (the
//! recorded q_proj outputs, the cached keys and values, the prefill, as the
//! Gpu model does) and runs MLX's CPU fallback in its own order of
//! operations on enclosures ([`crate::sdpa_cpu`], whose module doc names
//! every rounding: RoPE's `exp` and Cephes `sincos` ported bit for bit with
//! `logf`'s candidates hulled, `simd_gemm`'s index order, the precise
//! softmax's index-order normalizer). With exact inputs each element is
//! one point, so `attn` must be the kernel's value bit for bit; the bound
//! is float64's slack alone. The recorded query must be q_proj's emulated
//! value on `x` (the scalar loop: a point), or its head is computed from
//! that value at bound 0 (outside unless equal): the step stays covered as
//! in the Gpu section. Nothing is intersected with a worst case here (none
//! is computed); an enclosure that is not finite leaves `attn` at an
//! infinite bound (uninformative, reported as such). Where the order is not
//! known (arm64's SIMD lanes, a GPU, a float32 step whose matmuls go to
//! BLAS) `attn` above 8192 keys stays unchecked. Evidence: at the suite's
//! three long windows the reference's `attn` lies on its points (ratio 0),
//! and
//! `the_cpu_attn_above_exact_max_kv_is_the_emulated_fallback_and_faults_are_flagged`
//! (conformance-cases) checks MLX's CPU output at 8194 keys and flags a
//! dropped last key, a doubled tail, a wrong recorded query and one ulp.
//!
//! # y given attn (every model)
//! `y = o_proj(attn)` reads the attention output the kernel wrote; the
//! reference glue records exactly that array (o_proj's input), and it is
//! checked on its own (`attn` above). So where it is known
//! ([`DecodeInputs::attn_read`]), `y` is bounded given it: the quantized
//! matmul's bound on those exact inputs ([`crate::matmul`]: on x86-64 the
//! emulated scalar loop, so `y` must be its value bit for bit; on a GPU
//! the Gpu qmm bound), instead of the whole step's error propagated
//! through `attn`'s bound (vacuous after a bf16 accumulation over
//! `n_heads * head_dim`). The two checks together cover the step: `attn`
//! within its bound of the definition, and `y` what o_proj computes from
//! that `attn`. An input fault upstream of `attn` (a K tail of `x`) then
//! moves `attn`, where it is measured, not `y` given `attn`.

use crate::exp_bound::{eps_exp, exp_arg_k, EXP_ABS};
use crate::formats::QuantizedMatrix;
use crate::interval::Iv;
use crate::matmul::{quantized_matmul, quantized_matmul_tracked, tf32_round, TF32_U};
use crate::tracked::{gamma, Tracked};
use crate::{err, ExactError, Float, Model};

const U64: f64 = 1.0 / (1u64 << 53) as f64;

/// The attention graph's constants, in the field's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Graph {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dims: usize,
    pub rope_base: f64,
}

/// One decode run's inputs, as the reference received them.
pub struct DecodeInputs<'a> {
    /// `[T, hidden]`, exactly the activations' values.
    pub x: &'a [f64],
    pub x_dtype: Float,
    /// q, k, v, o projections (affine, no additive bias), and each one's
    /// scales dtype.
    pub projections: [QuantizedMatrix<'a>; 4],
    pub scales_dtypes: [Float; 4],
    /// The prefilled cache `[n_kv_heads, L0, head_dim]` (batch 1), and its
    /// dtypes (`None` when `L0 == 0`: the cache takes the new keys' dtype).
    pub k0: &'a [f64],
    pub v0: &'a [f64],
    pub l0: usize,
    pub k0_dtype: Option<Float>,
    pub v0_dtype: Option<Float>,
    pub graph: Graph,
    /// The attention output o_proj read (`[T, n_heads * head_dim]`, in
    /// the SDPA dtype), where it was recorded: `y` is then bounded given it
    /// (module doc, "y given attn").
    pub attn_read: Option<&'a [f64]>,
    /// What the attention read, where it was recorded (`[T, n_heads *
    /// head_dim]` q_proj's outputs before RoPE; `[T, n_kv_heads *
    /// head_dim]` the keys after RoPE and the values, as cached): `attn`
    /// is then bounded given them under the Gpu model (module doc, "attn
    /// given what it read").
    pub read: Option<DecodeRead<'a>>,
}

/// The arrays the attention itself read, recorded by the reference's
/// glue ([`DecodeInputs::read`]).
#[derive(Debug, Clone, Copy)]
pub struct DecodeRead<'a> {
    pub queries: &'a [f64],
    pub keys: &'a [f64],
    pub values: &'a [f64],
}

/// The four outputs, token-major, each element tracked, and their dtypes.
#[derive(Debug, Clone)]
pub struct DecodeExact {
    /// `[T, n_heads * head_dim]`, before `o_proj`.
    pub attn: Vec<Tracked>,
    /// `[T, hidden]`.
    pub y: Vec<Tracked>,
    /// `[T, n_kv_heads * head_dim]`: the roped keys as cached.
    pub keys: Vec<Tracked>,
    /// `[T, n_kv_heads * head_dim]`.
    pub values: Vec<Tracked>,
}

/// `t` cast from `from` to `to` (no rounding when they are the same).
fn cast(t: Tracked, from: Float, to: Float) -> Tracked {
    if from == to {
        t
    } else {
        t.round(to)
    }
}

/// The (cos, sin) of each rotated pair `i < rotary_dims / 2` at `pos`, as
/// the kernel holds them in `t` (see the module doc's RoPE step).
pub fn rope_tables(
    pos: usize,
    rotary_dims: usize,
    rope_base: f64,
    t: Float,
    model: Model,
) -> Vec<(Tracked, Tracked)> {
    rope_trig(pos, rotary_dims, rope_base, model)
        .into_iter()
        .map(|(c, s)| (c.round(t), s.round(t)))
        .collect()
}

/// The (cos, sin) of each rotated pair as the kernel computes them in
/// float32, before the cast to `T` (see the module doc's RoPE step).
pub(crate) fn rope_trig(
    pos: usize,
    rotary_dims: usize,
    rope_base: f64,
    model: Model,
) -> Vec<(Tracked, Tracked)> {
    let half = rotary_dims / 2;
    let u = Float::Float32.u();
    let eta = Float::Float32.eta();
    let hf = half as f64;
    let base32 = f64::from(rope_base as f32);
    let ln_b = rope_base.ln();
    // logf(f32(base)) / half, rounded (log within 1 ulp, the division u).
    let dlog = (base32.ln() - ln_b).abs() + 2f64.powi(-23) * ln_b.abs() + eta;
    let c = ln_b / hf;
    let dc = dlog / hf + u * (c.abs() + dlog / hf) + eta;
    let p = pos as f64;
    (0..half)
        .map(|i| {
            let fi = i as f64;
            let a = -fi * c;
            let da = fi * dc + u * (a.abs() + fi * dc) + eta + exp_arg_k() * (a.abs() + fi * dc);
            let inv = a.exp();
            let dinv = inv * ((da.exp()) * (1.0 + eps_exp(model)) - 1.0) + EXP_ABS;
            let theta = p * inv;
            let dtheta = p * dinv + u * (theta + p * dinv) + eta;
            let trig = match model {
                Model::Cpu => 2f64.powi(-21),
                Model::Gpu => 2f64.powi(-13) + (theta + dtheta) * 2f64.powi(-22),
            };
            // float64: theta within 4 ulp, cos / sin within 2 ulp of theirs.
            let f64_err = 4.0 * U64 * theta + 4.0 * U64;
            let e = dtheta.min(2.0) + trig + f64_err;
            let cos = Tracked {
                v: theta.cos(),
                e,
                mag: 1.0,
            };
            let sin = Tracked {
                v: theta.sin(),
                e,
                mag: 1.0,
            };
            (cos, sin)
        })
        .collect()
}

/// Non-traditional partial RoPE of one head `x` (`head_dim` values in `t`)
/// with `tables` from [`rope_tables`]: channel `i` pairs with `i + half`.
pub fn rope_head(x: &[Tracked], tables: &[(Tracked, Tracked)], t: Float) -> Vec<Tracked> {
    let half = tables.len();
    let mut out = x.to_vec();
    for (i, &(c, s)) in tables.iter().enumerate() {
        let (x1, x2) = (x[i], x[i + half]);
        out[i] = x1
            .mul(c)
            .round(t)
            .add(x2.mul(s).round(t).scale(-1.0))
            .round(t);
        out[i + half] = x1.mul(s).round(t).add(x2.mul(c).round(t)).round(t);
    }
    out
}

/// One query row's SDPA over `n` cached keys and values (`[n, D]`, D =
/// `q.len()`), all in the SDPA dtype `t`, with the bound of the module doc.
pub fn sdpa_row(
    q: &[Tracked],
    keys: &[Tracked],
    values: &[Tracked],
    scale: f64,
    t: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    let d = q.len();
    if d == 0 || !keys.len().is_multiple_of(d) || keys.len() != values.len() || keys.is_empty() {
        return err(format!(
            "SDPA of a {d}-channel query over {} keys and {} values",
            keys.len(),
            values.len()
        ));
    }
    let n = keys.len() / d;
    let u32_ = Float::Float32.u();
    let eta32 = Float::Float32.eta();
    let ut = t.u();
    // The scaled query: T(T(scale) * q) (Gpu: f32(scale), counted within).
    let mut sc = Tracked::exact(scale).round(t);
    if model == Model::Gpu {
        sc.e = sc.e.max((f64::from(scale as f32) - scale).abs());
    }
    // A float32 SDPA on a GPU may run as MLX ops (no fused kernel for its
    // head_dim or query rows), whose two matmuls read float32 operands as
    // TF32 (`matmul.rs`; measured on an H200, module doc): both matmuls'
    // operands are then rounded to TF32 first.
    let tf32 = model == Model::Gpu && t == Float::Float32;
    let operand = |x: Tracked| if tf32 { tf32_round(x) } else { x };
    let qs: Vec<Tracked> = q.iter().map(|x| operand(x.mul(sc).round(t))).collect();
    // Scores and their bounds.
    let g_d = gamma(d, u32_);
    let mut s = vec![0.0; n];
    let mut ds = vec![0.0; n];
    for j in 0..n {
        let kj: Vec<Tracked> = keys[j * d..(j + 1) * d]
            .iter()
            .map(|&k| operand(k))
            .collect();
        let (mut v, mut e, mut abs) = (0.0, 0.0, 0.0);
        for (a, b) in qs.iter().zip(&kj) {
            v += a.v * b.v;
            e += a.v.abs() * b.e + b.v.abs() * a.e + a.e * b.e;
            abs += (a.v.abs() + a.e) * (b.v.abs() + b.e);
        }
        e += g_d * abs + d as f64 * eta32 + gamma(d + 1, U64) * abs;
        e += ut * (v.abs() + e) + t.eta();
        s[j] = v;
        ds[j] = e;
    }
    // The exact softmax, float64.
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ex: Vec<f64> = s.iter().map(|&sj| (sj - m).exp()).collect();
    let z: f64 = ex.iter().sum();
    let p: Vec<f64> = ex.iter().map(|e| e / z).collect();
    // Perturbed-score factors.
    let dmax = ds.iter().cloned().fold(0.0, f64::max);
    let d_plus: f64 = p.iter().zip(&ds).map(|(p, e)| p * e.exp()).sum();
    let d_minus: f64 = p.iter().zip(&ds).map(|(p, e)| p * (-e).exp()).sum();
    // Kernel factors: the computed weight over softmax(s^), in [lo, hi].
    let r_steps = n.div_ceil(32) + 3;
    let a_bounds: Vec<(f64, f64)> = s
        .iter()
        .zip(&ds)
        .map(|(&sj, &dsj)| {
            let x = m - sj + dsj + dmax;
            // The CPU chain: f32 subtraction, `simd::exp` (argument scaling
            // and its polynomial).
            let kx = (u32_ + exp_arg_k()) * x;
            let mut hi = kx.exp() * (1.0 + eps_exp(Model::Cpu));
            let mut lo = (-kx).exp() * (1.0 - eps_exp(Model::Cpu));
            if model == Model::Gpu {
                let chain = (2f64.powi(-23) * (3.0 * (r_steps as f64 + 1.0) + 4.0 * x)).exp()
                    * (1.0 + u32_).powi(2 * r_steps as i32 + 4);
                hi *= chain;
                lo *= (2.0 - chain).max(0.0);
            }
            (lo, hi)
        })
        .collect();
    let g_z = gamma(n.saturating_sub(1), u32_);
    let a_hi = a_bounds.iter().map(|b| b.1).fold(0.0, f64::max);
    let a_lo = a_bounds.iter().map(|b| b.0).fold(f64::INFINITY, f64::min);
    // The normalizer is at least its largest term (~1): absolute underflow
    // terms are relative to it.
    let z_hi = (1.0 + g_z) * a_hi + n as f64 * (eta32 + EXP_ABS);
    let z_lo = ((1.0 - g_z) * a_lo - n as f64 * (eta32 + EXP_ABS)).max(0.0);
    if z_lo <= 0.0 {
        return err(format!(
            "SDPA over {n} keys: the normalizer's bound is vacuous"
        ));
    }
    let f64_p = gamma(n + 8, U64);
    let mut r = vec![0.0; n];
    for j in 0..n {
        let (lo_a, hi_a) = a_bounds[j];
        let hi = ds[j].exp() / d_minus * hi_a * (1.0 + u32_).powi(2) / z_lo * (1.0 + ut);
        let lo = (-ds[j]).exp() / d_plus * lo_a * (1.0 - u32_).powi(2) / z_hi * (1.0 - ut);
        r[j] = (hi - 1.0).max(1.0 - lo) + f64_p;
        if tf32 {
            // The weight read as TF32 by the second matmul.
            r[j] += 2.0 * TF32_U * (1.0 + r[j]);
        }
    }
    // Absolute (underflow) error of each weight: the exp, the product and
    // the rounding to T.
    let a_abs = 2.0 * EXP_ABS + eta32 + t.eta();
    let g_out = gamma(n, u32_) + if model == Model::Gpu { ut } else { 0.0 };
    let f64_out = gamma(n + d + 8, U64);
    let mut out = Vec::with_capacity(d);
    for c in 0..d {
        let (mut v, mut e, mut mg, mut mag) = (0.0, 0.0, 0.0, 0.0);
        for j in 0..n {
            let vj = operand(values[j * d + c]);
            let pj = p[j];
            let w = pj * (1.0 + r[j]) + a_abs;
            v += pj * vj.v;
            e += (r[j] * pj + a_abs) * vj.v.abs() + w * vj.e;
            mg += w * (vj.v.abs() + vj.e);
            mag += pj * vj.v.abs();
        }
        e += g_out * mg + n as f64 * eta32 + f64_out * mag;
        out.push(Tracked { v, e, mag }.round(t));
    }
    Ok(out)
}

/// The decode run: each token projected, roped at its position, appended
/// to the KV cache, attended over the whole cache, and projected by o_proj.
pub fn decode_m1(inp: &DecodeInputs, model: Model) -> Result<DecodeExact, ExactError> {
    decode(inp, model, true)
}

/// [`decode_m1`] without the attention itself: the cached keys and values
/// and `y` given the `attn` o_proj read ([`DecodeInputs::attn_read`],
/// required), at the cost of the projections alone (no SDPA over the
/// cache: what makes windows of tens of thousands of keys slow on the
/// host). `attn` is left empty; the prefill `k0` / `v0` is not read (it
/// may be empty; `l0` still gives the positions).
pub fn decode_m1_without_attention(
    inp: &DecodeInputs,
    model: Model,
) -> Result<DecodeExact, ExactError> {
    if inp.attn_read.is_none() {
        return err("the decode without its attention needs the attn o_proj read");
    }
    decode(inp, model, false)
}

/// [`decode_m1_without_attention`] plus `attn` given what the attention
/// read, where the x86-64 CPU's SDPA fallback is emulated in its own order
/// ([`cpu_emulates_sdpa`]; module doc, "attn given what it read, x86-64
/// CPU"; [`crate::sdpa_cpu`]): needs the prefill `k0` / `v0` and
/// [`DecodeInputs::read`]. No float64 SDPA over the cache is evaluated,
/// so windows of tens of thousands of keys cost seconds. `attn` is left
/// empty where the emulation does not apply (another model or
/// architecture, a float32 or mixed-dtype step).
pub fn decode_m1_attn_given_read(
    inp: &DecodeInputs,
    model: Model,
) -> Result<DecodeExact, ExactError> {
    let mut out = decode_m1_without_attention(inp, model)?;
    if !cpu_emulates_sdpa(inp, model) {
        return Ok(out);
    }
    let Some(read) = inp.read else {
        return err("attn given what it read needs the recorded queries, keys and values");
    };
    out.attn = cpu_attn_given_read(inp, read)?;
    Ok(out)
}

/// The one dtype of every step of the decode (projections, cache, SDPA,
/// o_proj), if there is one.
fn step_dtype(inp: &DecodeInputs) -> Option<Float> {
    let p: Vec<Float> = inp
        .scales_dtypes
        .iter()
        .map(|s| inp.x_dtype.promote(*s))
        .collect();
    let ck = inp.k0_dtype.unwrap_or(p[1]);
    let cv = inp.v0_dtype.unwrap_or(p[2]);
    let f = p[0].promote(ck).promote(cv);
    let py = f.promote(inp.scales_dtypes[3]);
    [p[1], p[2], ck, cv, f, py]
        .iter()
        .all(|&x| x == p[0])
        .then_some(p[0])
}

/// Whether [`decode_m1_attn_given_read`] computes `attn`: the Cpu model
/// on an x86-64 build (one SIMD lane: [`crate::sdpa_cpu`]'s module doc),
/// every step in one 16-bit dtype (bfloat16 or float16: `simd_gemm<T,
/// float>`; float32 matmuls go to BLAS, whose order is not known).
pub fn cpu_emulates_sdpa(inp: &DecodeInputs, model: Model) -> bool {
    model == Model::Cpu
        && cfg!(target_arch = "x86_64")
        && matches!(step_dtype(inp), Some(Float::Bfloat16 | Float::Float16))
}

/// The x86-64 CPU rope fallback's `(cos, sin)` per rotated pair at `pos`
/// in `t`: emulated ([`crate::sdpa_cpu::rope_trig_emulated`]), or the RoPE
/// step's bound for a pair MLX sends to libm.
fn cpu_rope_tables(pos: usize, g: Graph, t: Float) -> Vec<(Iv, Iv)> {
    let bounded = rope_trig(pos, g.rotary_dims, g.rope_base, Model::Cpu);
    crate::sdpa_cpu::rope_trig_emulated(pos, g.rotary_dims, g.rope_base, t)
        .into_iter()
        .zip(bounded)
        .map(|(e, (c, s))| {
            e.unwrap_or_else(|| {
                let iv = |x: Tracked| Iv::real(x.v - x.e, x.v + x.e).round32_then(t);
                (iv(c), iv(s))
            })
        })
        .collect()
}

/// One query head (`head_dim` values in `t`, exact) roped at `pos` by the
/// x86-64 CPU's rope fallback, on enclosures (points where the trig is
/// emulated): what [`crate::sdpa_cpu::sdpa_heads`] reads.
pub fn cpu_roped_query(q: &[f64], pos: usize, g: Graph, t: Float) -> Vec<Iv> {
    let points: Vec<Iv> = q.iter().map(|&v| Iv::point(v)).collect();
    rope_head_iv(&points, &cpu_rope_tables(pos, g, t), t)
}

/// `attn` `[T, n_heads * head_dim]` of the decode given what the attention
/// read, the x86-64 CPU's fallback emulated on enclosures (module doc,
/// "attn given what it read, x86-64 CPU"). Each element: the enclosure's
/// midpoint and half-width (0 for a point: the kernel's value bit for
/// bit). A recorded query that is not q_proj's emulated value on `x`
/// marks its head: that head is computed from q_proj's value instead, at
/// bound 0 (outside unless equal). A head whose enclosure is not finite
/// gets an infinite bound (uninformative, reported as such).
fn cpu_attn_given_read(inp: &DecodeInputs, read: DecodeRead) -> Result<Vec<Tracked>, ExactError> {
    use crate::sdpa_cpu::{sdpa_heads, KvHead};
    let g = inp.graph;
    let (h, hkv, d) = (g.n_heads, g.n_kv_heads, g.head_dim);
    let Some(t) = step_dtype(inp) else {
        return err("attn given what it read: not one dtype");
    };
    let hidden = inp.projections[0].cols;
    let tokens = inp.x.len() / hidden.max(1);
    let (l0, w) = (inp.l0, hkv * d);
    if read.queries.len() != tokens * h * d
        || read.keys.len() != tokens * w
        || read.values.len() != tokens * w
        || inp.k0.len() != hkv * l0 * d
        || inp.v0.len() != hkv * l0 * d
    {
        return err(format!(
            "attn given what it read: queries {}, keys {}, values {}, prefill {} / {} for {tokens} tokens of [{h}, {hkv}, {d}] after {l0}",
            read.queries.len(),
            read.keys.len(),
            read.values.len(),
            inp.k0.len(),
            inp.v0.len()
        ));
    }
    let scale = (d as f64).powf(-0.5);
    // q_proj's emulated loop on `x`: what the recorded queries must be.
    let x: Vec<Iv> = inp.x.iter().map(|&v| Iv::point(v)).collect();
    let q_proj =
        crate::matmul::CpuAffineKernel::new(&inp.projections[0], t).and_then(|k| k.enclosure(&x));
    let caches: Vec<KvHead> = (0..hkv)
        .map(|gh| {
            KvHead::new(
                d,
                (0..l0 + tokens).map(|j| {
                    if j < l0 {
                        let at = (gh * l0 + j) * d;
                        (&inp.k0[at..at + d], &inp.v0[at..at + d])
                    } else {
                        let at = (j - l0) * w + gh * d;
                        (&read.keys[at..at + d], &read.values[at..at + d])
                    }
                }),
            )
        })
        .collect();
    let group = h / hkv;
    let unknown = Tracked {
        v: 0.0,
        e: f64::INFINITY,
        mag: 0.0,
    };
    let mut attn = vec![unknown; tokens * h * d];
    for tok in 0..tokens {
        let pos = l0 + tok;
        let tables = cpu_rope_tables(pos, g, t);
        for (gh, cache) in caches.iter().enumerate() {
            let mut qs = Vec::with_capacity(group);
            let mut marked = Vec::with_capacity(group);
            for hh in gh * group..(gh + 1) * group {
                let at = tok * h * d + hh * d;
                let rec = &read.queries[at..at + d];
                let proj = q_proj.as_ref().map(|e| &e[at..at + d]);
                let within =
                    proj.is_none_or(|e| rec.iter().zip(e).all(|(&v, iv)| iv.lo <= v && v <= iv.hi));
                let src: Vec<Iv> = match proj {
                    Some(e) if !within => e.to_vec(),
                    _ => rec.iter().map(|&v| Iv::point(v)).collect(),
                };
                qs.push(rope_head_iv(&src, &tables, t));
                marked.push(!within);
            }
            let Some(rows) = sdpa_heads(&qs, cache, l0 + tok + 1, scale, t) else {
                continue;
            };
            for (i, row) in rows.into_iter().enumerate() {
                let at = tok * h * d + (gh * group + i) * d;
                for (c, iv) in row.into_iter().enumerate() {
                    let half_width = (iv.hi - iv.lo) / 2.0;
                    attn[at + c] = Tracked {
                        v: iv.lo + half_width,
                        e: if marked[i] { 0.0 } else { half_width },
                        mag: iv.mag(),
                    };
                }
            }
        }
    }
    Ok(attn)
}

fn decode(inp: &DecodeInputs, model: Model, with_attn: bool) -> Result<DecodeExact, ExactError> {
    let g = inp.graph;
    let (h, hkv, d, rd) = (g.n_heads, g.n_kv_heads, g.head_dim, g.rotary_dims);
    if h == 0 || hkv == 0 || h % hkv != 0 {
        return err(format!("{h} heads over {hkv} KV heads"));
    }
    if rd % 2 != 0 || rd > d {
        return err(format!("rotary_dims {rd} of head_dim {d}"));
    }
    let [wq, wk, wv, wo] = &inp.projections;
    let hidden = wq.cols;
    if hidden == 0 || !inp.x.len().is_multiple_of(hidden) {
        return err(format!(
            "x holds {} values, not rows of hidden {hidden}",
            inp.x.len()
        ));
    }
    if wq.rows != h * d || wk.rows != hkv * d || wv.rows != hkv * d || wo.cols != h * d {
        return err(format!(
            "projections [{}, {}], [{}, {}], [{}, {}], [{}, {}] for {h} heads, {hkv} KV heads of {d}",
            wq.rows, wq.cols, wk.rows, wk.cols, wv.rows, wv.cols, wo.rows, wo.cols
        ));
    }
    let l0 = inp.l0;
    // Without the attention the prefill is never read (and may be empty).
    if with_attn && (inp.k0.len() != hkv * l0 * d || inp.v0.len() != hkv * l0 * d) {
        return err(format!(
            "prefill of {} / {} values for [{hkv}, {l0}, {d}]",
            inp.k0.len(),
            inp.v0.len()
        ));
    }
    let tokens = inp.x.len() / hidden;
    let p_dtypes: Vec<Float> = inp
        .scales_dtypes
        .iter()
        .map(|s| inp.x_dtype.promote(*s))
        .collect();
    let (pq, pk, pv) = (p_dtypes[0], p_dtypes[1], p_dtypes[2]);
    let ck = inp.k0_dtype.unwrap_or(pk);
    let cv = inp.v0_dtype.unwrap_or(pv);
    let f = pq.promote(ck).promote(cv);
    let py = f.promote(inp.scales_dtypes[3]);
    let scale = (d as f64).powf(-0.5);
    // The KV cache per KV head, `[len, D]`, in the SDPA dtype (only
    // where the attention reads it; its prefill length `lc`).
    let lc = if with_attn { l0 } else { 0 };
    let mut cache_k: Vec<Vec<Tracked>> = (0..hkv)
        .map(|gh| {
            inp.k0[gh * l0 * d..][..lc * d]
                .iter()
                .map(|&v| cast(Tracked::exact(v), ck, f))
                .collect()
        })
        .collect();
    let mut cache_v: Vec<Vec<Tracked>> = (0..hkv)
        .map(|gh| {
            inp.v0[gh * l0 * d..][..lc * d]
                .iter()
                .map(|&v| cast(Tracked::exact(v), cv, f))
                .collect()
        })
        .collect();
    let mut out = DecodeExact {
        attn: Vec::new(),
        y: Vec::new(),
        keys: Vec::new(),
        values: Vec::new(),
    };
    // The projections of every token at once (each weight row prepared
    // once): rows-independent, the same values as token by token.
    // (q only where the attention reads it.)
    let q_all = if with_attn {
        quantized_matmul(inp.x, wq, pq, model)?
    } else {
        Vec::new()
    };
    let k_all = quantized_matmul(inp.x, wk, pk, model)?;
    let v_all = quantized_matmul(inp.x, wv, pv, model)?;
    for tok in 0..tokens {
        let k = &k_all[tok * hkv * d..(tok + 1) * hkv * d];
        let v = &v_all[tok * hkv * d..(tok + 1) * hkv * d];
        let pos = l0 + tok;
        let tab_q = rope_tables(pos, rd, g.rope_base, pq, model);
        let tab_k = rope_tables(pos, rd, g.rope_base, pk, model);
        for gh in 0..hkv {
            let kr = rope_head(&k[gh * d..(gh + 1) * d], &tab_k, pk);
            for (kc, vc) in kr.iter().zip(&v[gh * d..(gh + 1) * d]) {
                let kc = cast(*kc, pk, ck);
                let vc = cast(*vc, pv, cv);
                out.keys.push(kc);
                out.values.push(vc);
                if with_attn {
                    cache_k[gh].push(cast(kc, ck, f));
                    cache_v[gh].push(cast(vc, cv, f));
                }
            }
        }
        if !with_attn {
            continue;
        }
        let q = &q_all[tok * h * d..(tok + 1) * h * d];
        let mut attn = Vec::with_capacity(h * d);
        for hh in 0..h {
            let qr: Vec<Tracked> = rope_head(&q[hh * d..(hh + 1) * d], &tab_q, pq)
                .into_iter()
                .map(|t| cast(t, pq, f))
                .collect();
            let gh = hh / (h / hkv);
            attn.extend(sdpa_row(&qr, &cache_k[gh], &cache_v[gh], scale, f, model)?);
        }
        out.attn.extend(attn);
    }
    out.y = match inp.attn_read {
        Some(a) if a.len() == tokens * h * d => {
            // y given attn: o_proj on the values it read, exactly.
            let mut y = quantized_matmul(a, wo, py, model)?;
            if model == Model::Cpu && py == f {
                if let Some(enc) = crate::matmul::CpuAffineKernel::new(wo, py)
                    .and_then(|k| k.enclosure(&a.iter().map(|&v| Iv::point(v)).collect::<Vec<_>>()))
                {
                    tighten(&mut y, &enc);
                }
            }
            y
        }
        Some(a) => {
            return err(format!(
                "o_proj read {} attention values, the step has {}",
                a.len(),
                tokens * h * d
            ))
        }
        None => quantized_matmul_tracked(&out.attn, wo, py, model)?,
    };
    // x86-64 CPU, one dtype throughout: the enclosures of the emulated
    // kernel (module doc, "Emulated on enclosures").
    let one_dtype = [pk, pv, ck, cv, f, py].iter().all(|&x| x == pq);
    // A GPU, given what the attention read (module doc, "attn given what
    // it read").
    if let (Model::Gpu, true, true, Some(read)) = (model, with_attn, one_dtype, inp.read) {
        if let Some((enc, q_within)) = gpu_decode_attn_enclosures(inp, read, &q_all, pq) {
            if enc.len() == out.attn.len() {
                for (i, ok) in q_within.iter().enumerate() {
                    let head = &mut out.attn[i * d..(i + 1) * d];
                    if *ok {
                        tighten(head, &enc[i * d..(i + 1) * d]);
                    } else {
                        // A recorded query outside q_proj's own bound: the
                        // reference is wrong upstream of `attn`; that
                        // head's `attn` is marked outside (bound 0 at the
                        // definition's value).
                        for a in head {
                            a.e = 0.0;
                        }
                    }
                }
            }
        }
    }
    if model == Model::Cpu && one_dtype {
        if let Some(enc) = cpu_decode_enclosures(inp, pq, with_attn) {
            tighten(&mut out.attn, &enc.attn);
            if inp.attn_read.is_none() {
                tighten(&mut out.y, &enc.y);
            }
            tighten(&mut out.keys, &enc.keys);
            tighten(&mut out.values, &enc.values);
        }
    }
    Ok(out)
}

/// Enclosures of the four outputs the x86-64 CPU computes (module doc,
/// "Emulated on enclosures"), token-major like [`DecodeExact`].
struct DecodeEnclosures {
    attn: Vec<Iv>,
    y: Vec<Iv>,
    keys: Vec<Iv>,
    values: Vec<Iv>,
}

/// `T(T(x1 c) - T(x2 s))`, `T(T(x1 s) + T(x2 c))` on enclosures (the CPU
/// rope fallback's MLX ops, each computed in float32 and stored in `t`).
pub(crate) fn rope_head_iv(x: &[Iv], tables: &[(Iv, Iv)], t: Float) -> Vec<Iv> {
    let half = tables.len();
    let mut out = x.to_vec();
    for (i, &(c, s)) in tables.iter().enumerate() {
        let (x1, x2) = (x[i], x[i + half]);
        let (a, b) = (x1.mul(c).round32_then(t), x2.mul(s).round32_then(t));
        out[i] = a.sub_f32(b).round(t);
        let (a, b) = (x1.mul(s).round32_then(t), x2.mul(c).round32_then(t));
        out[i + half] = a.add_f32(b).round(t);
    }
    out
}

/// A float32 dot product in an order the model does not fix (`simd_gemm`'s
/// blocks), on enclosures of its operands: the real enclosure of every
/// sum the kernel can form, before its rounding to the output dtype.
fn dot_iv(a: impl Iterator<Item = (Iv, Iv)>) -> Iv {
    let (mut lo, mut hi, mut mag, mut n) = (0.0, 0.0, 0.0, 0usize);
    for (x, y) in a {
        let p = x.mul(y);
        lo += p.lo;
        hi += p.hi;
        mag += p.mag();
        n += 1;
    }
    let w = gamma(n, Float::Float32.u()) * mag
        + n as f64 * Float::Float32.eta()
        + gamma(n + 1, U64) * mag;
    Iv::real(lo - w, hi + w)
}

/// One query row of the CPU SDPA fallback on enclosures (module doc,
/// "Emulated on enclosures"): everything in `t`.
fn sdpa_row_iv(q: &[Iv], keys: &[Iv], values: &[Iv], scale: f64, t: Float) -> Vec<Iv> {
    let d = q.len();
    let n = keys.len() / d;
    let f32_ = Float::Float32;
    let sc = Iv::point(crate::formats::round_to(scale, t));
    let qs: Vec<Iv> = q.iter().map(|x| x.mul(sc).round32_then(t)).collect();
    let s: Vec<Iv> = (0..n)
        .map(|j| {
            let kj = &keys[j * d..(j + 1) * d];
            dot_iv(qs.iter().copied().zip(kj.iter().copied())).round(t)
        })
        .collect();
    // The precise softmax in float32 (max exact, `x = s - max`, MLX's
    // `exp`, the normalizer in any order, its reciprocal, the product).
    let m = Iv {
        lo: s.iter().map(|x| x.lo).fold(f64::NEG_INFINITY, f64::max),
        hi: s.iter().map(|x| x.hi).fold(f64::NEG_INFINITY, f64::max),
    };
    let k = exp_arg_k();
    let eps = eps_exp(Model::Cpu);
    let e: Vec<Iv> = s
        .iter()
        .map(|sj| {
            let x = sj.sub_f32(m);
            // x <= 0 up to the enclosure: e^{x (1 + K)} and e^{x (1 - K)}
            // are increasing, the relative error of MLX's exp at x.
            let f = |x: f64, k: f64| {
                if x <= 0.0 {
                    (x * (1.0 + k)).exp()
                } else {
                    (x * (1.0 - k)).exp()
                }
            };
            let lo = (f(x.lo, k) * (1.0 - eps) - EXP_ABS).max(0.0);
            let hi = f(x.hi, -k) * (1.0 + eps) + EXP_ABS;
            Iv::real(lo, hi).round(f32_)
        })
        .collect();
    let (zl, zh): (f64, f64) = e.iter().fold((0.0, 0.0), |(a, b), x| (a + x.lo, b + x.hi));
    let wz =
        gamma(n.saturating_sub(1), f32_.u()) * zh + n as f64 * f32_.eta() + gamma(n + 1, U64) * zh;
    let z = Iv::real(zl - wz, zh + wz).round(f32_);
    let inv = Iv {
        lo: f64::from(1.0f32 / z.hi as f32),
        hi: f64::from(1.0f32 / z.lo as f32),
    };
    let p: Vec<Iv> = e
        .iter()
        .map(|x| {
            Iv {
                lo: f64::from(x.lo as f32 * inv.lo as f32),
                hi: f64::from(x.hi as f32 * inv.hi as f32),
            }
            .round(t)
        })
        .collect();
    (0..d)
        .map(|c| dot_iv((0..n).map(|j| (p[j], values[j * d + c]))).round(t))
        .collect()
}

/// The relative error factors `(lo, hi)` of one softmax numerator
/// `e^{x}` whose argument's magnitude is at most `x` (>= 0), over every
/// GPU path the module doc names: the unfused ops' `f32` subtraction and
/// `exp` (CPU chain: argument scaling `K`, polynomial `eps_exp`), times the
/// fused kernels' chain of `r_steps` rescales (`fast::exp` / `__expf` /
/// `exp2f` within `2^-23 (3 + 2|x|)`, each multiply rounded), as
/// [`sdpa_row`] counts them.
fn gpu_exp_factors(x: f64, r_steps: usize) -> (f64, f64) {
    let u32_ = Float::Float32.u();
    let kx = (u32_ + exp_arg_k()) * x;
    let chain = (2f64.powi(-23) * (3.0 * (r_steps as f64 + 1.0) + 4.0 * x)).exp()
        * (1.0 + u32_).powi(2 * r_steps as i32 + 4);
    let hi = kx.exp() * (1.0 + eps_exp(Model::Cpu)) * chain;
    let lo = (-kx).exp() * (1.0 - eps_exp(Model::Cpu)) * (2.0 - chain).max(0.0);
    (lo, hi)
}

/// The smallest interval holding both.
fn hull(a: Iv, b: Iv) -> Iv {
    Iv {
        lo: a.lo.min(b.lo),
        hi: a.hi.max(b.hi),
    }
}

/// One head's RoPE on a GPU, on enclosures, from the exact query values
/// q_proj returned (`x`, in `t`): the fused kernel (`rope.cu`,
/// `rope.metal`: float32 cos / sin, `x1 c - x2 s` in float32, one
/// rounding to `t`), hulled with the unfused ops (`rope_head_iv`: the
/// trig cast to `t`, three roundings), so the enclosure also holds where
/// the fallback runs (the CPU: what lets a CPU run test it).
fn gpu_rope_head_iv(x: &[f64], trig: &[(Iv, Iv)], t: Float) -> Vec<Iv> {
    let half = trig.len();
    let u32_ = Float::Float32.u();
    let eta = Float::Float32.eta();
    let unfused: Vec<(Iv, Iv)> = trig.iter().map(|(c, s)| (c.round(t), s.round(t))).collect();
    let points: Vec<Iv> = x.iter().map(|&v| Iv::point(v)).collect();
    let mut out = rope_head_iv(&points, &unfused, t);
    for (i, &(c, s)) in trig.iter().enumerate() {
        let (x1, x2) = (Iv::point(x[i]), Iv::point(x[i + half]));
        // Two float32 roundings (or one fma), relative to the terms.
        let fused = |a: Iv, b: Iv, sign: f64| {
            let (pa, pb) = (a, b.mul(Iv::point(sign)));
            let lo = pa.lo + pb.lo;
            let hi = pa.hi + pb.hi;
            let w = 2.0 * u32_ * (pa.mag() + pb.mag()) + 2.0 * eta;
            Iv::real(lo - w, hi + w).round(Float::Float32).round(t)
        };
        out[i] = hull(out[i], fused(x1.mul(c), x2.mul(s), -1.0));
        out[i + half] = hull(out[i + half], fused(x1.mul(s), x2.mul(c), 1.0));
    }
    out
}

/// `a / b` for `b > 0`: the extreme quotients.
fn div_pos(a: Iv, b: Iv) -> Iv {
    let lo = if a.lo >= 0.0 {
        a.lo / b.hi
    } else {
        a.lo / b.lo
    };
    let hi = if a.hi >= 0.0 {
        a.hi / b.lo
    } else {
        a.hi / b.hi
    };
    Iv::real(lo, hi)
}

/// One query row of a GPU SDPA on enclosures (module doc, "attn given
/// what it read"): `q` the roped query (enclosures in `t`), `keys` /
/// `values` `[n, D]` the exact cached values, `t` a 16-bit dtype. The
/// hull of the unfused ops (CUDA's fallback: `T(T(scale) q)`, a float32
/// gemm / gemv rounded to `T`, the precise softmax's online normalizer
/// with `__expf`, the weights in `T`, the second gemm rounded to `T`) and
/// the fused kernels (Metal / CUDA `sdpa_vector`, the 2-pass variants,
/// cuDNN: scores in float32, online softmax, numerators held in `T` at
/// most twice (cuDNN's P tile, 2-pass partials), one division, one
/// rounding to `T`).
///
/// The weights are computed against a fixed shift `m*` (the largest
/// score's upper end), not the kernel's max `m_k`: `e^{s_j - m_k} =
/// e^{s_j - m*} e^{m* - m_k}`, and the common factor cancels exactly in
/// `e_j / sum_k e_k`; the kernel's `f32(s_j - m_k)` and `exp` errors are
/// relative, at most those of an argument of magnitude `m* - lo(s_j)`.
fn gpu_sdpa_row_iv(
    q: &[Iv],
    keys: &[f64],
    values: &[f64],
    scale: f64,
    t: Float,
    unfused: bool,
) -> Vec<Iv> {
    let d = q.len();
    let n = keys.len() / d;
    let f32_ = Float::Float32;
    let (u32_, ut) = (f32_.u(), t.u());
    let r_steps = n.div_ceil(32) + 3;
    let key = |j: usize| keys[j * d..(j + 1) * d].iter().map(|&v| Iv::point(v));
    // The softmax numerators against m*, and their normalizer, from
    // enclosures of the scores.
    let weights = |s: &[Iv]| -> (Vec<Iv>, Iv) {
        let m_star = s.iter().map(|x| x.hi).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<Iv> = s
            .iter()
            .map(|sj| {
                let (lo_f, hi_f) = gpu_exp_factors(m_star - sj.lo, r_steps);
                let lo = ((sj.lo - m_star).exp() * lo_f - EXP_ABS).max(0.0);
                let hi = (sj.hi - m_star).exp() * hi_f + EXP_ABS;
                Iv::real(lo, hi)
            })
            .collect();
        let (zl, zh) = e.iter().fold((0.0, 0.0), |(a, b), x| (a + x.lo, b + x.hi));
        let g = gamma(n.saturating_sub(1), u32_);
        let w = n as f64 * f32_.eta() + gamma(n + 1, U64) * zh;
        (e, Iv::real(zl * (1.0 - g) - w, zh * (1.0 + g) + w))
    };
    // The unfused ops.
    let sc_t = Iv::point(crate::formats::round_to(scale, t));
    let qs: Vec<Iv> = q.iter().map(|x| x.mul(sc_t).round32_then(t)).collect();
    let s: Vec<Iv> = (0..n)
        .map(|j| dot_iv(qs.iter().copied().zip(key(j))).round(t))
        .collect();
    let (e, z) = weights(&s);
    let unfused: Vec<Iv> = if !unfused {
        Vec::new()
    } else if z.lo > 0.0 {
        let p: Vec<Iv> = e
            .iter()
            .map(|ej| {
                let r = div_pos(*ej, z);
                // `e * (1 / Z)` or `e / Z`: two float32 roundings at most.
                Iv::real(r.lo * (1.0 - u32_).powi(2), r.hi * (1.0 + u32_).powi(2)).round32_then(t)
            })
            .collect();
        (0..d)
            .map(|c| dot_iv((0..n).map(|j| (p[j], Iv::point(values[j * d + c])))).round(t))
            .collect()
    } else {
        vec![Iv::real(f64::NEG_INFINITY, f64::INFINITY); d]
    };
    // The fused kernels.
    let sc32 = Iv::point(f64::from(scale as f32));
    let qs: Vec<Iv> = q
        .iter()
        .map(|x| {
            let p = x.mul(sc32);
            Iv::real(p.lo - u32_ * p.mag(), p.hi + u32_ * p.mag())
        })
        .collect();
    let s: Vec<Iv> = (0..n)
        .map(|j| dot_iv(qs.iter().copied().zip(key(j))))
        .collect();
    let (e, z) = weights(&s);
    if z.lo <= 0.0 {
        return vec![Iv::real(f64::NEG_INFINITY, f64::INFINITY); d];
    }
    // Numerators held in `T` once at most (cuDNN's P tile on CUDA, or
    // the 2-pass kernels' unnormalized partials on Metal: never both).
    let held = 1.0 + ut;
    let e_held: Vec<Iv> = e
        .iter()
        .map(|x| Iv::real(x.lo * (2.0 - held), x.hi * held))
        .collect();
    (0..d)
        .map(|c| {
            let num = dot_iv((0..n).map(|j| (e_held[j], Iv::point(values[j * d + c]))));
            let o = div_pos(num, z);
            let w = u32_ * o.mag();
            let fused = Iv::real(o.lo - w, o.hi + w).round(t);
            unfused.get(c).map_or(fused, |&a| hull(a, fused))
        })
        .collect()
}

/// Whether some GPU backend runs MLX 0.32's SDPA of this shape as
/// unfused ops (`use_fallback`): CUDA has `sdpa_vector` for head_dim 64 /
/// 96 / 128 and fewer than 4 query rows without an array mask (else cuDNN
/// for 16-bit head_dim <= 128, else the ops); Metal has `sdpa_vector` for
/// head_dim 64 / 96 / 128 / 256 and at most 8 query rows, `rows * gqa <=
/// 32` (else the full kernel above 8 rows, else the ops). Only where both
/// run a fused kernel is the unfused path left out.
pub fn gpu_may_run_unfused(head_dim: usize, rows: usize, gqa: usize, array_mask: bool) -> bool {
    let vector_both = matches!(head_dim, 64 | 96 | 128) && rows < 4 && rows * gqa <= 32;
    !vector_both || array_mask
}

/// Narrows a Gpu-model SDPA row's bounds ([`sdpa_row`]) with the
/// enclosure of every GPU path that may run it (module doc, "attn given
/// what it read"), from exact 16-bit inputs: `q` `[D]`, `keys` / `values`
/// `[n, D]`; `unfused` from [`gpu_may_run_unfused`]. A float32 SDPA keeps
/// its bound (TF32 operands are not modelled on enclosures).
pub fn tighten_gpu_sdpa_row(
    out: &mut [Tracked],
    q: &[f64],
    keys: &[f64],
    values: &[f64],
    scale: f64,
    t: Float,
    unfused: bool,
) {
    if t == Float::Float32 || q.len() != out.len() {
        return;
    }
    let q: Vec<Iv> = q.iter().map(|&v| Iv::point(v)).collect();
    let enc = gpu_sdpa_row_iv(&q, keys, values, scale, t, unfused);
    if enc.iter().all(|x| x.finite()) {
        tighten(out, &enc);
    }
}

/// `attn` of the decode given what the attention read (module doc, "attn
/// given what it read"), every GPU path's enclosure; `None` where it does
/// not apply (a float32 SDPA: TF32 operands are not modelled here) or an
/// enclosure is not finite. Also returns, per token and head, whether the
/// recorded query lies within q_proj's own bound (`q_bound`).
fn gpu_decode_attn_enclosures(
    inp: &DecodeInputs,
    read: DecodeRead,
    q_bound: &[Tracked],
    t: Float,
) -> Option<(Vec<Iv>, Vec<bool>)> {
    if t == Float::Float32 {
        return None;
    }
    let g = inp.graph;
    let (h, hkv, d, rd) = (g.n_heads, g.n_kv_heads, g.head_dim, g.rotary_dims);
    let tokens = read.queries.len() / (h * d).max(1);
    let (l0, w) = (inp.l0, hkv * d);
    if read.queries.len() != tokens * h * d
        || read.keys.len() != tokens * w
        || read.values.len() != tokens * w
        || q_bound.len() != read.queries.len()
        || inp.k0.len() != hkv * l0 * d
    {
        return None;
    }
    let scale = (d as f64).powf(-0.5);
    // Each KV head's cache `[len, D]`: the prefill, then the keys and
    // values each token cached.
    let mut cache_k: Vec<Vec<f64>> = (0..hkv)
        .map(|gh| inp.k0[gh * l0 * d..][..l0 * d].to_vec())
        .collect();
    let mut cache_v: Vec<Vec<f64>> = (0..hkv)
        .map(|gh| inp.v0[gh * l0 * d..][..l0 * d].to_vec())
        .collect();
    let mut attn = Vec::with_capacity(read.queries.len());
    let mut q_within = Vec::with_capacity(tokens * h);
    for tok in 0..tokens {
        for gh in 0..hkv {
            cache_k[gh].extend(&read.keys[tok * w + gh * d..][..d]);
            cache_v[gh].extend(&read.values[tok * w + gh * d..][..d]);
        }
        let trig: Vec<(Iv, Iv)> = rope_trig(l0 + tok, rd, g.rope_base, Model::Gpu)
            .into_iter()
            .map(|(c, s)| {
                let iv = |x: Tracked| Iv::real(x.v - x.e, x.v + x.e).round(Float::Float32);
                (iv(c), iv(s))
            })
            .collect();
        for hh in 0..h {
            let at = tok * h * d + hh * d;
            let q = &read.queries[at..at + d];
            q_within.push(
                q.iter()
                    .zip(&q_bound[at..at + d])
                    .all(|(&v, b)| (v - b.v).abs() <= b.e),
            );
            let qr = gpu_rope_head_iv(q, &trig, t);
            let gh = hh / (h / hkv);
            let unfused = gpu_may_run_unfused(d, 1, h / hkv, false);
            let row = gpu_sdpa_row_iv(&qr, &cache_k[gh], &cache_v[gh], scale, t, unfused);
            if !row.iter().all(|x| x.finite()) {
                return None;
            }
            attn.extend(row);
        }
    }
    Some((attn, q_within))
}

/// The decode on enclosures, x86-64 CPU only (the projections' scalar
/// loops emulated, `matmul`'s module doc), every dtype the same `T`;
/// `None` elsewhere or where an enclosure stops being finite.
fn cpu_decode_enclosures(
    inp: &DecodeInputs,
    t: Float,
    with_attn: bool,
) -> Option<DecodeEnclosures> {
    use crate::matmul::CpuAffineKernel;
    let g = inp.graph;
    let (h, hkv, d, rd) = (g.n_heads, g.n_kv_heads, g.head_dim, g.rotary_dims);
    let [wq, wk, wv, wo] = &inp.projections;
    let hidden = wq.cols;
    let tokens = inp.x.len() / hidden;
    let l0 = inp.l0;
    let scale = (d as f64).powf(-0.5);
    let (wk, wv) = (CpuAffineKernel::new(wk, t)?, CpuAffineKernel::new(wv, t)?);
    let point = |v: &f64| Iv::point(*v);
    let lc = if with_attn { l0 } else { 0 };
    let mut cache_k: Vec<Vec<Iv>> = (0..hkv)
        .map(|gh| inp.k0[gh * l0 * d..][..lc * d].iter().map(point).collect())
        .collect();
    let mut cache_v: Vec<Vec<Iv>> = (0..hkv)
        .map(|gh| inp.v0[gh * l0 * d..][..lc * d].iter().map(point).collect())
        .collect();
    let mut out = DecodeEnclosures {
        attn: Vec::new(),
        y: Vec::new(),
        keys: Vec::new(),
        values: Vec::new(),
    };
    let x: Vec<Iv> = inp.x.iter().map(point).collect();
    let (k_all, v_all) = (wk.enclosure(&x)?, wv.enclosure(&x)?);
    // q and o_proj only where the attention is evaluated.
    let (q_all, wo) = if with_attn {
        let wq = CpuAffineKernel::new(wq, t)?;
        (wq.enclosure(&x)?, Some(CpuAffineKernel::new(wo, t)?))
    } else {
        (Vec::new(), None)
    };
    for tok in 0..tokens {
        let k = &k_all[tok * hkv * d..(tok + 1) * hkv * d];
        let v = &v_all[tok * hkv * d..(tok + 1) * hkv * d];
        let tables: Vec<(Iv, Iv)> = rope_trig(l0 + tok, rd, g.rope_base, Model::Cpu)
            .into_iter()
            .map(|(c, s)| {
                let iv = |x: Tracked| Iv::real(x.v - x.e, x.v + x.e).round32_then(t);
                (iv(c), iv(s))
            })
            .collect();
        for gh in 0..hkv {
            let kr = rope_head_iv(&k[gh * d..(gh + 1) * d], &tables, t);
            out.keys.extend(&kr);
            out.values.extend(&v[gh * d..(gh + 1) * d]);
            if with_attn {
                cache_k[gh].extend(kr);
                cache_v[gh].extend(&v[gh * d..(gh + 1) * d]);
            }
        }
        if !with_attn {
            continue;
        }
        let q = &q_all[tok * h * d..(tok + 1) * h * d];
        let mut attn = Vec::with_capacity(h * d);
        for hh in 0..h {
            let qr = rope_head_iv(&q[hh * d..(hh + 1) * d], &tables, t);
            let gh = hh / (h / hkv);
            attn.extend(sdpa_row_iv(&qr, &cache_k[gh], &cache_v[gh], scale, t));
        }
        if !attn.iter().all(|x| x.finite()) {
            return None;
        }
        out.attn.extend(attn);
    }
    if let Some(wo) = wo {
        out.y = wo.enclosure(&out.attn)?;
    }
    Some(out)
}

/// Each tracked value's interval `[v - e, v + e]` narrowed to its
/// intersection with the enclosure (both hold the kernel's value): `v`
/// becomes the intersection's midpoint and `e` its half-width. An empty
/// intersection (the model contradicting itself) leaves the value as it
/// was.
fn tighten(values: &mut [Tracked], enclosures: &[Iv]) {
    for (t, iv) in values.iter_mut().zip(enclosures) {
        // The worst case's ends as float64 computes them, within
        // `OUTWARD` (far inside the float64 slack every bound adds).
        let m = crate::interval::OUTWARD * (t.v.abs() + t.e);
        let lo = iv.lo.max(t.v - t.e - m);
        let hi = iv.hi.min(t.v + t.e + m);
        if lo <= hi {
            t.v = lo + (hi - lo) / 2.0;
            t.e = (hi - lo) / 2.0;
        }
    }
}

#[cfg(test)]
// The tests port MLX's float literal for log2(e) (1.442695f), not the constant.
#[allow(clippy::approx_constant)]
mod tests {
    use super::*;
    use crate::{check, Exact, Format};

    fn bf(v: f64) -> f64 {
        f64::from(half::bf16::from_f64(v))
    }
    fn bf32(v: f32) -> f32 {
        f32::from(half::bf16::from_f32(v))
    }

    /// A deterministic pseudo-random stream in [-1, 1).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        }
    }

    /// MLX's CPU SDPA fallback for one bf16 query row, written out
    /// independently of the model: T(T(scale) q), bf16 scores from float32
    /// dots, the precise softmax (float32 exp, normalizer, reciprocal), bf16
    /// weights, float32 p.v, bf16 output.
    fn cpu_sdpa_bf16(q: &[f64], k: &[f64], v: &[f64], scale: f64) -> Vec<f64> {
        let d = q.len();
        let n = k.len() / d;
        let sc = bf32(scale as f32);
        let qs: Vec<f32> = q.iter().map(|&x| bf32(sc * x as f32)).collect();
        let s: Vec<f32> = (0..n)
            .map(|j| bf32((0..d).map(|c| qs[c] * k[j * d + c] as f32).sum::<f32>()))
            .collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = s.iter().map(|&x| (x - m).exp()).sum();
        let inv = 1.0 / z;
        let p: Vec<f32> = s.iter().map(|&x| bf32((x - m).exp() * inv)).collect();
        (0..d)
            .map(|c| {
                f64::from(bf32(
                    (0..n).map(|j| p[j] * v[j * d + c] as f32).sum::<f32>(),
                ))
            })
            .collect()
    }

    fn row_case(seed: u64, n: usize, d: usize, spread: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut r = Lcg(seed);
        let q = (0..d).map(|_| bf(r.next() * spread)).collect();
        let k = (0..n * d).map(|_| bf(r.next() * spread)).collect();
        let v = (0..n * d).map(|_| bf(r.next())).collect();
        (q, k, v)
    }

    fn exact_row(q: &[f64], k: &[f64], v: &[f64], scale: f64, model: Model) -> Exact {
        let t = |x: &[f64]| x.iter().map(|&v| Tracked::exact(v)).collect::<Vec<_>>();
        let o = sdpa_row(&t(q), &t(k), &t(v), scale, Float::Bfloat16, model).unwrap();
        Exact::from_tracked("sdpa", model, vec![q.len()], &o)
    }

    /// The written-out CPU fallback lies within the bound; wrong outputs
    /// (uniform weights, another row's cache, zeros) do not.
    #[test]
    fn the_cpu_sdpa_fallback_is_within_and_wrong_outputs_are_outside() {
        let (n, d) = (300, 64);
        let scale = (d as f64).powf(-0.5);
        let (q, k, v) = row_case(7, n, d, 3.0);
        let exact = exact_row(&q, &k, &v, scale, Model::Cpu);
        let computed = cpu_sdpa_bf16(&q, &k, &v, scale);
        let side = check(&computed, &exact);
        assert!(side.within(), "{side:?}");
        // Uniform weights: the mean of the values.
        let uniform: Vec<f64> = (0..d)
            .map(|c| bf((0..n).map(|j| v[j * d + c]).sum::<f64>() / n as f64))
            .collect();
        assert!(!check(&uniform, &exact).within());
        // Another batch row's cache (other keys and values).
        let (_, k2, v2) = row_case(8, n, d, 3.0);
        let other = cpu_sdpa_bf16(&q, &k2, &v2, scale);
        assert!(!check(&other, &exact).within());
        // A stale cache: the last key and value missing.
        let stale = cpu_sdpa_bf16(&q, &k[..(n - 1) * d], &v[..(n - 1) * d], scale);
        let s = check(&stale, &exact);
        assert!(!s.within() || s.max_ratio > 0.0);
        assert!(!check(&vec![0.0; d], &exact).within());
        // The Gpu bound is wider and holds it too.
        let gpu = exact_row(&q, &k, &v, scale, Model::Gpu);
        assert!(check(&computed, &gpu).within());
    }

    /// float32 SDPA as a GPU runs it without a fused kernel (matmuls on TF32
    /// operands, module doc) lies within the Gpu bound over many seeds and
    /// shapes, and outside the float32 CPU bound at the shape the explorer
    /// reported (the model was missing TF32).
    #[test]
    fn float32_sdpa_on_tf32_operands_is_within_the_gpu_bound() {
        fn tf32(x: f32) -> f32 {
            // Round to nearest even at 10 mantissa bits.
            let b = x.to_bits();
            let r = b.wrapping_add(0xfff + ((b >> 13) & 1)) & !0x1fff;
            f32::from_bits(r)
        }
        fn run(q: &[f64], k: &[f64], v: &[f64], d: usize, scale: f64) -> Vec<f64> {
            let n = k.len() / d;
            let qs: Vec<f32> = q.iter().map(|&x| tf32((scale as f32) * x as f32)).collect();
            let s: Vec<f32> = (0..n)
                .map(|j| {
                    (0..d)
                        .map(|c| qs[c] * tf32(k[j * d + c] as f32))
                        .sum::<f32>()
                })
                .collect();
            let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let p: Vec<f32> = e.iter().map(|&x| tf32(x / z)).collect();
            (0..d)
                .map(|c| {
                    f64::from(
                        (0..n)
                            .map(|j| p[j] * tf32(v[j * d + c] as f32))
                            .sum::<f32>(),
                    )
                })
                .collect()
        }
        let mut outside_cpu = 0;
        for seed in 0..200u64 {
            let d = [8, 16, 64][seed as usize % 3];
            let n = 2 + (seed as usize * 7) % 63;
            let mut r = Lcg(seed + 100);
            let q: Vec<f64> = (0..d).map(|_| f64::from((r.next() * 2.0) as f32)).collect();
            let k: Vec<f64> = (0..n * d)
                .map(|_| f64::from((r.next() * 2.0) as f32))
                .collect();
            let v: Vec<f64> = (0..n * d).map(|_| f64::from(r.next() as f32)).collect();
            let scale = (d as f64).powf(-0.5);
            let t = |x: &[f64]| x.iter().map(|&v| Tracked::exact(v)).collect::<Vec<_>>();
            let computed = run(&q, &k, &v, d, scale);
            for model in [Model::Gpu, Model::Cpu] {
                let o = sdpa_row(&t(&q), &t(&k), &t(&v), scale, Float::Float32, model).unwrap();
                let exact = Exact::from_tracked("sdpa", model, vec![d], &o);
                let side = check(&computed, &exact);
                if model == Model::Gpu {
                    assert!(side.within(), "seed {seed} d {d} n {n}: {side:?}");
                } else if !side.within() {
                    outside_cpu += 1;
                }
            }
        }
        assert!(
            outside_cpu > 100,
            "TF32 outputs outside the CPU bound: {outside_cpu} of 200"
        );
    }

    /// A score error widens the weights' bound rigorously: a weight computed
    /// from perturbed scores (every score moved by its full bound) is inside.
    #[test]
    fn perturbed_scores_stay_within_the_softmax_bound() {
        let (n, d) = (50, 32);
        let scale = (d as f64).powf(-0.5);
        let (q, k, v) = row_case(3, n, d, 2.0);
        let dk = 0.01;
        let qt: Vec<Tracked> = q.iter().map(|&x| Tracked::exact(x)).collect();
        let kt: Vec<Tracked> = k
            .iter()
            .map(|&x| Tracked {
                v: x,
                e: dk,
                mag: x.abs(),
            })
            .collect();
        let vt: Vec<Tracked> = v.iter().map(|&x| Tracked::exact(x)).collect();
        let o = sdpa_row(&qt, &kt, &vt, scale, Float::Bfloat16, Model::Cpu).unwrap();
        let exact = Exact::from_tracked("sdpa", Model::Cpu, vec![d], &o);
        // Keys moved by +-dk towards the query's sign on alternate rows.
        let mut r = Lcg(11);
        let k_moved: Vec<f64> = k.iter().map(|&x| x + dk * r.next()).collect();
        let computed = cpu_sdpa_bf16(&q, &k_moved, &v, scale);
        let s = check(&computed, &exact);
        assert!(s.within(), "{s:?}");
    }

    /// MLX's CPU `simd::exp` ported (float32, fused multiply-adds): its
    /// error past the argument scaling is within `eps_exp`.
    #[test]
    fn mlx_cpu_exp_polynomial_is_within_eps_exp() {
        let mlx_exp = |x0: f32| -> f32 {
            let x = x0 * 1.442695f32;
            let ipart = (x + 0.5).floor();
            let f = x - ipart;
            let mut p = 1.535_336_2e-4_f32;
            for c in [
                1.339_887_4e-3_f32,
                9.618_437e-3,
                5.550_332_4e-2,
                2.402_264_8e-1,
                6.931_472e-1,
                1.0,
            ] {
                p = p.mul_add(f, c);
            }
            if x0 < -88.0 {
                return 0.0;
            }
            let bits = ((ipart as i32 + 127) << 23) as u32;
            f32::from_bits(bits) * p
        };
        let mut worst = 0f64;
        for i in 0..2_000_000u32 {
            let x0 = -87.0f32 * i as f32 / 2_000_000.0;
            let got = f64::from(mlx_exp(x0));
            // The exact value of 2^(the float32 scaled argument), so only
            // the polynomial's error is left.
            let y = f64::from(x0 * 1.442695f32);
            let want = y.exp2();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst <= eps_exp(Model::Cpu), "{worst:e}");
        assert!(worst > 0.0);
    }

    /// The tracked-input qmm equals `quantized_matmul` on exact inputs.
    #[test]
    fn the_tracked_qmm_reproduces_quantized_matmul_on_exact_inputs() {
        let (n, k, gs) = (8, 128, 64);
        let mut packed = vec![0u8; n * k / 2];
        for i in 0..n * k {
            packed[i / 2] |= (((i * 5 + 3) % 16) as u8) << (4 * (i % 2));
        }
        let scales = vec![bf(0.013); n * k / gs];
        let biases = vec![bf(-0.1); n * k / gs];
        let w = QuantizedMatrix {
            format: Format::Affine,
            bits: 4,
            group_size: gs,
            rows: n,
            cols: k,
            packed: &packed,
            scales: &scales,
            scale_codes: &[],
            biases: &biases,
        };
        let mut r = Lcg(5);
        let x: Vec<f64> = (0..2 * k).map(|_| bf(r.next())).collect();
        for model in [Model::Cpu, Model::Gpu] {
            let a = quantized_matmul(&x, &w, Float::Bfloat16, model).unwrap();
            let xt: Vec<Tracked> = x.iter().map(|&v| Tracked::exact(v)).collect();
            let b = quantized_matmul_tracked(&xt, &w, Float::Bfloat16, model).unwrap();
            for (a, b) in a.iter().zip(&b) {
                assert!(
                    (a.v - b.v).abs() <= 1e-12 * a.mag
                        && (a.e - b.e).abs() <= 1e-9 * a.e.max(1e-30),
                    "{a:?} {b:?}"
                );
            }
        }
    }

    /// MLX's CPU rope fallback written out in float32 / bf16 at a large
    /// position lies within the RoPE bound; the unrotated head does not.
    #[test]
    fn the_cpu_rope_fallback_is_within_at_large_positions() {
        let (d, rd, base) = (256, 64, 1e7f64);
        let mut r = Lcg(9);
        let x: Vec<f64> = (0..d).map(|_| bf(r.next() * 2.0)).collect();
        for pos in [0usize, 1, 1029, 65539] {
            let tab = rope_tables(pos, rd, base, Float::Bfloat16, Model::Cpu);
            let xt: Vec<Tracked> = x.iter().map(|&v| Tracked::exact(v)).collect();
            let o = rope_head(&xt, &tab, Float::Bfloat16);
            let exact = Exact::from_tracked("rope", Model::Cpu, vec![d], &o);
            let half = rd / 2;
            let c = (base as f32).ln() / half as f32;
            let mut computed = x.clone();
            for i in 0..half {
                let inv = (-(i as f32) * c).exp();
                let th = pos as f32 * inv;
                let (co, si) = (bf32(th.cos()), bf32(th.sin()));
                let (x1, x2) = (x[i] as f32, x[i + half] as f32);
                computed[i] = f64::from(bf32(bf32(x1 * co) - bf32(x2 * si)));
                computed[i + half] = f64::from(bf32(bf32(x1 * si) + bf32(x2 * co)));
            }
            let s = check(&computed, &exact);
            assert!(s.within(), "pos {pos}: {s:?}");
            if pos == 1029 {
                assert!(!check(&x, &exact).within());
            }
        }
    }

    /// A whole decode over a small graph: wrong keys (another position)
    /// fall outside the keys' bound.
    #[test]
    fn a_small_decode_runs_and_a_wrong_position_is_outside() {
        let (hidden, h, hkv, d, rd, l0, toks, gs) = (64, 4, 2, 32, 16, 5, 2, 32);
        let mut r = Lcg(21);
        let mk = |rows: usize, cols: usize, r: &mut Lcg| {
            let mut packed = vec![0u8; rows * cols / 2];
            for i in 0..rows * cols {
                packed[i / 2] |= (((r.next() + 1.0) * 8.0) as u8 & 15) << (4 * (i % 2));
            }
            let g = rows * cols / gs;
            let s: Vec<f64> = (0..g).map(|_| bf(0.02 + 0.01 * r.next())).collect();
            let b: Vec<f64> = (0..g).map(|_| bf(-0.16 + 0.01 * r.next())).collect();
            (packed, s, b)
        };
        let ps = [
            mk(h * d, hidden, &mut r),
            mk(hkv * d, hidden, &mut r),
            mk(hkv * d, hidden, &mut r),
            mk(hidden, h * d, &mut r),
        ];
        let dims = [
            (h * d, hidden),
            (hkv * d, hidden),
            (hkv * d, hidden),
            (hidden, h * d),
        ];
        let projections = std::array::from_fn(|i| QuantizedMatrix {
            format: Format::Affine,
            bits: 4,
            group_size: gs,
            rows: dims[i].0,
            cols: dims[i].1,
            packed: &ps[i].0,
            scales: &ps[i].1,
            scale_codes: &[],
            biases: &ps[i].2,
        });
        let x: Vec<f64> = (0..toks * hidden).map(|_| bf(r.next())).collect();
        let k0: Vec<f64> = (0..hkv * l0 * d).map(|_| bf(r.next())).collect();
        let v0: Vec<f64> = (0..hkv * l0 * d).map(|_| bf(r.next())).collect();
        let inp = DecodeInputs {
            x: &x,
            x_dtype: Float::Float32,
            projections,
            scales_dtypes: [Float::Float32; 4],
            k0: &k0,
            v0: &v0,
            l0,
            k0_dtype: Some(Float::Float32),
            v0_dtype: Some(Float::Float32),
            graph: Graph {
                n_heads: h,
                n_kv_heads: hkv,
                head_dim: d,
                rotary_dims: rd,
                rope_base: 10000.0,
            },
            attn_read: None,
            read: None,
        };
        let out = decode_m1(&inp, Model::Cpu).unwrap();
        assert_eq!(out.attn.len(), toks * h * d);
        assert_eq!(out.y.len(), toks * hidden);
        assert_eq!(out.keys.len(), toks * hkv * d);
        // float32 activations: the bounds stay tight (in bf16 the scalar
        // CPU qmm's bf16 accumulation widens them with K).
        for t in &out.attn {
            assert!(t.e.is_finite() && t.e < 1e-3, "{t:?}");
        }
        assert!(out.y.iter().all(|t| t.e.is_finite()));
        // Keys rotated at position 0 instead of l0: outside.
        let keys = Exact::from_tracked("keys", Model::Cpu, vec![out.keys.len()], &out.keys);
        let kproj = quantized_matmul(
            &x[..hidden],
            &inp.projections[1],
            Float::Float32,
            Model::Cpu,
        )
        .unwrap();
        let tab0 = rope_tables(0, rd, 10000.0, Float::Float32, Model::Cpu);
        let mut wrong: Vec<f64> = rope_head(&kproj[..d], &tab0, Float::Float32)
            .iter()
            .map(|t| f64::from(t.v as f32))
            .collect();
        wrong.extend(vec![0.0; out.keys.len() - d]);
        assert!(check(&wrong, &keys).outside >= 1);
    }
}
