//! `position/mrope`: the port's mRoPE apply against
//! `MRoPERotaryEmbedding.apply_rotary` (as `Qwen3_5RotaryEmbedding` builds
//! it), with positions from the rope index (3-D for images and videos, so
//! a wrong section layout shows), decode steps after an image prompt, the
//! selector, and the Metal kernel's source text and launch.
//!
//! - [`apply`]: the apply after a prompt's rope index (prefill, decode).
//! - [`selector`]: the interleaved position selector over a sweep.
//! - [`kernel`]: the Metal kernel's source text and launch geometry.

mod apply;
mod kernel;
pub mod refused;
mod selector;
pub mod shape;

use layers::position::{MropeConfig, MropePath, Pairing};
use oracle::DType;

use super::{dtype_tag, FLOAT_DTYPES};
use crate::case::{Backend, Case};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use apply::SCENARIOS;
use kernel::{run_kernel_launch, run_kernel_source};
use selector::run_selector_sweep;

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
    pub fn rotary(&self) -> reference::position::Rotary<'_> {
        reference::position::Rotary {
            head_dim: self.head_dim,
            partial_rotary_factor: self.partial_rotary_factor,
            rope_theta: self.rope_theta,
            mrope_section: &self.mrope_section,
        }
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

/// A model runs these pieces in sequence inside its forward; no single
/// reference function returns the positions and the rotated q, k together.
const APPLY_PIECES: &[&str] = &[
    "mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index (prefill positions)",
    "mlx_vlm.models.qwen3_5.language.LanguageModel.__call__ (decode positions at the cache offset)",
    "mlx_vlm.models.rope_utils.MRoPERotaryEmbedding.apply_rotary",
];

/// A `position/mrope` case as data.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MropeCase {
    /// Must-equal: the port's apply against the reference's, on the path
    /// the backend takes.
    Apply(shape::MropeShape),
    /// Must-equal (Metal only): the fused kernel against the reference's.
    MetalKernel(shape::MropeShape),
    /// Must-equal: the interleaved position selector over a sweep.
    SelectorSweep,
    /// Must-equal: the kernel source and arguments the reference builds.
    KernelSource {
        #[serde(with = "pairing")]
        pairing: Pairing,
        rotary_dim: usize,
        position_ndim: usize,
    },
    /// Must-equal: one launch of the reference's kernel, `[B, Hq, Hk, L, D]`.
    KernelLaunch {
        dtype: DType,
        shape: [usize; 5],
        rotary_dim: usize,
        position_ndim: usize,
    },
}

/// `Pairing` as its reference spelling (`half_split`, `even_odd`).
mod pairing {
    use layers::position::Pairing;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Pairing, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Pairing, D::Error> {
        let text = String::deserialize(d)?;
        [Pairing::HalfSplit, Pairing::EvenOdd]
            .into_iter()
            .find(|p| p.as_str() == text)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("pairing `{text}`: half_split or even_odd"))
            })
    }
}

impl Params for MropeCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            MropeCase::Apply(shape) => shape.case_named(name),
            MropeCase::MetalKernel(shape) => shape
                .case_forced(name, MropePath::MetalKernel)
                .glue_composed(APPLY_PIECES)
                .only_on(
                    &[Backend::Metal],
                    "the fused mRoPE kernel runs only on Metal",
                ),
            MropeCase::SelectorSweep => {
                Case::must_equal(name, FAMILY, SELECTOR_REFERENCE, run_selector_sweep)
            }
            MropeCase::KernelSource {
                pairing,
                rotary_dim,
                position_ndim,
            } => Case::must_equal(name, FAMILY, KERNEL_REFERENCE, move |ctx| {
                run_kernel_source(ctx, pairing, rotary_dim, position_ndim)
            }),
            MropeCase::KernelLaunch {
                dtype,
                shape,
                rotary_dim,
                position_ndim,
            } => Case::must_equal(name, FAMILY, LAUNCH_REFERENCE, move |ctx| {
                run_kernel_launch(ctx, dtype, shape, rotary_dim, position_ndim)
            }),
        }
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    // The apply cases: `MropeShape`s (the explorer's data) under their
    // fixed names.
    for model in MODELS {
        for dtype in FLOAT_DTYPES {
            for (tag, scenario) in SCENARIOS {
                let name = format!("{FAMILY}/{}/{}/{tag}", model.name, dtype_tag(dtype));
                let shape = shape::MropeShape::fixed(&model, dtype, scenario);
                cases.push(described(name, &MropeCase::Apply(shape)));
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
            let shape = shape::MropeShape::fixed(&QWEN3_5, dtype, scenario);
            cases.push(described(name, &MropeCase::MetalKernel(shape)));
        }
    }
    cases.push(described(
        format!("{FAMILY}/selector/sweep"),
        &MropeCase::SelectorSweep,
    ));
    for pairing in [Pairing::HalfSplit, Pairing::EvenOdd] {
        for rotary_dim in [64, 128, 32] {
            for position_ndim in [3, 2] {
                let name = format!(
                    "{FAMILY}/kernel-source/{}/rot{rotary_dim}/{position_ndim}d",
                    pairing.as_str()
                );
                cases.push(described(
                    name,
                    &MropeCase::KernelSource {
                        pairing,
                        rotary_dim,
                        position_ndim,
                    },
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
        cases.push(described(
            name,
            &MropeCase::KernelLaunch {
                dtype,
                shape,
                rotary_dim,
                position_ndim,
            },
        ));
    }
    cases.extend(refused::descriptions());
    cases
}
