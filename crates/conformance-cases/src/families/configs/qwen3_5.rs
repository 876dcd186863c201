//! Qwen3.5 configs: the text config and vision tokens as read, then the
//! rope index and mRoPE at the model's head_dim, heads, theta and
//! sections.

use std::path::PathBuf;

use layers::config::{Qwen3_5Config, RopeTheta};
use layers::position::{rope_index, GridThw, Mrope, RopeIndexInput};
use oracle::DType;
use serde_json::Value as Json;

use super::{
    case_shape, f64_bits, int64, models, read_text, register, ConfigCase, ConfigCheck,
    LOAD_MODEL_STEPS,
};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described};
use crate::families::position::{build_prompt_for, in_position_dtype, mrope_path, Piece};
use crate::families::support::{host, int32_tensor, port};
use crate::reference;

const FAMILY: &str = "configs/qwen3_5";
const READ_REFERENCE: &str = "mlx_vlm.models.qwen3_5.config / qwen3_5_moe.config ModelConfig, TextConfig, VisionConfig (mlx-vlm 0.7.6), as mlx_vlm.utils.load_model builds them";
const MROPE_REFERENCE: &str = "mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index with the config, then Qwen3_5RotaryEmbedding.apply_rotary as Qwen3_5Attention builds it (mlx-vlm 0.7.6)";

/// A prompt with an image and a two-frame video between text.
const PROMPT: [Piece; 5] = [
    Piece::Text(3),
    Piece::Image(GridThw::new(1, 8, 8)),
    Piece::Text(2),
    Piece::Video(GridThw::new(2, 4, 4)),
    Piece::Text(3),
];

/// Spellings a real config could have but the shipped ones do not, each
/// applied to `VARIANT_BASE`'s config: the port must read them as the
/// reference does.
const VARIANT_BASE: &str = "Qwen3.5-0.8B";
type Edit = fn(&mut Json);
const VARIANTS: [(&str, Edit); 7] = [
    // rope_theta as a JSON float (every shipped config writes an integer).
    ("theta-float", |c| {
        c["text_config"]["rope_parameters"]["rope_theta"] = Json::from(10_000_000.0)
    }),
    // `type` instead of `rope_type`.
    ("type-key", |c| {
        let rope = c["text_config"]["rope_parameters"]
            .as_object_mut()
            .expect("an object");
        let t = rope.remove("rope_type").unwrap_or(Json::Null);
        rope.insert("type".into(), t);
    }),
    // The older spelling: `rope_scaling` + top-level `rope_theta`, no
    // `rope_parameters`. mlx-vlm ignores both and takes its dataclass
    // default (theta 100000): a finding about the reference, mirrored.
    ("rope-scaling-spelling", |c| {
        let text = c["text_config"].as_object_mut().expect("an object");
        let rope = text.remove("rope_parameters").unwrap_or(Json::Null);
        text.insert("rope_theta".into(), rope["rope_theta"].clone());
        text.insert("rope_scaling".into(), rope);
    }),
    // Half the head rotated: 128 rotary dims.
    ("partial-0.5", |c| {
        c["text_config"]["rope_parameters"]["partial_rotary_factor"] = Json::from(0.5)
    }),
    // Keys the reference checks for presence but never reads, with values
    // of other types (the port once refused them: REFUSALS.md).
    ("unread-keys-of-other-types", |c| {
        let rope = &mut c["text_config"]["rope_parameters"];
        rope["rope_type"] = Json::from(3);
        rope["mrope_interleaved"] = Json::from("yes");
    }),
    // A Python bool is an int: base True is 1.
    ("rope-theta-true", |c| {
        c["text_config"]["rope_parameters"]["rope_theta"] = Json::from(true)
    }),
    // No vision_config: mlx-vlm's VisionConfig defaults (spatial_merge_size 2).
    ("no-vision-config", |c| {
        c.as_object_mut()
            .expect("an object")
            .remove("vision_config");
    }),
];

/// A config to read: a shipped file, or a variant of one.
#[derive(Clone)]
struct Source {
    path: PathBuf,
    edit: Option<Edit>,
}

impl Source {
    /// The config text both sides read.
    fn text(&self) -> Result<String, CaseError> {
        let text = read_text(&self.path)?;
        let Some(edit) = self.edit else {
            return Ok(text);
        };
        let mut json: Json = serde_json::from_str(&text)
            .map_err(|e| CaseError::Harness(format!("{}: {e}", self.path.display())))?;
        edit(&mut json);
        Ok(json.to_string())
    }

    fn parse(&self) -> Result<(Qwen3_5Config, String), CaseError> {
        let text = self.text()?;
        let config = match self.edit {
            None => Qwen3_5Config::from_file(&self.path).map_err(port)?,
            Some(_) => {
                let map =
                    layers::config::parse_config_json(text.as_bytes(), &self.path).map_err(port)?;
                Qwen3_5Config::from_json(&map).map_err(port)?
            }
        };
        Ok((config, text))
    }
}

/// The Qwen3.5 configs of real quantized conversions
/// (`fixtures/configs/quantized/`), read like the others; one that cannot
/// be read is kept, so its cases fail loudly.
fn quantized_models() -> Vec<(String, PathBuf)> {
    models("quantized")
        .into_iter()
        .filter(|(_, path)| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<Json>(&t).ok())
                .and_then(|c| c["model_type"].as_str().map(|m| m.starts_with("qwen3_5")))
                .unwrap_or(true)
        })
        .collect()
}

pub(super) fn descriptions() -> Vec<Described> {
    // (case stem, folder, model, variant), sorted by stem.
    let mut sources: Vec<(String, &str, String, Option<&str>)> = Vec::new();
    let quantized = quantized_models();
    let folders = models("qwen3_5")
        .into_iter()
        .map(|m| ("qwen3_5", m))
        .chain(quantized.iter().cloned().map(|m| ("quantized", m)));
    for (dir, (model, _)) in folders {
        if model == VARIANT_BASE {
            for (variant, _) in VARIANTS {
                sources.push((
                    format!("{model}+{variant}"),
                    dir,
                    model.clone(),
                    Some(variant),
                ));
            }
        }
        sources.push((model.clone(), dir, model, None));
    }
    sources.sort_by(|a, b| a.0.cmp(&b.0));
    let mut cases = Vec::new();
    for (stem, dir, model, variant) in sources {
        let config = ConfigCase {
            dir: dir.into(),
            model,
            variant: variant.map(str::to_owned),
            check: ConfigCheck::Read,
        };
        register(&mut cases, FAMILY, &stem, &config, "mrope");
        cases.push(described(
            format!("{FAMILY}/{stem}/mlx-lm-vs-mlx-vlm"),
            &ConfigCase {
                check: ConfigCheck::MlxLmVsMlxVlm,
                ..config.clone()
            },
        ));
        if dir == "quantized" {
            cases.push(described(
                format!("{FAMILY}/{stem}/quantization-keys"),
                &ConfigCase {
                    check: ConfigCheck::QuantizationKeys,
                    ..config
                },
            ));
        }
    }
    cases
}

/// The case of a Qwen3.5 config at `path`, edited by `variant`.
pub(super) fn build(
    name: String,
    path: PathBuf,
    variant: Option<String>,
    check: ConfigCheck,
) -> Case {
    let edit = match variant.as_deref() {
        None => None,
        Some(v) => match VARIANTS.iter().find(|(name, _)| *name == v) {
            Some((_, edit)) => Some(*edit),
            None => {
                let known: Vec<&str> = VARIANTS.iter().map(|(n, _)| *n).collect();
                return super::failing(name, format!("variant `{v}`: one of {}", known.join(", ")));
            }
        },
    };
    let s = Source { path, edit };
    match check {
        ConfigCheck::Read => {
            Case::must_equal(name, FAMILY, READ_REFERENCE, move |ctx| run_read(ctx, &s))
                .glue_composed(LOAD_MODEL_STEPS)
        }
        ConfigCheck::Apply { dtype } => {
            Case::must_equal(name, FAMILY, MROPE_REFERENCE, move |ctx| {
                run_mrope(ctx, &s, dtype)
            })
            .glue_composed(LOAD_MODEL_STEPS)
        }
        ConfigCheck::MlxLmVsMlxVlm => {
            Case::finding(name, FAMILY, LIBRARIES_REFERENCE, move |ctx| {
                run_libraries(ctx, &s)
            })
        }
        ConfigCheck::QuantizationKeys => Case::finding(name, FAMILY, KEYS_REFERENCE, move |ctx| {
            run_quantization_keys(ctx, &s)
        }),
    }
}

const LIBRARIES_REFERENCE: &str = "mlx_vlm.models.qwen3_5 TextConfig (mlx-vlm 0.7.6) vs mlx_lm.models.qwen3_5 TextModelArgs (mlx-lm 0.32.2) on the same config.json";
const KEYS_REFERENCE: &str = "mlx_lm.utils.load_model reads config[\"quantization\"] as written (mlx-lm 0.32.2); mlx_vlm.utils.load_model takes ModelConfig.quantization, renamed by qwen3_5.config.sanitize_quantization_config (mlx-vlm 0.7.6)";

/// Every `rope_theta` the file writes in its text config, by dotted key.
fn written_thetas(text: &str) -> serde_json::Map<String, Json> {
    let mut found = serde_json::Map::new();
    let Ok(config) = serde_json::from_str::<Json>(text) else {
        return found;
    };
    for (key, value) in [
        ("rope_theta", &config["rope_theta"]),
        (
            "text_config.rope_theta",
            &config["text_config"]["rope_theta"],
        ),
        (
            "text_config.rope_parameters.rope_theta",
            &config["text_config"]["rope_parameters"]["rope_theta"],
        ),
        (
            "text_config.rope_scaling.rope_theta",
            &config["text_config"]["rope_scaling"]["rope_theta"],
        ),
    ] {
        if !value.is_null() {
            found.insert(key.into(), value.clone());
        }
    }
    found
}

fn int64s(t: &oracle::HostTensor) -> Vec<i64> {
    (0..t.len()).map(|i| t.bits(i) as i64).collect()
}

fn f64s(t: &oracle::HostTensor) -> Vec<f64> {
    (0..t.len()).map(|i| f64::from_bits(t.bits(i))).collect()
}

/// Finding: what mlx-vlm's and mlx-lm's config classes make of the same
/// file (head_dim, rotary dims, theta, partial rotary factor), next to
/// every theta the file writes. Two reference paths that should agree.
fn run_libraries(ctx: &Ctx, source: &Source) -> Result<CaseOutput, CaseError> {
    let text = source.text()?;
    let vlm = reference::configs::config_qwen3_5(ctx, &text)?;
    let lm = reference::configs::config_qwen3_5_mlx_lm(ctx, &text)?;
    let vlm_fields = int64s(vlm.fields.tensor());
    let vlm_floats = f64s(vlm.floats.tensor());
    let lm_fields = int64s(lm.fields.tensor());
    let lm_floats = f64s(lm.floats.tensor());
    let agree = vlm_fields.get(..2) == Some(&lm_fields[..]) && vlm_floats == lm_floats;
    let written = written_thetas(&text);
    let used = vlm_floats.first().copied();
    let file_theta_used = written
        .values()
        .any(|v| v.as_f64().is_some() && v.as_f64() == used);
    let library = |fields: &[i64], floats: &[f64]| {
        serde_json::json!({
            "head_dim": fields.first(),
            "rotary_dims": fields.get(1),
            "rope_theta": floats.first(),
            "partial_rotary_factor": floats.get(1),
        })
    };
    let mut lm_json = library(&lm_fields, &lm_floats);
    lm_json["rope_type"] = Json::from(lm.rope_type);
    lm_json["mrope_section"] =
        Json::from("not read (mlx-lm's rotary is initialize_rope's, text positions)");
    let mut vlm_json = library(&vlm_fields, &vlm_floats);
    vlm_json["mrope_section"] = Json::from(int64s(vlm.mrope_section.tensor()));
    let mut out = CaseOutput::new("config");
    out.digest("mlx-vlm fields", vlm.fields.tensor());
    out.digest("mlx-lm fields", lm.fields.tensor());
    Ok(out.with_finding(serde_json::json!({
        "libraries_agree": agree,
        "mlx_vlm": vlm_json,
        "mlx_lm": lm_json,
        "written_rope_theta": written,
        "file_theta_used": file_theta_used,
    })))
}

/// Finding: the per-path keys of a real conversion's quantization block
/// as mlx-lm's loader reads them (as written) and as mlx-vlm's does
/// (renamed from HF paths to the MLX model's module paths).
fn run_quantization_keys(ctx: &Ctx, source: &Source) -> Result<CaseOutput, CaseError> {
    let text = source.text()?;
    let keys = reference::configs::config_quantization_keys(ctx, &text)?;
    let top_level = ["group_size", "bits", "mode"];
    let per_path: Vec<(&String, &String)> = keys
        .written
        .iter()
        .zip(&keys.mlx_vlm)
        .filter(|(w, _)| !top_level.contains(&w.as_str()))
        .collect();
    let renamed: Vec<_> = per_path.iter().filter(|(w, v)| w != v).collect();
    let examples: Vec<Json> = renamed
        .iter()
        .take(3)
        .map(|(w, v)| serde_json::json!({"written (mlx-lm)": w, "mlx-vlm": v}))
        .collect();
    let mut out = CaseOutput::new("config");
    let joined = |k: &[String]| k.join("\n").into_bytes();
    out.digest(
        "mlx-vlm keys",
        &oracle::HostTensor::new(
            oracle::DType::Uint8,
            vec![joined(&keys.mlx_vlm).len()],
            joined(&keys.mlx_vlm),
        )?,
    );
    Ok(out.with_finding(serde_json::json!({
        "keys": keys.written.len(),
        "same_count": keys.written.len() == keys.mlx_vlm.len(),
        "per_path_entries": per_path.len(),
        "renamed_by_mlx_vlm": renamed.len(),
        "examples": examples,
    })))
}

/// What the port reads from a Qwen3.5 config, as `config_qwen3_5`
/// returns it (the linked case and the port candidate's `qwen3_5_config`).
pub struct ReadFields {
    /// head_dim, rotary_dim, image/video/vision-start token ids,
    /// spatial_merge_size, heads, KV heads, hidden_size, layers.
    pub fields: [i64; 10],
    pub mrope_section: Vec<i64>,
    /// rope_theta, partial_rotary_factor.
    pub floats: [f64; 2],
    /// Whether rope_theta was a JSON integer.
    pub theta_is_int: i64,
}

/// The port's [`ReadFields`] of `c`.
pub fn read_fields(c: &layers::config::Qwen3_5Config) -> Result<ReadFields, CaseError> {
    let mrope = c.mrope().map_err(port)?;
    let tokens = c.vision_tokens().map_err(port)?;
    let fields = [
        c.head_dim,
        mrope.rotary_dim,
        tokens.image_token_id as usize,
        tokens.video_token_id as usize,
        tokens.vision_start_token_id as usize,
        tokens.spatial_merge_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.hidden_size,
        c.num_hidden_layers,
    ]
    .map(|v| v as i64);
    Ok(ReadFields {
        fields,
        mrope_section: c.rope.mrope_section.iter().map(|&v| v as i64).collect(),
        floats: [c.rope.rope_theta.as_f64(), c.rope.partial_rotary_factor],
        theta_is_int: i64::from(matches!(c.rope.rope_theta, RopeTheta::Int(_))),
    })
}

fn run_read(ctx: &Ctx, source: &Source) -> Result<CaseOutput, CaseError> {
    let (c, text) = source.parse()?;
    let ReadFields {
        fields,
        mrope_section: section,
        floats,
        theta_is_int,
    } = read_fields(&c)?;

    let r = reference::configs::config_qwen3_5(ctx, &text)?;
    let mut out = CaseOutput::new("config");
    out.compare("fields", &int64(&fields), &r.fields);
    if c.defaults_used
        .iter()
        .any(|k| k == "text_config.rope_parameters")
    {
        // No number of the file reaches the dataclass default.
        let why = "mlx-vlm's default rope_parameters (the file has none), which no number of the file reaches";
        out.compare_derived("mrope_section", &int64(&section), &r.mrope_section, why);
        out.compare_derived("floats", &f64_bits(&floats), &r.floats, why);
    } else {
        out.compare("mrope_section", &int64(&section), &r.mrope_section);
        out.compare("floats", &f64_bits(&floats), &r.floats);
    }
    out.compare_derived(
        "theta_is_int",
        &int64(&[theta_is_int]),
        &r.theta_is_int,
        "the JSON type of rope_theta, which the number perturbation keeps",
    );
    Ok(out)
}

fn run_mrope(ctx: &Ctx, source: &Source, dtype: DType) -> Result<CaseOutput, CaseError> {
    let (c, text) = source.parse()?;
    let tokens = c.vision_tokens().map_err(port)?;
    let mrope_path = mrope_path(ctx)?;
    let mut inputs = ctx.inputs();
    let prompt = build_prompt_for(&PROMPT, &mut inputs, &tokens);
    let len = prompt.ids.len();
    let q_shape = case_shape(
        &[1, c.num_attention_heads, len, c.head_dim],
        "text_config.num_attention_heads and head_dim",
    )?;
    let k_shape = case_shape(
        &[1, c.num_key_value_heads, len, c.head_dim],
        "text_config.num_key_value_heads and head_dim",
    )?;
    let q = inputs.uniform(dtype, &q_shape, 2.0);
    let k = inputs.uniform(dtype, &k_shape, 2.0);

    // Port: rope index with the config's tokens → positions → apply.
    let index = rope_index(
        &RopeIndexInput {
            input_ids: &prompt.ids,
            image_grid_thw: Some(&prompt.images),
            video_grid_thw: Some(&prompt.videos),
            attention_mask: None,
        },
        &tokens,
    )
    .map_err(port)?;
    let window = index.window(0, len).map_err(port)?;
    let values: Vec<i32> = window.iter().flat_map(|w| w.iter().copied()).collect();
    let positions = int32_tensor(&values, &[3, 1, len]);
    let mrope = Mrope::new(c.mrope().map_err(port)?).map_err(port)?;
    let (q_port, k_port) = mrope
        .apply_with_path(
            mrope_path,
            &q.to_array(),
            &k.to_array(),
            &positions.to_array(),
        )
        .map_err(port)?;

    let ids = int32_tensor(&prompt.ids, &[1, len]);
    let r = reference::configs::config_qwen3_5_mrope(
        ctx,
        &text,
        &q,
        &k,
        reference::position::Prompt {
            input_ids: &ids,
            image_grid_thw: Some(&prompt.images),
            video_grid_thw: Some(&prompt.videos),
        },
        mrope_path.as_str(),
    )?;
    if r.path != mrope_path.as_str() {
        return Err(CaseError::Harness(format!(
            "the reference took {}, the port {}",
            r.path,
            mrope_path.as_str()
        )));
    }
    let mut out = CaseOutput::new(mrope_path.as_str());
    out.compare("q", &host(&q_port)?, &r.q);
    out.compare("k", &host(&k_port)?, &r.k);
    let layout =
        "the prompt layout is a constant of the case (position/rope-index perturbs prompts)";
    out.compare_derived(
        "position_ids",
        &in_position_dtype(&positions, index.position_dtype())?,
        &r.position_ids,
        layout,
    );
    out.compare_derived(
        "rope_deltas",
        &in_position_dtype(
            &int32_tensor(&[index.rope_delta()], &[1, 1]),
            index.position_dtype(),
        )?,
        &r.rope_deltas,
        layout,
    );
    Ok(out)
}
