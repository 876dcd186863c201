//! MLX's x86-64 CPU attention fallback emulated in its own order of
//! operations, on enclosures (issue 41, item 5): the decode's `attn` at
//! windows of tens of thousands of keys, given what the attention read.
//!
//! # Why an order, not a bound
//! The any-order bounds of `attention`'s module doc grow with the window:
//! at 65540 keys `gamma_n(u32)` of the normalizer and of `p · v` is
//! `65540 · 2^-24 ≈ 4e-3` relative, and the float64 Tracked SDPA over
//! every key costs a minute on the host. On x86-64 MLX 0.32's CPU SIMD
//! width is one lane (`simd::max_size` is 1: `base_simd.h`; the NEON and
//! Accelerate headers are not compiled in for x86-64), so every loop of the
//! fallback runs scalar in a knowable order, and each float32 operation can
//! be performed here as the kernel performs it, on the endpoints of
//! enclosures (round to nearest even is monotone: `crate::interval`).
//!
//! # What runs (MLX 0.32.2, `mlx/fast.cpp`, CPU)
//! Given the query q_proj returned (`[D]` in `T`, exact), the keys and
//! values the step cached (prefill and decoded rows, exact), per token at
//! position `pos` and query head `h`:
//!
//! 1. **RoPE of the query** (`fast::rope`'s fallback, every step an MLX op):
//!    `c = f32(logf(f32 base) / half)` (the division by `half` in float32);
//!    `a_i = f32(-i · c)` (`arange(0, -half, -1) * c`);
//!    `inv_i = exp(a_i)` with MLX's `simd::exp` ([`mlx_exp`], ported bit
//!    for bit: the product by `1.442695f`, `floor(x + 0.5)`, the degree-6
//!    polynomial in `fma`, `2^ipart` from the bits, `0` below `-88`);
//!    `theta_i = f32(f32(pos) · inv_i)` (`positions * inv_freqs`, the scale
//!    1 exact); `cos`, `sin` with MLX's `simd::sincos` ([`mlx_sincos`],
//!    Cephes, ported bit for bit: the product by `4/pi`, the truncation to
//!    `uint32`, three `fma` reductions, the two polynomials in `fma`; above
//!    `2^23` MLX calls libm, not emulated: the pair then keeps
//!    `attention::rope_trig`'s bound), each cast to `T` (to nearest even).
//!    The one value not computed by MLX's own code is `logf` (glibc's,
//!    `std::log(float)`): glibc's `logf` (since 2.28) is within 0.818 ulp in
//!    round-to-nearest (its source's stated bound), so every float32 within
//!    0.82 ulp of `ln(f32 base)` is a candidate ([`logf_candidates`]: one
//!    at the suite's base 1e7, which lies 0.13 ulp from a float32), and
//!    each pair's `cos` / `sin` enclosure is the hull over the candidates.
//!    Then `T(T(x1 c) − T(x2 s))`, `T(T(x1 s) + T(x2 c))`, each float32
//!    operation on the endpoints (`attention::rope_head_iv`).
//! 2. **Scaled query**: `T(T(f32 scale) · q)` (`multiply(array(scale, T),
//!    q)`: the product in float32, stored in `T`).
//! 3. **Scores** `matmul(q, k^T)`: `simd_gemm<T, float>`
//!    (`gemms/simd_gemm.h`, `simd_bf16.cpp` / `simd_fp16.cpp`): per output
//!    a float32 accumulator from `+0`, for `k = 0 .. D−1` in index order
//!    (the 16-blocks of `k` keep that order; one lane: `simd::sum` of a
//!    one-lane product is the product) `c = f32(c + f32(q_k · K_jk))`, then
//!    `T(1.0f · c)`. Two roundings per step, no fused multiply-add (MLX's
//!    x86-64 wheel is built for the baseline ISA, which has no FMA
//!    instruction: the same assumption as `matmul`'s emulated loops, whose
//!    outputs match bit for bit; a contracted build would land outside).
//! 4. **Softmax** (`softmax.cpp`, `precise`: AccT float32; one lane, so
//!    every element takes the vector loop, `std::exp` of the tail is never
//!    reached): `m = max_j s_j` (exact); `e_j = exp(f32(s_j − m))`
//!    ([`mlx_exp`]); `Z = f32(... f32(f32(0 + e_0) + e_1) ... + e_{n−1})`
//!    in index order; `r = f32(1 / Z)`; `p_j = T(f32(e_j · r))` (the
//!    numerator recomputed identically in the normalize loop).
//! 5. **Output** `matmul(p, V)`: `simd_gemm` again, `K = n` keys in index
//!    order, `o_c = T(f32(... f32(0 + f32(p_0 v_0c)) ...))`.
//!
//! # On enclosures
//! Each value is held as `[lo, hi]`; a product by an exact operand takes
//! the two endpoint products (swapped for a negative operand), each sum
//! adds the ends, each rounding rounds the ends: the kernel's value lies in
//! the result for any kernel value in the operands' enclosures. Where a
//! score or the max is not a point, the numerator's argument `x =
//! f32(s − m)` is an interval and the ported `exp` (not proven monotone)
//! is replaced by the real `e^x` within `attention`'s factors for MLX's
//! `exp` (`e^{±K|x|}(1 ± eps_exp)`, `±2^-125`), rounded outward to float32.
//! Everything else runs in Rust's `f32` (IEEE binary32, to nearest even;
//! Rust never contracts `a * b + c`), with subnormals kept as MLX's build
//! keeps them (no flush-to-zero). With exact inputs and a single `logf`
//! candidate every enclosure is one point: the kernel's value bit for bit.
//!
//! # Evidence
//! `the_ported_exp_sin_cos_are_mlx_cpu_kernels_bit_for_bit`
//! (conformance-cases) compares [`mlx_exp`] and [`mlx_sincos`] with MLX's
//! CPU `exp`, `sin`, `cos` on 60 000 arguments each (0 differ; replacing
//! one `fma` of the reduction by a product and a difference makes 175
//! differ); `the_cpu_attn_above_exact_max_kv_is_the_emulated_fallback_and_faults_are_flagged`
//! compares the whole emulation with MLX's decode at 8194 keys (summing the
//! normalizer in reverse order puts 83 of 3072 elements outside); the test
//! below compares it with the fallback written out as scalar loops.
//!
//! # Cost
//! Plain `f32` loops the compiler vectorizes: the scores over a block of
//! 16 keys at a time (keys stored `[block][D][16]`), the output over the
//! `D` channels of one value row, every head of a KV group sharing each
//! block and row while it is in cache; a path for point operands (one
//! accumulator) and one for intervals (two).

use crate::exp_bound::{eps_exp, exp_arg_k, EXP_ABS};
use crate::interval::Iv;
use crate::Float;

/// MLX's CPU `simd::exp` for one float32 lane (`cpu/simd/math.h`), bit for
/// bit.
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub fn mlx_exp(x_init: f32) -> f32 {
    if x_init.is_nan() {
        return x_init;
    }
    let x = x_init * 1.442695f32;
    let ipart = (x + 0.5f32).floor();
    let fpart = x - ipart;
    let mut p = 1.535336188319500e-4f32;
    p = p.mul_add(fpart, 1.339887440266574e-3f32);
    p = p.mul_add(fpart, 9.618437357674640e-3f32);
    p = p.mul_add(fpart, 5.550332471162809e-2f32);
    p = p.mul_add(fpart, 2.402264791363012e-1f32);
    p = p.mul_add(fpart, 6.931472028550421e-1f32);
    p = p.mul_add(fpart, 1.000000000000000f32);
    if x_init > 88.0 {
        return f32::INFINITY;
    }
    if x_init < -88.0 {
        return 0.0;
    }
    let epart = ((ipart as i32).wrapping_add(127)).wrapping_shl(23) as u32;
    f32::from_bits(epart) * p
}

/// MLX's CPU `simd::sin` (`sine`) or `cos` for one float32 lane (Cephes
/// `sincos`, `cpu/simd/math.h`), bit for bit; `None` above `2^23` in
/// magnitude, where MLX calls libm instead.
#[allow(clippy::excessive_precision)]
pub fn mlx_sincos(input: f32, sine: bool) -> Option<f32> {
    if input.is_nan() || input.abs() > 8_388_608.0 {
        return None;
    }
    let mut sign_sin = input < 0.0;
    let mut x = input.abs();
    let y = x * 1.27323954473516f32;
    let mut emm2 = y as u32;
    emm2 = emm2.wrapping_add(1) & !1u32;
    let y = emm2 as f32;
    let poly_mask = (emm2 & 2) != 0;
    x = y.mul_add(-0.78515625f32, x);
    x = y.mul_add(-2.4187564849853515625e-4f32, x);
    x = y.mul_add(-3.77489497744594108e-8f32, x);
    sign_sin ^= (emm2 & 4) != 0;
    let sign_cos = (emm2.wrapping_sub(2) & 4) != 0;
    let z = x * x;
    let mut y1 = z.mul_add(2.443315711809948e-5f32, -1.388731625493765e-3f32);
    let mut y2 = z.mul_add(-1.9515295891e-4f32, 8.3321608736e-3f32);
    y1 = y1.mul_add(z, 4.166664568298827e-2f32);
    y2 = y2.mul_add(z, -1.6666654611e-1f32);
    y1 *= z;
    y2 *= z;
    y1 *= z;
    y2 = x.mul_add(y2, x);
    y1 = z.mul_add(-0.5f32, y1);
    y1 += 1.0f32;
    Some(if sine {
        let ys = if poly_mask { y1 } else { y2 };
        if sign_sin {
            -ys
        } else {
            ys
        }
    } else {
        let yc = if poly_mask { y2 } else { y1 };
        if sign_cos {
            yc
        } else {
            -yc
        }
    })
}

/// The float32 neighbour of a finite `v` towards `+inf` (`up`) or `-inf`.
fn next_f32(v: f32, up: bool) -> f32 {
    if v == 0.0 {
        let tiny = f32::from_bits(1);
        return if up { tiny } else { -tiny };
    }
    let b = v.to_bits();
    let away = (v > 0.0) == up;
    f32::from_bits(if away { b + 1 } else { b - 1 })
}

/// glibc's `logf` is within 0.818 ulp of `ln` in round-to-nearest (its
/// source's stated bound): every float32 within 0.82 ulp of `ln(b)`
/// (float64's own error far below the margin).
pub fn logf_candidates(b: f32) -> Vec<f32> {
    let l = f64::from(b).ln();
    let f = l as f32;
    let mut out = Vec::new();
    for c in [next_f32(f, false), f, next_f32(f, true)] {
        let ulp = (f64::from(next_f32(c, true)) - f64::from(c))
            .abs()
            .max((f64::from(c) - f64::from(next_f32(c, false))).abs());
        if (f64::from(c) - l).abs() <= 0.82 * ulp {
            out.push(c);
        }
    }
    out
}

/// `v` (a float32 value) stored in `t` (to nearest even), as float32.
fn to_t(v: f32, t: Float) -> f32 {
    match t {
        Float::Bfloat16 => f32::from(half::bf16::from_f32(v)),
        Float::Float16 => f32::from(half::f16::from_f32(v)),
        Float::Float32 => v,
    }
}

/// The CPU rope fallback's `(cos, sin)` of each rotated pair at `pos`, as
/// stored in `t`, emulated (module doc, step 1): the hull over the `logf`
/// candidates; `None` for a pair whose angle MLX sends to libm (above
/// `2^23`) or a base whose `logf` is not finite.
pub fn rope_trig_emulated(
    pos: usize,
    rotary_dims: usize,
    rope_base: f64,
    t: Float,
) -> Vec<Option<(Iv, Iv)>> {
    let half = rotary_dims / 2;
    let base = rope_base as f32;
    let cands = logf_candidates(base);
    let pos32 = pos as f32;
    (0..half)
        .map(|i| {
            if !base.is_finite() || base <= 0.0 || cands.is_empty() || pos >= 1 << 24 {
                return None;
            }
            let mut acc: Option<(Iv, Iv)> = None;
            for &lg in &cands {
                let c = lg / half as f32;
                let a = -(i as f32) * c;
                let inv = mlx_exp(a);
                let theta = pos32 * inv;
                let co = to_t(mlx_sincos(theta, false)?, t) as f64;
                let si = to_t(mlx_sincos(theta, true)?, t) as f64;
                acc = Some(match acc {
                    None => (Iv::point(co), Iv::point(si)),
                    Some((x, y)) => (
                        Iv {
                            lo: x.lo.min(co),
                            hi: x.hi.max(co),
                        },
                        Iv {
                            lo: y.lo.min(si),
                            hi: y.hi.max(si),
                        },
                    ),
                });
            }
            acc
        })
        .collect()
}

/// Keys per block of the score loop.
const B: usize = 16;

/// One KV head's cache as the emulated fallback reads it, float32: keys
/// `[ceil(n / B)][D][B]` (zero-padded), values `[n][D]`.
pub struct KvHead {
    d: usize,
    n: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KvHead {
    /// From `n` rows of `D` keys and values (each row a slice of `D` values
    /// in `T`, exact).
    pub fn new<'a>(d: usize, rows: impl Iterator<Item = (&'a [f64], &'a [f64])>) -> Self {
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut n = 0;
        for (k, v) in rows {
            if n % B == 0 {
                keys.resize(keys.len() + d * B, 0.0);
            }
            let (blk, jj) = (n / B, n % B);
            for (c, &x) in k.iter().enumerate() {
                keys[(blk * d + c) * B + jj] = x as f32;
            }
            values.extend(v.iter().map(|&x| x as f32));
            n += 1;
        }
        KvHead { d, n, keys, values }
    }
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// The scores of several query heads over the first `n` keys: float32 sums
/// in index order (module doc, step 3), before the rounding to `T`; each
/// query as `(lo, hi)` float32 endpoints.
fn scores(qs: &[(Vec<f32>, Vec<f32>)], kv: &KvHead, n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let d = kv.d;
    let blocks = n.div_ceil(B);
    let points: Vec<bool> = qs.iter().map(|(lo, hi)| lo == hi).collect();
    let mut out: Vec<(Vec<f32>, Vec<f32>)> = qs
        .iter()
        .map(|_| (vec![0f32; blocks * B], vec![0f32; blocks * B]))
        .collect();
    for blk in 0..blocks {
        let kb = &kv.keys[blk * d * B..(blk + 1) * d * B];
        for (h, (qlo, qhi)) in qs.iter().enumerate() {
            if points[h] {
                let mut acc = [0f32; B];
                for (k, row) in kb.chunks_exact(B).enumerate() {
                    let q = qlo[k];
                    for jj in 0..B {
                        acc[jj] += q * row[jj];
                    }
                }
                out[h].0[blk * B..(blk + 1) * B].copy_from_slice(&acc);
                out[h].1[blk * B..(blk + 1) * B].copy_from_slice(&acc);
            } else {
                let (mut lo, mut hi) = ([0f32; B], [0f32; B]);
                for (k, row) in kb.chunks_exact(B).enumerate() {
                    let (a, b) = (qlo[k], qhi[k]);
                    for jj in 0..B {
                        let (x, y) = (a * row[jj], b * row[jj]);
                        lo[jj] += x.min(y);
                        hi[jj] += x.max(y);
                    }
                }
                out[h].0[blk * B..(blk + 1) * B].copy_from_slice(&lo);
                out[h].1[blk * B..(blk + 1) * B].copy_from_slice(&hi);
            }
        }
    }
    for o in &mut out {
        o.0.truncate(n);
        o.1.truncate(n);
    }
    out
}

/// The CPU fallback's SDPA of several query heads sharing one KV head over
/// its first `n` keys (module doc, steps 2 to 5): `q` the roped queries'
/// enclosures (endpoints in `t`), `t` bfloat16 or float16. `None` for a
/// non-finite enclosure.
pub fn sdpa_heads(
    q: &[Vec<Iv>],
    kv: &KvHead,
    n: usize,
    scale: f64,
    t: Float,
) -> Option<Vec<Vec<Iv>>> {
    let d = kv.d;
    if n == 0 || n > kv.n || q.iter().any(|x| x.len() != d) || t == Float::Float32 {
        return None;
    }
    let sc = to_t(scale as f32, t);
    // Step 2: T(T(scale) q), monotone in q (sc > 0).
    let qs: Vec<(Vec<f32>, Vec<f32>)> = q
        .iter()
        .map(|head| {
            head.iter()
                .map(|x| (to_t(sc * x.lo as f32, t), to_t(sc * x.hi as f32, t)))
                .unzip()
        })
        .collect();
    let raw = scores(&qs, kv, n);
    // Steps 4 and 5 per head.
    let f32_ = Float::Float32;
    let (k_arg, eps) = (exp_arg_k(), eps_exp(crate::Model::Cpu));
    let mut weights: Vec<(Vec<f32>, Vec<f32>)> = Vec::with_capacity(q.len());
    for (slo, shi) in raw {
        let s_lo: Vec<f32> = slo.iter().map(|&x| to_t(x, t)).collect();
        let s_hi: Vec<f32> = shi.iter().map(|&x| to_t(x, t)).collect();
        let m_lo = s_lo.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let m_hi = s_hi.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        if !m_lo.is_finite() || !m_hi.is_finite() {
            return None;
        }
        let mut e_lo = Vec::with_capacity(n);
        let mut e_hi = Vec::with_capacity(n);
        for j in 0..n {
            if m_lo == m_hi && s_lo[j] == s_hi[j] {
                let e = mlx_exp(s_lo[j] - m_lo);
                e_lo.push(e);
                e_hi.push(e);
            } else {
                // The real exp within MLX's exp's error factors, outward.
                let (xl, xh) = (f64::from(s_lo[j] - m_hi), f64::from(s_hi[j] - m_lo));
                let f = |x: f64, k: f64| {
                    if x <= 0.0 {
                        (x * (1.0 + k)).exp()
                    } else {
                        (x * (1.0 - k)).exp()
                    }
                };
                let lo = (f(xl, k_arg) * (1.0 - eps) - EXP_ABS).max(0.0);
                let hi = f(xh, -k_arg) * (1.0 + eps) + EXP_ABS;
                let iv = Iv::real(lo, hi).round(f32_);
                e_lo.push(iv.lo as f32);
                e_hi.push(iv.hi as f32);
            }
        }
        let (mut z_lo, mut z_hi) = (0f32, 0f32);
        for j in 0..n {
            z_lo += e_lo[j];
            z_hi += e_hi[j];
        }
        if z_lo <= 0.0 || !z_hi.is_finite() {
            return None;
        }
        let (r_lo, r_hi) = (1.0 / z_hi, 1.0 / z_lo);
        let p_lo: Vec<f32> = e_lo.iter().map(|&e| to_t(e * r_lo, t)).collect();
        let p_hi: Vec<f32> = e_hi.iter().map(|&e| to_t(e * r_hi, t)).collect();
        weights.push((p_lo, p_hi));
    }
    // Step 5: every head's output accumulated over the value rows in
    // order, each row shared while it is in cache.
    let heads = q.len();
    let points: Vec<bool> = weights.iter().map(|(lo, hi)| lo == hi).collect();
    let mut acc_lo = vec![0f32; heads * d];
    let mut acc_hi = vec![0f32; heads * d];
    for j in 0..n {
        let v = &kv.values[j * d..(j + 1) * d];
        for h in 0..heads {
            let (pl, ph) = (weights[h].0[j], weights[h].1[j]);
            let lo = &mut acc_lo[h * d..(h + 1) * d];
            if points[h] {
                for (a, &x) in lo.iter_mut().zip(v) {
                    *a += pl * x;
                }
            } else {
                let hi = &mut acc_hi[h * d..(h + 1) * d];
                for ((a, b), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(v) {
                    let (p1, p2) = (pl * x, ph * x);
                    *a += p1.min(p2);
                    *b += p1.max(p2);
                }
            }
        }
    }
    let out: Vec<Vec<Iv>> = (0..heads)
        .map(|h| {
            (0..d)
                .map(|c| {
                    let lo = to_t(acc_lo[h * d + c], t);
                    let hi = if points[h] {
                        lo
                    } else {
                        to_t(acc_hi[h * d + c], t)
                    };
                    Iv {
                        lo: f64::from(lo),
                        hi: f64::from(hi),
                    }
                })
                .collect()
        })
        .collect();
    out.iter().flatten().all(|x| x.finite()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(v: f64) -> f64 {
        f64::from(half::bf16::from_f64(v))
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

    /// MLX's CPU fallback for one bf16 query row, written out from the
    /// source as plain scalar loops (module doc, steps 2 to 5), with a
    /// fault hook: the first `keys_used` keys attended, and the last
    /// `doubled` products of the output sums added twice.
    fn fallback_row(q: &[f32], k: &[f32], v: &[f32], keys_used: usize, doubled: usize) -> Vec<f32> {
        let d = q.len();
        let bf = |x: f32| f32::from(half::bf16::from_f32(x));
        let sc = bf(0.0625);
        let qs: Vec<f32> = q.iter().map(|&x| bf(sc * x)).collect();
        let mut s = Vec::new();
        for j in 0..keys_used {
            let mut c = 0f32;
            for kk in 0..d {
                c += qs[kk] * k[j * d + kk];
            }
            s.push(bf(c));
        }
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut z = 0f32;
        for &x in &s {
            z += mlx_exp(x - m);
        }
        let r = 1.0 / z;
        let p: Vec<f32> = s.iter().map(|&x| bf(mlx_exp(x - m) * r)).collect();
        (0..d)
            .map(|c| {
                let mut o = 0f32;
                for j in 0..keys_used {
                    o += p[j] * v[j * d + c];
                    if j + doubled >= keys_used {
                        o += p[j] * v[j * d + c];
                    }
                }
                bf(o)
            })
            .collect()
    }

    fn case(seed: u64, n: usize, d: usize) -> (Vec<Vec<f64>>, Vec<f64>, Vec<f64>) {
        let mut r = Lcg(seed);
        let q = (0..3)
            .map(|_| (0..d).map(|_| bf(r.next() * 3.0)).collect())
            .collect();
        let k = (0..n * d).map(|_| bf(r.next() * 3.0)).collect();
        let v = (0..n * d).map(|_| bf(r.next())).collect();
        (q, k, v)
    }

    /// The emulation on point inputs is the scalar fallback bit for bit
    /// (three query heads over one KV head, every prefix length the decode
    /// reads); a dropped last key and a doubled tail of the `p · v` sums
    /// are not; enclosures of queries one bf16 ulp wide hold the fallback
    /// at their ends and at random points inside, and are narrower than
    /// the values.
    #[test]
    fn the_emulated_fallback_is_the_kernel_in_its_order_and_faults_are_not() {
        let (n, d) = (600, 64);
        let (q, k, v) = case(3, n, d);
        let kv = KvHead::new(
            d,
            (0..n).map(|j| (&k[j * d..(j + 1) * d], &v[j * d..(j + 1) * d])),
        );
        let (k32, v32): (Vec<f32>, Vec<f32>) = (
            k.iter().map(|&x| x as f32).collect(),
            v.iter().map(|&x| x as f32).collect(),
        );
        let qp: Vec<Vec<Iv>> = q
            .iter()
            .map(|h| h.iter().map(|&x| Iv::point(x)).collect())
            .collect();
        let (mut dropped, mut doubled) = (0, 0);
        for used in [1, 2, 17, 333, 599, 600] {
            let out = sdpa_heads(&qp, &kv, used, 0.0625, Float::Bfloat16).unwrap();
            for (h, row) in out.iter().enumerate() {
                let q32: Vec<f32> = q[h].iter().map(|&x| x as f32).collect();
                let want = fallback_row(&q32, &k32, &v32, used, 0);
                for (c, iv) in row.iter().enumerate() {
                    assert!(
                        iv.is_point() && iv.lo == f64::from(want[c]),
                        "n {used} head {h} c {c}: {iv:?} {}",
                        want[c]
                    );
                }
                if used > 1 {
                    let short = fallback_row(&q32, &k32, &v32, used - 1, 0);
                    dropped += usize::from(
                        row.iter()
                            .zip(&short)
                            .any(|(iv, &x)| f64::from(x) < iv.lo || f64::from(x) > iv.hi),
                    );
                    let twice = fallback_row(&q32, &k32, &v32, used, 32.min(used));
                    doubled += usize::from(
                        row.iter()
                            .zip(&twice)
                            .any(|(iv, &x)| f64::from(x) < iv.lo || f64::from(x) > iv.hi),
                    );
                }
            }
        }
        assert_eq!((dropped, doubled), (15, 15));
        // Queries known to one bf16 ulp: the enclosure holds the fallback
        // at both ends and inside, and stays informative.
        let mut r = Lcg(9);
        let ulp = |x: f64| bf(x.abs().max(1e-3) * (1.0 + 2f64.powi(-7))) - bf(x.abs().max(1e-3));
        let qi: Vec<Vec<Iv>> = q
            .iter()
            .map(|h| {
                h.iter()
                    .map(|&x| Iv {
                        lo: bf(x - ulp(x)),
                        hi: x,
                    })
                    .collect()
            })
            .collect();
        let out = sdpa_heads(&qi, &kv, n, 0.0625, Float::Bfloat16).unwrap();
        for trial in 0..6 {
            for (h, row) in out.iter().enumerate() {
                let q32: Vec<f32> = qi[h]
                    .iter()
                    .map(|iv| match trial {
                        0 => iv.lo as f32,
                        1 => iv.hi as f32,
                        _ => {
                            if r.next() > 0.0 {
                                iv.lo as f32
                            } else {
                                iv.hi as f32
                            }
                        }
                    })
                    .collect();
                let got = fallback_row(&q32, &k32, &v32, n, 0);
                for (iv, &x) in row.iter().zip(&got) {
                    assert!(iv.lo <= f64::from(x) && f64::from(x) <= iv.hi, "{iv:?} {x}");
                }
            }
        }
        let informative = out
            .iter()
            .flatten()
            .filter(|iv| (iv.hi - iv.lo) / 2.0 < iv.mag())
            .count();
        assert!(informative * 10 > 9 * out.len() * d, "{informative}");
    }

    /// MLX's `exp`, `sin`, `cos` ports against float64 (bit-equality with
    /// MLX itself is the conformance test's: the decode's `attn` lands on
    /// its points), and the `logf` candidates of the suite's base.
    #[test]
    fn the_ported_functions_are_close_to_the_math_and_logf_has_one_candidate_at_1e7() {
        for i in 0..200_000u32 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let e = f64::from(mlx_exp(x));
            let want = f64::from(x).exp();
            assert!(
                x > 88.0 || ((e - want) / want).abs() < 2e-5 * (1.0 + f64::from(x).abs()),
                "exp {x}"
            );
            let y = 70_000.0 * i as f32 / 200_000.0;
            let (c, s) = (mlx_sincos(y, false).unwrap(), mlx_sincos(y, true).unwrap());
            assert!((f64::from(c) - f64::from(y).cos()).abs() < 2e-7, "cos {y}");
            assert!((f64::from(s) - f64::from(y).sin()).abs() < 2e-7, "sin {y}");
        }
        assert_eq!(mlx_sincos(9e6, false), None);
        assert_eq!(logf_candidates(1e7), vec![(1e7f64.ln()) as f32]);
        // A base whose ln lies near a float32 midpoint has two.
        let two = (0..1000)
            .filter(|i| logf_candidates(10000.0 + *i as f32).len() == 2)
            .count();
        assert!(two > 100 && two < 900, "{two}");
    }
}
