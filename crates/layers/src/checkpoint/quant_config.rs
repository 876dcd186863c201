//! The quantization spec of one module path, resolved as `mlx_lm.utils.load_model`
//! (mlx-lm 0.32.2) resolves it.
//!
//! The reference, for every leaf module `p` of the model:
//!
//! 1. takes the quantization dict: `config["quantization"]` if not null;
//!    otherwise a legacy `quantization_config` (from `config`, else
//!    `config["text_config"]`, else `hf_quant_config.json`) mapped to
//!    `{group_size, bits, mode}` by `quant_method`; with neither, nothing is
//!    quantized. `quantization["group_size"]` and `["bits"]` must exist
//!    (`KeyError` otherwise), whatever the path.
//! 2. `class_predicate(p, m)`: if `p` is a key of that dict, its value is
//!    used as is: falsy (`false`, `0`, `""`, `{}`, `[]`, `null`) → not
//!    quantized; `true` → the top-level `group_size`, `bits`, `mode`
//!    (default affine); a dict → `m.to_quantized(**dict)`; anything else →
//!    `ValueError`.
//! 3. otherwise, no `p.scales` tensor → not quantized (**the top-level
//!    default is never applied to a path the config does not name**);
//! 4. otherwise `infer_quant_config(p, m, weights)`: `group_size = in //
//!    scales.shape[-1]`, `bits = weight.shape[-1] * 32 // in`, mode affine
//!    unless the scales are `uint8`, in which case (4,16) → nvfp4, (4,32) →
//!    mxfp4, (8,32) → mxfp8 and any other pair is a `ValueError`.
//!
//! `to_quantized` then builds the layer, and `mx.quantize` inside it rejects
//! invalid combinations and an in_features the group size does not divide.
//! `to_quantized`'s defaults depend on the module type: `Linear` takes
//! `group_size=None, bits=None` (the mode's defaults) while `SwitchLinear`
//! takes `group_size=64, bits=4`, so `{"mode": "mxfp4"}` is valid for a
//! linear layer and rejected for a switch layer ([`LayerKind`]).
//!
//! **Every config key that changes which module the reference builds**
//! (audit of `mlx_lm.utils.load_model`, mlx-lm 0.32.2), and this port:
//!
//! | key | reference | port |
//! |---|---|---|
//! | `quantization` (`group_size`, `bits`, `mode`, per-path bool/dict) | `nn.quantize` with `class_predicate` | resolved as above |
//! | per-path `quantize_input: true` | `nn.QQLinear` | refused ([`Unresolvable::QuantizeInputUnsupported`]) |
//! | `{path}.global_scale` tensor, or per-path `global_scale: true` (switch) | `global_scale=True`: `_quantize_experts` shapes, nvfp4 only (`ValueError` otherwise) | resolved; the loader attaches the tensor ([`crate::quantized::QuantizedPayload::with_global_scale`]); a mode other than nvfp4 is [`Unresolvable::GlobalScaleMode`] |
//! | `quantization_config.quant_method` `mxfp4`, `mxfp8`, `fp8` (ue8m0, 32×32), `compressed-tensors`, `modelopt` (NVFP4) | mapped to a `quantization` dict | mapped the same way |
//! | `quant_method` `bitnet`, `awq`, `gptq` | `BitLinear` / weight transforms | refused ([`Unresolvable::UnsupportedQuantMethod`]) |
//! | `text_config.quantization_config`, `hf_quant_config.json` | legacy fallbacks | read the same way |
//! | top-level `quantize_activations` (truthy) | every `QuantizedLinear` → `nn.QQLinear`, or `ValueError` for other modes / a bias | refused for linear layers ([`Unresolvable::QuantizeActivations`]); switch layers unaffected, as in the reference |
//!
//! **Finding (reference):** the inferred spec is decided by the caller's
//! in_features, and the tensor shapes cannot catch a wrong one: 4-bit,
//! group-64 tensors of a 256-wide layer resolve to 2-bit, group-128 for a
//! 512-wide module, and every shape still matches, so a wrong in_features
//! loads silently (in the reference too).
//!
//! **Finding (origin):** the origin's loader called `quantFor(config.quantization,
//! path)`: the per-path entry, else the top-level default. The reference
//! instead infers the spec from the saved tensors for paths the config does
//! not name and leaves paths without `.scales` unquantized; they differ on
//! mixed-precision checkpoints whose config lists only some paths.

use std::path::Path;

use serde_json::{Map, Value};

use crate::ffi::Mode;
use crate::quantized::QuantSpec;

use super::{CheckpointError, TensorDtype};

/// The module type being quantized; it decides `to_quantized`'s defaults
/// and keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// `mlx.nn.Linear` → `QuantizedLinear` (`to_quantized(group_size=None,
    /// bits=None, mode="affine", quantize_input=False)`).
    Linear,
    /// `mlx_lm.models.switch_layers.SwitchLinear` → `QuantizedSwitchLinear`
    /// (`to_quantized(group_size=64, bits=4, mode="affine",
    /// global_scale=False)`).
    Switch,
}

/// Where a resolved spec came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecSource {
    /// A dict entry for the path in `config["quantization"]`.
    PerPath,
    /// A `true` entry for the path: the top-level `group_size`/`bits`/`mode`.
    TopLevel,
    /// `infer_quant_config` on the saved tensors.
    Inferred,
}

/// Why a path is not quantized.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NotQuantizedReason {
    /// Neither `quantization` nor a legacy `quantization_config`.
    NoQuantizationConfig,
    /// A legacy `quant_method` the reference's loader ignores.
    IgnoredQuantMethod(String),
    /// A falsy per-path entry (e.g. `false`).
    DisabledForPath,
    /// No `path.scales` tensor and no per-path entry.
    NoScales,
}

/// The outcome for one path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SpecResolution {
    /// The layer is quantized with `spec`.
    Quantized {
        /// The validated spec.
        spec: QuantSpec,
        /// Where it came from.
        source: SpecSource,
    },
    /// The layer stays a float layer.
    NotQuantized(NotQuantizedReason),
}

/// Why a path's spec cannot be resolved (each is an exception in the
/// reference's loader).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolvable {
    /// `config["quantization"]` is not an object.
    #[error("`quantization` is not an object")]
    QuantizationNotObject,
    /// `quantization` lacks `group_size` or `bits` (`KeyError`).
    #[error("`quantization` has no `{0}` key")]
    MissingTopLevelKey(&'static str),
    /// A per-path entry that is neither a bool nor a dict.
    #[error("the per-path entry {0} is neither a bool nor a dict (``class_predicate`` must return a bool or a dict of parameters to pass to ``to_quantized``)")]
    InvalidEntry(String),
    /// A key `to_quantized` does not take (`TypeError`).
    #[error("to_quantized() got an unexpected keyword argument '{0}'")]
    UnexpectedKey(String),
    /// A `group_size`, `bits` or `mode` value of the wrong type.
    #[error("`{key}` = {value} is not a valid value")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value (as JSON).
        value: String,
    },
    /// `quantize_input: true` asks for `QQLinear`, which is not ported.
    #[error("quantize_input=true (QQLinear) is not supported")]
    QuantizeInputUnsupported,
    /// Top-level `quantize_activations: true`: the reference builds
    /// `nn.QQLinear` (activations quantized too) for nvfp4 and mxfp8
    /// layers without a bias, and raises `ValueError` for any other mode
    /// or a bias. `QQLinear` is not ported, so both are refused.
    #[error(
        "quantize_activations=true: {}",
        if *bias {
            "the reference raises ValueError (\"Linear layer with bias does not support activation quantization\")".to_owned()
        } else if matches!(mode, Mode::Nvfp4 | Mode::Mxfp8) {
            format!("the reference builds nn.QQLinear ({mode} weights and activations), which is not ported; load without quantize_activations")
        } else {
            format!("the reference raises ValueError (mode {mode} does not support activation quantization)")
        }
    )]
    QuantizeActivations {
        /// The layer's mode.
        mode: Mode,
        /// Whether the layer has an additive bias.
        bias: bool,
    },
    /// A per-expert global scale with a mode other than nvfp4
    /// (`_quantize_experts`' `ValueError`).
    #[error("A global scale needs 'nvfp4' mode, got '{mode}'.")]
    GlobalScaleMode {
        /// The mode.
        mode: Mode,
    },
    /// `infer_quant_config`'s `ValueError` for uint8 scales.
    #[error("Cannot infer the quantization mode: {bits} bits with group size {group_size}.")]
    CannotInfer {
        /// The inferred bits.
        bits: i64,
        /// The inferred group size.
        group_size: i64,
    },
    /// `infer_quant_config` divides by zero (scales' last dimension is 0).
    #[error("the scales' last dimension is 0 (division by zero)")]
    ZeroGroups,
    /// `infer_quant_config` needs 2-D+ scales.
    #[error("the scales are a scalar")]
    ScalarScales,
    /// A legacy `quantization_config` that is not an object or lacks
    /// `quant_method`.
    #[error("`quantization_config` is not an object with a `quant_method`")]
    MalformedQuantizationConfig,
    /// A legacy method that needs conversion this port does not do (bitnet,
    /// awq, gptq) or that the reference rejects.
    #[error("quant_method {0} is not supported")]
    UnsupportedQuantMethod(String),
    /// `hf_quant_config.json` exists but is not valid JSON.
    #[error("hf_quant_config.json is malformed: {0}")]
    MalformedHfQuantConfig(String),
}

/// What the resolver needs to know about the saved tensors.
pub(crate) trait Tensors {
    /// dtype and shape of `name`, if saved.
    fn lookup(&self, name: &str) -> Option<(TensorDtype, &[usize])>;
}

fn unresolvable(path: &str, reason: Unresolvable) -> CheckpointError {
    CheckpointError::QuantSpecUnresolvable {
        path: path.to_owned(),
        reason,
    }
}

/// Python truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The effective `quantization` dict, or why there is none.
fn quantization_dict(
    config: &Map<String, Value>,
    dir: Option<&Path>,
    path: &str,
) -> Result<Result<Map<String, Value>, NotQuantizedReason>, CheckpointError> {
    // The reference looks for a legacy `quantization_config` (config, then
    // text_config, then hf_quant_config.json, which it parses even when
    // `quantization` is present) before it looks at `quantization`.
    let hf;
    let qc = if config.contains_key("quantization_config") {
        config.get("quantization_config")
    } else if let Some(tc) = config
        .get("text_config")
        .and_then(Value::as_object)
        .filter(|tc| tc.contains_key("quantization_config"))
    {
        tc.get("quantization_config")
    } else {
        hf = read_hf_quant_config(dir, path)?;
        hf.as_ref()
    };
    match config.get("quantization") {
        Some(Value::Null) | None => {}
        Some(Value::Object(q)) => return Ok(Ok(q.clone())),
        Some(_) => return Err(unresolvable(path, Unresolvable::QuantizationNotObject)),
    }
    let Some(qc) = qc.filter(|v| truthy(v)) else {
        return Ok(Err(NotQuantizedReason::NoQuantizationConfig));
    };
    let method = qc
        .get("quant_method")
        .ok_or_else(|| unresolvable(path, Unresolvable::MalformedQuantizationConfig))?;
    let method_str = method.as_str().unwrap_or_default();
    let legacy = |group_size: i64, bits: i64, mode: &str| {
        let mut q = Map::new();
        q.insert("group_size".into(), group_size.into());
        q.insert("bits".into(), bits.into());
        q.insert("mode".into(), mode.into());
        Ok(Ok(q))
    };
    match method_str {
        "mxfp4" => legacy(32, 4, "mxfp4"),
        "mxfp8" => legacy(32, 8, "mxfp8"),
        "fp8"
            if qc.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
                && qc.get("weight_block_size") == Some(&serde_json::json!([32, 32])) =>
        {
            legacy(32, 8, "mxfp8")
        }
        "compressed-tensors" => match qc.get("format").and_then(Value::as_str) {
            Some("nvfp4-pack-quantized") => legacy(16, 4, "nvfp4"),
            Some("mxfp4-pack-quantized") => legacy(32, 4, "mxfp4"),
            Some("pack-quantized") => legacy(32, 4, "affine"),
            other => Err(unresolvable(
                path,
                Unresolvable::UnsupportedQuantMethod(format!(
                    "compressed-tensors with format {other:?}"
                )),
            )),
        },
        "modelopt" => {
            let settings = qc.get("quantization").unwrap_or(qc);
            let algo = settings.get("quant_algo");
            if algo.and_then(Value::as_str) != Some("NVFP4") {
                return Err(unresolvable(
                    path,
                    Unresolvable::UnsupportedQuantMethod(format!("modelopt quant_algo {algo:?}")),
                ));
            }
            match settings.get("group_size") {
                None => legacy(16, 4, "nvfp4"),
                Some(gs) => {
                    let mut q = Map::new();
                    q.insert("group_size".into(), gs.clone());
                    q.insert("bits".into(), 4.into());
                    q.insert("mode".into(), "nvfp4".into());
                    Ok(Ok(q))
                }
            }
        }
        "bitnet" | "awq" | "gptq" => Err(unresolvable(
            path,
            Unresolvable::UnsupportedQuantMethod(method_str.to_owned()),
        )),
        _ => Ok(Err(NotQuantizedReason::IgnoredQuantMethod(
            method.to_string(),
        ))),
    }
}

fn read_hf_quant_config(dir: Option<&Path>, path: &str) -> Result<Option<Value>, CheckpointError> {
    let Some(file) = dir.map(|d| d.join("hf_quant_config.json")) else {
        return Ok(None);
    };
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| unresolvable(path, Unresolvable::MalformedHfQuantConfig(e.to_string()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io { path: file, source }),
    }
}

/// An optional integer argument: absent or `null` → `None`; a JSON integer
/// → its value; anything else (bool, float, string, ...) is rejected, as
/// `mx.quantize`'s `std::optional<int>` parameters reject it.
fn int_arg(path: &str, key: &str, v: Option<&Value>) -> Result<Option<i64>, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
        Some(other) => Err(unresolvable(
            path,
            Unresolvable::InvalidValue {
                key: key.to_owned(),
                value: other.to_string(),
            },
        )),
    }
}

fn mode_arg(path: &str, v: Option<&Value>) -> Result<Mode, CheckpointError> {
    match v {
        None => Ok(Mode::Affine),
        Some(Value::String(s)) => s.parse::<Mode>().map_err(|e| CheckpointError::InvalidSpec {
            path: path.to_owned(),
            source: e.into(),
        }),
        Some(other) => Err(unresolvable(
            path,
            Unresolvable::InvalidValue {
                key: "mode".to_owned(),
                value: other.to_string(),
            },
        )),
    }
}

/// `to_quantized(group_size, bits, mode)` then `mx.quantize` of the
/// `[out, in_features]` weight: a `None` takes the mode's default; the
/// result must be a combination `mx.quantize` accepts and the group size
/// must divide in_features.
fn finish(
    path: &str,
    mode: Mode,
    group_size: Option<i64>,
    bits: Option<i64>,
    in_features: i32,
    source: SpecSource,
) -> Result<SpecResolution, CheckpointError> {
    let (default_gs, default_bits) = mode.defaults();
    let narrow = |key: &str, v: i64| {
        i32::try_from(v).map_err(|_| {
            unresolvable(
                path,
                Unresolvable::InvalidValue {
                    key: key.to_owned(),
                    value: v.to_string(),
                },
            )
        })
    };
    let group_size = group_size.map_or(Ok(default_gs), |v| narrow("group_size", v))?;
    let bits = bits.map_or(Ok(default_bits), |v| narrow("bits", v))?;
    let spec =
        QuantSpec::new(mode, bits, group_size).map_err(|source| CheckpointError::InvalidSpec {
            path: path.to_owned(),
            source,
        })?;
    if in_features % group_size != 0 {
        return Err(CheckpointError::Payload {
            path: path.to_owned(),
            source: crate::quantized::PayloadError::GroupSizeDoesNotDivide {
                in_features,
                group_size,
            },
        });
    }
    Ok(SpecResolution::Quantized { spec, source })
}

/// Resolves the spec of module `path` (see the module docs).
pub(crate) fn resolve(
    config: &Map<String, Value>,
    dir: Option<&Path>,
    tensors: &impl Tensors,
    path: &str,
    kind: LayerKind,
    in_features: i32,
) -> Result<SpecResolution, CheckpointError> {
    let resolution = resolve_spec(config, dir, tensors, path, kind, in_features)?;
    // `if config.get("quantize_activations", False)`: after quantization,
    // load_model replaces every `nn.QuantizedLinear` (not switch layers)
    // with `nn.QQLinear`, or raises for a mode or a bias QQLinear cannot
    // take. Either way the module is not the weight-only layer this port
    // builds, so it is refused rather than built with other numerics.
    if kind == LayerKind::Linear && config.get("quantize_activations").is_some_and(truthy) {
        if let SpecResolution::Quantized { spec, .. } = &resolution {
            let bias = tensors.lookup(&format!("{path}.bias")).is_some();
            return Err(unresolvable(
                path,
                Unresolvable::QuantizeActivations {
                    mode: spec.mode,
                    bias,
                },
            ));
        }
    }
    Ok(resolution)
}

fn resolve_spec(
    config: &Map<String, Value>,
    dir: Option<&Path>,
    tensors: &impl Tensors,
    path: &str,
    kind: LayerKind,
    in_features: i32,
) -> Result<SpecResolution, CheckpointError> {
    if in_features <= 0 {
        return Err(CheckpointError::InvalidInFeatures {
            path: path.to_owned(),
            in_features,
        });
    }
    let q = match quantization_dict(config, dir, path)? {
        Ok(q) => q,
        Err(reason) => return Ok(SpecResolution::NotQuantized(reason)),
    };
    // `nn.quantize(model, group_size=q["group_size"], bits=q["bits"], ...)`
    // is evaluated before any predicate runs.
    for key in ["group_size", "bits"] {
        if !q.contains_key(key) {
            return Err(unresolvable(path, Unresolvable::MissingTopLevelKey(key)));
        }
    }

    if let Some(entry) = q.get(path) {
        if !truthy(entry) {
            return Ok(SpecResolution::NotQuantized(
                NotQuantizedReason::DisabledForPath,
            ));
        }
        return match entry {
            Value::Bool(true) => {
                let mode = mode_arg(path, q.get("mode"))?;
                let gs = int_arg(path, "group_size", q.get("group_size"))?;
                let bits = int_arg(path, "bits", q.get("bits"))?;
                finish(path, mode, gs, bits, in_features, SpecSource::TopLevel)
            }
            Value::Object(params) => per_path(path, params, kind, in_features),
            other => Err(unresolvable(
                path,
                Unresolvable::InvalidEntry(other.to_string()),
            )),
        };
    }

    let scales_name = format!("{path}.scales");
    let Some((scales_dtype, scales_shape)) = tensors.lookup(&scales_name) else {
        return Ok(SpecResolution::NotQuantized(NotQuantizedReason::NoScales));
    };
    let weight_name = format!("{path}.weight");
    let (_, weight_shape) =
        tensors
            .lookup(&weight_name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                path: path.to_owned(),
                tensor: weight_name.clone(),
            })?;
    let groups = *scales_shape
        .last()
        .ok_or_else(|| unresolvable(path, Unresolvable::ScalarScales))?;
    if groups == 0 {
        return Err(unresolvable(path, Unresolvable::ZeroGroups));
    }
    let packed = weight_shape.last().copied().unwrap_or(1);
    let in_dims = i64::from(in_features);
    let group_size = in_dims / i64::try_from(groups).unwrap_or(i64::MAX);
    let bits = i64::try_from(packed)
        .ok()
        .and_then(|p| p.checked_mul(32))
        .map_or(i64::MAX, |p| p / in_dims);
    let scales_uint8 = super::mlx_dtype(scales_dtype) == Some(mlx_rs::Dtype::Uint8);
    let mode = if !scales_uint8 {
        Mode::Affine
    } else {
        match (bits, group_size) {
            (4, 16) => Mode::Nvfp4,
            (4, 32) => Mode::Mxfp4,
            (8, 32) => Mode::Mxfp8,
            _ => {
                return Err(unresolvable(
                    path,
                    Unresolvable::CannotInfer { bits, group_size },
                ))
            }
        }
    };
    if kind == LayerKind::Switch
        && tensors.lookup(&format!("{path}.global_scale")).is_some()
        && mode != Mode::Nvfp4
    {
        return Err(unresolvable(path, Unresolvable::GlobalScaleMode { mode }));
    }
    finish(
        path,
        mode,
        Some(group_size),
        Some(bits),
        in_features,
        SpecSource::Inferred,
    )
}

/// `m.to_quantized(**params)` for a dict entry.
fn per_path(
    path: &str,
    params: &Map<String, Value>,
    kind: LayerKind,
    in_features: i32,
) -> Result<SpecResolution, CheckpointError> {
    // nn.quantize pops a falsy `quantize_input` before the call.
    let mut params = params.clone();
    if params.get("quantize_input").is_some_and(|v| !truthy(v)) {
        params.remove("quantize_input");
    }
    let allowed: &[&str] = match kind {
        LayerKind::Linear => &["group_size", "bits", "mode", "quantize_input"],
        LayerKind::Switch => &["group_size", "bits", "mode", "global_scale"],
    };
    if let Some(key) = params.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(unresolvable(path, Unresolvable::UnexpectedKey(key.clone())));
    }
    if params.contains_key("quantize_input") {
        return Err(unresolvable(path, Unresolvable::QuantizeInputUnsupported));
    }
    let mode = mode_arg(path, params.get("mode"))?;
    if params.get("global_scale").is_some_and(truthy) && mode != Mode::Nvfp4 {
        return Err(unresolvable(path, Unresolvable::GlobalScaleMode { mode }));
    }
    let gs = int_arg(path, "group_size", params.get("group_size"))?;
    let bits = int_arg(path, "bits", params.get("bits"))?;
    // A missing key takes the keyword's default: None (the mode's default)
    // for Linear, 64 and 4 for SwitchLinear. An explicit null is None for
    // both (then mx.quantize applies the mode's default).
    let (gs, bits) = match kind {
        LayerKind::Linear => (gs, bits),
        LayerKind::Switch => (
            if params.contains_key("group_size") {
                gs
            } else {
                Some(64)
            },
            if params.contains_key("bits") {
                bits
            } else {
                Some(4)
            },
        ),
    };
    finish(path, mode, gs, bits, in_features, SpecSource::PerPath)
}
