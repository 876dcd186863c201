//! Gemma vision multidimensional RoPE: the head is split into one partition
//! per position axis and each partition is rotated (`rotate_half` within
//! the partition) by its own axis position.
//!
//! Mirrors `optiq.vlm.gemma4.vision.apply_multidimensional_rope`
//! (mlx-optiq 0.7.7), which is textually identical to
//! `mlx_vlm.models.gemma4.vision.apply_multidimensional_rope` (mlx-vlm
//! 0.7.6).

use mlx_rs::ops::indexing::{Ellipsis, NewAxis, TryIndexOp};
use mlx_rs::ops::{concatenate, cos, expand_dims, sin};
use mlx_rs::{Array, Dtype};

use super::error::PositionError;

/// cos and sin of one head partition, each `[B, L, 1, channels]` in the
/// activation dtype (broadcast over heads).
#[derive(Debug)]
pub struct Rope2dAxis {
    /// `concatenate([cos, cos], -1).astype(dtype)[:, :, None, :]`.
    pub cos: Array,
    /// `concatenate([sin, sin], -1).astype(dtype)[:, :, None, :]`.
    pub sin: Array,
}

/// The tables of one call: one [`Rope2dAxis`] per position axis, or a single
/// one covering the whole head for the 1-D form.
#[derive(Debug)]
pub struct Rope2dTables {
    axes: Vec<Rope2dAxis>,
    head_dim: usize,
    channels_per_axis: usize,
    one_dimensional: bool,
}

impl Rope2dTables {
    /// The per-axis tables, in axis order.
    pub fn axes(&self) -> &[Rope2dAxis] {
        &self.axes
    }

    /// Head dimension the tables were built for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Channels each axis rotates: `2·(head_dim / (2·axes))`, or
    /// `2·(head_dim / 2)` for the 1-D form.
    pub fn channels_per_axis(&self) -> usize {
        self.channels_per_axis
    }

    /// Channels of the output: `axes · channels_per_axis`. Smaller than
    /// `head_dim` when `head_dim` is not a multiple of `2·axes`.
    pub fn output_dim(&self) -> usize {
        self.axes.len() * self.channels_per_axis
    }

    /// Whether these are the 1-D form's tables (positions `[B, L]`).
    pub fn is_one_dimensional(&self) -> bool {
        self.one_dimensional
    }
}

/// Builds the cos/sin tables for `positions` with the reference's op
/// sequence.
///
/// - `positions`: `[B, L, A]` (A axes, Gemma: x then y) or `[B, L]` (1-D
///   form); any real dtype, cast to f32.
/// - `head_dim`: last axis of the inputs these tables will rotate.
/// - `base_frequency`: `rope_theta` of the vision config (default 100.0);
///   becomes an f32 scalar, as a Python float meeting an f32 array.
/// - `dtype`: the inputs' dtype; cos/sin are cast to it.
///
/// Per axis `d`, with `c = 2·(head_dim / (2·A))`: `exponents = (2.0 / c) *
/// arange(0, c/2).astype(f32)`; `timescale = power(base, exponents)`;
/// `angle = positions[..., d:d+1].astype(f32) / timescale` (a division, not a
/// multiply by an inverse frequency); `cos(angle)`, `sin(angle)`, each
/// concatenated with itself, cast to `dtype`, given a head axis at 2. The
/// 1-D form does the same with `c = 2·(head_dim/2)` and
/// `positions[..., None]`.
///
/// # Errors
/// [`PositionError::RopeBase`] for a base that is NaN, not positive, or
/// zero in f32 (an infinite base is accepted, as the reference accepts it:
/// the timescale becomes `[1, inf, …]` and the angles past the first pair
/// 0); [`PositionError::Rank`]; [`PositionError::NoPositionAxes`];
/// [`PositionError::HeadDimTooSmall`] when `head_dim < 2·A` (reference:
/// `ZeroDivisionError`); [`PositionError::OddHeadDim`] for the 1-D form
/// (reference: a broadcast error when applied); [`PositionError::Mlx`].
pub fn rope2d_tables(
    positions: &Array,
    head_dim: usize,
    base_frequency: f64,
    dtype: Dtype,
) -> Result<Rope2dTables, PositionError> {
    super::error::check_rope_base("base_frequency", base_frequency)?;
    let table = |angle_positions: &Array, channels: usize| -> Result<Rope2dAxis, PositionError> {
        let half = (channels / 2) as i32;
        let exponents = Array::from_f32((2.0 / channels as f64) as f32)
            .multiply(Array::arange::<i32, i32>(0, half, None)?.as_dtype(Dtype::Float32)?)?;
        let timescale = Array::from_f32(base_frequency as f32).power(&exponents)?;
        let angle = angle_positions
            .as_dtype(Dtype::Float32)?
            .divide(&timescale)?;
        let (c, s) = (cos(&angle)?, sin(&angle)?);
        let c = concatenate(&[&c, &c], -1)?.as_dtype(dtype)?;
        let s = concatenate(&[&s, &s], -1)?.as_dtype(dtype)?;
        Ok(Rope2dAxis {
            cos: expand_dims(&c, 2)?,
            sin: expand_dims(&s, 2)?,
        })
    };
    match positions.ndim() {
        2 => {
            if head_dim % 2 == 1 {
                return Err(PositionError::OddHeadDim { head_dim });
            }
            let channels = 2 * (head_dim / 2);
            let axis = table(&positions.try_index((Ellipsis, NewAxis))?, channels)?;
            Ok(Rope2dTables {
                axes: vec![axis],
                head_dim,
                channels_per_axis: channels,
                one_dimensional: true,
            })
        }
        3 => {
            let axes = positions.shape()[2] as usize;
            if axes == 0 {
                return Err(PositionError::NoPositionAxes);
            }
            let channels = 2 * (head_dim / (2 * axes));
            if channels == 0 {
                return Err(PositionError::HeadDimTooSmall { head_dim, axes });
            }
            let tables = (0..axes as i32)
                .map(|d| table(&positions.try_index((Ellipsis, d..d + 1))?, channels))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Rope2dTables {
                axes: tables,
                head_dim,
                channels_per_axis: channels,
                one_dimensional: false,
            })
        }
        _ => Err(PositionError::Rank {
            tensor: "positions",
            expected: "[B, L, axes] or [B, L]",
            shape: positions.shape().to_vec(),
        }),
    }
}

/// Rotates `inputs` `[B, L, N, H]` with prebuilt tables.
///
/// Multi-axis form: for each axis `d`, `x = inputs[..., d·c:(d+1)·c]`, `y =
/// x * cos_d + rotate_half(x) * sin_d`; the parts are concatenated. Output
/// `[B, L, N, A·c]` in the promoted dtype of inputs and tables (the inputs'
/// dtype when the tables were built for it).
///
/// Other ranks are rotated as the reference's broadcasting rotates them:
/// the tables are `[B', L', 1, c]`, and `inputs` of any rank of at least 1
/// whose leading axes broadcast against `[B', L', 1]` give the broadcast
/// shape (e.g. `[4, 2, 16]` with tables of batch 1 gives `[1, 4, 2, 16]`). 1-D form: `inputs * cos +
/// rotate_half(inputs) * sin` on the whole head. The expression is issued
/// in an equivalent, bit-identical form with fewer memory passes (see
/// `rotate_halves`).
///
/// Finding: when `H` is not a multiple of `2·A` the reference silently
/// **drops** the trailing `H − A·c` channels (head_dim 70 with 2 axes gives
/// 68 channels out); this port mirrors that. The origin (`rope-2d.ts`) rejects
/// such head dims instead.
///
/// # Errors
/// [`PositionError::Rank`] for a 0-D `inputs`;
/// [`PositionError::TablesHeadDim`] if `inputs`' head dimension
/// is not the one the tables were built for;
/// [`PositionError::PositionIdsShape`] when `inputs`' leading axes do not
/// broadcast against the tables' `[B', L', 1]` (the reference raises
/// `[broadcast_shapes]`); [`PositionError::Mlx`].
pub fn apply_rope2d(inputs: &Array, tables: &Rope2dTables) -> Result<Array, PositionError> {
    let shape = inputs.shape();
    let Some((&last, leading)) = shape.split_last() else {
        return Err(PositionError::Rank {
            tensor: "inputs",
            expected: "[B, L, N, H]",
            shape: shape.to_vec(),
        });
    };
    let head_dim = last as usize;
    if head_dim != tables.head_dim {
        return Err(PositionError::TablesHeadDim {
            tables: tables.head_dim,
            inputs: head_dim,
        });
    }
    let table_shape = tables.axes[0].cos.shape();
    let table_leading = &table_shape[..table_shape.len() - 1];
    if crate::shape::broadcast(leading, table_leading).is_none() {
        return Err(PositionError::PositionIdsShape {
            got: table_leading[..2].to_vec(),
            tensor: "inputs",
            tensor_shape: shape.to_vec(),
            expected: "positions whose [B, L] broadcast against the inputs' axes -4 and -3",
        });
    }
    if tables.one_dimensional {
        return Ok(concatenate(&rotate_halves(inputs, &tables.axes[0])?, -1)?);
    }
    let c = tables.channels_per_axis as i32;
    let mut parts = Vec::with_capacity(2 * tables.axes.len());
    for (axis, d) in tables.axes.iter().zip(0i32..) {
        parts.extend(rotate_halves(
            &inputs.try_index((Ellipsis, d * c..(d + 1) * c))?,
            axis,
        )?);
    }
    Ok(concatenate(&parts, -1)?)
}

/// `x * cos + rotate_half(x) * sin` for one partition, as its two halves
/// `[x1·c − x2·s, x2·c + x1·s]` (`x1`, `x2` the halves of `x`; `c`, `s` the
/// first halves of the tables).
///
/// Bit-identical to the reference's expression, with fewer passes over
/// memory (no materialised `rotate_half`, no per-partition concatenate):
/// the tables are `concatenate([t, t])`, so both halves hold the same bits;
/// every element still sees one rounded product per term and one rounded
/// sum, and `(−x2)·s = −(x2·s)` and `a + (−b) = a − b` hold exactly in
/// IEEE arithmetic (signed zeros included).
fn rotate_halves(x: &Array, axis: &Rope2dAxis) -> Result<[Array; 2], PositionError> {
    let n = x.shape()[x.ndim() - 1];
    let h = n / 2;
    let cos = axis.cos.try_index((Ellipsis, ..h))?;
    let sin = axis.sin.try_index((Ellipsis, ..h))?;
    let x1 = x.try_index((Ellipsis, ..h))?;
    let x2 = x.try_index((Ellipsis, h..n))?;
    Ok([
        x1.multiply(&cos)?.subtract(x2.multiply(&sin)?)?,
        x2.multiply(&cos)?.add(x1.multiply(&sin)?)?,
    ])
}

/// Gemma vision RoPE in one call: [`rope2d_tables`] for `inputs`' head
/// dimension and dtype, then [`apply_rope2d`].
///
/// Mirrors `apply_multidimensional_rope(inputs, positions, base_frequency)`
/// (mlx-optiq 0.7.7 `optiq/vlm/gemma4/vision.py`) dtype for dtype: the
/// tables op for op, the rotation bit-identically (see [`apply_rope2d`]).
///
/// - `inputs`: `[B, L, N, H]` (heads on axis 2, before the transpose for
///   SDPA), any float dtype. Other ranks broadcast as in the reference
///   (see [`apply_rope2d`]).
/// - `positions`: `[B, L, A]` or `[B, L]` (1-D form), `B` and `L`
///   broadcasting against `inputs`' (equal, or one of them 1). Padding
///   patches (position −1) are rotated like any other, as in the reference.
///
/// Returns `[B, L, N, A·c]` with `c = 2·(H / (2·A))` (`[B, L, N, H]` for the
/// 1-D form), in `inputs`' dtype.
///
/// # Errors
/// Those of [`rope2d_tables`] and [`apply_rope2d`] (a 0-D `inputs` is
/// [`PositionError::Rank`]).
pub fn apply_multidimensional_rope(
    inputs: &Array,
    positions: &Array,
    base_frequency: f64,
) -> Result<Array, PositionError> {
    let Some(&head_dim) = inputs.shape().last() else {
        return Err(PositionError::Rank {
            tensor: "inputs",
            expected: "[B, L, N, H]",
            shape: inputs.shape().to_vec(),
        });
    };
    let tables = rope2d_tables(positions, head_dim as usize, base_frequency, inputs.dtype())?;
    apply_rope2d(inputs, &tables)
}
