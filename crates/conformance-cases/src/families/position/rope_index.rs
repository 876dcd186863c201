//! `position/rope-index`: the port's rope index against
//! `LanguageModel.get_rope_index` (Qwen3.5 token ids, spatial merge 2):
//! position ids and `rope_deltas` for text, images, multi-frame videos,
//! text between and after spans, left padding, batches; and the decode
//! positions that continue a prompt (`LanguageModel.__call__`'s delta
//! rule).
//!
//! The first tensor sent to the reference is the attention mask (all ones
//! stands for "not passed"), so the proof mode's flipped bit masks or
//! unmasks token 0 and the positions must change.

use layers::position::{
    rope_index, GridThw, PositionDtype, PositionLayout, RopeIndex, RopeIndexInput, VisionTokens,
};

use super::mrope::shape::{check_pieces, PromptPiece};
use super::{build_prompt, in_position_dtype, int32_tensor, port, Piece, Prompt};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const FAMILY: &str = "position/rope-index";
const REFERENCE: &str =
    "mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index (mlx-vlm 0.7.6)";
const DECODE_REFERENCE: &str =
    "mlx_vlm.models.qwen3_5.language.LanguageModel.__call__: prefill, then the positions it \
     hands its transformer body at the cache offset (body stubbed: it does not decide \
     positions) (mlx-vlm 0.7.6)";

/// Token id of left padding (masked out).
const PAD: i32 = 0;

type Rows = &'static [&'static [Piece]];

const TEXT: Rows = &[&[Piece::Text(12)]];
const TEXT_LEFT_PADDED_B2: Rows = &[&[Piece::Text(10)], &[Piece::Text(6)]];
const ONE_IMAGE: Rows = &[&[
    Piece::Text(4),
    Piece::Image(GridThw::new(1, 8, 12)),
    Piece::Text(6),
]];
const IMAGE_FIRST: Rows = &[&[Piece::Image(GridThw::new(1, 4, 4)), Piece::Text(5)]];
const IMAGE_LAST: Rows = &[&[Piece::Text(3), Piece::Image(GridThw::new(1, 6, 8))]];
const SEVERAL_IMAGES: Rows = &[&[
    Piece::Text(3),
    Piece::Image(GridThw::new(1, 4, 16)),
    Piece::Text(2),
    Piece::Image(GridThw::new(1, 12, 4)),
    Piece::Image(GridThw::new(1, 2, 2)),
    Piece::Text(5),
]];
const IMAGE_VIDEO: Rows = &[&[
    Piece::Text(3),
    Piece::Image(GridThw::new(1, 4, 6)),
    Piece::Text(4),
    Piece::Video(GridThw::new(4, 6, 4)),
    Piece::Text(5),
]];
const VIDEO_IMAGE: Rows = &[&[
    Piece::Text(2),
    Piece::Video(GridThw::new(2, 4, 8)),
    Piece::Text(3),
    Piece::Image(GridThw::new(1, 8, 8)),
    Piece::Text(3),
]];
const TWO_VIDEOS: Rows = &[&[
    Piece::Text(2),
    Piece::Video(GridThw::new(3, 4, 4)),
    Piece::Text(1),
    Piece::Video(GridThw::new(2, 2, 6)),
    Piece::Text(2),
]];
const MIXED_LEFT_PADDED_B2: Rows = &[
    &[
        Piece::Text(3),
        Piece::Image(GridThw::new(1, 4, 4)),
        Piece::Text(3),
    ],
    &[
        Piece::Text(2),
        Piece::Image(GridThw::new(1, 8, 4)),
        Piece::Text(1),
        Piece::Video(GridThw::new(2, 4, 4)),
        Piece::Text(2),
    ],
];

// Prompts the reference computes on although their grids do not match
// their tokens exactly (the port once refused each).
const IMAGE_FLOORED: Rows = &[&[
    Piece::Text(3),
    Piece::Image(GridThw::new(1, 5, 6)),
    Piece::Text(2),
]];
const EXTRA_IMAGE_GRID: Rows = &[&[
    Piece::Text(2),
    Piece::Image(GridThw::new(1, 4, 4)),
    Piece::Text(2),
    Piece::ImageGrid(GridThw::new(1, 4, 4)),
]];
const SPAN_SHORTER_THAN_GRID: Rows = &[&[
    Piece::Text(2),
    Piece::ImageSpan(GridThw::new(1, 4, 6), 4),
    Piece::Text(3),
]];
const SPAN_LONGER_THAN_GRID: Rows = &[&[
    Piece::Text(2),
    Piece::ImageSpan(GridThw::new(1, 4, 4), 6),
    Piece::Text(2),
]];
const SPAN_PAST_THE_PROMPT: Rows = &[&[Piece::Text(1), Piece::ImageSpan(GridThw::new(1, 8, 8), 2)]];
const STRAY_IMAGE_TOKEN: Rows = &[&[
    Piece::Text(2),
    Piece::StrayImageToken,
    Piece::Text(2),
    Piece::Image(GridThw::new(1, 4, 4)),
    Piece::Text(1),
]];

/// `(extra, len)`: `len` decode tokens at cache offset `prompt_len + extra`.
type Decode = Option<(usize, usize)>;

/// `(name, rows, decode)`.
const SCENARIOS: [(&str, Rows, Decode); 22] = [
    ("text", TEXT, None),
    ("text-left-padded-B2", TEXT_LEFT_PADDED_B2, None),
    ("one-image", ONE_IMAGE, None),
    ("image-first", IMAGE_FIRST, None),
    ("image-last", IMAGE_LAST, None),
    ("several-images", SEVERAL_IMAGES, None),
    ("image-then-video-4-frames", IMAGE_VIDEO, None),
    ("video-2-frames-then-image", VIDEO_IMAGE, None),
    ("two-videos", TWO_VIDEOS, None),
    ("image-video-left-padded-B2", MIXED_LEFT_PADDED_B2, None),
    ("decode/text", TEXT, Some((0, 3))),
    (
        "decode/text-left-padded-B2",
        TEXT_LEFT_PADDED_B2,
        Some((0, 2)),
    ),
    ("decode/one-image", ONE_IMAGE, Some((0, 1))),
    ("decode/one-image", ONE_IMAGE, Some((500, 4))),
    (
        "decode/image-then-video-4-frames",
        IMAGE_VIDEO,
        Some((7, 2)),
    ),
    (
        "decode/image-video-left-padded-B2",
        MIXED_LEFT_PADDED_B2,
        Some((0, 3)),
    ),
    ("image-5x6-floored", IMAGE_FLOORED, None),
    ("extra-image-grid", EXTRA_IMAGE_GRID, None),
    ("span-shorter-than-grid", SPAN_SHORTER_THAN_GRID, None),
    ("span-longer-than-grid", SPAN_LONGER_THAN_GRID, None),
    ("span-past-the-prompt", SPAN_PAST_THE_PROMPT, None),
    ("stray-image-token", STRAY_IMAGE_TOKEN, None),
];

/// Tokens of a prompt row (as `build_prompt` lays it out).
fn row_len(pieces: &[Piece]) -> usize {
    let merge = VisionTokens::QWEN3_5.spatial_merge_size;
    pieces
        .iter()
        .map(|p| match *p {
            Piece::Text(n) => n,
            Piece::Image(g) => 2 + g.t * (g.h / merge) * (g.w / merge),
            Piece::Video(g) => g.t * (4 + (g.h / merge) * (g.w / merge)),
            Piece::ImageSpan(_, n) => 2 + n,
            Piece::ImageGrid(_) => 0,
            Piece::StrayImageToken => 1,
        })
        .sum()
}

/// A `position/rope-index` case as data: prompt rows (left-padded to the
/// longest) and, for a decode case, `(extra, len)`: `len` positions at
/// cache offset `prompt_len + extra`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeIndexCase {
    pub rows: Vec<Vec<PromptPiece>>,
    pub decode: Option<(usize, usize)>,
    /// A prompt both sides refuse: what the reference's message holds and
    /// the port's `PositionError` variant (must-equal on "refused").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
}

/// What a refused prompt's two sides must say.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refused {
    /// A piece of the reference's exception text.
    pub reference: String,
    /// The port's `PositionError` variant.
    pub port: String,
}

impl Params for RopeIndexCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        let reference = if self.decode.is_some() {
            DECODE_REFERENCE
        } else {
            REFERENCE
        };
        Case::must_equal(name, FAMILY, reference, move |ctx| {
            check_pieces(&self.rows).map_err(|e| CaseError::harness("rows", e))?;
            let rows: Vec<Vec<Piece>> = self
                .rows
                .iter()
                .map(|r| r.iter().map(|p| p.piece()).collect())
                .collect();
            match &self.refused {
                Some(refused) => run_refused(ctx, &rows, refused),
                None => run(ctx, &rows, self.decode),
            }
        })
    }
}

pub fn descriptions() -> Vec<Described> {
    SCENARIOS
        .into_iter()
        .map(|(tag, rows, decode)| {
            let len = rows.iter().map(|r| row_len(r)).max().unwrap_or(0);
            let name = match decode {
                Some((extra, n)) => format!("{FAMILY}/{tag}/offset{}-L{n}", len + extra),
                None => format!("{FAMILY}/{tag}/L{len}"),
            };
            let rows = rows
                .iter()
                .map(|r| r.iter().map(|p| PromptPiece::of(*p)).collect())
                .collect();
            described(
                name,
                &RopeIndexCase {
                    rows,
                    decode,
                    refused: None,
                },
            )
        })
        .chain(
            REFUSED_SCENARIOS
                .into_iter()
                .map(|(tag, rows, reference, port)| {
                    let rows = rows
                        .iter()
                        .map(|r| r.iter().map(|p| PromptPiece::of(*p)).collect())
                        .collect();
                    described(
                        format!("{FAMILY}/refused/{tag}"),
                        &RopeIndexCase {
                            rows,
                            decode: None,
                            refused: Some(Refused {
                                reference: reference.into(),
                                port: port.into(),
                            }),
                        },
                    )
                }),
        )
        .collect()
}

/// Prompts both sides refuse: `(name, rows, the reference's message, the
/// port's variant)`.
const REFUSED_SCENARIOS: [(&str, Rows, &str, &str); 2] = [
    (
        "empty-grid",
        &[&[
            Piece::Text(2),
            Piece::ImageSpan(GridThw::new(1, 1, 4), 1),
            Piece::Text(2),
        ]],
        "Cannot max reduce",
        "EmptyGrid",
    ),
    (
        "vision-token-not-found",
        &[&[
            Piece::Text(1),
            Piece::ImageSpan(GridThw::new(1, 4, 4), 1),
            Piece::ImageSpan(GridThw::new(1, 2, 2), 1),
            Piece::Text(2),
        ]],
        "is not in list",
        "VisionTokenNotFound",
    ),
];

/// A prompt both sides must refuse. The proof mode gives the reference a
/// text prompt instead, which it computes on: "refused" must then differ.
fn run_refused(ctx: &Ctx, rows: &[Vec<Piece>], refused: &Refused) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let prompts: Vec<Prompt> = rows.iter().map(|r| build_prompt(r, &mut inputs)).collect();
    let [prompt] = prompts.as_slice() else {
        return Err(CaseError::Harness("a refused prompt is one row".into()));
    };
    let port_result = rope_index(
        &RopeIndexInput {
            input_ids: &prompt.ids,
            image_grid_thw: (!prompt.images.is_empty()).then_some(prompt.images.as_slice()),
            video_grid_thw: (!prompt.videos.is_empty()).then_some(prompt.videos.as_slice()),
            attention_mask: None,
        },
        &VisionTokens::QWEN3_5,
    );
    let port_said = match port_result {
        Err(e) if format!("{e:?}").starts_with(&refused.port) => (1u8, e.to_string()),
        Err(other) => return Err(port(other)),
        Ok(_) => (0, "computed".to_owned()),
    };
    let twin = build_prompt(&[Piece::Text(4)], &mut inputs);
    let given = if ctx.perturbed() { &twin } else { prompt };
    let len = given.ids.len();
    let ids = int32_tensor(&given.ids, &[1, len]);
    let mask = int32_tensor(&vec![1; len], &[1, len]);
    let reference = reference::refusal(
        reference::position::position_rope_index(
            ctx,
            &mask,
            reference::position::Prompt {
                input_ids: &ids,
                image_grid_thw: (!given.images.is_empty()).then_some(given.images.as_slice()),
                video_grid_thw: (!given.videos.is_empty()).then_some(given.videos.as_slice()),
            },
        ),
        &refused.reference,
    )?;
    crate::families::support::refusal_output(ctx, "pure-mlx", port_said, reference)
}

/// Left-pads every row to the longest; returns ids, mask and row lengths.
fn pad_rows(prompts: &[Prompt]) -> (Vec<i32>, Vec<bool>, usize) {
    let len = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for p in prompts {
        let pad = len - p.ids.len();
        ids.extend(std::iter::repeat_n(PAD, pad));
        ids.extend(&p.ids);
        mask.extend(std::iter::repeat_n(false, pad));
        mask.extend(std::iter::repeat_n(true, p.ids.len()));
    }
    (ids, mask, len)
}

fn run(ctx: &Ctx, rows: &[Vec<Piece>], decode: Decode) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let prompts: Vec<Prompt> = rows.iter().map(|r| build_prompt(r, &mut inputs)).collect();
    let (ids, mask, len) = pad_rows(&prompts);
    if rows.iter().map(|r| row_len(r)).max() != Some(len) {
        return Err(CaseError::Harness(format!(
            "row_len disagrees with the prompt length {len}"
        )));
    }
    let batch = prompts.len();
    let masked = mask.iter().any(|&m| !m);
    let has_images = prompts.iter().any(|p| !p.images.is_empty());
    let has_videos = prompts.iter().any(|p| !p.videos.is_empty());

    // Port, row by row (grids split by row; the reference consumes one
    // global list in row order).
    let indices: Vec<RopeIndex> = prompts
        .iter()
        .enumerate()
        .map(|(row, p)| {
            let input = RopeIndexInput {
                input_ids: &ids[row * len..(row + 1) * len],
                image_grid_thw: has_images.then_some(p.images.as_slice()),
                video_grid_thw: has_videos.then_some(p.videos.as_slice()),
                attention_mask: masked.then_some(&mask[row * len..(row + 1) * len]),
            };
            rope_index(&input, &VisionTokens::QWEN3_5).map_err(port)
        })
        .collect::<Result<_, _>>()?;
    let text = indices.iter().all(|i| i.layout() == PositionLayout::Text);
    // Positions in the dtype the port declares (`RopeIndex::position_dtype`),
    // compared with the reference's dtype and bits unwidened.
    let dtype = indices
        .first()
        .map_or(PositionDtype::Int32, RopeIndex::position_dtype);
    let stack = |streams: &[[Vec<i32>; 3]], width: usize| {
        let t = if text {
            let values: Vec<i32> = streams.iter().flat_map(|s| s[0].iter().copied()).collect();
            int32_tensor(&values, &[batch, width])
        } else {
            let values: Vec<i32> = (0..3)
                .flat_map(|axis| streams.iter().flat_map(move |s| s[axis].iter().copied()))
                .collect();
            int32_tensor(&values, &[3, batch, width])
        };
        in_position_dtype(&t, dtype)
    };
    let prompt_streams: Vec<[Vec<i32>; 3]> =
        indices.iter().map(|i| i.position_ids().clone()).collect();
    let positions = stack(&prompt_streams, len)?;
    let deltas: Vec<i32> = indices.iter().map(|i| i.rope_delta()).collect();
    let deltas = in_position_dtype(&int32_tensor(&deltas, &[batch, 1]), dtype)?;

    // Reference.
    let mask_values: Vec<i32> = mask.iter().map(|&m| i32::from(m)).collect();
    let images: Vec<GridThw> = prompts
        .iter()
        .flat_map(|p| p.images.iter().copied())
        .collect();
    let videos: Vec<GridThw> = prompts
        .iter()
        .flat_map(|p| p.videos.iter().copied())
        .collect();
    let mask = int32_tensor(&mask_values, &[batch, len]);
    let ids = int32_tensor(&ids, &[batch, len]);
    let prompt = reference::position::Prompt {
        input_ids: &ids,
        image_grid_thw: has_images.then_some(images.as_slice()),
        video_grid_thw: has_videos.then_some(videos.as_slice()),
    };
    let reference = match decode {
        Some((extra, n)) => {
            reference::position::position_rope_decode(ctx, &mask, prompt, len + extra, n)?
        }
        None => reference::position::position_rope_index(ctx, &mask, prompt)?,
    };

    let mut out = CaseOutput::new("pure-mlx");
    out.compare("position_ids", &positions, &reference.position_ids);
    if has_images || has_videos {
        // The proof's masked token shifts positions; the delta of a prompt
        // with vision spans follows from its grids and token count.
        out.compare_derived(
            "rope_deltas",
            &deltas,
            &reference.rope_deltas,
            "with vision spans, fixed by the grids and the token layout, constants of the case",
        );
    } else {
        out.compare("rope_deltas", &deltas, &reference.rope_deltas);
    }
    if let Some((extra, n)) = decode {
        let streams: Vec<[Vec<i32>; 3]> = indices
            .iter()
            .map(|i| i.window(len + extra, n).map_err(port))
            .collect::<Result<_, _>>()?;
        let expected = reference.decode_position_ids.as_ref().ok_or_else(|| {
            CaseError::Harness("the decode call returned no decode positions".into())
        })?;
        out.compare("decode_position_ids", &stack(&streams, n)?, expected);
    }
    Ok(out)
}
