//! Check (b), "mRoPE vs plain RoPE for text-only input": with the three
//! position streams equal (text), mRoPE rotates every frequency by the same
//! position, exactly what `mx.fast.rope(traditional=False, dims =
//! rotary_dim, base = rope_theta, scale = 1.0)` computes in exact
//! arithmetic. The case measures where the two round differently on this
//! backend over positions 0..70000 (the reference's mRoPE path against
//! `mx.fast.rope`, and the port's mRoPE against `fast::rope` through
//! mlx-rs), and whether the port's mRoPE equals the reference's.
//!
//! Qwen3.5's rotary (rotary_dim 64 of head_dim 256, theta 1e7, section
//! [11, 11, 10]) on a head of its 64 rotated channels only: the other 192
//! channels are copies on every path (`q_pass` concatenated back;
//! `fast.rope` with `dims < D` leaves them untouched), and dropping them
//! keeps 70000 positions inside the family's time budget.

use layers::position::Mrope;
use mlx_rs::{Array, Dtype};
use oracle::{DType, HostTensor};
use serde_json::json;

use super::mrope::Model;
use super::mrope::QWEN3_5;
use super::{dtype_tag, host, int32_tensor, mlx_dtype, mrope_path, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use crate::relation::Relation;

const FAMILY: &str = "position/mrope";
const REFERENCE: &str =
    "mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary (mlx-vlm 0.7.6) vs \
     mlx.core.fast.rope (mlx 0.32.2)";

/// Positions 0..POSITIONS in one call.
const POSITIONS: usize = 70_000;

/// Qwen3.5's rotary on its rotated channels: head_dim 64, factor 1.0.
const QWEN3_5_ROTATED: Model = Model {
    head_dim: 64,
    partial_rotary_factor: 1.0,
    ..QWEN3_5
};

/// A `vs-plain-rope` finding as data (Qwen3.5's rotary, positions 0 to
/// 4096 on three equal streams).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsRopeCase {
    pub dtype: DType,
}

impl Params for VsRopeCase {
    const BUILDER: &'static str = "position/mrope/vs-plain-rope";
    fn build(self, name: String) -> Case {
        let dtype = self.dtype;
        Case::finding(name, FAMILY, REFERENCE, move |ctx| run(ctx, dtype)).glue_composed(&[
            "mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary (three equal position streams)",
            "mlx.core.fast.rope",
        ])
        .deep()
    }
}

pub fn descriptions() -> Vec<Described> {
    [DType::Bfloat16, DType::Float32]
        .into_iter()
        .map(|dtype| {
            let name = format!(
                "{FAMILY}/vs-plain-rope/{}/{}/positions-0-to-{POSITIONS}",
                QWEN3_5.name,
                dtype_tag(dtype)
            );
            described(name, &VsRopeCase { dtype })
        })
        .collect()
}

/// How `a` relates to `b` ([`Relation`], with the positions (axis 2)
/// holding a difference and the first 8 of them), and the per-position
/// mask as a uint8 tensor for the digest.
fn divergence(a: &Array, b: &Array) -> Result<(serde_json::Value, HostTensor), CaseError> {
    let differs = a.ne(b)?;
    let per_position = differs.any_axes(&[0, 1, 3], None)?.as_dtype(Dtype::Uint8)?;
    let mask = host(&per_position)?;
    let positions: Vec<usize> = (0..mask.len()).filter(|&i| mask.bytes[i] != 0).collect();
    let relation = Relation::of(&host(a)?, &host(b)?).with_positions(positions.len());
    let mut finding = relation.json();
    finding["first_positions"] = json!(positions.iter().take(8).collect::<Vec<_>>());
    Ok((finding, mask))
}

fn run(ctx: &Ctx, dtype: DType) -> Result<CaseOutput, CaseError> {
    let path = mrope_path(ctx)?;
    let model = QWEN3_5_ROTATED;
    let config = model.config();
    let rotary_dim = config.rotary_dim;
    // 4.5M values: drawn on the device (MLX's threefry, seeded by the case).
    let key = mlx_rs::random::key(ctx.seed())?;
    let shape = [1, 1, POSITIONS as i32, model.head_dim as i32];
    let q = host(
        &mlx_rs::random::uniform::<f32, f32>(-2.0, 2.0, &shape[..], &key)?
            .as_dtype(mlx_dtype(dtype)?)?,
    )?;
    let stream: Vec<i32> = (0..POSITIONS as i32).collect();
    let positions = int32_tensor(
        &[stream.as_slice(), &stream, &stream].concat(),
        &[3, 1, POSITIONS],
    );

    let q_array = q.to_array();
    let mrope = Mrope::new(config).map_err(port)?;
    let (port_mrope, _) = mrope
        .apply_with_path(path, &q_array, &q_array, &positions.to_array())
        .map_err(port)?;
    let port_rope = mlx_rs::fast::rope(
        &q_array,
        rotary_dim as i32,
        false,
        Some(model.rope_theta as f32),
        1.0,
        0,
        None,
    )?;

    let reference = reference::position::position_mrope_vs_rope(
        ctx,
        &q,
        &positions,
        model.rotary(),
        path.as_str(),
    )?;
    let (reference_path, reference_mrope, reference_rope) = (
        reference.path,
        reference.mrope.into_tensor(),
        reference.rope.into_tensor(),
    );
    let port_mrope_host = host(&port_mrope)?;
    let port_equals_reference = port_mrope_host == reference_mrope;
    let (reference_finding, reference_mask) =
        divergence(&reference_mrope.to_array(), &reference_rope.to_array())?;
    let (port_finding, port_mask) = divergence(&port_mrope, &port_rope)?;

    let mut out = CaseOutput::new(reference_path);
    out.digest("reference mask", &reference_mask);
    out.digest("port mask", &port_mask);
    Ok(out.with_finding(json!({
        "relation": "mRoPE with three equal position streams vs fast.rope(traditional=False, dims=rotary_dim, base=rope_theta, scale=1.0)",
        "config": "qwen3.5 rotary: rotary_dim 64 of head_dim 256, theta 1e7, mrope_section [11, 11, 10]; rotated channels only",
        "shape": [1, 1, POSITIONS, model.head_dim],
        "rotary_dim": rotary_dim,
        "rope_theta": model.rope_theta,
        "reference_mrope_vs_mx_fast_rope": reference_finding,
        "port_mrope_vs_mlx_rs_fast_rope": port_finding,
        "port_mrope_equals_reference_mrope": port_equals_reference,
    })))
}
