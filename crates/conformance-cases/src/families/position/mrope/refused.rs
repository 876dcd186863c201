//! `position/mrope/refused`: mRoPE configurations both sides refuse, applied
//! to a text prompt of 4 tokens (q `[1, 2, 4, 32]`, k `[1, 1, 4, 32]`, f32),
//! and q / positions both sides refuse, applied directly.
//! The proof mode gives the reference a valid configuration (head_dim 32,
//! section `[6, 5, 5]`: its 16 frequencies), on which it computes.

use layers::position::{Mrope, MropeConfig};
use oracle::DType;

use super::super::{int32_tensor, mrope_path};
use super::{APPLY_REFERENCE, FAMILY};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::families::support::{port_refused, refusal_output};
use crate::reference;

/// `(what is broken, the reference's message, the port's variant)`.
pub const REFUSED: &[(&str, &str, &str)] = &[
    // Two entries: the interleaved selector reads entry 2.
    (
        "section-of-two",
        "list index out of range",
        "MropeSectionTooShort",
    ),
    // rotary_dim 64 for q and k of head dim 32.
    (
        "rotary-dim-past-head-dim",
        "broadcast_shapes",
        "RotaryDimExceedsHeadDim",
    ),
    // Positions [1, 5] for q and k of 4 tokens (the direct apply).
    (
        "position-ids-of-another-length",
        "broadcast_shapes",
        "PositionIdsShape",
    ),
    // q [2, 4, 48]: three axes, 16 pass-through channels (the direct apply).
    ("q-three-axes", "concatenate", "Rank"),
];

/// A refused mRoPE configuration as data ([`REFUSED`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MropeRefusedCase {
    broken: String,
}

impl Params for MropeRefusedCase {
    const BUILDER: &'static str = "position/mrope/refused";
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, APPLY_REFERENCE, move |ctx| {
            run(ctx, &self.broken)
        })
    }
}

pub fn descriptions() -> Vec<Described> {
    REFUSED
        .iter()
        .map(|&(broken, _, _)| {
            described(
                format!("{FAMILY}/refused/{broken}"),
                &MropeRefusedCase {
                    broken: broken.into(),
                },
            )
        })
        .collect()
}

const HEAD_DIM: usize = 32;
const THETA: f64 = 10_000.0;
const VALID_SECTION: [usize; 3] = [6, 5, 5];

fn run(ctx: &Ctx, broken: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = REFUSED
        .iter()
        .find(|r| r.0 == broken)
        .ok_or_else(|| CaseError::Harness(format!("`{broken}` is none of {REFUSED:?}")))?;
    let (config_head_dim, section): (usize, &[usize]) = match broken {
        "section-of-two" => (HEAD_DIM, &[8, 8]),
        "rotary-dim-past-head-dim" => (2 * HEAD_DIM, &[11, 11, 10]),
        "position-ids-of-another-length" | "q-three-axes" => {
            return run_direct(ctx, broken, expected, variant)
        }
        other => return Err(CaseError::Harness(format!("no breakage `{other}`"))),
    };
    let mut inputs = ctx.inputs();
    let q = inputs.uniform(DType::Float32, &[1, 2, 4, HEAD_DIM], 1.0);
    let k = inputs.uniform(DType::Float32, &[1, 1, 4, HEAD_DIM], 1.0);
    let ids = inputs.integers(DType::Int32, &[1, 4], 1_000, 200_000);
    let path = mrope_path(ctx)?;

    let positions = int32_tensor(&[0, 1, 2, 3], &[1, 4]).to_array();
    let port_said = port_refused(
        Mrope::new(MropeConfig::qwen3_5(
            config_head_dim,
            1.0,
            THETA,
            section.to_vec(),
        ))
        .and_then(|m| m.apply_with_path(path, &q.to_array(), &k.to_array(), &positions)),
        variant,
    )?;

    let (head_dim, section) = if ctx.perturbed() {
        (HEAD_DIM, &VALID_SECTION[..])
    } else {
        (config_head_dim, section)
    };
    let reference = reference::refusal(
        reference::position::position_mrope_prompt(
            ctx,
            &q,
            &k,
            reference::position::Prompt {
                input_ids: &ids,
                image_grid_thw: None,
                video_grid_thw: None,
            },
            reference::position::Rotary {
                head_dim,
                partial_rotary_factor: 1.0,
                rope_theta: THETA,
                mrope_section: section,
            },
            path.as_str(),
        ),
        expected,
    )?;
    refusal_output(ctx, path.as_str(), port_said, reference)
}

/// A breakage of the tensors rather than the rotary: the port's apply and
/// the reference's `apply_rotary` on the same q, k and positions (the
/// proof gives the reference the unbroken tensors).
fn run_direct(
    ctx: &Ctx,
    broken: &str,
    expected: &str,
    variant: &str,
) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let (q_shape, bad_q_shape, bad_len): (&[usize], &[usize], usize) = match broken {
        "position-ids-of-another-length" => (&[1, 2, 4, 32], &[1, 2, 4, 32], 5),
        _ => (&[1, 2, 4, 48], &[2, 4, 48], 4),
    };
    let q = inputs.uniform(DType::Float32, q_shape, 1.0);
    let bad_q = oracle::HostTensor::new(DType::Float32, bad_q_shape.to_vec(), q.bytes.clone())?;
    let k = inputs.uniform(DType::Float32, &[1, 1, 4, 32], 1.0);
    let positions = inputs.integers(DType::Int32, &[1, 4], 0, 100);
    let bad_positions = inputs.integers(DType::Int32, &[1, bad_len], 0, 100);
    let path = mrope_path(ctx)?;
    let rotary = (HEAD_DIM, 1.0, THETA, VALID_SECTION);
    let port_said = port_refused(
        Mrope::new(MropeConfig::qwen3_5(
            rotary.0,
            rotary.1,
            rotary.2,
            rotary.3.to_vec(),
        ))
        .and_then(|m| {
            m.apply_with_path(
                path,
                &bad_q.to_array(),
                &k.to_array(),
                &bad_positions.to_array(),
            )
        }),
        variant,
    )?;
    let (given_q, given_positions) = if ctx.perturbed() {
        (&q, &positions)
    } else {
        (&bad_q, &bad_positions)
    };
    let reference = reference::refusal(
        reference::position::position_mrope_apply(
            ctx,
            given_q,
            &k,
            given_positions,
            reference::position::Rotary {
                head_dim: rotary.0,
                partial_rotary_factor: rotary.1,
                rope_theta: rotary.2,
                mrope_section: &rotary.3,
            },
            path.as_str(),
        )
        .map(|r| r.q),
        expected,
    )?;
    refusal_output(ctx, path.as_str(), port_said, reference)
}
