//! Rotary position embeddings: plain RoPE (one position stream), Qwen3.5's
//! interleaved mRoPE (mlx-vlm `rope_utils.MRoPERotaryEmbedding`), and
//! Gemma 4 vision's 2-D RoPE (`apply_multidimensional_rope`).
//!
//! # The definition
//! `rotate_half` pairing: with `h = rotary_dim / 2` and angles `theta_j`
//! (`j < h`), channel `j` and `j + h` of a row rotate together:
//! `y_j = x_j cos theta_j - x_{j+h} sin theta_j`,
//! `y_{j+h} = x_{j+h} cos theta_j + x_j sin theta_j`; channels past
//! `rotary_dim` pass through.
//! - mRoPE: `inv_freq_j = rope_theta^(-2j / rotary_dim)`
//!   (`compute_inv_freq`), `theta_j = position_{s(j)} inv_freq_j`, stream
//!   `s(j)` interleaved ([`interleaved_streams`]); `[B, L]` positions are
//!   one stream for every `j` (plain RoPE).
//! - 2-D RoPE: the head splits into one part of `2 (head_dim / (2 n))`
//!   channels per position axis (`n` axes; `[B, L]` positions: one part of
//!   all `head_dim` channels); in a part of `c` channels
//!   `theta_j = position / base_frequency^(2j / c)`.
//!
//! # Where the kernels round (MLX 0.32, mlx-vlm 0.7.6, mlx-optiq 0.7.7)
//! 1. `inv_freq` / the timescale are computed on device in float32:
//!    `compute_inv_freq` is `1.0 / (base ** (arange(0, dim, 2) / dim))`,
//!    Gemma's `power(base, (2.0 / c) * arange(half))`. The base and the
//!    Python scalar `2.0 / c` are rounded to float32 (MLX casts a Python
//!    scalar to the array's dtype); the exponent is a rounded f32 division
//!    (or product); [`pow`] propagates their errors through `b^x`
//!    (`d ln(b^x) = ln b dx + x db / b`) and adds the function's own error:
//!    CPU `Power` is `std::pow(float, float)` (glibc `powf`, documented
//!    0.82 ulp; we assume 2), Metal's `metal::pow` in MLX's default safe
//!    math mode (MSL precise: 16 ulp), CUDA `powf` (4 ulp): [`Functions`].
//! 2. The angle: `float(position) * inv_freq` one f32 product (CPU: the
//!    compiled `_selected_mrope_freqs` or plain multiply; the Metal kernel:
//!    `pos * float(inv_freq[j])`), or Gemma's f32 division
//!    `position / timescale`. Its absolute error is `|theta|` times the
//!    relative errors above plus `u_f32 |theta|`: at positions ~70000 that
//!    is ~1e-2 rad, real, and in the bound.
//! 3. `cos` / `sin` of the f32 angle: `|cos a' - cos a| <= |a' - a|` plus
//!    the function's own error at `a'`: MLX's CPU `sincos` (Cephes, a
//!    three-constant Cody-Waite reduction with f32 FMAs and a degree-7/8
//!    polynomial, `simd/math.h`; libm past 2^23); measured here at under 1
//!    ulp of 1 for f32 angles to 1e5 (test
//!    `cephes_sincos_is_within_the_assumed_ulps`), assumed 2 ulp of 1;
//!    Metal precise `cos`/`sin` 4 ulp, CUDA `cosf`/`sinf` 2 ulp: assumed
//!    4 ulp of 1 (`2 u_f32` each), absolute.
//! 4. The pure-MLX paths (`_apply_interleaved_rotary_pos_emb_axis1` under
//!    `mx.compile`, Gemma's eager ops) round `cos`/`sin` to the activation
//!    dtype, then `x * cos` and `rotate_half(x) * sin` each in the
//!    activation dtype (a product of two bf16 / f16 values is exact in f32,
//!    so one rounding), and the sum: computed in f32 and rounded to the
//!    activation dtype (two roundings: MLX's bf16 / f16 arithmetic goes
//!    through float; compiled CPU code keeps each intermediate in its own
//!    dtype, `cpu/compiled.cpp`).
//! 5. The Metal kernel path (`_mrope_apply_kernel`): `cos`/`sin` stay f32,
//!    `xv * c - xp * s` in f32 (each product and the difference rounded; an
//!    FMA contraction rounds less, still covered), then one rounding to `T`.
//!
//! Positions are integers, exact in float32 below 2^24 (rounded for real
//! past that).
//!
//! # What the reference computes at the edges (issue 41)
//! - **An odd rotary dim** (`int(head_dim * partial_rotary_factor)` odd,
//!   `position/mrope/accepted/odd-rotary-dim-15-head-16`): mlx-vlm's
//!   `compute_inv_freq(d, base)` is `1 / base^(arange(0, d, 2) / d)`, so
//!   `ceil(d / 2)` frequencies with exponents `2j / d`; cos / sin are those
//!   twice (`concatenate([freqs, freqs])`), `ceil(d / 2) * 2 = d + 1`
//!   channels, and the apply rotates `q[..., :cos.shape[-1]]` with
//!   `rotate_half` (channel `j` with `j + ceil(d / 2)`). The definition is
//!   exactly that: [`mrope_apply`] rotates `d + 1` channels (an error
//!   where they exceed the head, as the reference's broadcast is) at the
//!   exponents [`inv_freq`] already computes for any `d`. Every rounding
//!   point is the even case's; the bound is derived the same way.
//! - **A base beyond float32** (`rope_theta = 1e39`,
//!   `position/rope2d/accepted/base-1e39`): both formulas raise a Python
//!   float to a float32 array, which MLX casts to float32 first, to
//!   nearest: `+inf`. The definition is the formula at that base
//!   (`F32Base::Infinite`): `inf^0 = 1` and `inf^y = +inf` for `y > 0`
//!   exactly (IEEE 754 §9.2.1, C Annex F; glibc's and CUDA's `powf`
//!   document these cases; Metal's precise `pow` is assumed to keep them,
//!   unverified: the Metal model has never run), the exponent of `j = 0` being exactly 0 (`0 /
//!   d`, `(2 / c) * 0`: a zero numerator or factor gives 0 in any division
//!   or product) and every other one positive. So `inv_freq = [1, 0, ...]`
//!   (`1 / inf = +0` exactly) and Gemma's `timescale = [1, inf, ...]`
//!   (`p / inf = ±0` exactly): bound 0 on those; the angles are the f32
//!   position and exactly 0; the rotation keeps the model's cos / sin and
//!   rounding errors above. Nothing there is NaN (no `0 * inf` or `inf /
//!   inf` arises: positions are finite). A real base `1e39` (`1e39^(-2j/d)`,
//!   what float64 would compute) is another value, which the bound
//!   separates from the reference's on float32 activations (test
//!   `odd_rotary_dims_and_bases_beyond_f32_are_the_formula_the_reference_computes`).

use crate::{err, Exact, ExactError, Float, Model, Tracked};

const F32: Float = Float::Float32;

/// Which apply the reference took (mlx-vlm's own names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Ordinary MLX ops (cos/sin rounded to the activation dtype).
    PureMlx,
    /// `_mrope_apply_kernel` (float32 cos/sin and rotation).
    MetalKernel,
}

impl Path {
    pub fn from_name(name: &str) -> Result<Self, ExactError> {
        match name {
            "pure-mlx" => Ok(Path::PureMlx),
            "metal-kernel" => Ok(Path::MetalKernel),
            other => err(format!("unknown rotary path `{other}`")),
        }
    }
}

/// The accuracy assumed of a backend's float32 functions, in ulps of the
/// result (see the module docs for the source of each number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Functions {
    pub pow_ulps: f64,
    /// 0.5 means correctly rounded.
    pub div_ulps: f64,
    /// Of `cos` / `sin`, in ulps of 1 (absolute).
    pub cos_sin_ulps: f64,
}

impl Functions {
    pub fn of(model: Model) -> Self {
        match model {
            // glibc powf (0.82 ulp documented), IEEE division, Cephes sincos.
            Model::Cpu => Functions {
                pow_ulps: 2.0,
                div_ulps: 0.5,
                cos_sin_ulps: 2.0,
            },
            // Metal precise math (pow 16 ulp, cos/sin 4 ulp, divide 2.5
            // ulp), CUDA (powf 4, cosf/sinf 2, IEEE division): the larger.
            Model::Gpu => Functions {
                pow_ulps: 16.0,
                div_ulps: 2.5,
                cos_sin_ulps: 4.0,
            },
        }
    }
}

/// `t` as a float32 function returns it, within `ulps` ulps of its result
/// (an ulp of `v` is at most `2 u |v|`; the result is within `e` of `v`).
fn f32_result(t: Tracked, ulps: f64) -> Tracked {
    t.widen(ulps * 2.0 * F32.u() * (t.v.abs() + t.e) + F32.eta())
}

/// `base^x` in float32 (MLX `Power`): the inputs' errors through
/// `ln(b'^x') - ln(b^x) = (x' - x) ln b' + x (ln b' - ln b)`, with
/// `|ln b' - ln b| <= e_b / (b - e_b)`, so `|b'^x' - b^x| <= b^x (e^L - 1)`;
/// then the function's own error.
fn pow(base: Tracked, x: Tracked, f: &Functions) -> Result<Tracked, ExactError> {
    if base.v.is_nan() || base.v <= base.e {
        return err(format!("rotary base {} is not positive", base.v));
    }
    let v = base.v.powf(x.v);
    let dln_base = base.e / (base.v - base.e);
    let l = x.e * (base.v.ln().abs() + dln_base) + x.v.abs() * dln_base;
    let t = Tracked {
        v,
        e: v * l.exp_m1(),
        mag: v,
    };
    Ok(f32_result(t, f.pow_ulps))
}

/// `n / d` in float32: `|n'/d' - n/d| <= (|n| e_d + |d| e_n) / (|d| (|d| - e_d))`,
/// then the division's rounding (the standard model when correctly
/// rounded).
fn divide(n: Tracked, d: Tracked, f: &Functions) -> Result<Tracked, ExactError> {
    // A finite value over an exactly infinite one (a timescale of an f32
    // base that overflowed: [`F32Base`]) is exactly ±0 in IEEE arithmetic.
    if d.v.is_infinite() && d.e == 0.0 && (n.v + n.e).is_finite() {
        return Ok(Tracked::zero());
    }
    // An exact zero over a finite nonzero divisor is exactly 0 however
    // the division is carried out (correctly rounded, or `n * (1 / d)`
    // with an approximate reciprocal: the product of 0 is 0).
    if n.v == 0.0 && n.e == 0.0 && d.v.is_finite() && d.v.abs() > d.e {
        return Ok(Tracked::zero());
    }
    let ad = d.v.abs();
    if ad.is_nan() || ad <= d.e {
        return err(format!("divisor {} within its error {} of zero", d.v, d.e));
    }
    let t = Tracked {
        v: n.v / d.v,
        e: (n.v.abs() * d.e + ad * n.e) / (ad * (ad - d.e)),
        mag: n.mag / ad,
    };
    Ok(if f.div_ulps <= 0.5 {
        t.round(F32)
    } else {
        f32_result(t, f.div_ulps)
    })
}

/// `cos` of a float32 angle: `|cos a' - cos a| <= min(|a' - a|, 2)`, plus
/// the function's error (absolute, ulps of 1). `mag` keeps `|a|` for the
/// float64 slack of evaluating `cos` at a large angle.
fn cos(a: Tracked, f: &Functions) -> Tracked {
    Tracked {
        v: a.v.cos(),
        e: a.e.min(2.0) + f.cos_sin_ulps * 2.0 * F32.u(),
        mag: a.mag + 1.0,
    }
}

/// `sin`, as [`cos`].
fn sin(a: Tracked, f: &Functions) -> Tracked {
    Tracked {
        v: a.v.sin(),
        ..cos(a, f)
    }
}

/// A rotary base as the kernels read it: the Python float cast to float32
/// (MLX casts a Python scalar to the array's dtype, to nearest). A base
/// beyond float32's range is `+inf` there, and the reference's formula is
/// evaluated at that base: the definition of `rope_theta = 1e39` is
/// what its formula gives, not `1e39^x` (see [`F32Base::Infinite`]).
#[derive(Debug, Clone, Copy)]
enum F32Base {
    /// A finite float32 base: the base, its cast to f32 counted as an
    /// error ([`Tracked::round`]).
    Finite(Tracked),
    /// The cast overflowed to `+inf` (`|base| >= f32::MAX + ulp / 2`).
    /// `inf^x` for the float32 exponent `x` the kernel computed:
    /// IEEE 754 (§9.2.1) and C's Annex F give `pow(+inf, ±0) = 1` and
    /// `pow(+inf, y > 0) = +inf` exactly, as glibc's and CUDA's `powf`
    /// document (Metal's `pow` assumed); the exponents here are `0 / d`
    /// (exactly 0 for `j = 0`: the division or product of an exact zero)
    /// and positive quotients or products of positive values for `j > 0`
    /// (about `2 / d` or more, far from underflow, whatever their
    /// rounding). So
    /// `inv_freq = [1, 0, 0, ...]` (`1 / 1`, `1 / inf = +0` exactly) and
    /// Gemma's `timescale = [1, inf, ...]`: bound 0; the angles are then
    /// `position * 1`, `position / 1` (f32 roundings of the position) and
    /// exactly 0, and cos / sin keep the model's function error.
    Infinite,
}

impl F32Base {
    fn of(base: f64) -> Result<Self, ExactError> {
        let b32 = base as f32;
        if b32 == f32::INFINITY {
            Ok(F32Base::Infinite)
        } else if b32.is_finite() && b32 > 0.0 {
            Ok(F32Base::Finite(Tracked::exact(base).round(F32)))
        } else {
            err(format!("rotary base {base} is not positive in float32"))
        }
    }
    /// `base^x` as the kernel computes it ([`pow`]; an infinite base as
    /// its doc says).
    fn pow(self, x: Tracked, f: &Functions) -> Result<Tracked, ExactError> {
        match self {
            F32Base::Finite(base) => pow(base, x, f),
            F32Base::Infinite if x.v == 0.0 && x.e == 0.0 => Ok(Tracked::exact(1.0)),
            F32Base::Infinite if x.v - x.e > 0.0 => Ok(Tracked::exact(f64::INFINITY)),
            F32Base::Infinite => err(format!(
                "an infinite base to an exponent {} ± {} not known positive or zero",
                x.v, x.e
            )),
        }
    }
}

/// A position as the kernel reads it: `astype(float32)` of an integer.
fn position(p: f64) -> Tracked {
    Tracked::exact(p).round(F32)
}

/// `compute_inv_freq(rotary_dim, rope_theta)`:
/// `1.0 / (rope_theta ** (arange(0, rotary_dim, 2) / rotary_dim))` in
/// float32 on device (steps 1 of the module docs).
pub fn inv_freq(
    rotary_dim: usize,
    rope_theta: f64,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    let f = Functions::of(model);
    let base = F32Base::of(rope_theta)?;
    (0..rotary_dim.div_ceil(2))
        .map(|j| {
            let x = divide(
                Tracked::exact(2.0 * j as f64),
                Tracked::exact(rotary_dim as f64),
                &f,
            )?;
            divide(Tracked::exact(1.0), base.pow(x, &f)?, &f)
        })
        .collect()
}

/// Gemma's `timescale = power(base, (2.0 / channels) * arange(channels / 2))`
/// in float32: the Python scalar `2.0 / channels` rounded to f32, times `j`
/// rounded, then [`pow`].
fn timescale(
    channels: usize,
    base_frequency: f64,
    model: Model,
) -> Result<Vec<Tracked>, ExactError> {
    let f = Functions::of(model);
    let base = F32Base::of(base_frequency)?;
    let step = Tracked::exact(2.0 / channels as f64).round(F32);
    (0..channels / 2)
        .map(|j| base.pow(step.mul(Tracked::exact(j as f64)).round(F32), &f))
        .collect()
}

/// Qwen3-VL / Qwen3.5 interleaved mRoPE: the position stream (0 t, 1 h,
/// 2 w) of each of `freq_dim` frequencies: `j % 3 == 1` below
/// `3 mrope_section[1]` is h, `j % 3 == 2` below `3 mrope_section[2]` is w,
/// every other `j` is t (mlx-vlm `_interleaved_position_selector`, HF
/// `apply_interleaved_mrope`).
pub fn interleaved_streams(
    mrope_section: &[usize],
    freq_dim: usize,
) -> Result<Vec<usize>, ExactError> {
    if mrope_section.len() != 3 {
        return err(format!(
            "mrope_section {mrope_section:?} is not three sections"
        ));
    }
    Ok((0..freq_dim)
        .map(|j| match j % 3 {
            s @ (1 | 2) if j < 3 * mrope_section[s] => s,
            _ => 0,
        })
        .collect())
}

/// Where the rotation rounds: `cos_sin` the dtype cos/sin are cast to
/// (None: kept f32), `at` the products' and the sum's dtype, `out` the
/// output's.
#[derive(Debug, Clone, Copy)]
struct Rounding {
    cos_sin: Option<Float>,
    at: Float,
    out: Float,
}

impl Rounding {
    /// The pure-MLX apply: cos/sin cast to `cos_dtype` (a no-op for f32),
    /// arithmetic in the promoted dtype, output cast to `x_dtype`.
    fn pure(x_dtype: Float, cos_dtype: Float) -> Self {
        Rounding {
            cos_sin: (cos_dtype != F32).then_some(cos_dtype),
            at: x_dtype.promote(cos_dtype),
            out: x_dtype,
        }
    }
    fn of(path: Path, x_dtype: Float, cos_dtype: Float) -> Self {
        match path {
            Path::PureMlx => Rounding::pure(x_dtype, cos_dtype),
            Path::MetalKernel => Rounding {
                cos_sin: None,
                at: F32,
                out: x_dtype,
            },
        }
    }
}

/// One rotated channel `x c + r s` (`r` the `rotate_half` partner, sign
/// included; exact inputs). Products of two `at` values are exact in f32,
/// so one rounding each; the sum is an f32 sum rounded to `at` when `at`
/// is narrower (MLX's half-precision arithmetic goes through float).
fn rotate(x: f64, r: f64, c: Tracked, s: Tracked, rounding: Rounding) -> Tracked {
    let a = Tracked::exact(x).mul(c).round(rounding.at);
    let b = Tracked::exact(r).mul(s).round(rounding.at);
    let mut y = a.add(b).round(F32);
    if rounding.at != F32 {
        y = y.round(rounding.at);
    }
    if rounding.out != rounding.at {
        y = y.round(rounding.out);
    }
    y
}

/// Rotates `row[..2h]` (rotate_half pairing) by angles `angles[..h]` into
/// `out`, cos/sin as the model computes them.
fn rotate_half(
    row: &[f64],
    angles: &[Tracked],
    f: &Functions,
    rounding: Rounding,
    out: &mut Vec<Tracked>,
) {
    let h = angles.len();
    let cs: Vec<(Tracked, Tracked)> = angles
        .iter()
        .map(|a| {
            let (c, s) = (cos(*a, f), sin(*a, f));
            match rounding.cos_sin {
                Some(d) => (c.round(d), s.round(d)),
                None => (c, s),
            }
        })
        .collect();
    for j in 0..h {
        out.push(rotate(row[j], -row[j + h], cs[j].0, cs[j].1, rounding));
    }
    for j in 0..h {
        out.push(rotate(row[j + h], row[j], cs[j].0, cs[j].1, rounding));
    }
}

/// The rotary of an mRoPE attention (`Qwen3_5RotaryEmbedding`).
#[derive(Debug, Clone, Copy)]
pub struct Mrope<'a> {
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub mrope_section: &'a [usize],
}

/// `MRoPERotaryEmbedding.apply_rotary` on one of q / k: `x` `[B, H, L, D]`
/// in `x_dtype`, cos/sin cast to `cos_dtype` (k's dtype: the reference
/// computes them as `self(k, position_ids)`), `position_ids` `[B, L]`
/// (plain RoPE) or `[3, B, L]`.
#[allow(clippy::too_many_arguments)]
pub fn mrope_apply(
    x: &[f64],
    shape: &[usize],
    x_dtype: Float,
    cos_dtype: Float,
    position_ids: &[f64],
    position_shape: &[usize],
    rotary: Mrope,
    path: Path,
    model: Model,
) -> Result<Exact, ExactError> {
    let &[b, heads, l, d] = shape else {
        return err(format!("x has shape {shape:?}, not [B, H, L, D]"));
    };
    if x.len() != b * heads * l * d {
        return err(format!("x holds {} values for shape {shape:?}", x.len()));
    }
    // `compute_inv_freq(rotary_dim)` has `ceil(rotary_dim / 2)`
    // frequencies (`arange(0, rotary_dim, 2)`), cos / sin twice that many
    // channels, and the apply rotates that many (`q[..., :cos.shape[-1]]`,
    // `rotate_half` pairing): an odd rotary dim rotates `rotary_dim + 1`
    // channels with exponents `2j / rotary_dim`.
    let rotary_dim = rotary.rotary_dim;
    let half = rotary_dim.div_ceil(2);
    if 2 * half > d {
        return err(format!("rotary_dim {rotary_dim} for head_dim {d}"));
    }
    let rotated = 2 * half;
    let streams = match position_shape {
        [pb, pl] if *pb == b && *pl == l => vec![0; half],
        [3, pb, pl] if *pb == b && *pl == l => interleaved_streams(rotary.mrope_section, half)?,
        other => return err(format!("position_ids shape {other:?} for x {shape:?}")),
    };
    if position_ids.len() != position_shape.iter().product::<usize>() {
        return err("position_ids length does not match its shape");
    }
    let inv = inv_freq(rotary_dim, rotary.rope_theta, model)?;
    let f = Functions::of(model);
    let rounding = Rounding::of(path, x_dtype, cos_dtype);
    let mut out = Vec::with_capacity(x.len());
    for bi in 0..b {
        for hi in 0..heads {
            for t in 0..l {
                let angles: Vec<Tracked> = (0..half)
                    .map(|j| {
                        let p = position_ids[(streams[j] * b + bi) * l + t];
                        position(p).mul(inv[j]).round(F32)
                    })
                    .collect();
                let row = &x[((bi * heads + hi) * l + t) * d..][..d];
                rotate_half(&row[..rotated], &angles, &f, rounding, &mut out);
                out.extend(row[rotated..].iter().map(|&v| Tracked::exact(v)));
            }
        }
    }
    Ok(Exact::from_tracked("rope", model, shape.to_vec(), &out))
}

/// `apply_multidimensional_rope(inputs, positions, base_frequency)`:
/// `inputs` `[B, L, N, H]` in `dtype`, `positions` `[B, L, n]` (one part
/// of `2 (H / (2 n))` channels per axis; the output keeps `n` parts) or
/// `[B, L]` (the 1-D fallback: one part of all `H` channels). Eager ops:
/// cos/sin cast to `dtype`, the rotation in `dtype`.
pub fn rope2d(
    inputs: &[f64],
    shape: &[usize],
    dtype: Float,
    positions: &[f64],
    position_shape: &[usize],
    base_frequency: f64,
    model: Model,
) -> Result<Exact, ExactError> {
    let &[b, l, n, hd] = shape else {
        return err(format!("inputs have shape {shape:?}, not [B, L, N, H]"));
    };
    if inputs.len() != b * l * n * hd {
        return err(format!(
            "inputs hold {} values for shape {shape:?}",
            inputs.len()
        ));
    }
    let (axes, channels) = match position_shape {
        [pb, pl] if *pb == b && *pl == l && hd % 2 == 0 => (1, hd),
        [pb, pl, axes] if *pb == b && *pl == l && *axes > 0 => (*axes, 2 * (hd / (2 * axes))),
        other => return err(format!("positions shape {other:?} for inputs {shape:?}")),
    };
    if positions.len() != b * l * axes || channels == 0 {
        return err("positions do not match their shape, or no channels per axis");
    }
    let ts = timescale(channels, base_frequency, model)?;
    let f = Functions::of(model);
    let rounding = Rounding::pure(dtype, dtype);
    let mut out = Vec::with_capacity(b * l * n * axes * channels);
    for bi in 0..b {
        for t in 0..l {
            let parts: Vec<Vec<Tracked>> = (0..axes)
                .map(|a| {
                    let p = position(positions[(bi * l + t) * axes + a]);
                    ts.iter().map(|s| divide(p, *s, &f)).collect()
                })
                .collect::<Result<_, _>>()?;
            for ni in 0..n {
                let row = &inputs[((bi * l + t) * n + ni) * hd..][..hd];
                for (a, angles) in parts.iter().enumerate() {
                    rotate_half(
                        &row[a * channels..][..channels],
                        angles,
                        &f,
                        rounding,
                        &mut out,
                    );
                }
            }
        }
    }
    let out_shape = vec![b, l, n, axes * channels];
    Ok(Exact::from_tracked("rope2d", model, out_shape, &out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check;
    use half::bf16;

    /// MLX's CPU `sincos` (`backend/cpu/simd/math.h`, Cephes), in f32,
    /// with its literals as written.
    #[allow(clippy::excessive_precision)]
    fn cephes(sine: bool, v: f32) -> f32 {
        let mut sign_sin = v < 0.0;
        let mut x = v.abs();
        let mut emm2 = (x * 1.273_239_544_735_16_f32) as u32;
        emm2 = (emm2 + 1) & !1;
        let y = emm2 as f32;
        let poly = emm2 & 2 != 0;
        x = y.mul_add(-0.785_156_25, x);
        x = y.mul_add(-2.418_756_484_985_351_562_5e-4, x);
        x = y.mul_add(-3.774_894_977_445_941_08e-8, x);
        sign_sin ^= emm2 & 4 != 0;
        let sign_cos = (emm2.wrapping_sub(2)) & 4 != 0;
        let z = x * x;
        let mut y1 = z.mul_add(2.443_315_711_809_948e-5, -1.388_731_625_493_765e-3);
        let mut y2 = z.mul_add(-1.951_529_589_1e-4, 8.332_160_873_6e-3);
        y1 = y1.mul_add(z, 4.166_664_568_298_827e-2);
        y2 = y2.mul_add(z, -1.666_665_461_1e-1);
        y1 *= z;
        y2 *= z;
        y1 *= z;
        y2 = x.mul_add(y2, x);
        y1 = z.mul_add(-0.5, y1);
        y1 += 1.0;
        if sine {
            let ys = if poly { y1 } else { y2 };
            if sign_sin {
                -ys
            } else {
                ys
            }
        } else {
            let yc = if poly { y2 } else { y1 };
            if sign_cos {
                yc
            } else {
                -yc
            }
        }
    }

    #[test]
    fn cephes_sincos_is_within_the_assumed_ulps() {
        let limit = Functions::of(Model::Cpu).cos_sin_ulps * 2.0 * F32.u();
        let mut worst = 0f64;
        let mut a = 1e-3f32;
        while a < 1e5 {
            for v in [a, -a] {
                let w = f64::from(v);
                worst = worst.max((f64::from(cephes(false, v)) - w.cos()).abs());
                worst = worst.max((f64::from(cephes(true, v)) - w.sin()).abs());
            }
            a = a * 1.000_37 + 1e-4;
        }
        assert!(worst <= limit, "{worst:e} > {limit:e}");
    }

    #[test]
    fn this_platforms_powf_is_within_the_assumed_ulps() {
        let limit = Functions::of(Model::Cpu).pow_ulps;
        for base in [1e7f32, 5e6, 1e5, 1e4, 100.0] {
            for d in [64u32, 128, 34, 70] {
                for j in 0..d / 2 {
                    let x = (2 * j) as f32 / d as f32;
                    let got = base.powf(x);
                    let exact = f64::from(base).powf(f64::from(x));
                    let ulp = f64::from(got.abs()) * 2.0 * F32.u();
                    assert!((f64::from(got) - exact).abs() <= limit * ulp, "{base}^{x}");
                }
            }
        }
    }

    /// The CPU pure-MLX mRoPE as MLX computes it, emulated in f32 / bf16
    /// (rotary dim `2 * streams.len()`).
    fn emulate_mrope(
        x: &[f64],
        shape: [usize; 4],
        pos: &[f64],
        streams: &[usize],
        theta: f32,
    ) -> Vec<f64> {
        emulate_mrope_dim(x, shape, pos, streams, theta, 2 * streams.len())
    }

    /// [`emulate_mrope`] with `compute_inv_freq(dim, theta)`'s exponents
    /// `2j / dim` (an odd `dim` has `streams.len() = ceil(dim / 2)`).
    fn emulate_mrope_dim(
        x: &[f64],
        shape: [usize; 4],
        pos: &[f64],
        streams: &[usize],
        theta: f32,
        dim: usize,
    ) -> Vec<f64> {
        let [b, heads, l, d] = shape;
        let half = streams.len();
        let inv: Vec<f32> = (0..half)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / dim as f32))
            .collect();
        let r = |v: f32| f64::from(bf16::from_f32(v));
        let mut out = Vec::new();
        for bi in 0..b {
            for hi in 0..heads {
                for t in 0..l {
                    let row = &x[((bi * heads + hi) * l + t) * d..][..d];
                    let cs: Vec<(f32, f32)> = (0..half)
                        .map(|j| {
                            let a = pos[(streams[j] * b + bi) * l + t] as f32 * inv[j];
                            (r(cephes(false, a)) as f32, r(cephes(true, a)) as f32)
                        })
                        .collect();
                    let rot =
                        |v: f32, p: f32, (c, s): (f32, f32)| r(r(v * c) as f32 + r(p * s) as f32);
                    for j in 0..half {
                        out.push(rot(row[j] as f32, -row[j + half] as f32, cs[j]));
                    }
                    for j in 0..half {
                        out.push(rot(row[j + half] as f32, row[j] as f32, cs[j]));
                    }
                    out.extend(&row[2 * half..]);
                }
            }
        }
        out
    }

    fn bf16_inputs(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f64 / (1u64 << 24) as f64;
                f64::from(bf16::from_f64(4.0 * u - 2.0))
            })
            .collect()
    }

    #[test]
    fn emulated_cpu_mrope_is_within_and_wrong_outputs_are_not() {
        // Qwen3.5: rotary 64 of head_dim 96 here, theta 1e7, [11, 11, 10];
        // [3, B=2, L=3] positions up to ~70000, rows differing.
        let shape = [2, 2, 3, 96];
        let section = [11, 11, 10];
        let x = bf16_inputs(shape.iter().product(), 7);
        let pos: Vec<f64> = (0..18).map(|i| (70_000 - 997 * i) as f64).collect();
        let streams = interleaved_streams(&section, 32).unwrap();
        let rotary = Mrope {
            rotary_dim: 64,
            rope_theta: 1e7,
            mrope_section: &section,
        };
        let bf = Float::Bfloat16;
        let exact = mrope_apply(
            &x,
            &shape,
            bf,
            bf,
            &pos,
            &[3, 2, 3],
            rotary,
            Path::PureMlx,
            Model::Cpu,
        )
        .unwrap();
        let computed = emulate_mrope(&x, shape, &pos, &streams, 1e7);
        let side = check(&computed, &exact);
        assert!(side.within(), "{side:?}");

        // Un-rotated: x itself.
        assert!(!check(&x, &exact).within());
        // The positions of another row (batch rows swapped).
        let swapped: Vec<f64> = (0..18)
            .map(|i| pos[(i / 6) * 6 + (i % 6 + 3) % 6])
            .collect();
        let other = emulate_mrope(&x, shape, &swapped, &streams, 1e7);
        assert!(!check(&other, &exact).within());
        // One stream for all frequencies (the section layout ignored).
        let other = emulate_mrope(&x, shape, &pos, &[0; 32], 1e7);
        assert!(!check(&other, &exact).within());
    }

    /// Issue 41: an odd rotary dim (15 of head 16: `compute_inv_freq(15)`'s
    /// 8 frequencies, exponents `2j / 15`, 16 channels rotated) and a theta
    /// beyond float32 (the f32 base `+inf`: inv_freq `[1, 0, ...]`) are
    /// defined as the reference's formula computes them: MLX's CPU apply,
    /// emulated, is within over many seeds; the same apply with the
    /// exponents of rotary 16 (the odd dim read as the next even one), or
    /// with 1e39 taken as a real base (`1e39^(-2j/d)`, what float64 would
    /// give), is not.
    #[test]
    fn odd_rotary_dims_and_bases_beyond_f32_are_the_formula_the_reference_computes() {
        let bf = Float::Bfloat16;
        let shape = [1, 2, 3, 16];
        let section = [3, 3, 2];
        let streams = interleaved_streams(&section, 8).unwrap();
        let exact_in = |dtype: Float, x: &[f64], pos: &[f64], dim: usize, theta: f64| {
            let rotary = Mrope {
                rotary_dim: dim,
                rope_theta: theta,
                mrope_section: &section,
            };
            mrope_apply(
                x,
                &shape,
                dtype,
                dtype,
                pos,
                &[3, 1, 3],
                rotary,
                Path::PureMlx,
                Model::Cpu,
            )
            .unwrap()
        };
        let exact_of =
            |x: &[f64], pos: &[f64], dim: usize, theta: f64| exact_in(bf, x, pos, dim, theta);
        for seed in 0..32u64 {
            let x = bf16_inputs(96, 100 + seed);
            let pos: Vec<f64> = (0..9)
                .map(|i| ((seed * 37 + i * 11) % 100) as f64)
                .collect();
            // Odd rotary dim 15.
            let exact = exact_of(&x, &pos, 15, 1e4);
            let got = emulate_mrope_dim(&x, shape, &pos, &streams, 1e4, 15);
            let side = check(&got, &exact);
            assert!(side.within(), "seed {seed}: {side:?}");
            let even = emulate_mrope_dim(&x, shape, &pos, &streams, 1e4, 16);
            assert!(!check(&even, &exact).within(), "seed {seed}: dim 16");
            // Theta 1e39: f32 infinity.
            let exact = exact_of(&x, &pos, 16, 1e39);
            let got = emulate_mrope(&x, shape, &pos, &streams, f32::INFINITY);
            let side = check(&got, &exact);
            assert!(side.within(), "seed {seed}: {side:?}");
            // 1e39 as a real base: inv_freq_j = 1e39^(-2j/16), in
            // float64 (no f32 cast of the base), on float32 q as the case
            // sends it (in bf16 its angles, ~1e-3 rad at position 100,
            // stay below the output's own rounding).
            let exact = exact_in(Float::Float32, &x, &pos, 16, 1e39);
            let inv: Vec<f64> = (0..8)
                .map(|j| 1e39f64.powf(-(2.0 * j as f64) / 16.0))
                .collect();
            let mut wrong = Vec::new();
            let r = |v: f64| f64::from(v as f32);
            for hi in 0..2 {
                for t in 0..3 {
                    let row = &x[(hi * 3 + t) * 16..][..16];
                    let a: Vec<f64> = (0..8).map(|j| pos[streams[j] * 3 + t] * inv[j]).collect();
                    for j in 0..8 {
                        wrong.push(r(row[j] * a[j].cos() - row[j + 8] * a[j].sin()));
                    }
                    for j in 0..8 {
                        wrong.push(r(row[j + 8] * a[j].cos() + row[j] * a[j].sin()));
                    }
                }
            }
            // Positions 0 everywhere would rotate nothing either way.
            if pos.iter().any(|&p| p >= 10.0) {
                assert!(!check(&wrong, &exact).within(), "seed {seed}: a real base");
            }
        }
        // inv_freq at theta 1e39: [1, 0, ...] exactly, bound 0.
        let inv = inv_freq(32, 1e39, Model::Cpu).unwrap();
        assert_eq!(inv[0], Tracked::exact(1.0));
        assert!(inv[1..].iter().all(|t| t.v == 0.0 && t.e == 0.0));
        // The same on the Gpu model.
        let inv = inv_freq(32, 1e39, Model::Gpu).unwrap();
        assert!(inv[1..].iter().all(|t| t.v == 0.0 && t.e == 0.0));
        // A base below f32's range stays an error.
        assert!(inv_freq(8, -1e39, Model::Cpu).is_err());
    }

    /// Issue 41: 2-D RoPE at a base beyond float32 (timescale `[1, inf,
    /// ...]`): frequency 0 of each part rotates by the position, every
    /// other channel passes through (angle exactly 0).
    #[test]
    fn rope2d_at_a_base_beyond_f32_rotates_frequency_0_alone() {
        let shape = [1, 3, 1, 8];
        let x = bf16_inputs(24, 13);
        let pos = [-1.0, 0.0, 3.0, 2.0, 15.0, 7.0];
        let e = rope2d(
            &x,
            &shape,
            Float::Float32,
            &pos,
            &[1, 3, 2],
            1e39,
            Model::Cpu,
        )
        .unwrap();
        for t in 0..3 {
            for a in 0..2 {
                let part = t * 8 + a * 4;
                let p = pos[t * 2 + a];
                let (c, s) = (p.cos(), p.sin());
                let want0 = x[part] * c - x[part + 2] * s;
                assert!((e.value[part] - want0).abs() < 1e-12, "t {t} axis {a}");
                assert_eq!(e.value[part + 1], x[part + 1]);
                assert_eq!(e.value[part + 3], x[part + 3]);
            }
        }
        assert!(e.bound.iter().all(|b| b.is_finite() && *b < 1e-5));
    }

    #[test]
    fn plain_rope_at_small_positions_has_a_tight_bound() {
        let shape = [1, 1, 4, 8];
        let x = bf16_inputs(32, 3);
        let pos = [0.0, 1.0, 2.0, 3.0];
        let rotary = Mrope {
            rotary_dim: 8,
            rope_theta: 1e4,
            mrope_section: &[1, 1, 1],
        };
        let f = Float::Float32;
        let e = mrope_apply(
            &x,
            &shape,
            f,
            f,
            &pos,
            &[1, 4],
            rotary,
            Path::PureMlx,
            Model::Cpu,
        )
        .unwrap();
        // Position 0 rotates nothing.
        assert_eq!(&e.value[..8], &x[..8]);
        assert!(e.bound.iter().all(|b| *b < 1e-5), "{:?}", e.bound);
        // Position 1, frequency 0: a rotation by 1 rad.
        let want = x[8] * 1f64.cos() - x[12] * 1f64.sin();
        assert!((e.value[8] - want).abs() < 1e-15);
    }

    #[test]
    fn inv_freq_bound_covers_this_platforms_f32_compute_inv_freq() {
        for theta in [1e7f32, 5e6, 1e5] {
            let t = inv_freq(64, f64::from(theta), Model::Cpu).unwrap();
            let exact = Exact::from_tracked("inv_freq", Model::Cpu, vec![32], &t);
            let got: Vec<f64> = (0..32)
                .map(|j| f64::from(1.0 / theta.powf((2 * j) as f32 / 64.0)))
                .collect();
            assert!(check(&got, &exact).within());
            // The f64 value rounded once is not what a wrong exponent gives.
            let wrong: Vec<f64> = (0..32)
                .map(|j| 1.0 / f64::from(theta).powf(j as f64 / 64.0))
                .collect();
            assert!(!check(&wrong, &exact).within());
        }
    }

    #[test]
    fn rope2d_checks_each_axis_with_its_own_positions() {
        // [B=1, L=3, N=1, H=8], two axes of 4 channels; f32.
        let shape = [1, 3, 1, 8];
        let x = bf16_inputs(24, 11);
        let pos = [0.0, 0.0, 1.0, 0.0, 2.0, 5.0];
        let e = rope2d(
            &x,
            &shape,
            Float::Float32,
            &pos,
            &[1, 3, 2],
            100.0,
            Model::Cpu,
        )
        .unwrap();
        // Row t = 2: axis 0 at position 2, frequency 0 (timescale 1).
        let (c, s) = (2f64.cos(), 2f64.sin());
        assert!((e.value[16] - (x[16] * c - x[18] * s)).abs() < 1e-12);
        // Axis 1 at position 5, frequency 1 (timescale 100^(1/2) = 10).
        let (c, s) = ((0.5f64).cos(), (0.5f64).sin());
        assert!((e.value[21] - (x[21] * c - x[23] * s)).abs() < 1e-12);
        // The axes swapped is outside the bound.
        let swapped = [0.0, 0.0, 0.0, 1.0, 5.0, 2.0];
        let w = rope2d(
            &x,
            &shape,
            Float::Float32,
            &swapped,
            &[1, 3, 2],
            100.0,
            Model::Cpu,
        )
        .unwrap();
        assert!(!check(&w.value, &e).within());
        // Head dim 70 with two axes: two parts of 34, the last 2 dropped.
        let x = bf16_inputs(70, 5);
        let e = rope2d(
            &x,
            &[1, 1, 1, 70],
            Float::Bfloat16,
            &[3.0, 4.0],
            &[1, 1, 2],
            100.0,
            Model::Cpu,
        )
        .unwrap();
        assert_eq!(e.shape, vec![1, 1, 1, 68]);
    }

    #[test]
    fn streams_interleave_as_qwen3_5_lays_them_out() {
        let s = interleaved_streams(&[11, 11, 10], 32).unwrap();
        assert_eq!(&s[..7], &[0, 1, 2, 0, 1, 2, 0]);
        // w stops after 10 sections (j = 29), h after 11 (j = 31).
        assert_eq!(&s[27..], &[0, 1, 2, 0, 1]);
        assert_eq!(s[30], 0);
    }
}
