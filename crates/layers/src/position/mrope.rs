//! Qwen3.5 interleaved multimodal RoPE (mRoPE): frequency→axis selector,
//! `inv_freq`, cos/sin tables and the q/k apply on both reference paths.
//!
//! Mirrors `mlx_vlm.models.rope_utils` (mlx-vlm 0.7.6): style
//! `"interleaved"`, half-split pairing, as constructed by
//! `mlx_vlm.models.qwen3_5.language.Qwen3_5RotaryEmbedding`.

use std::cell::RefCell;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{take_axis, Ellipsis, TryIndexOp};
use mlx_rs::ops::{concatenate, expand_dims, transpose_axes};
use mlx_rs::transforms::compile::compile;
use mlx_rs::{Array, Dtype};

use super::error::PositionError;
pub use super::metal_kernel::{metal_is_available, Pairing};
use super::metal_kernel::{mrope_kernel_launch, mrope_kernel_spec, run_mrope_kernel};

/// Which implementation of the mRoPE apply runs.
///
/// The reference decides once per process: `rope_utils._HAS_METAL =
/// mx.metal.is_available()` (evaluated at import), and
/// `MRoPERotaryEmbedding.fused_apply = position_selector is not None and
/// _HAS_METAL` (mlx-vlm 0.7.6). The two paths do not round alike: the
/// kernel computes in f32 and rounds once to the activation dtype (and
/// ignores `attention_scaling`); the pure-MLX path casts cos/sin to the
/// activation dtype first and rotates in that dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MropePath {
    /// The fused Metal kernel of `_mrope_apply_kernel` (Metal builds).
    MetalKernel,
    /// `MRoPERotaryEmbedding.__call__` + `_apply_interleaved_rotary_pos_emb_axis1`
    /// (every other build: CPU, CUDA).
    PureMlx,
}

impl MropePath {
    /// The path `MRoPERotaryEmbedding.apply_rotary` takes in this process.
    ///
    /// Mirrors `_HAS_METAL`: it depends on whether this libmlx has Metal,
    /// not on the default device. On a Metal build whose default device
    /// has been set to the CPU, `MRoPERotaryEmbedding.apply_rotary` still
    /// launches the kernel (and MLX rejects the launch on a CPU stream);
    /// [`Mrope::apply`] does the same. To run the pure-MLX arithmetic on
    /// the CPU of a Metal build, call [`Mrope::apply_with_path`] with
    /// [`MropePath::PureMlx`] — the reference's equivalent is
    /// `fused_apply = False`.
    ///
    /// The conformance suite's CPU rows do exactly that on every build: on
    /// macOS (a Metal build) `--device cpu` tests the **pure-MLX** path,
    /// port and reference alike (the glue sets `fused_apply = False`), as
    /// on Linux; the kernel path is tested only by `--device gpu` rows on
    /// Metal. CUDA builds have no Metal, so both devices take the pure-MLX
    /// path there.
    ///
    /// # Errors
    /// [`PositionError::MetalKernel`] if mlx-c cannot answer.
    pub fn current() -> Result<Self, PositionError> {
        Ok(if metal_is_available()? {
            MropePath::MetalKernel
        } else {
            MropePath::PureMlx
        })
    }

    /// A short name for reports: `"metal-kernel"` or `"pure-mlx"`.
    pub fn as_str(self) -> &'static str {
        match self {
            MropePath::MetalKernel => "metal-kernel",
            MropePath::PureMlx => "pure-mlx",
        }
    }
}

/// Configuration of one mRoPE: the fields `MRoPERotaryEmbedding.__init__`
/// reads (mlx-vlm 0.7.6).
#[derive(Debug, Clone, PartialEq)]
pub struct MropeConfig {
    /// Rotated channels per head (`dim` in the reference):
    /// `int(head_dim * partial_rotary_factor)` for Qwen3.5. Channels past it
    /// pass through unchanged.
    pub rotary_dim: usize,
    /// `rope_theta`, the frequency base (`base` in the reference).
    pub rope_theta: f64,
    /// `mrope_section`: frequencies per axis (t, h, w). Only entries 1 and 2
    /// are read by the interleaved selector; axis 0 takes every remaining
    /// frequency.
    pub mrope_section: Vec<usize>,
    /// Multiplier on cos and sin (`attention_scaling`; 1.0 for Qwen3.5).
    /// The pure-MLX path multiplies by it even when it is 1.0; the Metal
    /// kernel ignores it, as the reference's does.
    pub attention_scaling: f32,
}

impl MropeConfig {
    /// The Qwen3.5 attention's rotary: `Qwen3_5RotaryEmbedding(int(head_dim *
    /// partial_rotary_factor), base=rope_theta, mrope_section=...)` from
    /// `rope_parameters` (mlx-vlm 0.7.6 `qwen3_5/language.py`), with
    /// `attention_scaling = 1.0`.
    ///
    /// The product is truncated toward zero like Python's `int()`.
    pub fn qwen3_5(
        head_dim: usize,
        partial_rotary_factor: f64,
        rope_theta: f64,
        mrope_section: Vec<usize>,
    ) -> Self {
        // `as usize` truncates toward zero and saturates, like `int()` on
        // the values a config can hold.
        let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
        MropeConfig {
            rotary_dim,
            rope_theta,
            mrope_section,
            attention_scaling: 1.0,
        }
    }

    /// Number of rotary frequencies, `ceil(rotary_dim / 2)`: the length of
    /// `compute_inv_freq`'s `arange(0, rotary_dim, 2)`.
    pub fn freq_count(&self) -> usize {
        self.rotary_dim.div_ceil(2)
    }

    /// Channels the pure-MLX path rotates: the width of cos and sin,
    /// `2 * freq_count()` (`rotary_dim + 1` for an odd `rotary_dim`, as the
    /// reference rotates `cos.shape[-1]` channels).
    pub fn rotated_channels(&self) -> usize {
        2 * self.freq_count()
    }

    /// Checks the config.
    ///
    /// # Errors
    /// - [`PositionError::RopeBase`] for a `rope_theta` that is NaN, not
    ///   positive, or zero in f32 (the reference computes NaN there). An
    ///   infinite one is accepted, as the reference accepts it.
    /// - [`PositionError::MropeSectionTooShort`] (the reference raises
    ///   `IndexError`).
    ///
    /// An odd `rotary_dim` is accepted: the pure-MLX path rotates
    /// [`MropeConfig::rotated_channels`], as the reference does; the Metal
    /// kernel path refuses it at apply ([`PositionError::OddRotaryDim`]).
    ///
    /// Sections of any sum are accepted, as the reference accepts them: a
    /// smaller sum leaves the rest to axis 0 (the class default `[11, 11,
    /// 0]` relies on it) and a larger one is clipped by the selector
    /// ([`interleaved_position_selector`]: `min(3·section[i], F)`). The port
    /// once refused a larger sum (`MropeSectionExceedsFrequencies`); the
    /// shape explorer found the reference computing there (an upstream test
    /// builds `dim=64` with `[24, 20, 20]`), and a port that refuses what
    /// the reference computes does not conform.
    pub fn validate(&self) -> Result<(), PositionError> {
        super::error::check_rope_base("rope_theta", self.rope_theta)?;
        if self.mrope_section.len() < 3 {
            return Err(PositionError::MropeSectionTooShort {
                section: self.mrope_section.clone(),
            });
        }
        Ok(())
    }
}

/// Which position axis (0 = t, 1 = h, 2 = w) feeds each of `freq_dim`
/// frequencies.
///
/// Mirrors `rope_utils._interleaved_position_selector(mrope_section,
/// freq_dim)` (mlx-vlm 0.7.6) exactly: start from all zeros; axis 1 takes
/// indices `1, 4, 7, …` below `min(3·mrope_section[1], freq_dim)`; axis 2
/// takes `2, 5, 8, …` below `min(3·mrope_section[2], freq_dim)`.
/// `mrope_section[0]` is never read and entries past 2 are ignored; a
/// section larger than `freq_dim` allows is clipped, not rejected.
///
/// Finding: the origin (`qwen-mrope.ts` `interleavedSelector`) applies the
/// same rule with `mrope_section` hard-coded to `[11, 11, 10]`.
///
/// # Errors
/// [`PositionError::MropeSectionTooShort`] when `mrope_section` has fewer
/// than 3 entries (the reference raises `IndexError`).
pub fn interleaved_position_selector(
    mrope_section: &[usize],
    freq_dim: usize,
) -> Result<Vec<i32>, PositionError> {
    if mrope_section.len() < 3 {
        return Err(PositionError::MropeSectionTooShort {
            section: mrope_section.to_vec(),
        });
    }
    let mut selector = vec![0i32; freq_dim];
    for (axis, offset) in [(1usize, 1usize), (2, 2)] {
        let end = mrope_section[axis].saturating_mul(3).min(freq_dim);
        for idx in (offset..end).step_by(3) {
            selector[idx] = axis as i32;
        }
    }
    Ok(selector)
}

/// `inv_freq` on the device, with the reference's op sequence and dtypes.
///
/// Mirrors `rope_utils.compute_inv_freq(dim, base)` (mlx-vlm 0.7.6):
/// `1.0 / (base ** (mx.arange(0, dim, 2).astype(mx.float32) / dim))`, i.e.
/// int32 `arange` → cast to f32 → divide by f32(`dim`) → `power(f32(base),
/// ·)` → `divide(f32(1.0), ·)`. Returns shape `[ceil(dim/2)]`, f32, lazy.
///
/// Finding: the origin (`mropeInvFreq`) multiplies by the f32 reciprocal
/// `1/dim` instead of dividing by `dim`; the two differ in the last bit for
/// some entries when `dim` is not a power of two.
///
/// # Errors
/// [`PositionError::RopeBase`] for a base that is NaN, not positive, or
/// zero in f32 (an infinite base gives `[1, 0, 0, …]`, as in the
/// reference); [`PositionError::Mlx`] if MLX rejects an op (e.g. `dim`
/// beyond `i32`).
pub fn compute_inv_freq(dim: usize, base: f64) -> Result<Array, PositionError> {
    super::error::check_rope_base("rope_theta", base)?;
    let stop = i32::try_from(dim).map_err(|_| {
        PositionError::Mlx(mlx_rs::error::Exception::custom(format!(
            "rotary dim {dim} does not fit in int32"
        )))
    })?;
    let exponents = Array::arange::<i32, i32>(0, stop, 2)?
        .as_dtype(Dtype::Float32)?
        .divide(Array::from_f32(dim as f32))?;
    // A Python scalar meeting an f32 array becomes an f32 scalar array.
    let denominators = Array::from_f32(base as f32).power(&exponents)?;
    Ok(Array::from_f32(1.0).divide(&denominators)?)
}

/// Host emulation of `inv_freq` in f32, for measurement (feature
/// `test-support`): `1.0 / base.powf(i / dim)` with `i = 0, 2, 4, …` and
/// every operation in f32 (`i / dim` is a correctly rounded f32 division, as
/// on the device). Differs from [`compute_inv_freq`] wherever the platform's
/// `powf` and MLX's `power` round differently.
#[cfg(feature = "test-support")]
pub fn inv_freq_host_f32(dim: usize, base: f32) -> Vec<f32> {
    (0..dim)
        .step_by(2)
        .map(|i| 1.0f32 / base.powf(i as f32 / dim as f32))
        .collect()
}

/// Host emulation of `inv_freq` in f64, rounded once to f32 at the end, for
/// measurement (feature `test-support`): `(1.0 / base.powf(i / dim)) as f32`
/// with `i = 0, 2, 4, …` and every intermediate in f64. An estimate of the
/// correctly rounded value, for measuring how far the device's f32 sequence
/// is from it.
#[cfg(feature = "test-support")]
pub fn inv_freq_host_f64(dim: usize, base: f64) -> Vec<f32> {
    (0..dim)
        .step_by(2)
        .map(|i| (1.0f64 / base.powf(i as f64 / dim as f64)) as f32)
        .collect()
}

/// One mRoPE, ready to apply: config, `inv_freq` and selector built once,
/// like `MRoPERotaryEmbedding` (mlx-vlm 0.7.6) with style `"interleaved"`.
#[derive(Debug)]
pub struct Mrope {
    config: MropeConfig,
    inv_freq: Array,
    selector: Vec<i32>,
    selector_array: Array,
}

impl Mrope {
    /// Builds the rotary: validates `config`, computes `inv_freq` with
    /// [`compute_inv_freq`] and the selector with
    /// [`interleaved_position_selector`], and evaluates both (the reference's
    /// `eval_cached_arrays`).
    ///
    /// # Errors
    /// Those of [`MropeConfig::validate`], and [`PositionError::Mlx`].
    pub fn new(config: MropeConfig) -> Result<Self, PositionError> {
        config.validate()?;
        let inv_freq = compute_inv_freq(config.rotary_dim, config.rope_theta)?;
        let selector = interleaved_position_selector(&config.mrope_section, config.freq_count())?;
        let selector_array = Array::from_slice(&selector, &[selector.len() as i32]);
        mlx_rs::transforms::eval([&inv_freq, &selector_array])?;
        Ok(Mrope {
            config,
            inv_freq,
            selector,
            selector_array,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MropeConfig {
        &self.config
    }

    /// `inv_freq`, shape `[ceil(rotary_dim / 2)]`, f32.
    pub fn inv_freq(&self) -> &Array {
        &self.inv_freq
    }

    /// The frequency→axis selector, length `ceil(rotary_dim / 2)`.
    pub fn position_selector(&self) -> &[i32] {
        &self.selector
    }

    /// Rotation angles `[B, L, ceil(rotary_dim / 2)]`, f32.
    ///
    /// Mirrors `rope_utils.compute_mrope_frequencies` (mlx-vlm 0.7.6) for
    /// the interleaved style with the cached selector:
    /// - `position_ids` `[B, L]`: `position_ids.astype(f32)[..., None] *
    ///   inv_freq` (every axis at the same position);
    /// - `position_ids` `[3, B, L]`: `_selected_mrope_freqs`:
    ///   `take(position_ids, selector, axis=0).transpose(1, 2, 0)`, cast to
    ///   f32, times `inv_freq` (streams past the third are never selected).
    ///
    /// # Errors
    /// [`PositionError::Rank`] for other ranks; [`PositionError::PositionIdsShape`]
    /// for a 3-D `position_ids` with fewer than 3 streams (the reference's
    /// `take` would read past them); [`PositionError::Mlx`].
    pub fn frequencies(&self, position_ids: &Array) -> Result<Array, PositionError> {
        match position_ids.ndim() {
            2 => Ok(expand_dims(position_ids.as_dtype(Dtype::Float32)?, -1)?
                .multiply(&self.inv_freq)?),
            3 if position_ids.shape()[0] >= 3 => {
                let selected = take_axis(position_ids, &self.selector_array, 0)?;
                Ok(transpose_axes(&selected, &[1, 2, 0])?
                    .as_dtype(Dtype::Float32)?
                    .multiply(&self.inv_freq)?)
            }
            3 => Err(PositionError::PositionIdsShape {
                got: position_ids.shape().to_vec(),
                tensor: "the selector's streams",
                tensor_shape: vec![3],
                expected: "[3, B, L]: t, h and w streams",
            }),
            _ => Err(PositionError::Rank {
                tensor: "position_ids",
                expected: "[B, L] or [3, B, L]",
                shape: position_ids.shape().to_vec(),
            }),
        }
    }

    /// cos and sin tables, each `[B, L, rotated_channels]` in `dtype`.
    ///
    /// Mirrors `MRoPERotaryEmbedding.__call__(x, position_ids)` with
    /// `cast_output=True` (mlx-vlm 0.7.6), `dtype` being `x.dtype`:
    /// `emb = concatenate([freqs, freqs], -1)`, `cos = cos(emb) *
    /// attention_scaling`, `sin = sin(emb) * attention_scaling` (in f32),
    /// then both cast to `dtype`.
    ///
    /// # Errors
    /// Those of [`Mrope::frequencies`].
    pub fn cos_sin(
        &self,
        dtype: Dtype,
        position_ids: &Array,
    ) -> Result<(Array, Array), PositionError> {
        let freqs = self.frequencies(position_ids)?;
        let emb = concatenate(&[&freqs, &freqs], -1)?;
        let scaling = Array::from_f32(self.config.attention_scaling);
        let cos = emb.cos()?.multiply(&scaling)?;
        let sin = emb.sin()?.multiply(&scaling)?;
        Ok((cos.as_dtype(dtype)?, sin.as_dtype(dtype)?))
    }

    /// Rotates q and k on the path the reference takes here for these
    /// inputs ([`Mrope::path_for`]).
    ///
    /// Mirrors `MRoPERotaryEmbedding.apply_rotary(q, k, position_ids,
    /// unsqueeze_dim=1)` (mlx-vlm 0.7.6). See [`Mrope::apply_with_path`] for
    /// shapes, dtypes and errors.
    pub fn apply(
        &self,
        q: &Array,
        k: &Array,
        position_ids: &Array,
    ) -> Result<(Array, Array), PositionError> {
        self.apply_with_path(Self::path_for(q, k, position_ids)?, q, k, position_ids)
    }

    /// The path `apply_rotary` takes for these inputs: the fused kernel
    /// when this libmlx has Metal ([`MropePath::current`]) and q and k are
    /// 4-D and `position_ids` 2-D or 3-D; the pure-MLX path otherwise, as
    /// the reference falls back (mlx-vlm 0.7.6 `apply_rotary`'s condition).
    ///
    /// # Errors
    /// Those of [`MropePath::current`].
    pub fn path_for(
        q: &Array,
        k: &Array,
        position_ids: &Array,
    ) -> Result<MropePath, PositionError> {
        let kernel_shapes = q.ndim() == 4 && k.ndim() == 4 && matches!(position_ids.ndim(), 2 | 3);
        Ok(match MropePath::current()? {
            MropePath::MetalKernel if kernel_shapes => MropePath::MetalKernel,
            _ => MropePath::PureMlx,
        })
    }

    /// Rotates q and k on the given path.
    ///
    /// - `q`: `[B, Hq, L, Dq]`, `k`: `[B, Hk, L, Dk]`; any float dtypes.
    ///   Head counts and head dims may differ. The first
    ///   [`MropeConfig::rotated_channels`] channels rotate, the rest pass
    ///   through bit-exact.
    /// - `position_ids`: integer `[B', L']` (text: one position for all
    ///   axes) or `[S, B', L']` with `S >= 3` streams (t, h, w; further
    ///   streams are never selected).
    ///
    /// On the pure-MLX path each of q and k is checked against the
    /// positions as the reference's broadcasting checks it: it may have
    /// more than 4 axes (the last four are `B, H, L, D`), and `B'`, `L'`
    /// are its `B`, `L` or 1 (one position broadcast to every row or
    /// token). On the kernel path both are 4-D and `B' = B`, `L' = L`:
    /// the reference's kernel indexes `position_ids` with each tensor's own
    /// batch and length and would read past smaller ones (a reference
    /// hazard this port refuses).
    ///
    /// Returns `(q_embed, k_embed)` with the shapes and dtypes of q and k.
    ///
    /// [`MropePath::PureMlx`] mirrors `cos, sin = self(k, position_ids)` then
    /// `_apply_interleaved_rotary_pos_emb_axis1(q, k, cos, sin)`: cos/sin in
    /// k's dtype get a head axis; `x_rot * cos + rotate_half(x_rot) * sin` in
    /// the promoted dtype, cast to x's dtype, concatenated with the pass-
    /// through channels. The reference wraps that function in `mx.compile`;
    /// its fused CPU kernel keeps each intermediate in its dtype, so the
    /// eager sequence issues the same arithmetic (here split into the two
    /// halves of the rotation, bit-identically, to save memory passes).
    ///
    /// [`MropePath::MetalKernel`] mirrors `_compiled_mrope_apply(rotary_dim,
    /// position_ids.ndim, "half_split")`: the kernel of
    /// [`mrope_kernel_spec`](super::mrope_kernel_spec) launched on q, then
    /// on k, as [`mrope_kernel_launch`](super::mrope_kernel_launch)
    /// describes.
    ///
    /// # Errors
    /// - [`PositionError::Rank`] if q or k has fewer than 4 axes (exactly 4
    ///   on the kernel path) or `position_ids` is neither 2-D nor 3-D;
    /// - [`PositionError::RotaryDimExceedsHeadDim`] when the rotated
    ///   channels exceed a head dim;
    /// - [`PositionError::PositionIdsShape`] if `position_ids` do not fit q
    ///   or k, as above, or hold fewer than 3 streams;
    /// - [`PositionError::OddRotaryDim`] on the kernel path;
    /// - [`PositionError::MetalUnavailable`] for the Metal path without
    ///   Metal; [`PositionError::GridOverflow`]; [`PositionError::Mlx`].
    pub fn apply_with_path(
        &self,
        path: MropePath,
        q: &Array,
        k: &Array,
        position_ids: &Array,
    ) -> Result<(Array, Array), PositionError> {
        if path == MropePath::MetalKernel && self.config.rotary_dim % 2 == 1 {
            return Err(PositionError::OddRotaryDim {
                rotary_dim: self.config.rotary_dim,
            });
        }
        let rotated = self.config.rotated_channels();
        for (name, x) in [("q", q), ("k", k)] {
            check_against_positions(name, x, position_ids, rotated, path)?;
        }
        match path {
            MropePath::PureMlx => {
                let (cos, sin) = self.cos_sin(k.dtype(), position_ids)?;
                apply_interleaved_axis1(q, k, &cos, &sin)
            }
            MropePath::MetalKernel => {
                if !metal_is_available()? {
                    return Err(PositionError::MetalUnavailable);
                }
                let spec = mrope_kernel_spec(
                    self.config.rotary_dim,
                    position_ids.ndim(),
                    Pairing::HalfSplit,
                );
                let half = self.inv_freq.shape()[0] as usize;
                let inputs = |x: &Array| -> [Array; 4] {
                    [
                        x.clone(),
                        position_ids.clone(),
                        self.inv_freq.clone(),
                        self.selector_array.clone(),
                    ]
                };
                let launch_q = mrope_kernel_launch(q.shape(), q.dtype(), half)?;
                let launch_k = mrope_kernel_launch(k.shape(), k.dtype(), half)?;
                let q_out = run_mrope_kernel(&spec, &launch_q, &inputs(q))?;
                let k_out = run_mrope_kernel(&spec, &launch_k, &inputs(k))?;
                Ok((q_out, k_out))
            }
        }
    }
}

/// Rotates q and k with a one-off [`Mrope`] built from `config`, on the path
/// the reference takes here. See [`Mrope::apply_with_path`].
///
/// Mirrors `MRoPERotaryEmbedding(config...).apply_rotary(q, k,
/// position_ids)` (mlx-vlm 0.7.6).
///
/// # Errors
/// Those of [`Mrope::new`] and [`Mrope::apply_with_path`].
pub fn apply_mrope(
    q: &Array,
    k: &Array,
    position_ids: &Array,
    config: &MropeConfig,
) -> Result<(Array, Array), PositionError> {
    Mrope::new(config.clone())?.apply(q, k, position_ids)
}

/// Checks q or k against `position_ids` and the rotated channels, as the
/// reference's apply would fail on them (see [`Mrope::apply_with_path`]):
/// cos and sin are `[B', 1, L', rotated]` and must broadcast against `x`'s
/// rotated part without changing its leading axes, or the final
/// `concatenate` with the pass-through channels fails.
fn check_against_positions(
    name: &'static str,
    x: &Array,
    position_ids: &Array,
    rotated: usize,
    path: MropePath,
) -> Result<(), PositionError> {
    let kernel = path == MropePath::MetalKernel;
    let shape = x.shape();
    if shape.len() < 4 || (kernel && shape.len() != 4) {
        return Err(PositionError::Rank {
            tensor: name,
            expected: if kernel {
                "[B, H, L, D]"
            } else {
                "[..., B, H, L, D]"
            },
            shape: shape.to_vec(),
        });
    }
    let rank = shape.len();
    let head_dim = shape[rank - 1] as usize;
    if rotated > head_dim {
        return Err(PositionError::RotaryDimExceedsHeadDim {
            rotary_dim: rotated,
            head_dim,
        });
    }
    let (batch, len) = (shape[rank - 4], shape[rank - 2]);
    let fits = |p: i32, x: i32| p == x || (p == 1 && !kernel);
    let fit = match *position_ids.shape() {
        [b, l] => fits(b, batch) && fits(l, len),
        [streams, b, l] => streams >= 3 && fits(b, batch) && fits(l, len),
        _ => {
            return Err(PositionError::Rank {
                tensor: "position_ids",
                expected: "[B, L] or [3, B, L]",
                shape: position_ids.shape().to_vec(),
            })
        }
    };
    if fit {
        return Ok(());
    }
    Err(PositionError::PositionIdsShape {
        got: position_ids.shape().to_vec(),
        tensor: name,
        tensor_shape: shape.to_vec(),
        expected: if kernel {
            "[B, L] or [3, B, L]"
        } else {
            "[B or 1, L or 1] or [3, B or 1, L or 1], B and L being the tensor's axes -4 and -2"
        },
    })
}

/// `rope_utils._apply_interleaved_rotary_pos_emb_axis1` (mlx-vlm 0.7.6):
/// `embed = (x_rot * cos + rotate_half(x_rot) * sin).astype(x.dtype)`,
/// then `concatenate([embed, x_pass], -1)`, for q and for k.
///
/// The reference decorates that function with `@mx.compile`, so MLX traces
/// it once and fuses its elementwise ops into one kernel. This port issues
/// the **same op graph, compiled the same way** (`mlx_rs` `compile`, not
/// shapeless), so MLX generates the same fused kernels. That matters on
/// CUDA: there a fused kernel rounds differently from the same ops run one
/// by one (measured on an H200: the unfused form differed from the
/// reference in every dtype, while on CPU both forms agree bit for bit).
/// The graph mirrors the reference op for op and in its order: expand_dims
/// of cos and sin, the slices, `rotate_half` as `concatenate([-x2, x1])`,
/// multiply, add, the cast, and the final concatenate (also when `x_pass`
/// is empty).
fn apply_interleaved_axis1(
    q: &Array,
    k: &Array,
    cos: &Array,
    sin: &Array,
) -> Result<(Array, Array), PositionError> {
    let graph = |inputs: &[Array]| -> Result<Vec<Array>, Exception> {
        let (q, k) = (&inputs[0], &inputs[1]);
        let cos = expand_dims(&inputs[2], 1)?;
        let sin = expand_dims(&inputs[3], 1)?;
        let rotary_dim = cos.shape()[cos.ndim() - 1];
        let rotate_half = |x: &Array| -> Result<Array, Exception> {
            let half = x.shape()[x.ndim() - 1] / 2;
            let x1 = x.try_index((Ellipsis, ..half))?;
            let x2 = x.try_index((Ellipsis, half..))?;
            concatenate(&[&x2.negative()?, &x1], -1)
        };
        let q_rot = q.try_index((Ellipsis, ..rotary_dim))?;
        let q_pass = q.try_index((Ellipsis, rotary_dim..))?;
        let k_rot = k.try_index((Ellipsis, ..rotary_dim))?;
        let k_pass = k.try_index((Ellipsis, rotary_dim..))?;
        let q_embed = q_rot
            .multiply(&cos)?
            .add(rotate_half(&q_rot)?.multiply(&sin)?)?;
        let k_embed = k_rot
            .multiply(&cos)?
            .add(rotate_half(&k_rot)?.multiply(&sin)?)?;
        let q_embed = q_embed.as_dtype(q.dtype())?;
        let k_embed = k_embed.as_dtype(k.dtype())?;
        Ok(vec![
            concatenate(&[&q_embed, &q_pass], -1)?,
            concatenate(&[&k_embed, &k_pass], -1)?,
        ])
    };
    // One compiled function per thread, traced once per input shapes and
    // dtypes as the reference's module-level `@mx.compile` is (mlx-rs
    // compiled functions are not `Send`).
    type CompiledApply = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception>>;
    thread_local! {
        static COMPILED: RefCell<Option<CompiledApply>> = const { RefCell::new(None) };
    }
    let inputs = [q.clone(), k.clone(), cos.clone(), sin.clone()];
    let mut out = COMPILED.with(|slot| {
        let mut slot = slot.borrow_mut();
        let apply = slot.get_or_insert_with(|| Box::new(compile(graph, None)));
        apply(&inputs)
    })?;
    let k_out = out.pop().expect("the graph returns q and k");
    let q_out = out.pop().expect("the graph returns q and k");
    Ok((q_out, k_out))
}
