//! Position machinery of the vision-language models: Qwen3.5 interleaved
//! multimodal RoPE (mRoPE), its rope index and decode delta, the Gemma
//! vision two-axis RoPE, and KV-cache append chunk sizing.
//!
//! | item | mirrors (pinned reference) |
//! | --- | --- |
//! | [`interleaved_position_selector`] | `mlx_vlm.models.rope_utils._interleaved_position_selector` (mlx-vlm 0.7.6) |
//! | [`compute_inv_freq`] | `mlx_vlm.models.rope_utils.compute_inv_freq` (mlx-vlm 0.7.6) |
//! | [`Mrope::cos_sin`] | `mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.__call__` (mlx-vlm 0.7.6) |
//! | [`Mrope::apply`], [`apply_mrope`] | `mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary` (mlx-vlm 0.7.6) |
//! | [`MropePath`] | `mlx_vlm.models.rope_utils._HAS_METAL` / `MRoPERotaryEmbedding.fused_apply` (mlx-vlm 0.7.6) |
//! | [`mrope_kernel_spec`], [`mrope_kernel_launch`] | `mlx_vlm.models.rope_utils._mrope_apply_kernel`, `_fast_mrope_apply` (mlx-vlm 0.7.6) |
//! | [`rope_index`] | `mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index` (mlx-vlm 0.7.6) |
//! | [`RopeIndex::window`] | `mlx_vlm.models.qwen3_5.language.LanguageModel.__call__`, `rope_deltas` continuation (mlx-vlm 0.7.6) |
//! | [`apply_multidimensional_rope`] | `optiq.vlm.gemma4.vision.apply_multidimensional_rope` (mlx-optiq 0.7.7; textually identical in mlx-vlm 0.7.6 `gemma4.vision`) |
//! | [`RegimeTable`] | MLX 0.32.2 `mlx/backend/metal/scaled_dot_product_attention.cpp` kernel selection, as measured by the origin (`qwen-append.ts`) |
//!
//! Every device computation issues the reference's own op sequence, in the
//! reference's order and dtypes, on the same libmlx, so outputs can be
//! compared bit for bit. One refinement: the rotation `x·cos +
//! rotate_half(x)·sin` (pure-MLX mRoPE and 2-D RoPE) is issued as its two
//! halves, a bit-identical form with fewer memory passes (see
//! [`apply_rope2d`] and [`Mrope::apply_with_path`]).
//! Integer bookkeeping (selector, rope index, chunk sizes) is plain host
//! Rust.
//!
//! # Findings (origin TypeScript vs pinned reference)
//!
//! Each is documented at the item it concerns; in short:
//!
//! - **Selector**: the origin hard-codes `mrope_section = [11, 11, 10]`; the
//!   reference takes it from the config. The rule is otherwise the same
//!   (section 0 is never read; axis 1 takes indices `1, 4, 7, …` below
//!   `min(3·section[1], F)`, axis 2 takes `2, 5, 8, …` below
//!   `min(3·section[2], F)`).
//! - **inv_freq**: the origin multiplies `arange` by the f32 reciprocal
//!   `1/rotary_dim`; the reference divides by `rotary_dim`. The two round
//!   differently when `rotary_dim` is not a power of two.
//! - **Path**: the origin always launches the Metal kernel; the reference uses
//!   it only when Metal is available and otherwise (CPU) computes cos/sin in
//!   f32, casts them to the activation dtype and rotates in that dtype.
//! - **Kernel text**: the origin's 3-D kernel source differs from the
//!   reference's in whitespace only (it lacks the two indentation-only lines
//!   around the pair block and the trailing four spaces of the f-string), so
//!   the texts are not byte-identical though the code is; the origin has only
//!   the 3-D kernel, while the reference builds a separate `_2d` kernel for
//!   2-D (text-only) position ids.
//! - **Rope index**: the origin finds vision spans by image/video token alone;
//!   the reference counts spans by `vision_start` + token and then searches
//!   for the next image/video token. The origin does not split a video grid
//!   `(t, h, w)` into `t` frames of `(1, h, w)` as the reference does, so
//!   multi-frame videos get different temporal positions (the reference
//!   restarts `t` at 0 each frame).
//! - **2-D RoPE**: the origin rejects head dims not divisible by 4; the
//!   reference silently drops the trailing `head_dim mod 4` channels. The
//!   origin has no 1-D form (positions `[B, L]`) and fixes the axis count at 2.
//! - **Reference quirks this port mirrors or rejects** (odd `rotary_dim`
//!   rotating `rotary_dim + 1` channels, silent clipping of
//!   `mrope_section`, floor division of non-integral merges, unused grids,
//!   the Metal kernel's batch indexing) are listed on [`PositionError`]'s
//!   variants and on the functions concerned.

mod append;
mod error;
mod grid;
mod metal_kernel;
mod mrope;
mod rope2d;
mod rope_index;

pub use append::{Backend, RegimeTable, MAX_APPEND_CHUNK};
pub(crate) use error::check_rope_base;
pub use error::{PositionError, VisionKind};
pub use metal_kernel::{
    mrope_kernel_launch, mrope_kernel_spec, MropeKernelLaunch, MropeKernelSpec,
    MROPE_KERNEL_THREADGROUP,
};
pub use mrope::{
    apply_mrope, compute_inv_freq, interleaved_position_selector, metal_is_available, Mrope,
    MropeConfig, MropePath, Pairing,
};
#[cfg(feature = "test-support")]
pub use mrope::{inv_freq_host_f32, inv_freq_host_f64};
pub use rope2d::{
    apply_multidimensional_rope, apply_rope2d, rope2d_tables, Rope2dAxis, Rope2dTables,
};
pub use rope_index::{
    rope_index, GridThw, PositionDtype, PositionLayout, RopeIndex, RopeIndexInput, VisionTokens,
    MAX_WINDOW,
};
