//! `position/mrope/accepted`, `position/rope2d/accepted`: inputs the port
//! once refused while the reference computes (`crates/layers/REFUSALS.md`,
//! "Gaps closed"), each against the reference's own call on the same
//! tensors: an odd rotary dim, a base beyond f32, q of five axes, q and k
//! of different head dims, positions that broadcast (one token, four
//! streams), and 2-D RoPE inputs of three and five axes.
//!
//! The mRoPE cases run the pure-MLX path on every backend (the glue sets
//! `fused_apply = False` on a Metal build, as for CPU rows): the fused
//! kernel indexes positions by each tensor's own batch and length, so
//! broadcast positions and odd rotary dims are reference hazards there
//! (the port refuses them on that path). q, k, inputs and positions are
//! perturbed under `--perturb`; the shapes are the cases' constants.
//!
//! Every q, k, inv_freq and 2-D RoPE output is exact-checked: the
//! broadcast inputs through the 4-D models per leading index, the odd
//! rotary dim and the bases beyond f32 as the reference's formulas compute
//! them (`exact::rope`'s module doc, "What the reference computes at the
//! edges").

use layers::position::{apply_multidimensional_rope, Mrope, MropeConfig, MropePath};
use oracle::DType;

use super::{host, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const MROPE_REFERENCE: &str = "mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary \
     (pure-MLX path), built by qwen3_5.language.Qwen3_5RotaryEmbedding (mlx-vlm 0.7.6)";
const ROPE2D_REFERENCE: &str =
    "optiq.vlm.gemma4.vision.apply_multidimensional_rope (mlx-optiq 0.7.7)";

/// An mRoPE input the reference computes: the rotary, q, k and positions
/// shapes.
#[derive(Debug, Clone, Copy)]
struct MropeInput {
    name: &'static str,
    head_dim: usize,
    partial_rotary_factor: f64,
    rope_theta: f64,
    mrope_section: [usize; 3],
    q: &'static [usize],
    k: &'static [usize],
    positions: &'static [usize],
}

const MROPE: &[MropeInput] = &[
    // int(16 * 0.9375) = 15: 8 frequencies, 16 channels rotated.
    MropeInput {
        name: "odd-rotary-dim-15-head-16",
        head_dim: 16,
        partial_rotary_factor: 0.9375,
        rope_theta: 10_000.0,
        mrope_section: [3, 3, 2],
        q: &[1, 2, 4, 16],
        k: &[1, 1, 4, 16],
        positions: &[3, 1, 4],
    },
    // f32(1e39) is infinity: inv_freq [1, 0, 0, ...].
    MropeInput {
        name: "rope-theta-1e39",
        head_dim: 32,
        partial_rotary_factor: 1.0,
        rope_theta: 1e39,
        mrope_section: [6, 5, 5],
        q: &[1, 2, 4, 32],
        k: &[1, 1, 4, 32],
        positions: &[3, 1, 4],
    },
    MropeInput {
        name: "q-five-axes",
        head_dim: 32,
        partial_rotary_factor: 1.0,
        rope_theta: 10_000.0,
        mrope_section: [6, 5, 5],
        q: &[2, 1, 2, 4, 32],
        k: &[1, 1, 4, 32],
        positions: &[3, 1, 4],
    },
    // Rotary 16 of q's 32 and k's 48 channels.
    MropeInput {
        name: "head-dims-differ",
        head_dim: 32,
        partial_rotary_factor: 0.5,
        rope_theta: 10_000.0,
        mrope_section: [3, 3, 2],
        q: &[1, 2, 4, 32],
        k: &[1, 1, 4, 48],
        positions: &[3, 1, 4],
    },
    MropeInput {
        name: "one-position-for-every-token",
        head_dim: 32,
        partial_rotary_factor: 1.0,
        rope_theta: 10_000.0,
        mrope_section: [6, 5, 5],
        q: &[2, 2, 4, 32],
        k: &[2, 1, 4, 32],
        positions: &[3, 2, 1],
    },
    // The selector reads streams 0..2; the fourth is never used.
    MropeInput {
        name: "four-streams",
        head_dim: 32,
        partial_rotary_factor: 1.0,
        rope_theta: 10_000.0,
        mrope_section: [6, 5, 5],
        q: &[1, 2, 4, 32],
        k: &[1, 1, 4, 32],
        positions: &[4, 1, 4],
    },
];

/// A 2-D RoPE input the reference computes.
#[derive(Debug, Clone, Copy)]
struct Rope2dInput {
    name: &'static str,
    inputs: &'static [usize],
    positions: &'static [usize],
    base_frequency: f64,
}

const ROPE2D: &[Rope2dInput] = &[
    // [4, 2, 16] against tables [1, 4, 1, 8]: out [1, 4, 2, 16].
    Rope2dInput {
        name: "inputs-three-axes",
        inputs: &[4, 2, 16],
        positions: &[1, 4, 2],
        base_frequency: 100.0,
    },
    Rope2dInput {
        name: "inputs-five-axes",
        inputs: &[2, 1, 4, 2, 16],
        positions: &[1, 4, 2],
        base_frequency: 100.0,
    },
    Rope2dInput {
        name: "base-1e39",
        inputs: &[1, 4, 2, 16],
        positions: &[1, 4, 2],
        base_frequency: 1e39,
    },
];

/// An accepted input as data: which table and which entry.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "layer", rename_all = "snake_case", deny_unknown_fields)]
pub enum AcceptedCase {
    Mrope { input: String },
    Rope2d { input: String },
}

impl Params for AcceptedCase {
    const BUILDER: &'static str = "position/accepted";
    fn build(self, name: String) -> Case {
        match self {
            AcceptedCase::Mrope { input } => {
                Case::must_equal(name, "position/mrope", MROPE_REFERENCE, move |ctx| {
                    let found = MROPE.iter().find(|m| m.name == input);
                    run_mrope(ctx, found.ok_or_else(|| unknown(&input))?)
                })
            }
            AcceptedCase::Rope2d { input } => {
                Case::must_equal(name, "position/rope2d", ROPE2D_REFERENCE, move |ctx| {
                    let found = ROPE2D.iter().find(|r| r.name == input);
                    run_rope2d(ctx, found.ok_or_else(|| unknown(&input))?)
                })
            }
        }
    }
}

fn unknown(input: &str) -> CaseError {
    let names: Vec<&str> = MROPE
        .iter()
        .map(|m| m.name)
        .chain(ROPE2D.iter().map(|r| r.name))
        .collect();
    CaseError::Harness(format!("no accepted input `{input}`; known: {names:?}"))
}

pub fn descriptions() -> Vec<Described> {
    let mrope = MROPE.iter().map(|m| {
        described(
            format!("position/mrope/accepted/{}", m.name),
            &AcceptedCase::Mrope {
                input: m.name.into(),
            },
        )
    });
    let rope2d = ROPE2D.iter().map(|r| {
        described(
            format!("position/rope2d/accepted/{}", r.name),
            &AcceptedCase::Rope2d {
                input: r.name.into(),
            },
        )
    });
    mrope.chain(rope2d).collect()
}

fn run_mrope(ctx: &Ctx, m: &MropeInput) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let q = inputs.uniform(DType::Float32, m.q, 2.0);
    let k = inputs.uniform(DType::Float32, m.k, 2.0);
    let positions = inputs.integers(DType::Int32, m.positions, 0, 100);
    let path = MropePath::PureMlx;
    let rope = Mrope::new(MropeConfig::qwen3_5(
        m.head_dim,
        m.partial_rotary_factor,
        m.rope_theta,
        m.mrope_section.to_vec(),
    ))
    .map_err(port)?;
    let (q_port, k_port) = rope
        .apply_with_path(path, &q.to_array(), &k.to_array(), &positions.to_array())
        .map_err(port)?;
    let selector = rope.position_selector();

    let reference = reference::position::position_mrope_apply(
        ctx,
        &q,
        &k,
        &positions,
        reference::position::Rotary {
            head_dim: m.head_dim,
            partial_rotary_factor: m.partial_rotary_factor,
            rope_theta: m.rope_theta,
            mrope_section: &m.mrope_section,
        },
        path.as_str(),
    )?;
    let mut out = CaseOutput::new(reference.path.clone());
    out.compare("q", &host(&q_port)?, &reference.q);
    out.compare("k", &host(&k_port)?, &reference.k);
    if (m.rope_theta as f32).is_finite() {
        out.compare("inv_freq", &host(rope.inv_freq())?, &reference.inv_freq);
    } else {
        // Every base past f32 is infinity: a perturbed theta (the next f64
        // up) gives the same [1, 0, 0, ...] by design.
        out.compare_derived(
            "inv_freq",
            &host(rope.inv_freq())?,
            &reference.inv_freq,
            "a rope_theta beyond f32 is f32 infinity on both sides; the perturbed theta is too",
        );
    }
    out.compare(
        "position_selector",
        &super::int32_tensor(selector, &[selector.len()]),
        &reference.position_selector,
    );
    Ok(out)
}

fn run_rope2d(ctx: &Ctx, r: &Rope2dInput) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let x = inputs.uniform(DType::Float32, r.inputs, 2.0);
    let positions = inputs.integers(DType::Int32, r.positions, -1, 16);
    let y = apply_multidimensional_rope(&x.to_array(), &positions.to_array(), r.base_frequency)
        .map_err(port)?;
    let expected =
        reference::position::position_rope2d_broadcast(ctx, &x, &positions, r.base_frequency)?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare("out", &host(&y)?, &expected);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use exact::rope::Path;
    use exact::{Exact, Model};
    use oracle::{Arg, HostTensor};

    use super::*;
    use crate::exactness::faults::{inject_all, FaultKind, Variant};
    use crate::exactness::{ExactCheck, ExactClass, ExactPair, Sent};
    use crate::inputs::Inputs;
    use crate::reference::position::{
        inv_freq_exact, mrope_broadcast_exact, rope2d_broadcast_exact,
    };

    /// `y` measured against `exact` (both sides MLX's output), with every
    /// catalogue fault that applies planted: within, informative, every
    /// fault flagged. Returns the ratio and the faults planted.
    fn measured(
        at: &str,
        y: &HostTensor,
        sent: &Sent,
        f: &dyn Fn(&Sent) -> Option<Exact>,
    ) -> (f64, usize) {
        let e = f(sent).unwrap();
        assert_eq!(e.value.len(), y.len(), "{at}");
        let variants = FaultKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let value = f(&kind.mutate(sent)?)?.value;
                Some(Variant { kind, value })
            })
            .collect();
        let pair = ExactPair {
            reference: Arc::new(e.clone()),
            port: Arc::new(e),
            variants,
        };
        let c = ExactCheck::measure(y, y, &pair, true);
        assert_eq!(c.class, ExactClass::Within, "{at}: {}", c.line(at));
        assert!(c.informative, "{at}");
        let faults = inject_all(at, y, &pair);
        for fault in &faults {
            assert!(fault.flagged, "{at}: {fault:?}");
        }
        (c.reference.max_ratio, faults.len())
    }

    /// Issue 41: `odd-rotary-dim-15-head-16`, `rope-theta-1e39` (q, k,
    /// inv_freq) and `base-1e39` are within their exact bounds over 32
    /// seeds on MLX's CPU kernels (the port's apply: the same ops, bit-equal
    /// to the reference in the suite), and every planted fault that applies
    /// is flagged.
    #[test]
    fn odd_rotary_dims_and_bases_beyond_f32_are_within_and_faults_are_flagged() {
        let (mut worst, mut planted) = (0f64, 0);
        let model = Model::Cpu;
        for seed in 0..32u64 {
            for m in MROPE
                .iter()
                .filter(|m| m.name.starts_with("odd") || m.name.contains("1e39"))
            {
                let mut inputs = Inputs::new(seed);
                let q = inputs.uniform(DType::Float32, m.q, 2.0);
                let k = inputs.uniform(DType::Float32, m.k, 2.0);
                let positions = inputs.integers(DType::Int32, m.positions, 0, 100);
                let rope = Mrope::new(MropeConfig::qwen3_5(
                    m.head_dim,
                    m.partial_rotary_factor,
                    m.rope_theta,
                    m.mrope_section.to_vec(),
                ))
                .unwrap();
                let (qp, kp) = rope
                    .apply_with_path(
                        MropePath::PureMlx,
                        &q.to_array(),
                        &k.to_array(),
                        &positions.to_array(),
                    )
                    .unwrap();
                let sent = Sent::new(vec![
                    ("q", Arg::Tensor(q)),
                    ("k", Arg::Tensor(k)),
                    ("position_ids", Arg::Tensor(positions)),
                    ("head_dim", Arg::from(m.head_dim)),
                    ("partial_rotary_factor", Arg::Float(m.partial_rotary_factor)),
                    ("rope_theta", Arg::Float(m.rope_theta)),
                    (
                        "mrope_section",
                        Arg::List(m.mrope_section.iter().map(|&s| Arg::from(s)).collect()),
                    ),
                ]);
                for (which, y) in [("q", &qp), ("k", &kp)] {
                    let at = format!("seed {seed} {} {which}", m.name);
                    let (r, n) = measured(&at, &host(y).unwrap(), &sent, &|s| {
                        mrope_broadcast_exact(s, model, which, Path::PureMlx).ok()
                    });
                    worst = worst.max(r);
                    planted += n;
                }
                let dim = (m.head_dim as f64 * m.partial_rotary_factor) as usize;
                let at = format!("seed {seed} {} inv_freq", m.name);
                let (r, n) = measured(&at, &host(rope.inv_freq()).unwrap(), &sent, &|s| {
                    inv_freq_exact(&[dim], s.float("rope_theta").ok()?, model).ok()
                });
                worst = worst.max(r);
                planted += n;
            }
            for r in ROPE2D.iter().filter(|r| r.name.contains("1e39")) {
                let mut inputs = Inputs::new(seed);
                let x = inputs.uniform(DType::Float32, r.inputs, 2.0);
                let positions = inputs.integers(DType::Int32, r.positions, -1, 16);
                let y = apply_multidimensional_rope(
                    &x.to_array(),
                    &positions.to_array(),
                    r.base_frequency,
                )
                .unwrap();
                let sent = Sent::new(vec![
                    ("inputs", Arg::Tensor(x)),
                    ("positions", Arg::Tensor(positions)),
                ]);
                let at = format!("seed {seed} {}", r.name);
                let (ratio, n) = measured(&at, &host(&y).unwrap(), &sent, &|s| {
                    rope2d_broadcast_exact(s, r.base_frequency, model).ok()
                });
                worst = worst.max(ratio);
                planted += n;
            }
        }
        println!("worst ratio {worst}, {planted} faults flagged");
        assert!(worst < 1.0 && planted > 0);
    }
}
