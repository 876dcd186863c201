//! Qwen3.5 rope index: per-token (t, h, w) positions of a prompt with
//! image and video spans, the decode delta (`rope_deltas`), and position ids
//! for any window of a KV cache.
//!
//! Mirrors `mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index`
//! and the `rope_deltas` continuation of `LanguageModel.__call__`
//! (mlx-vlm 0.7.6) for one sequence, on the host.

use mlx_rs::Array;

use super::error::{PositionError, VisionKind};
pub use super::grid::GridThw;

/// Special tokens and merge size the rope index reads from the model config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VisionTokens {
    /// `image_token_id`.
    pub image_token_id: i32,
    /// `video_token_id`.
    pub video_token_id: i32,
    /// `vision_start_token_id`.
    pub vision_start_token_id: i32,
    /// `vision_config.spatial_merge_size`.
    pub spatial_merge_size: usize,
}

impl VisionTokens {
    /// Qwen3.5 defaults (`qwen3_5/config.py` `ModelConfig`: image 248056,
    /// video 248057, vision_start 248045; `qwen3_vl` `VisionConfig`
    /// `spatial_merge_size = 2`; mlx-vlm 0.7.6).
    pub const QWEN3_5: VisionTokens = VisionTokens {
        image_token_id: 248_056,
        video_token_id: 248_057,
        vision_start_token_id: 248_045,
        spatial_merge_size: 2,
    };
}

/// One sequence's inputs to the rope index.
///
/// `None` grids mean "not passed" (the reference's `None`), which selects
/// the text-only branch when both are `None`; `Some(&[])` takes the
/// multimodal branch with no grid.
#[derive(Debug, Clone, Copy, Default)]
pub struct RopeIndexInput<'a> {
    /// Token ids of the prompt.
    pub input_ids: &'a [i32],
    /// `image_grid_thw`, one per image span, in prompt order.
    pub image_grid_thw: Option<&'a [GridThw]>,
    /// `video_grid_thw`, one per video; each `(t, h, w)` is expanded to `t`
    /// frame spans of `(1, h, w)` as the reference does.
    pub video_grid_thw: Option<&'a [GridThw]>,
    /// `attention_mask` (`true` = keep). Masked tokens get position 1 on
    /// every axis and do not count toward the delta.
    pub attention_mask: Option<&'a [bool]>,
}

/// The rank the reference gives `position_ids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionLayout {
    /// `[B, L]`: no grid was passed; one position serves every axis.
    Text,
    /// `[3, B, L]`: (t, h, w) positions.
    Multimodal,
}

/// The dtype the reference gives `position_ids`, `rope_deltas` and decode
/// positions.
/// The values always fit int32 ([`PositionError::PositionOverflow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionDtype {
    /// `input_ids.dtype` for the int32 ids a serving engine passes: every
    /// prompt with a grid, and a text prompt without a mask.
    Int32,
    /// A text prompt with an attention mask: `get_rope_index` takes
    /// `mx.cumsum(attention_mask.astype(mx.int64))`, so int64.
    Int64,
}

/// Positions of one prompt and its decode continuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RopeIndex {
    position_ids: [Vec<i32>; 3],
    rope_delta: i32,
    layout: PositionLayout,
    dtype: PositionDtype,
}

impl RopeIndex {
    /// Reassembles a rope index (e.g. one stored with a request).
    ///
    /// # Errors
    /// [`PositionError::StreamLengths`] if the three streams differ in
    /// length.
    pub fn from_parts(
        position_ids: [Vec<i32>; 3],
        rope_delta: i32,
        layout: PositionLayout,
    ) -> Result<Self, PositionError> {
        let lengths = [
            position_ids[0].len(),
            position_ids[1].len(),
            position_ids[2].len(),
        ];
        if lengths[0] != lengths[1] || lengths[0] != lengths[2] {
            return Err(PositionError::StreamLengths { lengths });
        }
        Ok(RopeIndex {
            position_ids,
            rope_delta,
            layout,
            dtype: PositionDtype::Int32,
        })
    }

    /// The same positions declared in `dtype` (a reassembled masked text
    /// prompt: [`RopeIndex::from_parts`] gives int32).
    pub fn with_position_dtype(mut self, dtype: PositionDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// The dtype the reference gives these positions ([`PositionDtype`]).
    pub fn position_dtype(&self) -> PositionDtype {
        self.dtype
    }

    /// The t, h and w position streams of the prompt, each of prompt length.
    pub fn position_ids(&self) -> &[Vec<i32>; 3] {
        &self.position_ids
    }

    /// Prompt length in tokens (masked ones included).
    pub fn prompt_len(&self) -> usize {
        self.position_ids[0].len()
    }

    /// `rope_deltas` as `get_rope_index` returns it: `max position + 1 −
    /// unmasked tokens` (0 for a text prompt without mask).
    pub fn rope_delta(&self) -> i32 {
        self.rope_delta
    }

    /// The delta decoding continues with. `LanguageModel.__call__` replaces
    /// the delta with zeros when no grid was passed, so a masked text prompt
    /// decodes with 0 although `get_rope_index` returned `max + 1 − L`.
    pub fn decode_delta(&self) -> i32 {
        match self.layout {
            PositionLayout::Text => 0,
            PositionLayout::Multimodal => self.rope_delta,
        }
    }

    /// `[B, L]` (text) or `[3, B, L]` (multimodal).
    pub fn layout(&self) -> PositionLayout {
        self.layout
    }

    /// Positions of the window `[offset, offset + len)` of the KV cache, per
    /// axis: prompt positions for tokens inside the prompt, `index +
    /// decode_delta` on all three axes beyond it.
    ///
    /// Mirrors the origin's per-token rule (`mropePositionIds`) and the
    /// reference's two cases (mlx-vlm 0.7.6 `LanguageModel.__call__`): at
    /// cache offset 0 it slices the cached prompt positions; at offset > 0
    /// it uses `arange(L) + offset + rope_deltas`. The reference picks one
    /// case per window, not per token: a window starting inside the prompt
    /// at offset > 0 (chunked prefill without explicit `position_ids`) gets
    /// the delta rule there, which differs from the prompt positions of
    /// vision spans. Feed chunked prefill its prompt positions, as this does.
    ///
    /// # Errors
    /// [`PositionError::WindowTooLong`] for `len` beyond [`MAX_WINDOW`];
    /// [`PositionError::WindowAllocation`] when the host cannot hold the
    /// three streams; [`PositionError::PositionOverflow`] when a continued
    /// position leaves int32. A negative continued position (a caller's
    /// delta below `-offset`, through [`RopeIndex::from_parts`]) is kept, as
    /// the reference's `arange(L) + offset + rope_deltas` keeps it.
    pub fn window(&self, offset: usize, len: usize) -> Result<[Vec<i32>; 3], PositionError> {
        // Checked before allocating three `len`-long streams.
        if len > MAX_WINDOW {
            return Err(PositionError::WindowTooLong {
                len,
                max: MAX_WINDOW,
            });
        }
        let prompt_len = self.prompt_len();
        let delta = i64::from(self.decode_delta());
        let mut out: [Vec<i32>; 3] = Default::default();
        for stream in &mut out {
            // Fallible, so a window the host cannot hold is an error, not an abort.
            stream
                .try_reserve_exact(len)
                .map_err(|_| PositionError::WindowAllocation { len })?;
        }
        for step in 0..len {
            let index = offset as u64 + step as u64;
            if index < prompt_len as u64 {
                for (axis, stream) in out.iter_mut().enumerate() {
                    stream.push(self.position_ids[axis][index as usize]);
                }
                continue;
            }
            let value = i64::try_from(index)
                .ok()
                .and_then(|i| i.checked_add(delta))
                .ok_or(PositionError::PositionOverflow { index })?;
            let position = to_position(value, index)?;
            for stream in &mut out {
                stream.push(position);
            }
        }
        Ok(out)
    }

    /// [`RopeIndex::window`] as the int32 array the attention consumes:
    /// `[3, 1, len]` for a multimodal prompt, `[1, len]` for a text prompt
    /// (the reference keeps text positions 2-D, which gives the same angles
    /// on every axis).
    ///
    /// # Errors
    /// Those of [`RopeIndex::window`].
    pub fn window_position_ids(&self, offset: usize, len: usize) -> Result<Array, PositionError> {
        match self.layout {
            PositionLayout::Multimodal => self.window_position_ids_3d(offset, len),
            PositionLayout::Text => {
                let [t, _, _] = self.window(offset, len)?;
                Ok(Array::from_slice(&t, &[1, len_i32(len)?]))
            }
        }
    }

    /// [`RopeIndex::window`] as an int32 array `[3, 1, len]` whatever the
    /// layout.
    ///
    /// # Errors
    /// Those of [`RopeIndex::window`].
    pub fn window_position_ids_3d(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<Array, PositionError> {
        let streams = self.window(offset, len)?;
        let joint: Vec<i32> = streams.concat();
        Ok(Array::from_slice(&joint, &[3, 1, len_i32(len)?]))
    }
}

/// The longest position window [`RopeIndex::window`] builds: `i32::MAX`
/// tokens, the longest axis an MLX array can have (its shapes are int32),
/// where the reference's `mx.arange(L)` fails too. Longer windows are
/// refused before anything is allocated.
pub const MAX_WINDOW: usize = i32::MAX as usize;

fn len_i32(len: usize) -> Result<i32, PositionError> {
    i32::try_from(len).map_err(|_| PositionError::PositionOverflow { index: len as u64 })
}

fn to_position(value: i64, index: u64) -> Result<i32, PositionError> {
    i32::try_from(value).map_err(|_| PositionError::PositionOverflow { index })
}

/// The rope index of one sequence.
///
/// Mirrors `LanguageModel.get_rope_index(input_ids, image_grid_thw,
/// video_grid_thw, attention_mask)` (mlx-vlm 0.7.6 `qwen3_5/language.py`)
/// for batch 1, step by step:
///
/// 1. Video grids `(t, h, w)` become `t` rows `(1, h, w)`.
/// 2. No grid at all → text branch: positions `0..L` (with a mask:
///    `cumsum(mask) − 1`, masked → 1, delta `max + 1 − L`); layout
///    [`PositionLayout::Text`].
/// 3. Otherwise, over the unmasked tokens: count spans as the tokens that
///    follow a `vision_start` token (image and video separately); for each
///    span, find the next image and video token at or after the cursor
///    (`list.index`) and take whichever comes first with the next grid of
///    its kind; text before it gets `st_idx + 0..text_len` on all axes, the
///    span `(t, h/merge, w/merge)` grid coordinates `+ text_len + st_idx`,
///    where `st_idx` is the previous block's maximum + 1; trailing text
///    resumes likewise. Delta = overall max + 1 − unmasked tokens. Masked
///    tokens get 1 on every axis.
///
/// Positions are held as int32 values; [`RopeIndex::position_dtype`] is
/// the dtype the reference gives them (`input_ids.dtype`, int64 for a
/// masked text prompt).
///
/// Computes what the reference computes where it computes: a grid whose
/// `h` or `w` is not a multiple of the merge size is floored; a span is the
/// `t·h·w` tokens the grid claims, whatever they are (a vision token past
/// it, or outside every span, gets a text position; a span running past
/// the prompt still counts toward the maximum and the delta); grids no
/// span consumes are ignored. The grids are this row's: the reference
/// consumes one list across the batch, so a caller splitting a batch
/// gives each row the grids its spans consume.
///
/// # Errors
/// Where the reference raises too: [`PositionError::MissingGrid`],
/// [`PositionError::EmptyGrid`], [`PositionError::VisionTokenNotFound`],
/// [`PositionError::ZeroMergeSize`]. Also [`PositionError::MaskLength`]
/// (the reference's result is malformed there) and
/// [`PositionError::PositionOverflow`] (it wraps in int32).
///
/// Finding: the origin (`qwenRopeIndex`) detects spans by the image/video
/// token alone, consumes grids in order whatever their kind, and does not
/// split multi-frame video grids, so a video with `t > 1` gets temporal
/// positions `0..t` in one span where the reference restarts at 0 in each
/// frame span (each frame with its own `vision_start`).
pub fn rope_index(
    input: &RopeIndexInput<'_>,
    tokens: &VisionTokens,
) -> Result<RopeIndex, PositionError> {
    let ids = input.input_ids;
    if let Some(mask) = input.attention_mask {
        if mask.len() != ids.len() {
            return Err(PositionError::MaskLength {
                mask: mask.len(),
                input_ids: ids.len(),
            });
        }
    }
    if input.image_grid_thw.is_none() && input.video_grid_thw.is_none() {
        return text_rope_index(ids.len(), input.attention_mask);
    }

    let images: &[GridThw] = input.image_grid_thw.unwrap_or(&[]);
    // Each video frame becomes a grid of its own (the reference's expansion
    // of `(t, h, w)` into `t` rows of `(1, h, w)`). A frame's span takes at
    // least two tokens, so frames past the prompt's length are never
    // consumed, and the reference ignores unconsumed grids: they are not
    // expanded (a huge `t` allocates nothing).
    let video_grids = input.video_grid_thw.unwrap_or(&[]);
    let videos: Vec<GridThw> = video_grids
        .iter()
        .flat_map(|g| std::iter::repeat_n(GridThw::new(1, g.h, g.w), g.t))
        .take(ids.len())
        .collect();

    let keep = |col: usize| input.attention_mask.is_none_or(|m| m[col]);
    let kept_cols: Vec<usize> = (0..ids.len()).filter(|&c| keep(c)).collect();
    let kept: Vec<i32> = kept_cols.iter().map(|&c| ids[c]).collect();
    let compact = compact_positions(&kept, images, &videos, tokens)?;

    let mut position_ids: [Vec<i32>; 3] = std::array::from_fn(|_| vec![1; ids.len()]);
    for (compact_idx, &col) in kept_cols.iter().enumerate() {
        for (stream, axis) in position_ids.iter_mut().zip(&compact.axes) {
            stream[col] = to_position(axis[compact_idx], col as u64)?;
        }
    }
    let rope_delta = match compact.max {
        // `if not llm_pos_ids_list: mrope_position_deltas.append(0)`.
        None => 0,
        Some(max) => {
            let delta = max + 1 - kept.len() as i64;
            i32::try_from(delta).map_err(|_| PositionError::PositionOverflow {
                index: kept.len() as u64,
            })?
        }
    };
    Ok(RopeIndex {
        position_ids,
        rope_delta,
        layout: PositionLayout::Multimodal,
        dtype: PositionDtype::Int32,
    })
}

/// The `else` branch of `get_rope_index` (no grid passed).
fn text_rope_index(len: usize, mask: Option<&[bool]>) -> Result<RopeIndex, PositionError> {
    let (stream, rope_delta) = match mask {
        None => {
            let stream = (0..len)
                .map(|i| to_position(i as i64, i as u64))
                .collect::<Result<Vec<_>, _>>()?;
            (stream, 0)
        }
        Some(mask) => {
            // cumsum(mask) - 1, then 1 where the mask is 0.
            let mut kept = 0i64;
            let mut stream = Vec::with_capacity(len);
            for (i, &m) in mask.iter().enumerate() {
                kept += i64::from(m);
                let value = if m { kept - 1 } else { 1 };
                stream.push(to_position(value, i as u64)?);
            }
            let max = stream.iter().copied().max().map_or(i64::MIN, i64::from);
            let delta = if len == 0 { 0 } else { max + 1 - len as i64 };
            let delta = i32::try_from(delta)
                .map_err(|_| PositionError::PositionOverflow { index: len as u64 })?;
            (stream, delta)
        }
    };
    Ok(RopeIndex {
        position_ids: [stream.clone(), stream.clone(), stream],
        rope_delta,
        layout: PositionLayout::Text,
        dtype: if mask.is_some() {
            PositionDtype::Int64
        } else {
            PositionDtype::Int32
        },
    })
}

/// Positions of the unmasked tokens (the reference's `llm_positions`) and
/// their maximum (`None` when the list of blocks is empty).
struct Compact {
    axes: [Vec<i64>; 3],
    max: Option<i64>,
}

impl Compact {
    /// A maximum reached by positions that land on no token (a span that
    /// runs past the prompt).
    fn note_max(&mut self, m: i64) {
        self.max = Some(self.max.map_or(m, |old| old.max(m)));
    }

    fn push(&mut self, t: i64, h: i64, w: i64) {
        self.axes[0].push(t);
        self.axes[1].push(h);
        self.axes[2].push(w);
        let block_max = t.max(h).max(w);
        self.max = Some(self.max.map_or(block_max, |m| m.max(block_max)));
    }
}

/// The multimodal branch of `get_rope_index` over the unmasked tokens.
fn compact_positions(
    input_tokens: &[i32],
    images: &[GridThw],
    videos: &[GridThw],
    tokens: &VisionTokens,
) -> Result<Compact, PositionError> {
    let n = input_tokens.len();
    // Tokens that follow a vision_start token (the last token excluded).
    let follow: Vec<i32> = input_tokens
        .windows(2)
        .filter(|w| w[0] == tokens.vision_start_token_id)
        .map(|w| w[1])
        .collect();
    let image_nums = follow
        .iter()
        .filter(|&&t| t == tokens.image_token_id)
        .count();
    let video_nums = follow
        .iter()
        .filter(|&&t| t == tokens.video_token_id)
        .count();

    let index_from = |token: i32, from: usize, kind: VisionKind| -> Result<usize, PositionError> {
        input_tokens
            .get(from..)
            .and_then(|rest| rest.iter().position(|&t| t == token))
            .map(|i| from + i)
            .ok_or(PositionError::VisionTokenNotFound { kind, from })
    };
    let has_image = input_tokens.contains(&tokens.image_token_id);
    let has_video = input_tokens.contains(&tokens.video_token_id);

    let mut compact = Compact {
        axes: std::array::from_fn(|_| Vec::with_capacity(n)),
        max: None,
    };
    // Maximum of the last block appended (`llm_pos_ids_list[-1].max()`).
    let mut last_block_max: Option<i64> = None;
    let mut st = 0usize;
    let (mut image_index, mut video_index) = (0usize, 0usize);
    let (mut remain_images, mut remain_videos) = (image_nums, video_nums);

    for _ in 0..image_nums + video_nums {
        let ed_image = if has_image && remain_images > 0 {
            index_from(tokens.image_token_id, st, VisionKind::Image)?
        } else {
            n + 1
        };
        let ed_video = if has_video && remain_videos > 0 {
            index_from(tokens.video_token_id, st, VisionKind::Video)?
        } else {
            n + 1
        };
        let (kind, grid_index, grid, ed) = if ed_image < ed_video {
            let grid = *images.get(image_index).ok_or(PositionError::MissingGrid {
                kind: VisionKind::Image,
                span_index: image_index,
                grids: images.len(),
            })?;
            image_index += 1;
            remain_images -= 1;
            (VisionKind::Image, image_index - 1, grid, ed_image)
        } else {
            let grid = *videos.get(video_index).ok_or(PositionError::MissingGrid {
                kind: VisionKind::Video,
                span_index: video_index,
                grids: videos.len(),
            })?;
            video_index += 1;
            remain_videos -= 1;
            (VisionKind::Video, video_index - 1, grid, ed_video)
        };

        let merge = tokens.spatial_merge_size;
        if merge == 0 {
            return Err(PositionError::ZeroMergeSize);
        }
        // `h // spatial_merge_size`: floored, as the reference floors.
        let (grid_t, grid_h, grid_w) = (grid.t, grid.h / merge, grid.w / merge);
        if grid_t == 0 || grid_h == 0 || grid_w == 0 {
            return Err(PositionError::EmptyGrid {
                kind,
                grid_index,
                grid,
            });
        }
        // The span is `t·h·w` tokens from `ed`, whatever they are: the
        // reference positions that many (the part past the prompt still
        // counts toward the maximum) and resumes after them.
        let span = grid_t
            .checked_mul(grid_h)
            .and_then(|s| s.checked_mul(grid_w))
            .unwrap_or(usize::MAX);
        let text_len = (ed - st) as i64;
        let st_idx = last_block_max.map_or(0, |m| m + 1);
        for i in 0..text_len {
            let p = st_idx + i;
            compact.push(p, p, p);
        }
        let base = text_len + st_idx;
        // Only the span's first `n - ed` positions land on tokens.
        let mut room = n - ed;
        'block: for ti in 0..grid_t as i64 {
            for hi in 0..grid_h as i64 {
                for wi in 0..grid_w as i64 {
                    if room == 0 {
                        break 'block;
                    }
                    compact.push(base + ti, base + hi, base + wi);
                    room -= 1;
                }
            }
        }
        let extent = grid_t.max(grid_h).max(grid_w) as i64;
        let block_max = base + extent - 1;
        compact.note_max(block_max);
        last_block_max = Some(block_max);
        st = ed.saturating_add(span);
    }
    if st < n {
        let st_idx = last_block_max.map_or(0, |m| m + 1);
        for i in 0..(n - st) as i64 {
            let p = st_idx + i;
            compact.push(p, p, p);
        }
    }

    // Grids no span consumed are ignored, and a vision token outside every
    // span got a text position above, as the reference does both.
    Ok(compact)
}
