//! `quantized/adapters`: LoRA adapter directories from disk.
//!
//! Each case has the library write a directory with its own training save
//! code (mlx-lm: `linear_to_lora_layers` + the trainer's save +
//! `save_config`; mlx-vlm: `get_peft_model` + `save_adapter`, current and
//! legacy formats), with the case's "trained" matrices. Then:
//!
//! * the port opens it (`AdapterSet::open`), attaches each adapter to its
//!   `QuantizedLinear` and runs it, and fuses it (`lora::fuse`:
//!   dequantize, add the low-rank delta, requantize);
//! * the reference loads it into a tiny model of quantized layers with its
//!   own loader (`load_adapters` / `apply_lora_layers`), runs each adapted
//!   module, and fuses it with its own fuse.
//!
//! `y` and `y_fused` must be equal per module. The mlx-vlm scale is
//! `alpha / rank` with alpha 0.3 and rank 5, a pair where dividing in f32
//! would give another scale (see `scale-convention`). mlx-vlm's legacy
//! fuse (`replace_lora_with_linear`) fails on a quantized base; the
//! `…/legacy-fuse` finding records it.
//!
//! The write is never perturbed (both sides read the same files); the
//! proof perturbs the activation.

use std::path::Path;

use layers::quantized::{
    lora, lora_scale_from_alpha, AdapterFormat, AdapterSet, QuantSpec, QuantizedLinear,
    QuantizedPayload,
};
use oracle::{DType, HostTensor};

use super::{affine, dtype_tag, host, mode_default, port, quantized_weight};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::exactness::quantized as q;
use crate::families::describe::{described, Described, Params};
use crate::inputs::Inputs;
use crate::reference;
use crate::reference::adapters::{Applied, BaseLayers, Library, TinyModel, Trained};
use oracle::Arg;

const FAMILY: &str = "quantized/adapters";
const LM_REFERENCE: &str =
    "mlx_lm.tuner.utils.load_adapters, LoRALinear.__call__ and .fuse (mlx-lm 0.32.2)";
const VLM_REFERENCE: &str =
    "mlx_vlm.trainer.utils.apply_lora_layers, trainer.lora_layers.LoRALinear.__call__ and .fuse (mlx-vlm 0.7.6)";
const LEGACY_REFERENCE: &str =
    "mlx_vlm.trainer.utils.apply_lora_layers (legacy: trainer.lora.LoRaLayer), replace_lora_with_linear (mlx-vlm 0.7.6)";

const BLOCKS: usize = 2;
const KEYS: [&str; 2] = ["self_attn.q_proj", "mlp.down_proj"];
const RANK: usize = 5;
/// mlx-lm's `scale`, as a user writes it.
const LM_SCALE: f64 = 1.7;
/// mlx-vlm's alpha: 0.3 / 5 rounds differently in f32 and f64.
const VLM_ALPHA: f64 = 0.3;
/// mlx-lm converts the last `num_layers` blocks.
const LM_NUM_LAYERS: usize = 1;

/// A `quantized/adapters` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdapterCase {
    /// Must-equal: an adapter directory written, loaded and applied (and
    /// fused) by `library`.
    Load {
        library: Library,
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        dtype: DType,
    },
    /// Must-equal: as `Load` (affine 4-bit gs64, f32), with the written
    /// file edited before either side reads it ([`EDITS`]).
    Edited { library: Library, edit: String },
    /// Finding: the legacy mlx-vlm fuse.
    LegacyFuse {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
    },
    /// Finding: alpha / rank in Python floats.
    ScaleConvention,
}

impl Params for AdapterCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            AdapterCase::Load { library, spec, dtype } => {
                let reference = match library {
                    Library::MlxLm => LM_REFERENCE,
                    Library::MlxVlm => VLM_REFERENCE,
                    Library::MlxVlmLegacy => LEGACY_REFERENCE,
                };
                Case::must_equal(name, FAMILY, reference, move |ctx| {
                    run(ctx, library, spec, dtype, None)
                })
            }
            AdapterCase::Edited { library, edit } => {
                let reference = match library {
                    Library::MlxLm => LM_REFERENCE,
                    Library::MlxVlm => VLM_REFERENCE,
                    Library::MlxVlmLegacy => LEGACY_REFERENCE,
                };
                Case::must_equal(name, FAMILY, reference, move |ctx| {
                    run(ctx, library, affine(4, 64), DType::Float32, Some(&edit))
                })
            }
            AdapterCase::LegacyFuse { spec } => {
                Case::finding(name, FAMILY, LEGACY_REFERENCE, move |ctx| legacy_fuse(ctx, spec))
            }
            AdapterCase::ScaleConvention => Case::finding(
                name,
                FAMILY,
                "mlx_vlm.trainer.utils._lora_scale and trainer.lora.LoRaLayer: alpha / rank in Python floats (mlx-vlm 0.7.6)",
                scale_convention,
            ),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for library in [Library::MlxLm, Library::MlxVlm, Library::MlxVlmLegacy] {
        for (spec, dtype) in [
            (affine(4, 64), DType::Float32),
            (affine(4, 64), DType::Bfloat16),
            (
                mode_default(layers::quantized::Mode::Mxfp4),
                DType::Bfloat16,
            ),
        ] {
            let name = format!("{FAMILY}/{}/{spec}/{}", library.as_str(), dtype_tag(dtype));
            cases.push(described(
                name,
                &AdapterCase::Load {
                    library,
                    spec,
                    dtype,
                },
            ));
        }
    }
    for &(library, edit) in EDITS {
        cases.push(described(
            format!("{FAMILY}/{}/edited/{edit}", library.as_str()),
            &AdapterCase::Edited {
                library,
                edit: edit.into(),
            },
        ));
    }
    let spec = affine(4, 64);
    cases.push(described(
        format!("{FAMILY}/mlx-vlm-legacy/{spec}/legacy-fuse"),
        &AdapterCase::LegacyFuse { spec },
    ));
    cases.push(described(
        format!("{FAMILY}/scale-convention"),
        &AdapterCase::ScaleConvention,
    ));
    cases
}

/// Edits of a written adapter file the reference still loads (its
/// `load_weights(strict=False)`): the first module's B matrix removed (it
/// keeps its zero initialisation), or a tensor that names nothing in the
/// model added (ignored).
pub const EDITS: &[(Library, &str)] = &[
    (Library::MlxLm, "without-lora-b"),
    (Library::MlxVlm, "without-lora-b"),
    (Library::MlxVlmLegacy, "without-lora-b"),
    (Library::MlxVlm, "extra-tensor"),
    (Library::MlxVlmLegacy, "extra-tensor"),
];

/// Rewrites the adapter file of `s` with `edit` applied.
fn edit_file(s: &Setup, library: Library, edit: &str) -> Result<(), CaseError> {
    let path = s.dir().join("adapters.safetensors");
    let file = layers::checkpoint::SafetensorsFile::open(&path).map_err(port)?;
    let b = match library {
        Library::MlxVlmLegacy => "B",
        Library::MlxLm | Library::MlxVlm => "lora_b",
    };
    let first = &s.paths[0].0;
    let mut arrays = Vec::new();
    for (name, _) in file.tensors() {
        if edit == "without-lora-b" && name == format!("{first}.{b}") {
            continue;
        }
        arrays.push((name.to_owned(), file.array(name).map_err(port)?));
    }
    match edit {
        "without-lora-b" if arrays.len() == file.tensors().count() => {
            return Err(CaseError::Harness(format!("no `{first}.{b}` in the file")))
        }
        "without-lora-b" => {}
        "extra-tensor" => arrays.push((
            "trainer_state.step".to_owned(),
            mlx_rs::Array::from_slice(&[7.0f32], &[1]),
        )),
        other => return Err(CaseError::Harness(format!("no edit `{other}`"))),
    }
    drop(file);
    let named: Vec<(&str, &mlx_rs::Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    layers::checkpoint::write_arrays(&path, &named).map_err(port)
}

/// `[in, out]` of each key for a spec: q_proj K → 64, down_proj 2K → K.
fn dims(spec: QuantSpec) -> ([usize; 2], [usize; 2]) {
    let k = super::base_k(spec);
    ([k, 2 * k], [64, k])
}

fn format_of(library: Library) -> AdapterFormat {
    match library {
        Library::MlxLm => AdapterFormat::MlxLm,
        Library::MlxVlm => AdapterFormat::MlxVlm,
        Library::MlxVlmLegacy => AdapterFormat::MlxVlmLegacy,
    }
}

/// The modules the library converts, in the order the case sets them.
fn adapted_paths(library: Library) -> Vec<(String, usize)> {
    let (prefix, blocks): (&str, Vec<usize>) = match library {
        Library::MlxLm => ("layers", (BLOCKS - LM_NUM_LAYERS..BLOCKS).collect()),
        Library::MlxVlm | Library::MlxVlmLegacy => {
            ("language_model.model.layers", (0..BLOCKS).collect())
        }
    };
    blocks
        .into_iter()
        .flat_map(|b| {
            KEYS.iter()
                .enumerate()
                .map(move |(i, k)| (format!("{prefix}.{b}.{k}"), i))
        })
        .collect()
}

struct Setup {
    _dir: tempfile::TempDir,
    payloads: Vec<QuantizedPayload>,
    base: (Vec<HostTensor>, Vec<HostTensor>, Vec<Option<HostTensor>>),
    paths: Vec<(String, usize)>,
    x: HostTensor,
    ins: [usize; 2],
}

impl Setup {
    fn dir(&self) -> &Path {
        self._dir.path()
    }
}

fn setup(ctx: &Ctx, library: Library, spec: QuantSpec, dtype: DType) -> Result<Setup, CaseError> {
    let mut inputs: Inputs = ctx.inputs();
    let (ins, outs) = dims(spec);
    let mut payloads = Vec::new();
    for (i, o) in ins.iter().zip(outs) {
        payloads.push(quantized_weight(&mut inputs, spec, dtype, &[o, *i])?);
    }
    let paths = adapted_paths(library);
    let trained: Vec<Trained> = paths
        .iter()
        .map(|(path, i)| Trained {
            path: path.clone(),
            lora_a: inputs.uniform(DType::Float32, &[ins[*i], RANK], 0.5),
            lora_b: inputs.uniform(DType::Float32, &[RANK, outs[*i]], 0.5),
        })
        .collect();
    let x = super::activation(&mut inputs, dtype, &[3, ins[1]]);
    let dir = tempfile::Builder::new()
        .prefix("conformance-adapters-")
        .tempdir()
        .map_err(|e| CaseError::harness("a temporary adapter directory", e))?;
    let model = TinyModel {
        blocks: BLOCKS,
        keys: &KEYS,
        ins: &ins,
        outs: &outs,
    };
    reference::adapters::adapters_write(
        ctx,
        library,
        dir.path(),
        &model,
        RANK,
        LM_SCALE,
        VLM_ALPHA,
        LM_NUM_LAYERS,
        &trained,
    )?;
    let base = (
        payloads
            .iter()
            .map(|p| host(p.weight()))
            .collect::<Result<_, _>>()?,
        payloads
            .iter()
            .map(|p| host(p.scales()))
            .collect::<Result<_, _>>()?,
        payloads
            .iter()
            .map(|p| p.biases().map(host).transpose())
            .collect::<Result<_, _>>()?,
    );
    Ok(Setup {
        _dir: dir,
        payloads,
        base,
        paths,
        x,
        ins,
    })
}

fn reference_apply(
    ctx: &Ctx,
    library: Library,
    spec: QuantSpec,
    s: &Setup,
) -> Result<Applied, CaseError> {
    let (ins, outs) = dims(spec);
    let model = TinyModel {
        blocks: BLOCKS,
        keys: &KEYS,
        ins: &ins,
        outs: &outs,
    };
    let base = BaseLayers {
        weights: &s.base.0,
        scales: &s.base.1,
        biases: &s.base.2,
        group_size: spec.group_size,
        bits: spec.bits,
        mode: spec.mode.as_str(),
    };
    let paths: Vec<String> = s.paths.iter().map(|(p, _)| p.clone()).collect();
    reference::adapters::adapters_apply(ctx, library, s.dir(), &model, &base, &paths, &s.x)
}

/// `x[..., :in]` of the activation.
fn input(s: &Setup, key: usize) -> Result<mlx_rs::Array, CaseError> {
    use mlx_rs::ops::indexing::IndexOp;
    let x = s.x.to_array();
    Ok(x.index((.., ..s.ins[key] as i32)))
}

fn run(
    ctx: &Ctx,
    library: Library,
    spec: QuantSpec,
    dtype: DType,
    edit: Option<&str>,
) -> Result<CaseOutput, CaseError> {
    let s = setup(ctx, library, spec, dtype)?;
    if let Some(edit) = edit {
        edit_file(&s, library, edit)?;
    }
    let set = AdapterSet::open(s.dir(), format_of(library)).map_err(port)?;
    if set.adapters().len() != s.paths.len() {
        return Err(CaseError::Port(format!(
            "the port read {} adapters, the library wrote {}",
            set.adapters().len(),
            s.paths.len()
        )));
    }
    let r = reference_apply(ctx, library, spec, &s)?;
    let mut out = CaseOutput::new("mlx.core");
    for (j, (path, key)) in s.paths.iter().enumerate() {
        let adapter = set
            .get(path)
            .ok_or_else(|| CaseError::Port(format!("no adapter for `{path}` in the directory")))?;
        let base = QuantizedLinear::new(s.payloads[*key].clone(), None).map_err(port)?;
        let mut adapted = QuantizedLinear::new(s.payloads[*key].clone(), None).map_err(port)?;
        adapted
            .attach_adapter(path.clone(), adapter.clone())
            .map_err(port)?;
        let x = input(&s, *key)?;
        let y = adapted.forward(&x).map_err(port)?;
        // The exact oracle: the base layer plus the adapter as the port
        // read it (tensors and scale, bit-checked through `y`).
        let mut module = q::payload_args(&s.payloads[*key], None, s.ins[*key])?;
        module.extend([
            (
                "lora_a",
                Arg::List(vec![Arg::Tensor(host(adapter.lora_a())?)]),
            ),
            (
                "lora_b",
                Arg::List(vec![Arg::Tensor(host(adapter.lora_b())?)]),
            ),
            ("lora_scales", Arg::List(vec![Arg::Float(set.scale_f64())])),
        ]);
        let exact = r
            .calls
            .exact_with("adapters_apply", &module, |sent, model| {
                q::linear(&q::sliced(sent)?, model, "weight", true)
            })?;
        out.compare(
            &format!("{path}/y"),
            &host(&y)?,
            &r.y[j].clone().with_exact(exact),
        );
        if library != Library::MlxVlmLegacy {
            let fused = lora::fuse(&base, adapter).map_err(port)?;
            let y_fused = fused.forward(&x).map_err(port)?;
            let expected = r.y_fused[j].as_ref().ok_or_else(|| {
                CaseError::Harness(format!("the reference's fuse failed: {}", r.fuse_refused))
            })?;
            // The exact oracle on the fused layer's own tensors as the port
            // built them (the fuse's requantization decides codes, which is
            // not arithmetic to bound; the bits of y_fused check it).
            let fused_module = q::payload_args(fused.payload(), fused.bias(), s.ins[*key])?;
            let exact = r
                .calls
                .exact_with("adapters_apply", &fused_module, |sent, model| {
                    q::linear(&q::sliced(sent)?, model, "weight", false)
                })?;
            out.compare(
                &format!("{path}/y_fused"),
                &host(&y_fused)?,
                &expected.clone().with_exact(exact),
            );
        }
    }
    Ok(out)
}

fn legacy_fuse(ctx: &Ctx, spec: QuantSpec) -> Result<CaseOutput, CaseError> {
    let library = Library::MlxVlmLegacy;
    let s = setup(ctx, library, spec, DType::Float32)?;
    let set = AdapterSet::open(s.dir(), format_of(library)).map_err(port)?;
    let r = reference_apply(ctx, library, spec, &s)?;
    let (path, key) = &s.paths[0];
    let adapter = set
        .get(path)
        .ok_or_else(|| CaseError::Port(format!("no adapter for `{path}`")))?;
    let base = QuantizedLinear::new(s.payloads[*key].clone(), None).map_err(port)?;
    let y_fused = lora::fuse(&base, adapter)
        .map_err(port)?
        .forward(&input(&s, *key)?)
        .map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    out.digest("port_y_fused", &host(&y_fused)?);
    let finding = serde_json::json!({
        "reference_fuse_refuses": !r.fuse_refused.is_empty(),
        "reference": r.fuse_refused,
        "why": "replace_lora_with_linear adds scale * (A @ B), shaped [in, out], to original_layer.weight, \
                which for a QuantizedLinear is the packed uint32 [out, in * bits / 32]; the port fuses as \
                LoRALinear.fuse does (dequantize, add (scale * B.T) @ A.T, requantize)",
        "scale": set.scale(),
        "scale_f64": set.scale_f64(),
    });
    Ok(out.with_finding(finding))
}

/// Where dividing alpha by rank in f32 (a port's easy mistake) differs
/// from the reference's f64 division rounded once to f32.
fn scale_convention(_ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let alphas = [0.1_f64, 0.3, 0.7, 1.0, 2.0, 16.0, 32.0];
    let mut differing = Vec::new();
    let mut total = 0;
    for alpha in alphas {
        for rank in 1..=64_i64 {
            total += 1;
            let reference = lora_scale_from_alpha(alpha, rank);
            let f32_division = alpha as f32 / rank as f32;
            if reference.to_bits() != f32_division.to_bits() {
                differing.push(serde_json::json!({
                    "alpha": alpha, "rank": rank,
                    "reference": format!("{:#010x}", reference.to_bits()),
                    "f32_division": format!("{:#010x}", f32_division.to_bits()),
                }));
            }
        }
    }
    let finding = serde_json::json!({
        "pairs": total,
        "differing": differing.len(),
        "examples": differing.iter().take(8).collect::<Vec<_>>(),
        "rule": "scale = float32(alpha / rank computed in f64), as mlx-vlm's Python float meets a float32 array",
    });
    Ok(CaseOutput::new("host").with_finding(finding))
}
