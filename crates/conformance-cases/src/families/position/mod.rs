//! Case family `position`: Qwen3.5 mRoPE (apply, `inv_freq`, selector, the
//! Metal kernel's text and launch), the Qwen3.5 rope index and decode
//! delta, Gemma vision 2-D RoPE, and two measured relations (mRoPE versus
//! plain RoPE for text; host emulations of `inv_freq`).
//!
//! Every row names the reference path that ran: `pure-mlx` (MLX ops; the
//! reference's choice without Metal) or `metal-kernel` (the fused kernel of
//! `mlx_vlm.models.rope_utils`, or its source text and launch).
//!
//! The glue functions live in the `# --- position families` section of
//! `crates/oracle/python/reference_glue.py`.

use layers::position::{GridThw, MropePath, VisionTokens};
use oracle::{DType, HostTensor};

use super::support::{bytes_tensor, dtype_tag, host, int32_tensor, port};
use crate::case::{Backend, CaseError, Ctx};
use crate::inputs::Inputs;

pub mod accepted;
pub mod inv_freq;
pub mod mrope;
pub mod rope2d;
pub mod rope_index;
pub mod vs_rope;

pub fn descriptions() -> Vec<crate::families::describe::Described> {
    let mut cases = Vec::new();
    cases.extend(mrope::descriptions());
    cases.extend(vs_rope::descriptions());
    cases.extend(inv_freq::descriptions());
    cases.extend(rope_index::descriptions());
    cases.extend(rope2d::descriptions());
    cases.extend(rope2d::refused_descriptions());
    cases.extend(accepted::descriptions());
    cases
}

/// `vision_end_token_id` of Qwen3.5 (`qwen3_5/config.py` `ModelConfig`,
/// mlx-vlm 0.7.6). The rope index does not read it; prompts carry it as
/// the processor emits it.
pub(crate) const VISION_END: i32 = 248_046;

/// The float dtypes activations are tested in.
const FLOAT_DTYPES: [DType; 3] = DType::FLOATS;

/// The mlx-rs dtype of an activation dtype.
fn mlx_dtype(dtype: DType) -> Result<mlx_rs::Dtype, CaseError> {
    if dtype.is_float() {
        Ok(dtype.to_mlx())
    } else {
        Err(CaseError::Harness(format!(
            "not an activation dtype: {}",
            dtype.name()
        )))
    }
}

/// The port's int32 positions in the dtype the port declares for them
/// ([`layers::position::RopeIndex::position_dtype`]: int64 for a masked text
/// prompt, as the reference gives them). Compared with the reference's
/// dtype and bits unwidened: a wrong declaration fails.
pub(crate) fn in_position_dtype(
    t: &HostTensor,
    dtype: layers::position::PositionDtype,
) -> Result<HostTensor, CaseError> {
    if t.dtype != DType::Int32 {
        return Err(CaseError::Harness(format!(
            "port positions are int32 values, got {}",
            t.dtype.name()
        )));
    }
    match dtype {
        layers::position::PositionDtype::Int32 => Ok(t.clone()),
        layers::position::PositionDtype::Int64 => {
            let bytes = (0..t.len())
                .flat_map(|i| i64::from(t.bits(i) as u32 as i32).to_le_bytes())
                .collect();
            Ok(HostTensor::new(DType::Int64, t.shape.clone(), bytes)?)
        }
    }
}

/// Integers in `[low, high)` from the case's generator.
fn ints(inputs: &mut Inputs, n: usize, low: i64, high: i64) -> Vec<i32> {
    let t = inputs.integers(DType::Int32, &[n], low, high);
    (0..n).map(|i| t.bits(i) as u32 as i32).collect()
}

/// The mRoPE path the port takes for this run, mirroring the reference:
/// on a GPU run, `_HAS_METAL` decides ([`MropePath::current`]); on a CPU
/// run the pure-MLX path (the reference's choice on a build without Metal;
/// on a Metal build the glue turns `fused_apply` off to match, since the
/// kernel cannot launch on a CPU stream).
pub(crate) fn mrope_path(ctx: &Ctx) -> Result<MropePath, CaseError> {
    // The kernel path exists only on Metal; CPU rows (on every build,
    // macOS included) test the pure-MLX path, CUDA has no Metal.
    match ctx.backend() {
        Backend::Metal => MropePath::current().map_err(port),
        Backend::Cpu | Backend::Cuda => Ok(MropePath::PureMlx),
    }
}

/// One piece of a Qwen3.5 prompt.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Piece {
    /// Ordinary text tokens (random ids well below the special tokens).
    Text(usize),
    /// `<vision_start>`, `t·(h/2)·(w/2)` image tokens, `<vision_end>`.
    Image(GridThw),
    /// A video grid `(t, h, w)`: per frame, two text tokens (the
    /// processor's timestamp), `<vision_start>`, `(h/2)·(w/2)` video
    /// tokens, `<vision_end>`.
    Video(GridThw),
    /// `<vision_start>`, this many image tokens, `<vision_end>`, with the
    /// grid given whatever it claims (the reference positions the
    /// `t·(h/2)·(w/2)` tokens from the first, whatever they are).
    ImageSpan(GridThw, usize),
    /// An image grid no span of the prompt consumes (the reference ignores
    /// it).
    ImageGrid(GridThw),
    /// One image token outside every span (no `<vision_start>` before it).
    StrayImageToken,
}

/// A prompt row: token ids and the grids of its spans, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Prompt {
    pub(crate) ids: Vec<i32>,
    pub(crate) images: Vec<GridThw>,
    pub(crate) videos: Vec<GridThw>,
}

fn build_prompt(pieces: &[Piece], inputs: &mut Inputs) -> Prompt {
    build_prompt_for(pieces, inputs, &VisionTokens::QWEN3_5)
}

/// The token ids of `pieces` with a model's special tokens and merge size.
pub(crate) fn build_prompt_for(
    pieces: &[Piece],
    inputs: &mut Inputs,
    tokens: &VisionTokens,
) -> Prompt {
    let merge = tokens.spatial_merge_size;
    let mut prompt = Prompt::default();
    for piece in pieces {
        match *piece {
            Piece::Text(n) => prompt.ids.extend(ints(inputs, n, 1_000, 200_000)),
            Piece::Image(g) => {
                prompt.ids.push(tokens.vision_start_token_id);
                let n = g.t * (g.h / merge) * (g.w / merge);
                prompt
                    .ids
                    .extend(std::iter::repeat_n(tokens.image_token_id, n));
                prompt.ids.push(VISION_END);
                prompt.images.push(g);
            }
            Piece::Video(g) => {
                for _ in 0..g.t {
                    prompt.ids.extend(ints(inputs, 2, 1_000, 200_000));
                    prompt.ids.push(tokens.vision_start_token_id);
                    let n = (g.h / merge) * (g.w / merge);
                    prompt
                        .ids
                        .extend(std::iter::repeat_n(tokens.video_token_id, n));
                    prompt.ids.push(VISION_END);
                }
                prompt.videos.push(g);
            }
            Piece::ImageSpan(g, n) => {
                prompt.ids.push(tokens.vision_start_token_id);
                prompt
                    .ids
                    .extend(std::iter::repeat_n(tokens.image_token_id, n));
                prompt.ids.push(VISION_END);
                prompt.images.push(g);
            }
            Piece::ImageGrid(g) => prompt.images.push(g),
            Piece::StrayImageToken => prompt.ids.push(tokens.image_token_id),
        }
    }
    prompt
}
