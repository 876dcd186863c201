//! Case families: every family is one entry of the `families!` list
//! below. The registry, a value that adds the kept cases and explorer
//! samples to these, is [`crate::registry::Registry`].

use crate::case::Case;
use describe::Described;

pub mod describe;
pub(crate) mod support;

/// Declares every case family in one place: its module, and the
/// parameters types it builds cases from (each with its `BUILDER` key).
/// From this one list come the modules, [`fixed_descriptions`] (each
/// module's `descriptions()`, in this order) and the builder dispatch
/// ([`build`]). Adding a family is one entry here.
macro_rules! families {
    ($($family:ident: [$($params:ty),* $(,)?]),* $(,)?) => {
        $(pub mod $family;)*

        /// The fixed cases' descriptions, in report order.
        pub fn fixed_descriptions() -> Vec<describe::Described> {
            let mut cases = Vec::new();
            $(cases.extend($family::descriptions());)*
            cases
        }

        /// Every builder key, in registry order.
        pub fn builders() -> Vec<&'static str> {
            vec![$($(<$params as describe::Params>::BUILDER,)*)*]
        }

        fn builder_of(key: &str) -> Option<describe::BuildFn> {
            $($(if key == <$params as describe::Params>::BUILDER {
                return Some(describe::build_as::<$params> as describe::BuildFn);
            })*)*
            None
        }
    };
}

families! {
    smoke: [
        smoke::SmokeCase,
    ],
    quantized: [
        quantized::linear::LinearCase,
        quantized::lora::LoraCase,
        quantized::rows::RowsCase,
        quantized::rows_regime::RowsRegimeCase,
        quantized::switch::SwitchCase,
        quantized::checkpoint::CheckpointCase,
        quantized::float::FloatCase,
        quantized::embedding::EmbeddingCase,
        quantized::global_scale::GlobalScaleCase,
        quantized::adapters::AdapterCase,
        quantized::refused::RefusedCase,
        quantized::accepted::AcceptedCase,
    ],
    safetensors: [
        safetensors::SafetensorsCase,
    ],
    position: [
        position::mrope::MropeCase,
        position::mrope::refused::MropeRefusedCase,
        position::vs_rope::VsRopeCase,
        position::inv_freq::InvFreqCase,
        position::rope_index::RopeIndexCase,
        position::rope2d::Rope2dCase,
        position::rope2d::Rope2dRefusedCase,
        position::accepted::AcceptedCase,
    ],
    attention: [
        attention::AttentionCase,
        attention::sdpa::SdpaShape,
    ],
    configs: [
        configs::ConfigCase,
        configs::refused::ConfigRefusedCase,
    ],
    model: [
        model::ModelCase,
        model::finding::ChunkedFinding,
        model::verify::VerifyCase,
        model::finding::BlockFinding,
        model::finding::PackagesFinding,
        model::finding::BatchFinding,
    ],
}

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

pub use crate::case::Tier;

#[cfg(test)]
mod refusal_table {
    /// Every case `crates/layers/REFUSALS.md` names (its last column) is a
    /// registered case.
    #[test]
    fn every_case_the_refusal_table_names_is_registered() {
        let table = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../layers/REFUSALS.md"),
        )
        .unwrap();
        let registered: std::collections::BTreeSet<String> = super::fixed_descriptions()
            .into_iter()
            .map(|d| d.name)
            .collect();
        let mut named = 0;
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let last = row.trim_end_matches('|').rsplit('|').next().unwrap_or("");
            for case in last.split('`').skip(1).step_by(2) {
                named += 1;
                assert!(
                    registered.contains(case),
                    "REFUSALS.md names `{case}`, no such case"
                );
            }
        }
        assert!(named > 0, "REFUSALS.md names no case");
    }
}
