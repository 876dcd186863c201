//! Every family's builder, by key: a case from its description
//! ([`build`]). Above every family (each family's parameters type is named
//! here), below the registry; the description types are in `describe.rs`.

use super::describe::{build_as, BuildFn, Described, Params};
use crate::case::Case;

macro_rules! builders {
    ($($t:ty),* $(,)?) => {
        /// Every builder key, in registry order.
        pub fn builders() -> Vec<&'static str> {
            vec![$(<$t as Params>::BUILDER),*]
        }
        fn builder_of(key: &str) -> Option<BuildFn> {
            $(if key == <$t as Params>::BUILDER {
                return Some(build_as::<$t> as BuildFn);
            })*
            None
        }
    };
}

builders!(
    super::smoke::SmokeCase,
    super::quantized::linear::LinearCase,
    super::quantized::lora::LoraCase,
    super::quantized::rows::RowsCase,
    super::quantized::rows_regime::RowsRegimeCase,
    super::quantized::switch::SwitchCase,
    super::quantized::checkpoint::CheckpointCase,
    super::quantized::float::FloatCase,
    super::quantized::embedding::EmbeddingCase,
    super::quantized::global_scale::GlobalScaleCase,
    super::quantized::adapters::AdapterCase,
    super::quantized::refused::RefusedCase,
    super::quantized::accepted::AcceptedCase,
    super::safetensors::SafetensorsCase,
    super::position::mrope::MropeCase,
    super::position::mrope::refused::MropeRefusedCase,
    super::position::vs_rope::VsRopeCase,
    super::position::inv_freq::InvFreqCase,
    super::position::rope_index::RopeIndexCase,
    super::position::rope2d::Rope2dCase,
    super::position::rope2d::Rope2dRefusedCase,
    super::position::accepted::AcceptedCase,
    super::attention::AttentionCase,
    super::attention::sdpa::SdpaShape,
    super::configs::ConfigCase,
    super::configs::refused::ConfigRefusedCase,
    super::model::ModelCase,
    super::model::finding::ChunkedFinding,
);

/// The case `d` describes: built by its builder from its parameters
/// alone, with its seed. An unknown builder or parameters the builder
/// cannot read is an error naming the case and what to fix.
pub fn build(d: &Described) -> Result<Case, String> {
    let Some(build) = builder_of(&d.builder) else {
        return Err(format!(
            "case `{}`: no builder `{}` (builders: {})",
            d.name,
            d.builder,
            builders().join(", ")
        ));
    };
    let mut case = build(d.name.clone(), d.params.clone()).map_err(|e| {
        format!(
            "case `{}`: builder `{}` cannot read its params: {e}",
            d.name, d.builder
        )
    })?;
    case.seed = d.seed;
    Ok(case)
}

/// [`build`], or a case under the description's name that fails with
/// why it cannot be built (never a silent skip).
pub fn build_or_failing(d: &Described) -> Case {
    build(d).unwrap_or_else(|why| {
        let mut case = Case::must_equal(
            d.name.clone(),
            "describe",
            "a case description",
            move |_| Err(crate::case::CaseError::Harness(why.clone())),
        );
        case.seed = d.seed;
        case
    })
}
