//! `configs/refused`: Qwen3.5 configs both sides refuse. Each case edits
//! `fixtures/configs/qwen3_5/Qwen3.5-0.8B/config.json` one way and reads it
//! with the port (`Qwen3_5Config::from_json`, then `mrope()` and
//! `vision_tokens()`) and with the reference (`load_model`'s config steps:
//! `ModelConfig.from_dict`, `update_module_configs`). Must-equal on
//! "refused"; the proof mode gives the reference the unedited file, which
//! it reads.

use layers::config::Qwen3_5Config;
use serde_json::Value as Json;

use super::LOAD_MODEL_STEPS;
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::families::support::{port_refused, refusal_output};
use crate::reference;

const FAMILY: &str = "configs/refused";
const REFERENCE: &str =
    "mlx_vlm.models.qwen3_5.config.ModelConfig.from_dict / TextConfig.__post_init__ (mlx-vlm 0.7.6)";

/// `(edit, the reference's message, the port's ConfigError variant)`.
pub const REFUSED: &[(&str, &str, &str)] = &[
    // rope_parameters without mrope_section.
    (
        "rope-parameters-without-mrope-section",
        "rope_parameters must contain keys",
        "RopeParametersIncomplete",
    ),
    // text_config without hidden_size (a field TextConfig has no default for).
    (
        "text-config-without-hidden-size",
        "missing 1 required",
        "MissingKey",
    ),
];

/// A refused config as data ([`REFUSED`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRefusedCase {
    edit: String,
}

impl Params for ConfigRefusedCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| run(ctx, &self.edit))
            .glue_composed(LOAD_MODEL_STEPS)
    }
}

pub fn descriptions() -> Vec<Described> {
    REFUSED
        .iter()
        .map(|&(edit, _, _)| {
            described(
                format!("{FAMILY}/Qwen3.5-0.8B/{edit}"),
                &ConfigRefusedCase { edit: edit.into() },
            )
        })
        .collect()
}

fn run(ctx: &Ctx, edit: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = REFUSED
        .iter()
        .find(|r| r.0 == edit)
        .ok_or_else(|| CaseError::Harness(format!("`{edit}` is none of {REFUSED:?}")))?;
    let path = crate::home::Home::get()
        .fixtures_dir()
        .join("configs/qwen3_5/Qwen3.5-0.8B/config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| CaseError::harness(&format!("reading {}", path.display()), e))?;
    let mut json: Json = serde_json::from_str(&text)
        .map_err(|e| CaseError::harness(&format!("parsing {}", path.display()), e))?;
    let text_config = json
        .get_mut("text_config")
        .and_then(Json::as_object_mut)
        .ok_or_else(|| CaseError::Harness("the fixture has no text_config".into()))?;
    let removed = match edit {
        "rope-parameters-without-mrope-section" => text_config
            .get_mut("rope_parameters")
            .and_then(Json::as_object_mut)
            .and_then(|r| r.remove("mrope_section")),
        "text-config-without-hidden-size" => text_config.remove("hidden_size"),
        other => return Err(CaseError::Harness(format!("no edit `{other}`"))),
    };
    if removed.is_none() {
        return Err(CaseError::Harness(format!(
            "`{edit}`: the fixture lacks the key"
        )));
    }
    let edited = json.to_string();
    let map = json
        .as_object()
        .ok_or_else(|| CaseError::Harness("the fixture is not an object".into()))?;
    let port_said = port_refused(
        Qwen3_5Config::from_json(map).and_then(|c| {
            c.mrope()?;
            c.vision_tokens()?;
            Ok(())
        }),
        variant,
    )?;
    let given = if ctx.perturbed() { &text } else { &edited };
    let reference = reference::refusal(reference::configs::config_qwen3_5(ctx, given), expected)?;
    refusal_output(ctx, "mlx-vlm", port_said, reference)
}
