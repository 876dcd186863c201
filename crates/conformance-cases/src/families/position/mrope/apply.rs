//! The apply cases: the port's rope index → positions → mRoPE apply,
//! against the reference's prefill or decode call.

use layers::position::{
    rope_index, GridThw, Mrope, MropePath, RopeIndex, RopeIndexInput, VisionTokens,
};
use oracle::{DType, HostTensor};

use super::super::{build_prompt, host, int32_tensor, port, Piece, Prompt};
use super::Model;
use crate::case::{CaseError, CaseOutput, Ctx};
use crate::reference;

/// One image between text: 5 + 26 + 7 = 38 tokens.
const IMAGE_PROMPT: [Piece; 3] = [
    Piece::Text(5),
    Piece::Image(GridThw::new(1, 8, 12)),
    Piece::Text(7),
];

/// Two rows of 43 tokens: image + 3-frame video, and two images.
const BATCH_PROMPTS: [&[Piece]; 2] = [
    &[
        Piece::Text(3),
        Piece::Image(GridThw::new(1, 4, 8)),
        Piece::Text(2),
        Piece::Video(GridThw::new(3, 4, 4)),
        Piece::Text(4),
    ],
    &[
        Piece::Text(2),
        Piece::Image(GridThw::new(1, 6, 4)),
        Piece::Text(3),
        Piece::Image(GridThw::new(1, 2, 2)),
        Piece::Text(27),
    ],
];

#[derive(Debug, Clone, Copy)]
pub(super) enum Scenario {
    /// Text-only prompt: 2-D positions `[1, L]`.
    Text { prompt: &'static [Piece] },
    /// Prefill of prompts with vision spans: 3-D positions.
    Prompt { rows: &'static [&'static [Piece]] },
    /// Decode after a prompt: `len` tokens at cache offset `prompt_len +
    /// extra` (positions `offset + rope_delta`).
    Decode {
        prompt: &'static [Piece],
        extra: usize,
        len: usize,
    },
}

pub(super) const SCENARIOS: [(&str, Scenario); 6] = [
    (
        "text-L24",
        Scenario::Text {
            prompt: &[Piece::Text(24)],
        },
    ),
    (
        "image-L38",
        Scenario::Prompt {
            rows: &[&IMAGE_PROMPT],
        },
    ),
    (
        "image-video-B2-L43",
        Scenario::Prompt {
            rows: &BATCH_PROMPTS,
        },
    ),
    (
        "decode-after-image/offset38-L1",
        Scenario::Decode {
            prompt: &IMAGE_PROMPT,
            extra: 0,
            len: 1,
        },
    ),
    (
        "decode-after-image/offset75-L4",
        Scenario::Decode {
            prompt: &IMAGE_PROMPT,
            extra: 37,
            len: 4,
        },
    ),
    (
        "decode-after-text/offset65530-L8",
        Scenario::Decode {
            prompt: &[Piece::Text(16)],
            extra: 65_514,
            len: 8,
        },
    ),
];

/// The rope index of each row, as the port computes it.
fn port_indices(prompts: &[Prompt], text_only: bool) -> Result<Vec<RopeIndex>, CaseError> {
    let grids_present = !text_only;
    prompts
        .iter()
        .map(|p| {
            let input = RopeIndexInput {
                input_ids: &p.ids,
                image_grid_thw: grids_present.then_some(p.images.as_slice()),
                video_grid_thw: grids_present.then_some(p.videos.as_slice()),
                attention_mask: None,
            };
            rope_index(&input, &VisionTokens::QWEN3_5).map_err(port)
        })
        .collect()
}

/// Position ids of the window `[offset, offset + len)` of every row, as
/// the attention consumes them: `[B, len]` for text prompts, `[3, B, len]`
/// otherwise.
fn port_positions(
    indices: &[RopeIndex],
    offset: usize,
    len: usize,
) -> Result<HostTensor, CaseError> {
    let batch = indices.len();
    let windows = indices
        .iter()
        .map(|i| i.window(offset, len).map_err(port))
        .collect::<Result<Vec<_>, _>>()?;
    let text = indices
        .iter()
        .all(|i| i.layout() == layers::position::PositionLayout::Text);
    if text {
        let values: Vec<i32> = windows.iter().flat_map(|w| w[0].iter().copied()).collect();
        return Ok(int32_tensor(&values, &[batch, len]));
    }
    let values: Vec<i32> = (0..3)
        .flat_map(|axis| windows.iter().flat_map(move |w| w[axis].iter().copied()))
        .collect();
    Ok(int32_tensor(&values, &[3, batch, len]))
}

/// A step's port inputs: prompts, the rotated window's q / k and its
/// positions (one generator: the prompts' token ids, then q, then k).
pub(crate) struct Window {
    prompts: Vec<Prompt>,
    pub(crate) q: HostTensor,
    pub(crate) k: HostTensor,
    indices: Vec<RopeIndex>,
    pub(crate) positions: HostTensor,
    offset: usize,
}

/// The window of `rows` (prompts of equal length): the whole prompt, or
/// with `decode = (extra, len)` `len` tokens at cache offset
/// `prompt_len + extra`. Text-only prompts get text positions `[B, L]`.
pub(crate) fn window(
    inputs: &mut crate::inputs::Inputs,
    model: &Model,
    dtype: DType,
    rows: &[&[Piece]],
    decode: Option<(usize, usize)>,
) -> Result<Window, CaseError> {
    let text_only = rows
        .iter()
        .all(|r| r.iter().all(|p| matches!(p, Piece::Text(_))));
    let prompts: Vec<Prompt> = rows.iter().map(|r| build_prompt(r, inputs)).collect();
    let prompt_len = prompts[0].ids.len();
    if prompts.iter().any(|p| p.ids.len() != prompt_len) {
        return Err(CaseError::Harness("batch rows differ in length".into()));
    }
    let batch = prompts.len();
    let (offset, len) = match decode {
        Some((extra, len)) => (prompt_len + extra, len),
        None => (0, prompt_len),
    };
    let (hq, hk) = model.heads;
    let q = inputs.uniform(dtype, &[batch, hq, len, model.head_dim], 2.0);
    let k = inputs.uniform(dtype, &[batch, hk, len, model.head_dim], 2.0);
    // Port: rope index → positions.
    let indices = port_indices(&prompts, text_only)?;
    let positions = port_positions(&indices, offset, len)?;
    Ok(Window {
        prompts,
        q,
        k,
        indices,
        positions,
        offset,
    })
}

/// The apply of `rows` (see [`window`]) against the reference's prefill
/// (no `decode`) or decode call.
pub(crate) fn run_rows(
    ctx: &Ctx,
    model: Model,
    dtype: DType,
    rows: &[&[Piece]],
    decode: Option<(usize, usize)>,
    forced: Option<MropePath>,
    path: MropePath,
) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let Window {
        prompts,
        q,
        k,
        indices,
        positions,
        offset,
    } = window(&mut inputs, &model, dtype, rows, decode)?;
    let (batch, prompt_len) = (prompts.len(), prompts[0].ids.len());
    let mrope = Mrope::new(model.config()).map_err(port)?;
    let (q_port, k_port) = if forced.is_none() && path == MropePath::current().map_err(port)? {
        mrope.apply(&q.to_array(), &k.to_array(), &positions.to_array())
    } else {
        mrope.apply_with_path(path, &q.to_array(), &k.to_array(), &positions.to_array())
    }
    .map_err(port)?;
    let selector = mrope.position_selector();
    let deltas: Vec<i32> = indices.iter().map(|i| i.rope_delta()).collect();

    // Reference.
    let ids: Vec<i32> = prompts.iter().flat_map(|p| p.ids.iter().copied()).collect();
    let ids = int32_tensor(&ids, &[batch, prompt_len]);
    let images: Vec<GridThw> = prompts
        .iter()
        .flat_map(|p| p.images.iter().copied())
        .collect();
    let videos: Vec<GridThw> = prompts
        .iter()
        .flat_map(|p| p.videos.iter().copied())
        .collect();
    let prompt = reference::position::Prompt {
        input_ids: &ids,
        image_grid_thw: (!images.is_empty()).then_some(images.as_slice()),
        video_grid_thw: (!videos.is_empty()).then_some(videos.as_slice()),
    };
    let decode = decode.is_some();
    let reference = if decode {
        reference::position::position_mrope_decode(
            ctx,
            &q,
            &k,
            prompt,
            offset,
            model.rotary(),
            path.as_str(),
        )?
    } else {
        reference::position::position_mrope_prompt(
            ctx,
            &q,
            &k,
            prompt,
            model.rotary(),
            path.as_str(),
        )?
    };
    if reference.path != path.as_str() {
        return Err(CaseError::Harness(format!(
            "the reference took {}, the port {}",
            reference.path,
            path.as_str()
        )));
    }

    // The prompt's token layout is a constant of the case: its positions
    // and deltas are proven able to fail by the `position/rope-index`
    // cases, which perturb the attention mask.
    const LAYOUT: &str =
        "from the prompt's token layout, a constant of the case (position/rope-index perturbs it)";
    let mut out = CaseOutput::new(reference.path.clone());
    out.compare("q", &host(&q_port)?, &reference.q);
    out.compare("k", &host(&k_port)?, &reference.k);
    match (decode, &reference.decode_position_ids) {
        // Decode positions move with the cache offset, which is perturbed.
        (true, Some(expected)) => out.compare("position_ids", &positions, expected),
        (true, None) => {
            return Err(CaseError::Harness(
                "the decode call returned no decode positions".into(),
            ))
        }
        (false, _) => {
            out.compare_derived("position_ids", &positions, &reference.position_ids, LAYOUT)
        }
    }
    out.compare_derived(
        "rope_deltas",
        &int32_tensor(&deltas, &[batch, 1]),
        &reference.rope_deltas,
        LAYOUT,
    );
    out.compare("inv_freq", &host(mrope.inv_freq())?, &reference.inv_freq);
    out.compare(
        "position_selector",
        &int32_tensor(selector, &[selector.len()]),
        &reference.position_selector,
    );
    Ok(out)
}
