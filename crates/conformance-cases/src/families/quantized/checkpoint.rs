//! `quantized/checkpoint`: checkpoints written by the reference's own
//! quantization code (`fixtures/checkpoints/write_fixture.py`:
//! `mlx_lm.utils.quantize_model` + `save_model` + `save_config`), loaded by
//! the port (`Checkpoint::open`, `resolve_quant_spec`,
//! `QuantizedLinear::from_checkpoint`, `QuantizedSwitchLinear::from_checkpoint`)
//! and by the reference (`mlx_lm.utils.load_model` with a tiny model class
//! whose modules the config lists under `conformance_layers`).
//!
//! One must-equal case per fixture directory compares
//! * the spec decided per module path, as an int32 table `[bits,
//!   group_size, mode_id]` (`mode_id`: affine 0, mxfp4 1, mxfp8 2, nvfp4 3;
//!   `[0, 0, -1]` for a module left in float): the port's
//!   `resolve_quant_spec` against what `load_model`'s `class_predicate` /
//!   `infer_quant_config` / `nn.quantize` built;
//! * every quantized module's output on the same activation `x` (sliced to
//!   the module's width; switch modules driven as `SwitchGLU` drives them,
//!   unsorted, with the gather_qmm shim of `quantized/switch`).
//!
//! The proof mode perturbs x and the expert indices, so every module's
//! output must differ; the spec table is read from the fixture's
//! config.json, a constant of the case, and is declared derived.
//! A finding per fixture records where each spec came from on the port side
//! (per-path entry, `true` entry, inferred, or why not quantized).

use std::collections::BTreeMap;

use layers::checkpoint::{Checkpoint, LayerKind, SpecResolution};
use layers::quantized::{Mode, QuantizedEmbedding, QuantizedLinear, QuantizedSwitchLinear};
use mlx_rs::ops::indexing::IndexOp;
use oracle::{DType, HostTensor};
use serde_json::Value as Json;

use super::modules::{layer_infos, module_args, module_exact, LayerInfo};
use super::switch::{expert_indices, port_apply};
use super::{activation, fixture_dir, host, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use oracle::Arg;

const FAMILY: &str = "quantized/checkpoint";
const REFERENCE: &str =
    "mlx_lm.utils.load_model (mlx-lm 0.32.2: class_predicate, infer_quant_config, nn.quantize, \
     load_weights), then the loaded modules' __call__";
/// `tiny-*`: made-up modules; `real-*`: a real conversion's quantization
/// block (verbatim, `fixtures/configs/quantized/`) at its real tensor
/// paths (the AutoRound block's per-path entries name HF checkpoint paths,
/// which mlx-lm's loader looks module paths up in as written); `mlx-lm-mixed_*`: mlx-lm's own mixed recipe over a real model's
/// paths; `tiny-nvfp4-global-scale`: nvfp4 with mlx-lm's per-expert global
/// scale (its switch output is the loaded global scale: the pinned MLX
/// cannot call the layer) and a quantized embedding.
pub(super) const FIXTURES: [&str; 6] = [
    "tiny-mixed",
    "tiny-mixed-sharded",
    "real-Qwen3.5-9B-MLX-8bit",
    "real-Qwen3.6-27B-int4-mlx-AutoRound",
    "mlx-lm-mixed_3_6-Qwen3.5-0.8B",
    "tiny-nvfp4-global-scale",
];
/// Tokens of the activation.
const TOKENS: usize = 5;
/// Experts per token for switch modules.
const TOP: usize = 2;

/// A `quantized/checkpoint` case as data: a fixture of [`FIXTURES`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckpointCase {
    /// Must-equal: every conformance layer of the fixture, loaded by both.
    /// With `index: "lists-missing-shard"`, from a copy of the fixture whose
    /// `model.safetensors.index.json` places a tensor in a shard that is
    /// not there: `load_model` never reads the index, so neither does the
    /// port, and both load what the shards hold.
    Load {
        fixture: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<String>,
    },
    /// Finding: which rule decides each path's spec.
    SpecSources { fixture: String },
    /// Must-equal on "both refuse": a copy of the fixture edited one way
    /// ([`REFUSED`]); the proof mode gives the reference the unedited one.
    Refused { fixture: String, edit: String },
}

/// `(edit, the reference's message, the port's error variant)`:
/// checkpoints `load_model` refuses, and so does the port.
pub const REFUSED: &[(&str, &str, &str)] = &[
    // `quantization.bits` 7: nn.quantize -> mx.quantize refuses it.
    ("quantization-bits-7", "number of bits 7", "InvalidSpec"),
    // `quantization` without `bits`.
    (
        "quantization-without-bits",
        "'bits'",
        "QuantSpecUnresolvable",
    ),
    // No model*.safetensors (nor index) in the directory.
    ("no-weight-files", "No safetensors found", "NoWeightFiles"),
];

impl Params for CheckpointCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            CheckpointCase::Load { fixture, index } => {
                // Only a fixture with switch modules drives one SwitchGLU projection.
                let switch = has_switch(&fixture);
                let case = Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
                    load(ctx, &fixture, index.as_deref())
                });
                if switch {
                    case.glue_composed(super::switch::SWITCH_GLU_STEP)
                } else {
                    case
                }
            }
            CheckpointCase::Refused { fixture, edit } => {
                Case::must_equal(name, FAMILY, REFERENCE, move |ctx| refused(ctx, &fixture, &edit))
            }
            CheckpointCase::SpecSources { fixture } => Case::finding(
                name,
                FAMILY,
                "mlx_lm.utils.load_model (mlx-lm 0.32.2) class_predicate: which rule decides each path",
                move |_ctx| spec_sources(&fixture),
            ),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for fixture in FIXTURES {
        cases.push(described(
            format!("{FAMILY}/{fixture}/load"),
            &CheckpointCase::Load {
                fixture: fixture.into(),
                index: None,
            },
        ));
    }
    for &(edit, _, _) in REFUSED {
        cases.push(described(
            format!("{FAMILY}/tiny-mixed/refused/{edit}"),
            &CheckpointCase::Refused {
                fixture: "tiny-mixed".into(),
                edit: edit.into(),
            },
        ));
    }
    cases.push(described(
        format!("{FAMILY}/tiny-mixed-sharded/load-index-lists-missing-shard"),
        &CheckpointCase::Load {
            fixture: "tiny-mixed-sharded".into(),
            index: Some(INDEX_LISTS_MISSING_SHARD.into()),
        },
    ));
    // Which rule decides each path: the made-up mix, and a real block
    // whose per-path entries no module path matches.
    for fixture in [FIXTURES[0], FIXTURES[3]] {
        cases.push(described(
            format!("{FAMILY}/{fixture}/spec-sources"),
            &CheckpointCase::SpecSources {
                fixture: fixture.into(),
            },
        ));
    }
    cases
}

/// Whether the fixture's tiny model has a switch module (`conformance_layers`
/// kind "switch"); an unreadable config counts as having one (the case
/// then errors with the reason).
fn has_switch(fixture: &str) -> bool {
    fixture_dir(fixture)
        .ok()
        .and_then(|dir| std::fs::read_to_string(dir.join("config.json")).ok())
        .and_then(|t| serde_json::from_str::<Json>(&t).ok())
        .and_then(|c| {
            c["conformance_layers"]
                .as_object()
                .map(|l| l.values().any(|d| d["kind"] == "switch"))
        })
        .unwrap_or(true)
}

fn mode_id(mode: Mode) -> i32 {
    match mode {
        Mode::Affine => 0,
        Mode::Mxfp4 => 1,
        Mode::Mxfp8 => 2,
        Mode::Nvfp4 => 3,
    }
}

/// The one index edit [`CheckpointCase::Load`] knows.
const INDEX_LISTS_MISSING_SHARD: &str = "lists-missing-shard";

/// A scratch copy of a fixture directory, removed on drop.
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of `dir` whose index places every tensor of its last shard in a
/// shard that does not exist (`model-00009-of-00009.safetensors`).
fn with_missing_shard_index(dir: &std::path::Path) -> Result<ScratchDir, CaseError> {
    let fail = |e: &dyn std::fmt::Display| {
        CaseError::Harness(format!(
            "copying {} with an edited index: {e}",
            dir.display()
        ))
    };
    let copy = scratch_copy(dir, "index")?;
    let index_path = copy.0.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index_path).map_err(|e| fail(&e))?;
    let mut index: Json = serde_json::from_str(&text).map_err(|e| fail(&e))?;
    let map = index
        .get_mut("weight_map")
        .and_then(Json::as_object_mut)
        .ok_or_else(|| fail(&"the index has no weight_map"))?;
    let last = map
        .values()
        .filter_map(Json::as_str)
        .max()
        .map(str::to_owned)
        .ok_or_else(|| fail(&"the index lists no shard"))?;
    for shard in map.values_mut() {
        if shard.as_str() == Some(last.as_str()) {
            *shard = "model-00009-of-00009.safetensors".into();
        }
    }
    std::fs::write(&index_path, index.to_string()).map_err(|e| fail(&e))?;
    Ok(copy)
}

/// A scratch copy of fixture directory `dir`.
fn scratch_copy(dir: &std::path::Path, tag: &str) -> Result<ScratchDir, CaseError> {
    let fail =
        |e: &dyn std::fmt::Display| CaseError::Harness(format!("copying {}: {e}", dir.display()));
    let copy = ScratchDir(std::env::temp_dir().join(format!(
        "conformance-{tag}-{}-{}",
        std::process::id(),
        dir.file_name().unwrap_or_default().to_string_lossy()
    )));
    let _ = std::fs::remove_dir_all(&copy.0);
    std::fs::create_dir_all(&copy.0).map_err(|e| fail(&e))?;
    for entry in std::fs::read_dir(dir).map_err(|e| fail(&e))? {
        let entry = entry.map_err(|e| fail(&e))?;
        std::fs::copy(entry.path(), copy.0.join(entry.file_name())).map_err(|e| fail(&e))?;
    }
    Ok(copy)
}

/// A [`REFUSED`] edit of a fixture: the port (`Checkpoint::open`, then each
/// conformance layer's spec and `from_checkpoint`) and `load_model` must
/// both refuse it.
fn refused(ctx: &Ctx, fixture: &str, edit: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = REFUSED
        .iter()
        .find(|r| r.0 == edit)
        .ok_or_else(|| CaseError::Harness(format!("`{edit}` is none of {REFUSED:?}")))?;
    let original = fixture_dir(fixture)?;
    let infos = layer_infos(&Checkpoint::open(&original).map_err(port)?)?;
    let copy = scratch_copy(&original, "refused")?;
    let fail = |e: &dyn std::fmt::Display| CaseError::Harness(format!("editing the copy: {e}"));
    let config_path = copy.0.join("config.json");
    let mut config: Json =
        serde_json::from_str(&std::fs::read_to_string(&config_path).map_err(|e| fail(&e))?)
            .map_err(|e| fail(&e))?;
    let quantization = config
        .get_mut("quantization")
        .and_then(Json::as_object_mut)
        .ok_or_else(|| fail(&"no quantization block"))?;
    match edit {
        "quantization-bits-7" => {
            quantization.insert("bits".into(), 7.into());
        }
        "quantization-without-bits" => {
            quantization.remove("bits");
        }
        "no-weight-files" => {
            for entry in std::fs::read_dir(&copy.0).map_err(|e| fail(&e))?.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("model") && name.contains(".safetensors") {
                    std::fs::remove_file(entry.path()).map_err(|e| fail(&e))?;
                }
            }
        }
        other => return Err(CaseError::Harness(format!("no edit `{other}`"))),
    }
    std::fs::write(&config_path, config.to_string()).map_err(|e| fail(&e))?;

    let port_result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let checkpoint = Checkpoint::open(&copy.0)?;
        for (path, info) in &infos {
            let in_features = info.in_features as i32;
            let resolution = checkpoint.resolve_quant_spec(path, info.kind, in_features)?;
            if !matches!(resolution, SpecResolution::Quantized { .. }) {
                continue;
            }
            match info.kind {
                LayerKind::Linear if info.embedding => {
                    QuantizedEmbedding::from_checkpoint(&checkpoint, path, in_features).map(drop)?
                }
                LayerKind::Linear => {
                    QuantizedLinear::from_checkpoint(&checkpoint, path, in_features).map(drop)?
                }
                LayerKind::Switch => {
                    QuantizedSwitchLinear::from_checkpoint(&checkpoint, path, in_features)
                        .map(drop)?
                }
            }
        }
        Ok(())
    })();
    let (flag, said) = crate::families::support::port_refused(port_result, variant)?;
    // The scratch copy's path (it holds the process id) is not part of
    // what either side says.
    let shown = copy.0.display().to_string();
    let port_said = (flag, said.replace(&shown, "<dir>"));

    let (x, indices) = activations(ctx, &infos);
    let paths: Vec<&str> = infos.keys().map(String::as_str).collect();
    let given = if ctx.perturbed() { &original } else { &copy.0 };
    let mut reference = reference::refusal(
        reference::checkpoint::quantized_checkpoint(ctx, &x, &indices, given, &paths),
        expected,
    )?;
    reference.message = reference.message.replace(&shown, "<dir>");
    crate::families::support::refusal_output(ctx, "mlx-lm", port_said, reference)
}

/// The activation `x` (as wide as the widest module) and expert indices
/// valid for every switch module of the fixture.
fn activations(ctx: &Ctx, infos: &BTreeMap<String, LayerInfo>) -> (HostTensor, HostTensor) {
    let width = infos.values().map(|i| i.in_features).max().unwrap_or(1);
    let experts = infos
        .values()
        .filter(|i| i.experts > 0)
        .map(|i| i.experts)
        .min()
        .unwrap_or(TOP);
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, DType::Bfloat16, &[TOKENS, width]);
    let indices = expert_indices(&mut inputs, &[TOKENS], TOP.min(experts), experts);
    (x, indices)
}

fn load(ctx: &Ctx, fixture: &str, index: Option<&str>) -> Result<CaseOutput, CaseError> {
    let fixture_path = fixture_dir(fixture)?;
    let scratch = match index {
        None => None,
        Some(INDEX_LISTS_MISSING_SHARD) => Some(with_missing_shard_index(&fixture_path)?),
        Some(other) => {
            return Err(CaseError::Harness(format!(
                "index edit `{other}` is not `{INDEX_LISTS_MISSING_SHARD}`"
            )))
        }
    };
    let dir = scratch.as_ref().map_or(fixture_path, |s| s.0.clone());
    let checkpoint = Checkpoint::open(&dir).map_err(port)?;
    let infos = layer_infos(&checkpoint)?;
    let (x, indices) = activations(ctx, &infos);
    let paths: Vec<&String> = infos.keys().collect();
    let path_names: Vec<&str> = paths.iter().map(|p| p.as_str()).collect();
    let PortModules {
        table: port_table,
        outputs,
        loaded_constants,
        modules,
    } = port_modules(&dir, &x, &indices, &path_names)?;

    let loaded = reference::checkpoint::quantized_checkpoint(ctx, &x, &indices, &dir, &path_names)?;
    if loaded.outputs.len() != paths.len() {
        return Err(CaseError::Harness(
            "reference returned another number of outputs".into(),
        ));
    }

    let mut out = CaseOutput::new("mlx.core");
    out.compare_derived(
        "spec per path [bits, group_size, mode_id]",
        &port_table,
        &loaded.specs,
        "read from the committed checkpoint's config.json, a constant of the case",
    );
    for (((path, ours), theirs), module) in
        paths.iter().zip(&outputs).zip(loaded.outputs).zip(&modules)
    {
        let theirs = match (theirs, module) {
            (Some(t), Some(args)) => Some(t.with_exact(loaded.calls.exact_with(
                "quantized_checkpoint",
                args,
                module_exact,
            )?)),
            (t, _) => t,
        };
        match (ours, theirs) {
            (Some(ours), Some(theirs)) if loaded_constants.contains(path.as_str()) => out
                .compare_derived(
                    &format!("global_scale {path}"),
                    ours,
                    &theirs,
                    "the loaded per-expert global scale, a constant of the committed checkpoint",
                ),
            (Some(ours), Some(theirs)) => out.compare(&format!("y {path}"), ours, &theirs),
            (None, None) => {}
            // A float module on one side only: the spec table already
            // differs; nothing more to compare.
            _ => {}
        }
    }
    Ok(out)
}

/// What the port loads from a checkpoint directory, per module path.
pub struct PortModules {
    /// int32 `[paths, 3]`: `[bits, group_size, mode_id]`, `[0, 0, -1]`
    /// for a module left float.
    pub table: HostTensor,
    /// Each path's output on `x[:, :in]` (None for float modules).
    pub outputs: Vec<Option<HostTensor>>,
    /// Paths whose output is a loaded tensor (an nvfp4 global scale), not
    /// a forward of x.
    pub loaded_constants: std::collections::BTreeSet<String>,
    /// Each quantized module's tensors as the port loaded them, for the
    /// exact oracle (the read is bit-checked; the arithmetic is its scope).
    pub modules: Vec<Option<Vec<(&'static str, Arg)>>>,
}

/// The port's side of `quantized_checkpoint` (the linked case and the
/// port candidate's `quantized_checkpoint_forward`): opens `dir`, resolves
/// each of `paths` (a module of the fixture's tiny model) and runs it on
/// `x[:, :in]` (switch modules with `indices`).
pub fn port_modules(
    dir: &std::path::Path,
    x: &HostTensor,
    indices: &HostTensor,
    paths: &[&str],
) -> Result<PortModules, CaseError> {
    let checkpoint = Checkpoint::open(dir).map_err(port)?;
    let infos = layer_infos(&checkpoint)?;
    let mut table = Vec::with_capacity(paths.len() * 3);
    let mut outputs: Vec<Option<HostTensor>> = Vec::with_capacity(paths.len());
    let mut loaded_constants = std::collections::BTreeSet::new();
    let mut modules: Vec<Option<Vec<(&'static str, Arg)>>> = Vec::with_capacity(paths.len());
    let xa = x.to_array();
    for path in paths {
        let info = infos.get(*path).ok_or_else(|| {
            CaseError::Harness(format!(
                "`{path}` is no module of the checkpoint's tiny model"
            ))
        })?;
        let resolution = checkpoint
            .resolve_quant_spec(path, info.kind, info.in_features as i32)
            .map_err(port)?;
        let SpecResolution::Quantized { spec, .. } = resolution else {
            table.extend([0, 0, -1]);
            outputs.push(None);
            modules.push(None);
            continue;
        };
        table.extend([spec.bits, spec.group_size, mode_id(spec.mode)]);
        let xs = xa.index((.., ..info.in_features as i32));
        let y = match info.kind {
            LayerKind::Linear if info.embedding => {
                let table =
                    QuantizedEmbedding::from_checkpoint(&checkpoint, path, info.in_features as i32)
                        .map_err(port)?;
                modules.push(Some(module_args(
                    table.payload(),
                    None,
                    "linear",
                    info.in_features,
                )?));
                table.as_linear(&xs).map_err(port)?
            }
            LayerKind::Linear => {
                let layer =
                    QuantizedLinear::from_checkpoint(&checkpoint, path, info.in_features as i32)
                        .map_err(port)?;
                modules.push(Some(module_args(
                    layer.payload(),
                    layer.bias(),
                    "linear",
                    info.in_features,
                )?));
                layer.forward(&xs).map_err(port)?
            }
            LayerKind::Switch => {
                let layer = QuantizedSwitchLinear::from_checkpoint(
                    &checkpoint,
                    path,
                    info.in_features as i32,
                )
                .map_err(port)?;
                if let Some(gs) = layer.payload().global_scale() {
                    // The forward needs gather_qmm with a global scale,
                    // which the pinned MLX lacks (quantized/global-scale).
                    outputs.push(Some(host(gs)?));
                    modules.push(None);
                    loaded_constants.insert(path.to_string());
                    continue;
                }
                modules.push(Some(module_args(
                    layer.payload(),
                    layer.bias(),
                    "switch",
                    info.in_features,
                )?));
                port_apply(
                    &layer,
                    &xs.expand_dims(0)?,
                    &indices.to_array().expand_dims(0)?,
                    false,
                )?
            }
        };
        outputs.push(Some(host(&y)?));
    }
    let table_bytes = table.iter().flat_map(|v: &i32| v.to_le_bytes()).collect();
    Ok(PortModules {
        table: HostTensor::new(DType::Int32, vec![paths.len(), 3], table_bytes)?,
        outputs,
        loaded_constants,
        modules,
    })
}

/// Where the port's spec of each path comes from.
fn spec_sources(fixture: &str) -> Result<CaseOutput, CaseError> {
    let checkpoint = Checkpoint::open(fixture_dir(fixture)?).map_err(port)?;
    let mut map = serde_json::Map::new();
    for (path, info) in layer_infos(&checkpoint)? {
        let resolution = checkpoint
            .resolve_quant_spec(&path, info.kind, info.in_features as i32)
            .map_err(port)?;
        let text = match resolution {
            SpecResolution::Quantized { spec, source } => format!("{spec} ({source:?})"),
            SpecResolution::NotQuantized(reason) => format!("not quantized ({reason:?})"),
        };
        map.insert(path, Json::String(text));
    }
    let mut out = CaseOutput::new("port");
    let text = Json::Object(map);
    let bytes = text.to_string().into_bytes();
    out.digest(
        "spec sources (JSON)",
        &HostTensor::new(DType::Uint8, vec![bytes.len()], bytes)?,
    );
    Ok(out.with_finding(text))
}
