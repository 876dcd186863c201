//! The one error type of the position module.

use std::fmt;

use mlx_rs::error::Exception;

use super::grid::GridThw;

/// Which kind of vision span a rope-index error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VisionKind {
    /// An image span (`image_token_id`, `image_grid_thw`).
    Image,
    /// A video frame span (`video_token_id`, one row of the expanded
    /// `video_grid_thw`).
    Video,
}

impl fmt::Display for VisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VisionKind::Image => "image",
            VisionKind::Video => "video",
        })
    }
}

/// Everything that can go wrong computing or applying positions.
///
/// Variants note whether the pinned reference fails the same way
/// ("reference: raises …") or accepts the input silently ("stricter than
/// the reference": an open conformance gap, listed with the rest in
/// `crates/layers/REFUSALS.md`), so a conformance case knows which side to
/// expect.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PositionError {
    /// A position window longer than [`super::MAX_WINDOW`] tokens (an
    /// MLX array axis is int32), refused before its streams are allocated.
    /// Reference: `mx.arange(L)` fails there too.
    #[error("a position window of {len} tokens is longer than the maximum {max} (an MLX array axis is int32); ask for shorter windows")]
    WindowTooLong {
        /// The length asked for.
        len: usize,
        /// [`super::MAX_WINDOW`].
        max: usize,
    },
    /// The host could not allocate the three position streams of a window
    /// of `len` tokens.
    #[error(
        "could not allocate the position streams of a {len}-token window; ask for shorter windows"
    )]
    WindowAllocation {
        /// The length asked for.
        len: usize,
    },
    /// A RoPE frequency base (`rope_theta`, Gemma's `base_frequency`) that
    /// is NaN, zero, negative, or so small that it is zero in f32 (the
    /// reference computes in f32). The reference computes NaN frequencies
    /// there (reference undefined). An infinite base, or one beyond f32, is
    /// accepted as the reference accepts it: it becomes f32 infinity and the
    /// frequencies degenerate to `[1, 0, 0, …]`.
    #[error("{what} {value} is not a positive f32 number: RoPE frequencies would be NaN; use the model config's value (e.g. 10000.0)")]
    RopeBase {
        /// `rope_theta` or `base_frequency`.
        what: &'static str,
        /// The value given.
        value: f64,
    },
    /// `rotary_dim` is odd, on the fused Metal kernel path. The reference's
    /// kernel (`_mrope_apply_kernel`) then rotates `rotary_dim - 1`
    /// channels and never writes channel `rotary_dim - 1` of its output
    /// (uninitialised memory: reference undefined). The pure-MLX path
    /// accepts an odd `rotary_dim` as the reference's does: it rotates
    /// `rotary_dim + 1` channels (`ceil(rotary_dim / 2)` frequencies).
    #[error("rotary_dim {rotary_dim} is odd: the fused Metal kernel rotates channel pairs and leaves one output channel unwritten; use an even rotary_dim, or the pure-MLX path")]
    OddRotaryDim {
        /// The offending rotary dimension.
        rotary_dim: usize,
    },

    /// `rotary_dim` exceeds the head dimension of q/k. Reference: raises
    /// `ValueError [broadcast_shapes]` on the CPU path.
    #[error("rotary_dim {rotary_dim} exceeds head_dim {head_dim}")]
    RotaryDimExceedsHeadDim {
        /// Configured rotary dimension.
        rotary_dim: usize,
        /// Last axis of q/k.
        head_dim: usize,
    },

    /// `mrope_section` has fewer than 3 entries. Reference: raises
    /// `IndexError` in `_interleaved_position_selector` (it reads entries 1
    /// and 2).
    #[error("mrope_section {section:?} has {} entries; the interleaved selector reads entries 1 and 2", section.len())]
    MropeSectionTooShort {
        /// The section as given.
        section: Vec<usize>,
    },

    /// An array has the wrong number of axes.
    #[error("{tensor} must have shape {expected}, got {shape:?}")]
    Rank {
        /// Which argument.
        tensor: &'static str,
        /// The expected layout, e.g. `[B, H, L, D]`.
        expected: &'static str,
        /// The shape given.
        shape: Vec<i32>,
    },

    /// `position_ids` do not fit the tensor they position.
    #[error(
        "position_ids shape {got:?} does not fit {tensor} {tensor_shape:?}: expected {expected}"
    )]
    PositionIdsShape {
        /// Shape of the position ids.
        got: Vec<i32>,
        /// The tensor being positioned.
        tensor: &'static str,
        /// Its shape.
        tensor_shape: Vec<i32>,
        /// What would fit.
        expected: &'static str,
    },

    /// The 1-D form of the Gemma RoPE (positions `[B, L]`) needs an even
    /// head dimension. Reference: raises `ValueError [broadcast_shapes]`
    /// (cos/sin have `2·(H/2)` channels against `H`).
    #[error("head_dim {head_dim} is odd: the 1-D RoPE form needs an even head dimension")]
    OddHeadDim {
        /// Last axis of the input.
        head_dim: usize,
    },

    /// The head dimension leaves no channel pair per position axis
    /// (`head_dim < 2·axes`). Reference: raises `ZeroDivisionError` on
    /// `2.0 / channels_per_dim`.
    #[error("head_dim {head_dim} leaves no channel pair for each of {axes} position axes")]
    HeadDimTooSmall {
        /// Last axis of the input.
        head_dim: usize,
        /// Number of position axes (last axis of `positions`).
        axes: usize,
    },

    /// Rotary tables built for one head dimension were applied to inputs
    /// of another.
    #[error("tables were built for head_dim {tables}, inputs have {inputs}")]
    TablesHeadDim {
        /// Head dimension of the tables.
        tables: usize,
        /// Head dimension of the inputs.
        inputs: usize,
    },

    /// Positions `[B, L, 0]`: no axis to rotate by. Reference: raises
    /// `ZeroDivisionError`.
    #[error("positions have no axis (last dimension 0)")]
    NoPositionAxes,

    /// `spatial_merge_size` is zero. Reference: raises `ZeroDivisionError`.
    #[error("spatial_merge_size must be positive")]
    ZeroMergeSize,

    /// A grid covers no token (`t`, `h/merge` or `w/merge` is zero).
    /// Reference: raises `ValueError [max] Cannot max reduce … size 0`
    /// wherever the span is (probed as the last span too, with and without
    /// trailing text: its own vision token becomes text that reads the
    /// empty block's maximum).
    #[error("{kind} grid {grid_index} {grid} covers no token")]
    EmptyGrid {
        /// Image or video.
        kind: VisionKind,
        /// Index into the (expanded) grid list.
        grid_index: usize,
        /// The grid, in patch units.
        grid: GridThw,
    },

    /// More vision spans than grids. The reference indexes past its grid
    /// array (an out-of-bounds read), so what it then raises depends on the
    /// memory there (probed: `ValueError [max] …` and `ValueError
    /// [broadcast_to] Negative dimensions`); the port refuses.
    #[error("{kind} span {span_index} has no grid ({grids} {kind} grids given)")]
    MissingGrid {
        /// Image or video.
        kind: VisionKind,
        /// Zero-based index of the span without a grid.
        span_index: usize,
        /// How many grids of this kind were given (videos: frames).
        grids: usize,
    },

    /// A span was counted (vision_start followed by the token) but no such
    /// token occurs at or after the search start. Reference: raises
    /// `ValueError: … is not in list` from `list.index`.
    #[error("no {kind} token at or after token {from}")]
    VisionTokenNotFound {
        /// Image or video.
        kind: VisionKind,
        /// Where the search started (index among unmasked tokens).
        from: usize,
    },

    /// The attention mask does not match the input ids.
    #[error("attention_mask has {mask} entries for {input_ids} input ids")]
    MaskLength {
        /// Mask length.
        mask: usize,
        /// Number of input ids.
        input_ids: usize,
    },

    /// The three position streams of a rope index differ in length.
    #[error("position streams have lengths {lengths:?}")]
    StreamLengths {
        /// Lengths of the t, h, w streams.
        lengths: [usize; 3],
    },

    /// A position does not fit in `i32` (position ids are int32).
    #[error("position of token {index} overflows int32")]
    PositionOverflow {
        /// Token index within the sequence.
        index: u64,
    },

    /// A kernel launch dimension does not fit in `i32`.
    #[error("kernel grid of {work} threads overflows int32")]
    GridOverflow {
        /// Threads needed.
        work: u128,
    },

    /// Regime boundaries must be positive and strictly increasing.
    #[error("regime boundaries {boundaries:?} are not positive and strictly increasing")]
    RegimeBoundaries {
        /// The list given.
        boundaries: Vec<usize>,
    },

    /// The Metal kernel path was requested where Metal is not available.
    #[error("the fused Metal mRoPE kernel needs Metal, which this MLX build does not have")]
    MetalUnavailable,

    /// A raw mlx-c call of the Metal kernel path failed. MLX's own message
    /// goes to mlx-rs's error stash, which is not readable from here.
    #[error("mlx-c {call} failed")]
    MetalKernel {
        /// The mlx-c function that failed.
        call: &'static str,
    },

    /// MLX rejected an operation.
    #[error(transparent)]
    Mlx(#[from] Exception),
}

/// `value` as a RoPE frequency base: positive, and not zero in f32. An
/// infinite base is accepted (see [`PositionError::RopeBase`]).
pub(crate) fn check_rope_base(what: &'static str, value: f64) -> Result<(), PositionError> {
    // NaN fails the comparison too.
    if value > 0.0 && (value as f32) > 0.0 {
        Ok(())
    } else {
        Err(PositionError::RopeBase { what, value })
    }
}
