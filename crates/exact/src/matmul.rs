//! Quantized and float matmul, the MoE gather, the LoRA residual, the
//! embedding lookup: exact values and bounds.
//!
//! # Kernel models (read from MLX 0.32's kernels)
//! **Cpu** (`mlx/backend/cpu/quantized.cpp`). On x86-64 `simd::max_size`
//! is 1, so every quantized matmul takes the scalar loops `_qmm_t` (affine)
//! and `fp_qmm_t` (mxfp4, nvfp4, mxfp8), whose every operation is in the
//! output dtype `T` (bf16 and f16 operators compute in float32 and round
//! back to `T` per operation):
//! - affine, per element in index order:
//!   `sum = T(sum + T(x * T(T(scale * q) + bias)))`;
//! - fp modes, per group in index order: `gsum = T(gsum + T(x * T(code)))`,
//!   then `sum = T(sum + T(T(scale) * gsum))` (the e8m0 scale is built as a
//!   bf16 and cast to `T`: it can under- or overflow in f16).
//!
//! On arm64 the SIMD path (`_qmm_t_simd`, `fp_qmm_t_simd`) accumulates in
//! float32 in any lane order and rounds once to `T`; the Cpu bound adds
//! `gamma_{K+2}(u_f32)` of the sum of magnitudes, so it covers that path
//! too (its one rounding to `T` is within the scalar path's last step).
//!
//! **Emulated** (x86-64, issue 41). There the scalar loops' arithmetic
//! is fully determined: the order (index order from an exact zero; fp
//! modes: each group's sum from zero, then the groups in order), every
//! rounding point (each `*` and `+` computed in float32, IEEE round to
//! nearest even, exact for two `T` operands' product, and stored back in
//! `T` by MLX's `_MLX_BFloat16` / `_MLX_Float16` conversions, also to
//! nearest even; an fp scale cast to `T` the same way), and the inputs
//! (the `T` values of x, scales, biases and codes the kernel reads).
//! `emulate_affine` and `emulate_fp` perform those same operations in
//! Rust's `f32` and `half`, so their result `c` is the kernel's result,
//! and the bound of the element is `|c − v|` (plus the float64 slack every
//! bound has): the kernel's own legitimate rounding, no more. Derivation:
//! if the kernel performs exactly these operations, its output is `c` bit
//! for bit, and `|c − v| ≤ |c − v|`; and since the worst-case bound below
//! holds for that same computation, `|c − v|` never exceeds it (no bound
//! is widened). It applies only where every input is exactly a `T` value
//! the kernel reads (an activation computed with an error, as in the
//! attention step's o_proj, keeps the worst case) and the sum stays
//! finite; the arm64 SIMD path keeps the worst-case bound below. Evidence
//! that the model is exact: the CPU suite's plain bf16 / f16 matmul
//! outputs (linear, rows, rows-regime, switch: 79 affine, 61 fp) land at
//! ratios of 0.9965 to 1 − 4e-10 of it (1 exactly would be `c`; the
//! float64 slack makes the rest), and
//! `the_emulated_cpu_bound_holds_over_many_seeds_and_is_tight`
//! (conformance-cases) checks 24 seeds × affine, mxfp4, mxfp8, nvfp4 ×
//! bf16, f16 × K 96, 512 against MLX's CPU kernels. Were MLX's loops to
//! change (another order, a float32 accumulator), its outputs would land
//! outside: the exact oracle then reports the reference outside, never a
//! wrong pass.
//!
//! **Gpu** (Metal `quantized.h` / `fp_quantized.h`, CUDA `qmm/*.cu`):
//! weights dequantized into the activation dtype `T` (two roundings:
//! `T(T(scale * q) + bias)`; exact for fp codes), products and partial
//! sums in float32 in an order the model does not fix (simdgroup
//! reductions, tensor-core tiles, split-K), each group's partial rounded to
//! `T` (some paths hold it there), fp scales applied to the group partial
//! in float32, groups summed in float32 in any order, the output rounded
//! once to `T`. Every rounding named is counted whether or not a given
//! kernel performs it, so the bound holds for each of them.
//!
//! CUDA's `qmv` (`qmm/qmv.cu`, the matrix-vector kernel of every mode on
//! sm80/sm90: `fp_qmv` runs on sm100+ only) keeps each thread's
//! accumulators in `T` for codes under 8 bits
//! (`conditional_t<(bits >= 8), float, T> sums[elems_per_thread]`,
//! `cutlass::fma` in `T`): each of `K` elements is fma'd into one of
//! `32 * elems_per_thread` accumulators, one per `32 * elems_per_thread`
//! columns, so a chain of `c = ceil(K / 256)` roundings to `T` (at 8
//! elements per thread; 16 gives shorter chains) before the float32
//! warp sum. The Gpu bound adds `gamma_c(u_T)` of the sum of the
//! products' magnitudes for codes under 8 bits and 16-bit `T` (found on
//! an H200: without it, about 1% of mxfp4, nvfp4 and one-group affine bf16
//! outputs exceeded the bound by up to 4x).
//!
//! Float matmul (`x @ w.T`, `gather_mm`; CPU casts to float32 for BLAS,
//! GPUs accumulate in float32): products and sums in float32 in any order,
//! output rounded to `T`. An additive bias (`x + bias`, or `addmm`'s
//! epilogue) is counted as a second rounding to the output dtype. On GPUs a
//! float32 matmul reads its inputs as TF32 (10 mantissa bits): MLX enables
//! TF32 by default (`MLX_ENABLE_TF32`, default 1; CUDA
//! `CUBLAS_COMPUTE_32F_FAST_TF32`, the grouped gemm, and Metal's NAX path),
//! so the Gpu model rounds each float32 operand to TF32 first (seen on an
//! H200: float32 `nn.Linear` outputs exceeded the float32 bound by ~20x).
//! The conversion's rounding is not documented (cuBLAS, Metal), and a
//! path may skip it (a gemv, `MLX_ENABLE_TF32=0`), so an exact operand is
//! read as any of: itself, truncated toward zero, rounded to nearest
//! (`tf32_round`: their hull, half a TF32 ulp about its centre at most,
//! where one ulp either side was assumed before; the products of TF32
//! values are exact in float32). That made the planted bf16 accumulation
//! visible on float32 outputs: on the H200 it escaped on every one of them
//! (worst error / bound 0.26 to 0.79), and a test over 60 seeds
//! (`float32_matmuls_on_tf32_operands_are_within_and_bf16_outputs_flagged`)
//! flags it on at least 90% of them, on none with the old interval.
//!
//! **Layouts** (issue 41: `quantized/accepted`, `float/accepted`). The
//! layers accept tensors of other layouts than a checkpoint's; the math
//! and the kernels are the plain layer's, so each element gets the plain
//! layer's model and bound, and only which values meet follows the
//! layout: an additive bias broadcast as MLX's `add` / `addmm` broadcasts
//! it ([`add_broadcast`]: a scalar, `[1]`, `[1, N]`, a row per row, a bias
//! that widens the output; one rounding per sum, as [`add_bias`]); a
//! quantized weight with leading axes of 1 (the same matrix); a LoRA
//! `lora_b` of one column (its one delta per row broadcast over the
//! outputs, [`lora_residual`]); an integer weight in a float matmul (cast
//! to the activation dtype first, exact where every value is one of its
//! values, which the caller checks); a per-expert bias `[E, 1]` (one value
//! per routed row, broadcast over its outputs).

use crate::formats::{Format, QuantizedMatrix};
use crate::tracked::{gamma, sum_any_order, sum_in_order, Tracked};
use crate::{err, ExactError, Float, Model};

/// Half an ulp of TF32 at 1 (10 explicit mantissa bits), the precision
/// GPU float32 matmuls read their inputs at.
pub(crate) const TF32_U: f64 = 1.0 / 2048.0;

/// Row `n` of `w` as one output element's loop reads it, in output dtype
/// `t` under `model`: computed once per weight row, not once per output
/// element (the exact oracle's cost is then the products alone).
struct WeightRow {
    /// Per column: the weight each product multiplies by (affine:
    /// `T(T(scale * q) + bias)`; fp modes: the code in `T`).
    w: Vec<Tracked>,
    /// Per column: `|w| + e` of the weight as the product's magnitude
    /// counts it (fp modes: scaled by the group's scale).
    w_mag: Vec<f64>,
    /// fp modes, per group: the scale in `T`.
    group_scale: Vec<Tracked>,
    /// Affine, where every scale and bias is a `T` value: the weight the
    /// CPU's scalar loop computes, `T(T(scale * q) + bias)` with each
    /// operation in float32 (the x86-64 emulation, module doc).
    kernel_w: Option<Vec<f32>>,
    /// fp modes, where every code is a `T` value: the codes in `T`, and
    /// per group the scale cast to `T` (`T(scale)`, rounded: an e8m0
    /// scale can under- or overflow in f16) (the x86-64 emulation).
    kernel_fp: Option<(Vec<f32>, Vec<f32>)>,
}

/// One operation of MLX's CPU scalar loops in `T`: computed in float32
/// (IEEE, to nearest even) and stored back in `T` (to nearest even: MLX's
/// `_MLX_BFloat16` / `_MLX_Float16` conversions on x86-64).
#[inline]
fn in_t(t: Float, x: f32) -> f32 {
    match t {
        Float::Bfloat16 => half::bf16::from_f32(x).to_f32(),
        Float::Float16 => half::f16::from_f32(x).to_f32(),
        Float::Float32 => x,
    }
}

/// `v` as a `T` value, if it is one exactly.
fn as_t(v: f64, t: Float) -> Option<f32> {
    (crate::formats::round_to(v, t) == v && v.is_finite()).then_some(v as f32)
}

/// Whether this build emulates the CPU's scalar loops (x86-64:
/// `simd::max_size` is 1, module doc); elsewhere the SIMD path runs.
const EMULATES_CPU_LOOPS: bool = cfg!(target_arch = "x86_64");

impl WeightRow {
    fn new(w: &QuantizedMatrix, n: usize, t: Float) -> Self {
        let row = w.row(n);
        let gs = w.group_size;
        let affine = w.format == Format::Affine;
        let weight = |k: usize| {
            let g = k / gs;
            if affine {
                Tracked::exact(row.scale[g])
                    .mul(Tracked::exact(row.code[k]))
                    .round(t)
                    .add(Tracked::exact(row.bias[g]))
                    .round(t)
            } else {
                Tracked::exact(row.code[k]).round(t)
            }
        };
        let w_row: Vec<Tracked> = (0..w.cols).map(weight).collect();
        let w_mag = w_row
            .iter()
            .enumerate()
            .map(|(k, wk)| {
                let counted = if affine {
                    *wk
                } else {
                    wk.scale(row.scale[k / gs])
                };
                counted.v.abs() + counted.e
            })
            .collect();
        let group_scale = row
            .scale
            .iter()
            .map(|&s| Tracked::exact(s).round(t))
            .collect();
        let kernel_w = (affine && EMULATES_CPU_LOOPS)
            .then(|| {
                (0..w.cols)
                    .map(|k| {
                        let g = k / gs;
                        let (s, b) = (as_t(row.scale[g], t)?, as_t(row.bias[g], t)?);
                        let q = as_t(row.code[k], t)?;
                        Some(in_t(t, in_t(t, s * q) + b))
                    })
                    .collect::<Option<Vec<f32>>>()
            })
            .flatten();
        let kernel_fp = (!affine && EMULATES_CPU_LOOPS)
            .then(|| {
                let codes = (0..w.cols)
                    .map(|k| as_t(row.code[k], t))
                    .collect::<Option<Vec<f32>>>()?;
                let scales = row
                    .scale
                    .iter()
                    .map(|&s| {
                        let s32 = s as f32;
                        (f64::from(s32) == s).then(|| in_t(t, s32))
                    })
                    .collect::<Option<Vec<f32>>>()?;
                Some((codes, scales))
            })
            .flatten();
        WeightRow {
            w: w_row,
            w_mag,
            group_scale,
            kernel_w,
            kernel_fp,
        }
    }
}

/// One output element of a quantized matmul: row `x` (K values, tracked:
/// exact inputs, or computed ones with their errors) against a prepared
/// row of `w`, rounded as `model` says, in output dtype `t`.
fn qmm_element(
    x: &[Tracked],
    w: &QuantizedMatrix,
    row: &WeightRow,
    t: Float,
    model: Model,
) -> Tracked {
    // x86-64, affine, inputs read exactly: the emulated loop's result
    // decides the bound (below), so the worst-case chain need not run:
    // the same definition `v` (the products summed in index order, as
    // `sum_in_order` sums them) and magnitude, bit for bit.
    if model == Model::Cpu && x.iter().all(|xk| xk.e == 0.0) {
        if let Some(c) = row
            .kernel_w
            .as_ref()
            .and_then(|kw| emulate_affine(x, kw, t))
        {
            let (mut v, mut mag) = (0.0, 0.0);
            for (xk, wk) in x.iter().zip(&row.w) {
                v += xk.v * wk.v;
                mag += xk.mag * wk.mag;
            }
            return Tracked {
                v,
                e: (f64::from(c) - v).abs(),
                mag,
            };
        }
    }
    qmm_element_chain(x, w, row, t, model)
}

/// [`qmm_element`] through the tracked chain (the worst case, then the
/// emulation where it applies).
fn qmm_element_chain(
    x: &[Tracked],
    w: &QuantizedMatrix,
    row: &WeightRow,
    t: Float,
    model: Model,
) -> Tracked {
    let gs = w.group_size;
    let groups = w.cols / gs;
    let f32_ = Float::Float32;
    // The sum of the products' magnitudes (errors included).
    let mut magnitude = 0.0;
    let mut add_magnitude = |xk: &Tracked, k: usize| {
        magnitude += (xk.v.abs() + xk.e) * row.w_mag[k];
    };
    let out = match (model, w.format) {
        (Model::Cpu, Format::Affine) => sum_in_order(
            (0..w.cols).map(|k| {
                add_magnitude(&x[k], k);
                x[k].mul(row.w[k]).round(t)
            }),
            t,
        ),
        (Model::Cpu, _) => sum_in_order(
            (0..groups).map(|g| {
                let gsum = sum_in_order(
                    (g * gs..(g + 1) * gs).map(|k| {
                        add_magnitude(&x[k], k);
                        x[k].mul(row.w[k]).round(t)
                    }),
                    t,
                );
                row.group_scale[g].mul(gsum).round(t)
            }),
            t,
        ),
        (Model::Gpu, format) => {
            let mut terms = Vec::with_capacity(gs);
            let partials: Vec<Tracked> = (0..groups)
                .map(|g| {
                    terms.clear();
                    terms.extend((g * gs..(g + 1) * gs).map(|k| {
                        add_magnitude(&x[k], k);
                        x[k].mul(row.w[k]).round(f32_)
                    }));
                    let p = sum_any_order(&terms, f32_).round(t);
                    if format == Format::Affine {
                        p
                    } else {
                        p.mul(row.group_scale[g]).round(f32_)
                    }
                })
                .collect();
            sum_any_order(&partials, f32_).round(t)
        }
    };
    // x86-64, affine, inputs read exactly: the scalar loop's result is
    // known (module doc, "Emulated"); its distance from the definition is
    // the bound.
    if model == Model::Cpu {
        let emulated = match (&row.kernel_w, &row.kernel_fp) {
            (Some(kw), _) => emulate_affine(x, kw, t),
            (_, Some((codes, scales))) => emulate_fp(x, codes, scales, gs, t),
            _ => None,
        };
        if let Some(c) = emulated {
            return Tracked {
                e: (f64::from(c) - out.v).abs(),
                ..out
            };
        }
    }
    match model {
        // The Cpu model also covers the float32 SIMD path (module doc).
        Model::Cpu => out.widen(gamma(w.cols + 2, f32_.u()) * magnitude),
        // CUDA qmv's accumulators in `T` (module doc).
        Model::Gpu if w.bits < 8 && t != f32_ => {
            out.widen(gamma(w.cols.div_ceil(256), t.u()) * magnitude)
        }
        Model::Gpu => out,
    }
}

/// The x86-64 CPU's affine scalar loop (`_qmm_t` / `_qmm`), operation by
/// operation: `sum = T(sum + T(x * w))` in index order from 0, `w` the
/// kernel's weight ([`WeightRow`]'s `kernel_w`). `None` where an input is
/// not exactly a `T` value the kernel would read (a computed activation
/// with an error, a value `T` cannot hold).
fn emulate_affine(x: &[Tracked], kw: &[f32], t: Float) -> Option<f32> {
    let mut sum = 0.0f32;
    for (xk, wk) in x.iter().zip(kw) {
        if xk.e != 0.0 {
            return None;
        }
        let xk = as_t(xk.v, t)?;
        sum = in_t(t, sum + in_t(t, xk * wk));
    }
    // An overflow is left to the worst-case bound.
    sum.is_finite().then_some(sum)
}

/// The x86-64 CPU's fp-mode scalar loop (`fp_qmm_t`), operation by
/// operation: per group in index order `gsum = T(gsum + T(x * code))`
/// from 0, then `sum = T(sum + T(scale * gsum))` from 0, `code` and
/// `scale` in `T` ([`WeightRow`]'s `kernel_fp`). `None` as in
/// [`emulate_affine`].
fn emulate_fp(x: &[Tracked], codes: &[f32], scales: &[f32], gs: usize, t: Float) -> Option<f32> {
    let mut sum = 0.0f32;
    for (g, scale) in scales.iter().enumerate() {
        let mut gsum = 0.0f32;
        for k in g * gs..(g + 1) * gs {
            if x[k].e != 0.0 {
                return None;
            }
            let xk = as_t(x[k].v, t)?;
            gsum = in_t(t, gsum + in_t(t, xk * codes[k]));
        }
        sum = in_t(t, sum + in_t(t, scale * gsum));
    }
    sum.is_finite().then_some(sum)
}

/// The x86-64 CPU's affine scalar loop ([`emulate_affine`]) for one
/// weight matrix, on enclosures of its inputs (`crate::interval`).
pub struct CpuAffineKernel {
    t: Float,
    rows: usize,
    cols: usize,
    /// `[rows, cols]`: the weight each product multiplies by,
    /// `T(T(scale * q) + bias)` computed in float32 (as `WeightRow`'s
    /// `kernel_w`).
    w: Vec<f32>,
}

impl CpuAffineKernel {
    /// `None` where the loop is not emulated: another architecture or
    /// format, a scale or bias `T` cannot hold.
    pub fn new(w: &QuantizedMatrix, t: Float) -> Option<Self> {
        if !EMULATES_CPU_LOOPS || w.format != Format::Affine || w.validate().is_err() {
            return None;
        }
        let gs = w.group_size;
        let mut kw = Vec::with_capacity(w.rows * w.cols);
        for n in 0..w.rows {
            let row = w.row(n);
            let sb = row
                .scale
                .iter()
                .zip(&row.bias)
                .map(|(&s, &b)| Some((as_t(s, t)?, as_t(b, t)?)))
                .collect::<Option<Vec<_>>>()?;
            for (k, &q) in row.code.iter().enumerate() {
                let (s, b) = sb[k / gs];
                kw.push(in_t(t, in_t(t, s * as_t(q, t)?) + b));
            }
        }
        Some(CpuAffineKernel {
            t,
            rows: w.rows,
            cols: w.cols,
            w: kw,
        })
    }

    /// The loop on `x` (`[rows, K]` enclosures, each endpoint a `T`
    /// value): `[rows, N]` enclosures of each output the loop computes
    /// from any inputs in those enclosures (every operation is monotone in
    /// the running sum and in `x`; `T(x * w)` swaps the ends for a
    /// negative `w`). With point inputs it is [`emulate_affine`]'s result.
    /// `None` for an endpoint not in `T` or an overflow.
    pub fn enclosure(&self, x: &[crate::interval::Iv]) -> Option<Vec<crate::interval::Iv>> {
        use crate::interval::Iv;
        let (k, t) = (self.cols, self.t);
        if k == 0 || !x.len().is_multiple_of(k) {
            return None;
        }
        let xs: Vec<(f32, f32)> = x
            .iter()
            .map(|v| Some((as_t(v.lo, t)?, as_t(v.hi, t)?)))
            .collect::<Option<_>>()?;
        let rows = x.len() / k;
        let mut out = Vec::with_capacity(rows * self.rows);
        for r in 0..rows {
            let xr = &xs[r * k..(r + 1) * k];
            for n in 0..self.rows {
                let (mut lo, mut hi) = (0.0f32, 0.0f32);
                for (&(xl, xh), &wk) in xr.iter().zip(&self.w[n * k..(n + 1) * k]) {
                    let (tl, th) = if xl == xh {
                        let p = in_t(t, xl * wk);
                        (p, p)
                    } else {
                        let (a, b) = (in_t(t, xl * wk), in_t(t, xh * wk));
                        if a <= b {
                            (a, b)
                        } else {
                            (b, a)
                        }
                    };
                    // One sum while the enclosure is a point.
                    let same = lo == hi && tl == th;
                    lo = in_t(t, lo + tl);
                    hi = if same { lo } else { in_t(t, hi + th) };
                }
                if !(lo.is_finite() && hi.is_finite()) {
                    return None;
                }
                out.push(Iv {
                    lo: f64::from(lo),
                    hi: f64::from(hi),
                });
            }
        }
        Some(out)
    }
}

/// [`quantized_matmul`] on tracked activations (computed inputs: the
/// attention step's projections of its own results).
pub fn quantized_matmul_tracked(
    x: &[Tracked],
    w: &QuantizedMatrix,
    t: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    w.validate()?;
    let k = w.cols;
    if k == 0 || !x.len().is_multiple_of(k) {
        return err(format!("x holds {} values, not rows of K = {k}", x.len()));
    }
    let rows = x.len() / k;
    let mut out = vec![Tracked::zero(); rows * w.rows];
    for n in 0..w.rows {
        let row = WeightRow::new(w, n, t);
        for r in 0..rows {
            out[r * w.rows + n] = qmm_element(&x[r * k..(r + 1) * k], w, &row, t, model);
        }
    }
    Ok(out)
}

/// `x @ dequantize(w).T` as `mx.quantized_matmul(x, w, scales, biases,
/// transpose=True)` computes it: `x` is `[rows, K]` (leading dimensions
/// flattened), `w` `[N, K]`; the result is `[rows, N]`, each element
/// tracked. `t` is the output dtype (the promotion of x's and the scales'
/// dtypes).
pub fn quantized_matmul(
    x: &[f64],
    w: &QuantizedMatrix,
    t: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    let xt: Vec<Tracked> = x.iter().map(|&v| Tracked::exact(v)).collect();
    quantized_matmul_tracked(&xt, w, t, model)
}

/// `gather_qmm`: row `r` of `x` (`[rows, K]`) against expert `experts[r]`
/// of a stack of quantized matrices (`w` covers `[E * N, K]`, expert `e`
/// being rows `e N .. (e + 1) N`); `[rows, N]`.
pub fn gather_qmm(
    x: &[f64],
    experts: &[usize],
    w: &QuantizedMatrix,
    n: usize,
    t: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    w.validate()?;
    let k = w.cols;
    if experts.len() * k != x.len() {
        return err(format!(
            "{} expert indices for {} values of rows of K = {k}",
            experts.len(),
            x.len()
        ));
    }
    if n == 0 || !w.rows.is_multiple_of(n) {
        return err(format!("{} weight rows are not experts of N = {n}", w.rows));
    }
    let e_count = w.rows / n;
    if let Some(&e) = experts.iter().find(|&&e| e >= e_count) {
        return Err(ExactError::undefined(format!(
            "expert index {e} of {e_count} experts"
        )));
    }
    let xt: Vec<Tracked> = x.iter().map(|&v| Tracked::exact(v)).collect();
    let mut out = vec![Tracked::zero(); experts.len() * n];
    // Each routed expert's rows prepared once, for every token routed to it.
    let mut routed: Vec<usize> = experts.to_vec();
    routed.sort_unstable();
    routed.dedup();
    for e in routed {
        for j in 0..n {
            let row = WeightRow::new(w, e * n + j, t);
            for (r, _) in experts.iter().enumerate().filter(|(_, &er)| er == e) {
                out[r * n + j] = qmm_element(&xt[r * k..(r + 1) * k], w, &row, t, model);
            }
        }
    }
    Ok(out)
}

/// A float matmul `a @ b` with `a` `[rows, K]` tracked and `b` `[K, N]`
/// exact (row-major), in float32 in any order, rounded to `t`; a float32
/// matmul (`t` float32) on a GPU reads its operands as TF32 (module doc).
pub fn matmul(
    a: &[Tracked],
    b: &[f64],
    k: usize,
    n: usize,
    t: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    if k == 0 || !a.len().is_multiple_of(k) || b.len() != k * n {
        return err(format!(
            "matmul of {} values in rows of {k} with a [{k}, {n}] matrix of {} values",
            a.len(),
            b.len()
        ));
    }
    let rows = a.len() / k;
    let f32_ = Float::Float32;
    let tf32 = model == Model::Gpu && t == f32_;
    let mut out = Vec::with_capacity(rows * n);
    let mut terms = Vec::with_capacity(k);
    for r in 0..rows {
        for j in 0..n {
            terms.clear();
            terms.extend((0..k).map(|i| {
                let (x, y) = (
                    a[r * k + i].round(f32_),
                    Tracked::exact(b[i * n + j]).round(f32_),
                );
                let (x, y) = if tf32 {
                    (tf32_round(x), tf32_round(y))
                } else {
                    (x, y)
                };
                x.mul(y).round(f32_)
            }));
            out.push(sum_any_order(&terms, f32_).round(t));
        }
    }
    Ok(out)
}

/// A float32 operand read as TF32. An operand known exactly (a float32
/// value, `e == 0`) becomes the hull of every value a kernel may read for
/// it: itself (a path without TF32, say a gemv), its 10-bit truncation
/// toward zero, and its rounding to nearest (either tie rule), plus zero
/// for a subnormal (flushed): [`tf32_hull`]. That hull lies within one TF32
/// ulp of the operand, so inside the interval below; an operand already
/// carrying an error keeps that interval: one TF32 ulp (`2 * TF32_U`)
/// relative, which covers rounding to nearest and truncation alike.
pub(crate) fn tf32_round(x: Tracked) -> Tracked {
    match tf32_hull(x) {
        Some((lo, hi)) => Tracked {
            v: 0.5 * (lo + hi),
            e: 0.5 * (hi - lo),
            mag: x.mag,
        },
        None => x.widen(2.0 * TF32_U * (x.v.abs() + x.e)),
    }
}

/// `[lo, hi]`, the values a kernel may read for an exact float32 operand
/// as TF32 (`tf32_round`); `None` when the operand is inexact, not a
/// finite float32 value, or rounds up to infinity. The midpoint of two
/// float32 values is exact in float64, so the enclosure loses nothing.
fn tf32_hull(x: Tracked) -> Option<(f64, f64)> {
    let f = x.v as f32;
    if x.e != 0.0 || !f.is_finite() || f64::from(f) != x.v {
        return None;
    }
    let bits = f.to_bits();
    let toward_zero = f32::from_bits(bits & !0x1fff);
    // Nearest: up in magnitude from half a TF32 ulp (at exactly half, one
    // tie rule goes up); adding to the bits carries into the exponent.
    let nearest = if bits & 0x1fff >= 0x1000 {
        f32::from_bits((bits & !0x1fff) + 0x2000)
    } else {
        toward_zero
    };
    if !nearest.is_finite() {
        return None;
    }
    let mut reads = vec![f64::from(f), f64::from(toward_zero), f64::from(nearest)];
    if f.is_subnormal() {
        reads.push(0.0);
    }
    let lo = reads.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = reads.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    Some((lo, hi))
}

/// The broadcast of two shapes (NumPy's rule, as MLX's `broadcast_shapes`):
/// aligned at the last axis, each pair equal or one of them 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, ExactError> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(r).map_or(1, |j| s[j]);
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => err(format!(
                "shapes {a:?} and {b:?} do not broadcast ({x} vs {y})"
            )),
        })
        .collect()
}

/// `y + bias` as MLX's `add` broadcasts them (`y` of `y_shape`, `bias` of
/// `bias_shape`, any ranks), each sum rounded to `t`: the result and its
/// shape. Each element is the same one rounding [`add_bias`] counts; only
/// which bias element meets which `y` element follows the shapes (a scalar,
/// `[1]`, `[1, N]`, one row per row of `y`, a bias that widens the
/// output).
pub fn add_broadcast(
    y: &[Tracked],
    y_shape: &[usize],
    bias: &[f64],
    bias_shape: &[usize],
    t: Float,
) -> Result<(Vec<Tracked>, Vec<usize>), ExactError> {
    let count = |s: &[usize]| s.iter().product::<usize>();
    if count(y_shape) != y.len() || count(bias_shape) != bias.len() {
        return err(format!(
            "{} and {} values for shapes {y_shape:?} and {bias_shape:?}",
            y.len(),
            bias.len()
        ));
    }
    let shape = broadcast_shapes(y_shape, bias_shape)?;
    let r = shape.len();
    // Row-major strides of an operand against the result (0 on a
    // broadcast axis).
    let strides = |s: &[usize]| {
        let mut st = vec![0usize; r];
        let mut acc = 1;
        for i in (0..s.len()).rev() {
            let at = r - s.len() + i;
            st[at] = if s[i] == 1 { 0 } else { acc };
            acc *= s[i];
        }
        st
    };
    let (sy, sb) = (strides(y_shape), strides(bias_shape));
    let total = count(&shape);
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0usize; r];
    for _ in 0..total {
        let (iy, ib) = index
            .iter()
            .enumerate()
            .fold((0, 0), |(a, b), (ax, &i)| (a + i * sy[ax], b + i * sb[ax]));
        out.push(y[iy].add(Tracked::exact(bias[ib])).round(t));
        for ax in (0..r).rev() {
            index[ax] += 1;
            if index[ax] < shape[ax] {
                break;
            }
            index[ax] = 0;
        }
    }
    Ok((out, shape))
}

/// `y + bias` broadcast over rows of `bias.len()`, rounded to `t`.
pub fn add_bias(y: &[Tracked], bias: &[f64], t: Float) -> Vec<Tracked> {
    y.iter()
        .enumerate()
        .map(|(i, v)| v.add(Tracked::exact(bias[i % bias.len()])).round(t))
        .collect()
}

/// The LoRA residual as mlx-lm's `LoRALinear.__call__` writes it:
/// `y + (scale * ((x @ lora_a) @ lora_b)).astype(x.dtype)`; `lora_a`
/// `[K, r]`, `lora_b` `[r, N]` or `[r, 1]` (broadcast over the outputs). `z_dtype` is the dtype of `x @ lora_a`
/// (the promotion of x's and the adapters' dtypes); the Python float scale
/// is cast to it (a weak scalar); `out` is the promotion of `y` and `x`.
#[allow(clippy::too_many_arguments)]
pub fn lora_residual(
    y: &[Tracked],
    x: &[f64],
    lora_a: &[f64],
    lora_b: &[f64],
    rank: usize,
    scale: f64,
    z_dtype: Float,
    x_dtype: Float,
    out: Float,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    if rank == 0 || !lora_a.len().is_multiple_of(rank) || !lora_b.len().is_multiple_of(rank) {
        return err(format!(
            "LoRA rank {rank} with {} and {} values",
            lora_a.len(),
            lora_b.len()
        ));
    }
    let k = lora_a.len() / rank;
    let n = lora_b.len() / rank;
    let xt: Vec<Tracked> = x.iter().map(|&v| Tracked::exact(v)).collect();
    let t = matmul(&xt, lora_a, k, rank, z_dtype, model)?;
    let z = matmul(&t, lora_b, rank, n, z_dtype, model)?;
    // A `lora_b` of one column ([r, 1]) broadcasts its one delta per row
    // over the row's outputs, as the add broadcasts it.
    let per_delta = match (z.len(), n) {
        (len, _) if len == y.len() => 1,
        (len, 1) if len > 0 && y.len().is_multiple_of(len) => y.len() / len,
        _ => {
            return err(format!(
                "LoRA delta of {} values for an output of {}",
                z.len(),
                y.len()
            ))
        }
    };
    let s = Tracked::exact(scale).round(z_dtype);
    Ok(y.iter()
        .enumerate()
        .map(|(i, y)| {
            let z = z[i / per_delta];
            y.add(s.mul(z).round(z_dtype).round(x_dtype)).round(out)
        })
        .collect())
}

/// `mx.dequantize` of rows `ids` of a quantized table (`nn.QuantizedEmbedding`
/// lookup): `[ids.len(), K]`, each `T(T(scale * q) + bias)` (fp: `T(scale *
/// code)`), rounded as the dequantize kernels do in `t`.
pub fn embedding(ids: &[usize], w: &QuantizedMatrix, t: Float) -> Result<Vec<Tracked>, ExactError> {
    w.validate()?;
    let mut out = Vec::with_capacity(ids.len() * w.cols);
    for &id in ids {
        if id >= w.rows {
            return err(format!("token id {id} of a table of {} rows", w.rows));
        }
        let row = w.row(id);
        for k in 0..w.cols {
            let g = k / w.group_size;
            out.push(
                Tracked::exact(row.scale[g])
                    .mul(Tracked::exact(row.code[k]))
                    .round(t)
                    .add(Tracked::exact(row.bias[g]))
                    .round(t),
            );
        }
    }
    Ok(out)
}

/// `mx.dequantize(w, scales, mode="nvfp4", global_scale=g)`: each code
/// times its e4m3 scale times `g / (448 * 6)` (the encoding's inverse, as
/// MLX's `dequantize` builds it), in `t`: `inv = T(g / T(2688))`,
/// `s = T(T(scale) * inv)`, `w = T(code * s)`; a kernel computing in
/// float32 and rounding once is within.
pub fn dequantize_global_scale(
    w: &QuantizedMatrix,
    global_scale: f64,
    t: Float,
) -> Result<Vec<Tracked>, ExactError> {
    w.validate()?;
    if w.format != Format::Nvfp4 {
        return err(format!("a global scale is nvfp4's, not {:?}'s", w.format));
    }
    let inv = Tracked::exact(global_scale)
        .round(t)
        .scale(1.0 / 2688.0)
        .widen(global_scale.abs() * crate::F64_SLACK)
        .round(t);
    let mut out = Vec::with_capacity(w.rows * w.cols);
    for r in 0..w.rows {
        let row = w.row(r);
        for k in 0..w.cols {
            let s = Tracked::exact(row.scale[k / w.group_size])
                .round(t)
                .mul(inv)
                .round(t);
            out.push(Tracked::exact(row.code[k]).round(t).mul(s).round(t));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check;
    use crate::Exact;

    /// A 4-bit affine matrix `[n, k]` with codes `(r * 7 + c * 3) % 16`,
    /// scale 0.01 per group and bias -0.08.
    fn affine(n: usize, k: usize, gs: usize) -> (Vec<u8>, Vec<f64>, Vec<f64>) {
        let mut packed = vec![0u8; n * k / 2];
        for r in 0..n {
            for c in 0..k {
                let q = ((r * 7 + c * 3) % 16) as u8;
                let i = r * k + c;
                packed[i / 2] |= q << (4 * (i % 2));
            }
        }
        let g = n * k / gs;
        (packed, vec![0.01; g], vec![-0.08; g])
    }

    fn x(rows: usize, k: usize) -> Vec<f64> {
        (0..rows * k)
            .map(|i| f64::from(half::bf16::from_f64(((i * 13 % 29) as f64 - 14.0) / 9.0)))
            .collect()
    }

    /// A float32 value of every exponent class: normal, tie, carry into the
    /// exponent, subnormal, negative (an LCG over the bits).
    fn f32_values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut out = vec![1.0, -1.0, f32::MAX, f32::MIN_POSITIVE, 1e-40, -3e-42];
        for low in [0x0fff, 0x1000, 0x1001, 0x1fff] {
            out.push(f32::from_bits(0x3f80_0000 | low));
            out.push(f32::from_bits(0xbfff_e000 | low));
        }
        while out.len() < n {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let f = f32::from_bits((s >> 32) as u32);
            if f.is_finite() {
                out.push(f);
            }
        }
        out
    }

    /// Round to 10 mantissa bits: to nearest, ties even (`even`) or away.
    fn tf32_nearest(x: f32, even: bool) -> f32 {
        let b = x.to_bits();
        let add = if even {
            0xfff + ((b >> 13) & 1)
        } else {
            0x1000
        };
        f32::from_bits(b.wrapping_add(add) & !0x1fff)
    }

    /// Every value a kernel may read for a float32 operand as TF32 (itself,
    /// truncated, nearest with either tie rule) lies in `tf32_round`'s
    /// enclosure, and for a normal operand that enclosure lies inside the
    /// one-ulp interval it replaced (no bound widened).
    #[test]
    fn tf32_reads_lie_in_the_hull_which_is_inside_the_old_interval() {
        let mut tighter = 0;
        let values = f32_values(200_000, 7);
        for &f in &values {
            let r = tf32_round(Tracked::exact(f64::from(f)));
            let within = |y: f32| (f64::from(y) - r.v).abs() <= r.e;
            let reads = [
                f,
                f32::from_bits(f.to_bits() & !0x1fff),
                tf32_nearest(f, true),
                tf32_nearest(f, false),
            ];
            for y in reads.iter().filter(|y| y.is_finite()) {
                assert!(
                    within(*y),
                    "{f:e} ({:#x}): {y:e} outside {r:?}",
                    f.to_bits()
                );
            }
            if f.is_normal() {
                let old = 2.0 * TF32_U * f64::from(f).abs();
                let (v, x) = (r.v, f64::from(f));
                assert!(
                    v - r.e >= x - old && v + r.e <= x + old,
                    "{f:e}: {r:?} vs {old:e}"
                );
                if r.e <= 0.5 * old {
                    tighter += 1;
                }
            }
        }
        // Every normal operand's enclosure is at most half a TF32 ulp wide
        // about its centre, where the old one was one ulp either side.
        assert!(
            tighter > values.len() * 9 / 10,
            "{tighter} of {}",
            values.len()
        );
        // An inexact operand keeps the old interval.
        let inexact = Tracked {
            v: 1.0,
            e: 1e-9,
            mag: 1.0,
        };
        assert_eq!(tf32_round(inexact).e, 1e-9 + 2.0 * TF32_U * (1.0 + 1e-9));
    }

    /// A float32 matmul a GPU may run (operands as themselves, truncated or
    /// rounded to TF32; float32 sums forward or backward) lies within the
    /// Gpu bound over many seeds, and the planted bf16-intermediate fault
    /// (the output held in bf16) is outside it on most of them: the TF32
    /// hull is what lets the oracle see it (issue 41; on the H200 it
    /// escaped on every float32 matmul output before).
    #[test]
    fn float32_matmuls_on_tf32_operands_are_within_and_bf16_outputs_flagged() {
        let (rows, k, n) = (4, 64, 48);
        let mut flagged = 0;
        let seeds = 60;
        for seed in 0..seeds {
            let vals = f32_values(6 + 8 + rows * k + k * n + 64, seed);
            // Moderate magnitudes, as activations and weights are.
            let fit = |f: f32| f32::from_bits((f.to_bits() & 0x807f_ffff) | 0x3f00_0000);
            let a: Vec<f32> = vals[14..14 + rows * k].iter().map(|&f| fit(f)).collect();
            let b: Vec<f32> = vals[14 + rows * k..14 + rows * k + k * n]
                .iter()
                .map(|&f| fit(f))
                .collect();
            let at: Vec<Tracked> = a.iter().map(|&x| Tracked::exact(f64::from(x))).collect();
            let bd: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
            let out = matmul(&at, &bd, k, n, Float::Float32, Model::Gpu).unwrap();
            let exact = Exact::from_tracked("matmul", Model::Gpu, vec![rows, n], &out);
            let reads: [fn(f32) -> f32; 4] = [
                |x| x,
                |x| f32::from_bits(x.to_bits() & !0x1fff),
                |x| tf32_nearest(x, true),
                |x| tf32_nearest(x, false),
            ];
            for read in reads {
                for backward in [false, true] {
                    let y: Vec<f64> = (0..rows * n)
                        .map(|o| {
                            let (r, j) = (o / n, o % n);
                            let mut idx: Vec<usize> = (0..k).collect();
                            if backward {
                                idx.reverse();
                            }
                            let s = idx
                                .iter()
                                .fold(0f32, |s, &i| s + read(a[r * k + i]) * read(b[i * n + j]));
                            f64::from(s)
                        })
                        .collect();
                    let side = check(&y, &exact);
                    assert!(side.within(), "seed {seed}: {side:?}");
                }
            }
            // The output held in bf16 (the planted fault's effect).
            let y: Vec<f64> = (0..rows * n)
                .map(|o| {
                    let (r, j) = (o / n, o % n);
                    let s: f32 = (0..k).map(|i| a[r * k + i] * b[i * n + j]).sum();
                    f64::from(half::bf16::from_f32(s))
                })
                .collect();
            if !check(&y, &exact).within() {
                flagged += 1;
            }
        }
        assert!(
            flagged * 10 >= seeds * 9,
            "bf16 outputs flagged on {flagged} of {seeds} seeds"
        );
    }

    /// The x86-64 fast path (exact inputs, affine, emulated) gives the
    /// tracked chain's value, magnitude and bound bit for bit.
    #[test]
    fn the_emulated_fast_path_equals_the_tracked_chain() {
        let (n, k, gs) = (16, 128, 64);
        let (packed, _, _) = affine(n, k, gs);
        // Scales and biases every T holds: the emulation applies.
        let (scales, biases) = (vec![1.0 / 128.0; n * k / gs], vec![-0.078125; n * k / gs]);
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
        let xs: Vec<Tracked> = x(2, k).into_iter().map(Tracked::exact).collect();
        for t in [Float::Bfloat16, Float::Float16, Float::Float32] {
            for j in 0..n {
                let row = WeightRow::new(&w, j, t);
                assert_eq!(row.kernel_w.is_some(), EMULATES_CPU_LOOPS);
                let xr = &xs[..k];
                let fast = qmm_element(xr, &w, &row, t, Model::Cpu);
                let chain = qmm_element_chain(xr, &w, &row, t, Model::Cpu);
                assert_eq!(fast, chain, "{t:?} row {j}");
            }
        }
    }

    /// The scalar CPU loop for bf16 (`_qmm_t`), written out independently of
    /// the model, must be inside the Cpu bound; zeros must not be.
    #[test]
    fn the_cpu_bound_holds_the_scalar_bf16_loop_and_rejects_zeros() {
        let (n, k, gs) = (16, 96, 32);
        let (packed, scales, biases) = affine(n, k, gs);
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
        let xs = x(3, k);
        let tracked = quantized_matmul(&xs, &w, Float::Bfloat16, Model::Cpu).unwrap();
        let exact = Exact::from_tracked("qmm", Model::Cpu, vec![3, n], &tracked);
        let bf = |v: f32| f32::from(half::bf16::from_f32(v));
        let sb = bf(0.01);
        let bb = bf(-0.08);
        let mut computed = Vec::new();
        for r in 0..3 {
            for j in 0..n {
                let mut sum = 0f32;
                for c in 0..k {
                    let q = ((j * 7 + c * 3) % 16) as f32;
                    let wq = bf(bf(sb * q) + bb);
                    sum = bf(sum + bf(xs[r * k + c] as f32 * wq));
                }
                computed.push(f64::from(sum));
            }
        }
        // The exact side uses the bf16 scales too (what the kernel reads).
        let s = check(&computed, &exact);
        assert!(s.within(), "{s:?}");
        let zeros = vec![0.0; computed.len()];
        assert!(!check(&zeros, &exact).within());
    }

    /// Issue 41: a bias broadcast as MLX broadcasts it (`quantized/accepted`):
    /// a scalar, `[1]`, `[1, N]`, a row per row, `[2, 1, N]` widening a
    /// `[2, N]` output to `[2, 2, N]`; shapes that do not broadcast are an
    /// error.
    #[test]
    fn a_bias_broadcasts_as_mlx_broadcasts_it() {
        let y: Vec<Tracked> = (0..6).map(|i| Tracked::exact(i as f64)).collect();
        let t = Float::Float32;
        let sums = |b: &[f64], s: &[usize]| {
            let (v, shape) = add_broadcast(&y, &[2, 3], b, s, t).unwrap();
            (v.iter().map(|v| v.v).collect::<Vec<_>>(), shape)
        };
        assert_eq!(
            sums(&[10.0], &[]),
            ((10..16).map(f64::from).collect(), vec![2, 3])
        );
        assert_eq!(sums(&[10.0], &[1]).0, sums(&[10.0], &[1, 1]).0);
        assert_eq!(
            sums(&[10.0, 20.0, 30.0], &[1, 3]).0,
            vec![10.0, 21.0, 32.0, 13.0, 24.0, 35.0]
        );
        let rows = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0];
        assert_eq!(
            sums(&rows, &[2, 3]).0,
            vec![10.0, 21.0, 32.0, 43.0, 54.0, 65.0]
        );
        let (wide, shape) = sums(&[100.0, 200.0, 300.0, 400.0, 500.0, 600.0], &[2, 1, 3]);
        assert_eq!(shape, vec![2, 2, 3]);
        assert_eq!(
            wide,
            vec![
                100.0, 201.0, 302.0, 103.0, 204.0, 305.0, 400.0, 501.0, 602.0, 403.0, 504.0, 605.0
            ]
        );
        assert!(add_broadcast(&y, &[2, 3], &[1.0, 2.0], &[2], t).is_err());
        assert!(add_broadcast(&y, &[2, 3], &[1.0], &[2], t).is_err());
        // Each sum is the one rounding add_bias counts.
        let b = [0.1, 0.2, 0.3];
        let (v, _) = add_broadcast(&y, &[2, 3], &b, &[3], Float::Bfloat16).unwrap();
        assert_eq!(v, add_bias(&y, &b, Float::Bfloat16));
    }
}
