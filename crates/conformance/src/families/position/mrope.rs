//! `position/mrope`: the port's mRoPE apply against
//! `MRoPERotaryEmbedding.apply_rotary` (as `Qwen3_5RotaryEmbedding` builds
//! it), with positions from the rope index (3-D for images and videos, so
//! a wrong section layout shows), decode steps after an image prompt, the
//! selector, and the Metal kernel's source text and launch.

use layers::position::{
    interleaved_position_selector, mrope_kernel_launch, mrope_kernel_spec, rope_index, GridThw,
    Mrope, MropeConfig, MropePath, Pairing, RopeIndex, RopeIndexInput, VisionTokens,
};
use mlx_rs::Dtype;
use oracle::{Arg, DType, HostTensor};

use super::{
    build_prompt, bytes_tensor, dict, dtype_tag, grids_arg, host, int32_tensor, list_arg,
    mlx_dtype, mrope_path, port, take_str, take_tensor, Piece, Prompt, FLOAT_DTYPES,
};
use crate::case::{Backend, Case, CaseError, CaseOutput, Ctx};

const FAMILY: &str = "position/mrope";
const APPLY_REFERENCE: &str = "mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary, built by \
     qwen3_5.language.Qwen3_5RotaryEmbedding; positions from LanguageModel.get_rope_index (mlx-vlm 0.7.6)";
const SELECTOR_REFERENCE: &str =
    "mlx_vlm.models.rope_utils._interleaved_position_selector (mlx-vlm 0.7.6)";
const KERNEL_REFERENCE: &str =
    "mlx_vlm.models.rope_utils._mrope_apply_kernel -> mx.fast.metal_kernel arguments (mlx-vlm 0.7.6)";
const LAUNCH_REFERENCE: &str =
    "mlx_vlm.models.rope_utils._fast_mrope_apply kernel launch (mlx-vlm 0.7.6)";

/// A rotary configuration as the Qwen3.5 attention builds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Model {
    pub name: &'static str,
    pub head_dim: usize,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub mrope_section: [usize; 3],
    /// q heads and k heads (GQA: they differ).
    pub heads: (usize, usize),
}

impl Model {
    pub fn config(&self) -> MropeConfig {
        MropeConfig::qwen3_5(
            self.head_dim,
            self.partial_rotary_factor,
            self.rope_theta,
            self.mrope_section.to_vec(),
        )
    }

    /// The rotary arguments of the glue's `position_mrope_*` functions.
    fn args(&self) -> [Arg; 4] {
        [
            Arg::from(self.head_dim),
            Arg::from(self.partial_rotary_factor),
            Arg::from(self.rope_theta),
            list_arg(&self.mrope_section),
        ]
    }
}

/// Qwen3.5: head_dim 256, partial_rotary_factor 0.25 (rotary 64),
/// rope_theta 1e7, mrope_section [11, 11, 10] (spatial_merge_size 2 is in
/// the rope index).
pub(super) const QWEN3_5: Model = Model {
    name: "qwen3.5",
    head_dim: 256,
    partial_rotary_factor: 0.25,
    rope_theta: 1e7,
    mrope_section: [11, 11, 10],
    heads: (8, 2),
};

const MODELS: [Model; 3] = [
    QWEN3_5,
    // `qwen3_5/config.py` TextConfig's default rope_parameters.
    Model {
        name: "qwen3.5-textconfig-default",
        head_dim: 256,
        partial_rotary_factor: 0.25,
        rope_theta: 1e5,
        mrope_section: [11, 11, 10],
        heads: (4, 2),
    },
    // Full rotary (no pass-through channels), 64 frequencies.
    Model {
        name: "hd128-full-theta5e6-sec24-20-20",
        head_dim: 128,
        partial_rotary_factor: 1.0,
        rope_theta: 5e6,
        mrope_section: [24, 20, 20],
        heads: (4, 4),
    },
];

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
enum Scenario {
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

const SCENARIOS: [(&str, Scenario); 6] = [
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

pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for model in MODELS {
        for dtype in FLOAT_DTYPES {
            for (tag, scenario) in SCENARIOS {
                let name = format!("{FAMILY}/{}/{}/{tag}", model.name, dtype_tag(dtype));
                cases.push(Case::must_equal(
                    name,
                    FAMILY,
                    APPLY_REFERENCE,
                    move |ctx| run_apply(ctx, model, dtype, scenario, None),
                ));
            }
        }
    }
    // The fused kernel against the reference's fused kernel (Metal only).
    for dtype in FLOAT_DTYPES {
        for (tag, scenario) in [SCENARIOS[0], SCENARIOS[2], SCENARIOS[4]] {
            let name = format!(
                "{FAMILY}/metal-kernel/{}/{}/{tag}",
                QWEN3_5.name,
                dtype_tag(dtype)
            );
            cases.push(
                Case::must_equal(name, FAMILY, APPLY_REFERENCE, move |ctx| {
                    run_apply(ctx, QWEN3_5, dtype, scenario, Some(MropePath::MetalKernel))
                })
                .only_on(
                    &[Backend::Metal],
                    "the fused mRoPE kernel runs only on Metal",
                ),
            );
        }
    }
    cases.push(Case::must_equal(
        format!("{FAMILY}/selector/sweep"),
        FAMILY,
        SELECTOR_REFERENCE,
        run_selector_sweep,
    ));
    for pairing in [Pairing::HalfSplit, Pairing::EvenOdd] {
        for rotary_dim in [64, 128, 32] {
            for position_ndim in [3, 2] {
                let name = format!(
                    "{FAMILY}/kernel-source/{}/rot{rotary_dim}/{position_ndim}d",
                    pairing.as_str()
                );
                cases.push(Case::must_equal(
                    name,
                    FAMILY,
                    KERNEL_REFERENCE,
                    move |ctx| run_kernel_source(ctx, pairing, rotary_dim, position_ndim),
                ));
            }
        }
    }
    for (dtype, shape, rotary_dim, position_ndim) in [
        (DType::Bfloat16, [1, 16, 4, 512, 256], 64, 3),
        (DType::Float16, [2, 8, 2, 7, 256], 64, 2),
        (DType::Float32, [1, 4, 4, 33, 128], 128, 3),
    ] {
        let [b, hq, hk, l, d] = shape;
        let name =
            format!("{FAMILY}/kernel-launch/{}/B{b}-Hq{hq}-Hk{hk}-L{l}-D{d}/rot{rotary_dim}/{position_ndim}d", dtype_tag(dtype));
        cases.push(Case::must_equal(
            name,
            FAMILY,
            LAUNCH_REFERENCE,
            move |ctx| run_kernel_launch(ctx, dtype, shape, rotary_dim, position_ndim),
        ));
    }
    cases
}

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

fn run_apply(
    ctx: &Ctx,
    model: Model,
    dtype: DType,
    scenario: Scenario,
    forced: Option<MropePath>,
) -> Result<CaseOutput, CaseError> {
    let path = match forced {
        Some(path) => path,
        None => mrope_path(ctx)?,
    };
    let mut inputs = ctx.inputs();
    let (rows, text_only, offset, len): (Vec<&[Piece]>, bool, Option<usize>, Option<usize>) =
        match scenario {
            Scenario::Text { prompt } => (vec![prompt], true, None, None),
            Scenario::Prompt { rows } => (rows.to_vec(), false, None, None),
            Scenario::Decode { prompt, extra, len } => {
                let text_only = prompt.iter().all(|p| matches!(p, Piece::Text(_)));
                (vec![prompt], text_only, Some(extra), Some(len))
            }
        };
    let prompts: Vec<Prompt> = rows.iter().map(|r| build_prompt(r, &mut inputs)).collect();
    let prompt_len = prompts[0].ids.len();
    if prompts.iter().any(|p| p.ids.len() != prompt_len) {
        return Err(CaseError::Harness("batch rows differ in length".into()));
    }
    let batch = prompts.len();
    let (offset, len) = match (offset, len) {
        (Some(extra), Some(len)) => (prompt_len + extra, len),
        _ => (0, prompt_len),
    };
    let (hq, hk) = model.heads;
    let q = inputs.uniform(dtype, &[batch, hq, len, model.head_dim], 2.0);
    let k = inputs.uniform(dtype, &[batch, hk, len, model.head_dim], 2.0);

    // Port: rope index → positions → apply.
    let indices = port_indices(&prompts, text_only)?;
    let positions = port_positions(&indices, offset, len)?;
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
    let mut args = vec![
        Arg::from(q),
        Arg::from(k),
        Arg::from(ids),
        grids_arg(&images, !images.is_empty()),
        grids_arg(&videos, !videos.is_empty()),
    ];
    let function = if matches!(scenario, Scenario::Decode { .. }) {
        args.push(Arg::from(offset));
        "position_mrope_decode"
    } else {
        "position_mrope_prompt"
    };
    args.extend(model.args());
    args.push(Arg::from(path.as_str()));
    let mut reference = dict(ctx.reference(function, &args, &[])?, function)?;
    let reference_path = take_str(&mut reference, "path")?;
    if reference_path != path.as_str() {
        return Err(CaseError::Harness(format!(
            "the reference took {reference_path}, the port {}",
            path.as_str()
        )));
    }

    let mut out = CaseOutput::new(reference_path);
    out.compare("q", &host(&q_port)?, &take_tensor(&mut reference, "q")?);
    out.compare("k", &host(&k_port)?, &take_tensor(&mut reference, "k")?);
    let position_key = if matches!(scenario, Scenario::Decode { .. }) {
        "decode_position_ids"
    } else {
        "position_ids"
    };
    out.compare(
        "position_ids",
        &positions,
        &take_tensor(&mut reference, position_key)?,
    );
    out.compare(
        "rope_deltas",
        &int32_tensor(&deltas, &[batch, 1]),
        &take_tensor(&mut reference, "rope_deltas")?,
    );
    out.compare(
        "inv_freq",
        &host(mrope.inv_freq())?,
        &take_tensor(&mut reference, "inv_freq")?,
    );
    out.compare(
        "position_selector",
        &int32_tensor(selector, &[selector.len()]),
        &take_tensor(&mut reference, "position_selector")?,
    );
    Ok(out)
}

/// `(freq_dim, mrope_section)` pairs: the real sections, the class default
/// `[11, 11, 0]`, sections the frequency count clips, and small ones.
const SELECTOR_SWEEP: [(usize, [usize; 3]); 14] = [
    (32, [11, 11, 10]),
    (64, [24, 20, 20]),
    (32, [11, 11, 0]),
    (64, [16, 24, 24]),
    (16, [11, 11, 10]),
    (24, [11, 11, 10]),
    (8, [2, 3, 3]),
    (33, [11, 11, 11]),
    (1, [1, 0, 0]),
    (2, [0, 1, 1]),
    (48, [16, 16, 16]),
    (64, [0, 0, 0]),
    (128, [40, 44, 44]),
    (20, [4, 9, 7]),
];

fn run_selector_sweep(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let mut params = Vec::new();
    let mut port_values = Vec::new();
    for (freq_dim, section) in SELECTOR_SWEEP {
        params.push(freq_dim as i32);
        params.extend(section.iter().map(|&s| s as i32));
        port_values.extend(interleaved_position_selector(&section, freq_dim).map_err(port)?);
    }
    // Element 0 is a frequency count: one flipped bit changes the length.
    let params = int32_tensor(&params, &[params.len()]);
    let reference = ctx.reference_tensor("position_selectors", &[Arg::from(params)], &[])?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare(
        "selectors",
        &int32_tensor(&port_values, &[port_values.len()]),
        &reference,
    );
    Ok(out)
}

fn run_kernel_source(
    ctx: &Ctx,
    pairing: Pairing,
    rotary_dim: usize,
    position_ndim: usize,
) -> Result<CaseOutput, CaseError> {
    let spec = mrope_kernel_spec(rotary_dim, position_ndim, pairing);
    // Element 0 is rotary_dim: one flipped bit changes the source text.
    let params = int32_tensor(&[rotary_dim as i32, position_ndim as i32], &[2]);
    let function = "position_mrope_kernel_source";
    let mut reference = dict(
        ctx.reference(
            function,
            &[Arg::from(params), Arg::from(pairing.as_str())],
            &[],
        )?,
        function,
    )?;
    let mut out = CaseOutput::new("metal-kernel");
    out.compare(
        "name",
        &bytes_tensor(&spec.name),
        &take_tensor(&mut reference, "name")?,
    );
    out.compare(
        "input_names",
        &bytes_tensor(&spec.input_names.join("\0")),
        &take_tensor(&mut reference, "input_names")?,
    );
    out.compare(
        "output_names",
        &bytes_tensor(&spec.output_names.join("\0")),
        &take_tensor(&mut reference, "output_names")?,
    );
    out.compare(
        "source",
        &bytes_tensor(&spec.source),
        &take_tensor(&mut reference, "source")?,
    );
    out.compare(
        "header",
        &bytes_tensor(&spec.header),
        &take_tensor(&mut reference, "header")?,
    );
    out.compare(
        "flags",
        // ensure_row_contiguous, atomic_outputs, compile options given (the
        // port's mlx-c call passes none, as Python's default None).
        &int32_tensor(
            &[
                i32::from(spec.ensure_row_contiguous),
                i32::from(spec.atomic_outputs),
                0,
            ],
            &[3],
        ),
        &take_tensor(&mut reference, "flags")?,
    );
    Ok(out)
}

fn run_kernel_launch(
    ctx: &Ctx,
    dtype: DType,
    shape: [usize; 5],
    rotary_dim: usize,
    position_ndim: usize,
) -> Result<CaseOutput, CaseError> {
    let [b, hq, hk, l, d] = shape;
    let x_dtype = mlx_dtype(dtype)?;
    let half = rotary_dim / 2;
    let launches = [[b, hq, l, d], [b, hk, l, d]]
        .map(|s| mrope_kernel_launch(&s.map(|v| v as i32), x_dtype, half).map_err(port));
    // Element 0 is B: one flipped bit changes every grid.
    let params = int32_tensor(&shape.map(|v| v as i32), &[5]);
    let function = "position_mrope_kernel_launch";
    let reference = ctx.reference(
        function,
        &[
            Arg::from(params),
            Arg::from(dtype.name()),
            Arg::from(position_ndim),
            Arg::from(rotary_dim),
        ],
        &[],
    )?;
    let rows = reference
        .into_list()
        .ok_or_else(|| CaseError::Harness(format!("`{function}` did not return a list")))?;
    if rows.len() != 2 {
        return Err(CaseError::Harness(format!(
            "expected 2 launches (q, k), got {}",
            rows.len()
        )));
    }
    let mut out = CaseOutput::new("metal-kernel");
    for ((tensor, launch), row) in ["q", "k"].into_iter().zip(launches).zip(rows) {
        let launch = launch?;
        let mut row = dict(row, function)?;
        out.compare(
            &format!("{tensor}.grid"),
            &int32_tensor(&launch.grid, &[3]),
            &take_tensor(&mut row, "grid")?,
        );
        out.compare(
            &format!("{tensor}.threadgroup"),
            &int32_tensor(&launch.threadgroup, &[3]),
            &take_tensor(&mut row, "threadgroup")?,
        );
        let template: Vec<String> = launch
            .template
            .iter()
            .map(|(name, t)| format!("{name}={}", dtype_name(*t)))
            .collect();
        out.compare(
            &format!("{tensor}.template"),
            &bytes_tensor(&template.join(",")),
            &bytes_tensor(&take_str(&mut row, "template")?),
        );
        let shapes: Vec<i32> = launch.output_shapes.concat();
        out.compare(
            &format!("{tensor}.output_shapes"),
            &int32_tensor(&shapes, &[launch.output_shapes.len(), 4]),
            &take_tensor(&mut row, "output_shapes")?,
        );
        let port_dtypes: Vec<&str> = launch
            .output_dtypes
            .iter()
            .map(|t| dtype_name(*t))
            .collect();
        let reference_dtypes = match row.remove("output_dtypes") {
            Some(oracle::Value::List(items)) => items
                .into_iter()
                .map(|v| match v {
                    oracle::Value::Str(s) => Ok(s),
                    other => Err(CaseError::Harness(format!("output dtype {other:?}"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            other => return Err(CaseError::Harness(format!("output_dtypes is {other:?}"))),
        };
        out.compare(
            &format!("{tensor}.output_dtypes"),
            &bytes_tensor(&port_dtypes.join(",")),
            &bytes_tensor(&reference_dtypes.join(",")),
        );
        let inputs = match row.remove("inputs") {
            Some(oracle::Value::Int(n)) => n as i32,
            other => return Err(CaseError::Harness(format!("inputs is {other:?}"))),
        };
        // The port always passes [x, position_ids, inv_freq, position_selector].
        out.compare(
            &format!("{tensor}.inputs"),
            &int32_tensor(&[4], &[1]),
            &int32_tensor(&[inputs], &[1]),
        );
    }
    Ok(out)
}

/// The `mlx.core` name of a dtype (`bfloat16`, ...).
fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Float16 => "float16",
        Dtype::Float32 => "float32",
        _ => "other",
    }
}
