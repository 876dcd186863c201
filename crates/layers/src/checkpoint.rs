//! MLX model directories: `config.json`, `model*.safetensors` (read with positioned reads)
//! shards (with `model.safetensors.index.json` when sharded), tensors by
//! name, and the quantization spec of each module path.
//!
//! Mirrors the loading half of `mlx_lm.utils.load_model` (mlx-lm 0.32.2):
//! `load_config` (`config.json`), the weight files (`glob("model*.safetensors")`,
//! loaded with `mx.load`), and the per-path quantization decision
//! (`class_predicate` + `infer_quant_config`, see [`Checkpoint::resolve_quant_spec`]).
//!
//! The index (`model.safetensors.index.json`) is not read, as the
//! reference never reads it: a directory whose index lists a shard that is
//! not there, or names the wrong shard, loads as `load_model` loads it.
//!
//! One deliberate difference: a tensor name in two shards is an error, where
//! the reference keeps whichever file `glob` lists last (directory order,
//! which the OS does not specify: the reference's result is undefined).
//!
//! Every failure is a typed [`CheckpointError`] naming the file, tensor or
//! module path; nothing here panics on malformed input.

mod error;
mod offload;
mod quant_config;
mod safetensors;
#[cfg(feature = "test-support")]
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::{Map, Value};

use crate::quantized::{PayloadError, QuantizedPayload};

pub use self::error::CheckpointError;
pub use self::offload::{map_page_aligned, page_size, ExpertOffload, OffloadEntry, OffloadError};
pub use self::quant_config::{
    LayerKind, NotQuantizedReason, SpecResolution, SpecSource, Unresolvable,
};
pub use self::safetensors::{
    mlx_dtype, SafetensorsFile, SafetensorsHeader, TensorDtype, TensorInfo, TensorView,
};
#[cfg(feature = "test-support")]
pub use self::writer::{write_arrays, write_model_dir, write_safetensors, RawTensor};

/// The tensors of one quantized module, resolved and checked.
#[derive(Debug, Clone)]
pub struct QuantizedTensors {
    /// weight, scales, biases and the resolved spec.
    pub payload: QuantizedPayload,
    /// The additive `.bias`, when the checkpoint has one.
    pub bias: Option<Array>,
    /// Where the spec came from.
    pub source: SpecSource,
}

/// An MLX model directory, opened and validated.
pub struct Checkpoint {
    dir: PathBuf,
    config: Map<String, Value>,
    files: Vec<SafetensorsFile>,
    /// tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.files)
            .field("tensors", &self.index.len())
            .finish()
    }
}

/// Reads and parses `config.json` as `mlx_lm.utils.load_config` does
/// (`json.load`; the result must be an object).
///
/// # Errors
/// [`CheckpointError::ConfigMissing`], [`CheckpointError::ConfigMalformed`],
/// [`CheckpointError::Io`].
pub fn load_config(dir: impl AsRef<Path>) -> Result<Map<String, Value>, CheckpointError> {
    let path = dir.as_ref().join("config.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::ConfigMissing { path })
        }
        Err(source) => return Err(CheckpointError::Io { path, source }),
    };
    parse_config(&bytes, &path)
}

/// Parses config bytes; `path` only names them in errors.
///
/// # Errors
/// [`CheckpointError::ConfigMalformed`].
pub fn parse_config(bytes: &[u8], path: &Path) -> Result<Map<String, Value>, CheckpointError> {
    let malformed = |message: String| CheckpointError::ConfigMalformed {
        path: path.to_owned(),
        message,
    };
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(malformed("not a JSON object".to_owned())),
        Err(e) => Err(malformed(e.to_string())),
    }
}

impl Checkpoint {
    /// Opens `dir`: `config.json`, every `model*.safetensors` (sorted by
    /// name, each opened and its header validated), and the index when
    /// present.
    ///
    /// # Errors
    /// Config errors, [`CheckpointError::NoWeightFiles`], every safetensors
    /// header error, [`CheckpointError::DuplicateTensor`], and index errors.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let dir = dir.as_ref().to_owned();
        let config = load_config(&dir)?;
        let io = |source| CheckpointError::Io {
            path: dir.clone(),
            source,
        };
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map_err(io)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("model") && n.ends_with(".safetensors"))
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(CheckpointError::NoWeightFiles { dir });
        }
        let files = names
            .iter()
            .map(|n| SafetensorsFile::open(dir.join(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for (i, file) in files.iter().enumerate() {
            for (name, _) in file.tensors() {
                if let Some(&j) = index.get(name) {
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: name.to_owned(),
                        first: files[j].path().to_owned(),
                        second: file.path().to_owned(),
                    });
                }
                index.insert(name.to_owned(), i);
            }
        }
        let checkpoint = Checkpoint {
            dir,
            config,
            files,
            index,
        };
        Ok(checkpoint)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &Map<String, Value> {
        &self.config
    }

    /// The safetensors files, sorted by name.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// Every tensor name, sorted.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The file holding tensor `name`.
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`].
    pub fn file_of(&self, name: &str) -> Result<&SafetensorsFile, CheckpointError> {
        self.index
            .get(name)
            .and_then(|&i| self.files.get(i))
            .ok_or_else(|| CheckpointError::TensorNotFound {
                name: name.to_owned(),
            })
    }

    /// dtype, shape and byte range of tensor `name`.
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`].
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, CheckpointError> {
        self.file_of(name)?
            .info(name)
            .ok_or_else(|| CheckpointError::TensorNotFound {
                name: name.to_owned(),
            })
    }

    /// Tensor `name` with its raw bytes (read from its shard).
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, CheckpointError> {
        self.file_of(name)?.tensor(name)
    }

    /// Tensor `name` as an MLX array, with `mx.load`'s dtype and bits.
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`] and [`TensorView::to_array`]'s.
    pub fn array(&self, name: &str) -> Result<Array, CheckpointError> {
        self.tensor(name)?.to_array()
    }

    /// The quantization spec of module `path` (e.g.
    /// `model.layers.0.mlp.down_proj`), resolved as `mlx_lm.utils.load_model`
    /// (mlx-lm 0.32.2) does: `class_predicate` — a per-path entry of
    /// `config["quantization"]` (a dict, `false`/falsy = not quantized,
    /// `true` = the top-level values), else `infer_quant_config` on the saved
    /// tensors when `path.scales` exists, else not quantized — then the
    /// checks `to_quantized`/`mx.quantize` make. See the rules in
    /// `checkpoint/quant_config.rs`.
    ///
    /// `kind` selects `to_quantized`'s defaults; `in_features` is the
    /// unquantized module's `weight.shape[-1]`.
    ///
    /// # Errors
    /// [`CheckpointError::QuantSpecUnresolvable`], [`CheckpointError::InvalidSpec`],
    /// [`CheckpointError::Payload`] (group size not dividing in_features),
    /// [`CheckpointError::MissingTensor`] (scales without weight),
    /// [`CheckpointError::InvalidInFeatures`].
    pub fn resolve_quant_spec(
        &self,
        path: &str,
        kind: LayerKind,
        in_features: i32,
    ) -> Result<SpecResolution, CheckpointError> {
        quant_config::resolve(&self.config, Some(&self.dir), self, path, kind, in_features)
    }

    /// The tensors of quantized module `path`, checked against the resolved
    /// spec and `in_features` (the reference's strict `load_weights`).
    ///
    /// # Errors
    /// [`Checkpoint::resolve_quant_spec`]'s, [`CheckpointError::NotQuantized`],
    /// [`CheckpointError::MissingTensor`] for `.weight`/`.scales`/affine
    /// `.biases`, [`CheckpointError::UnexpectedTensor`] for `.biases` of a
    /// mode without zero points, [`CheckpointError::Payload`] for shapes that
    /// do not fit, and array conversion errors.
    pub fn quantized_tensors(
        &self,
        path: &str,
        kind: LayerKind,
        in_features: i32,
    ) -> Result<QuantizedTensors, CheckpointError> {
        let (spec, source) = match self.resolve_quant_spec(path, kind, in_features)? {
            SpecResolution::Quantized { spec, source } => (spec, source),
            SpecResolution::NotQuantized(reason) => {
                return Err(CheckpointError::NotQuantized {
                    path: path.to_owned(),
                    reason,
                })
            }
        };
        let required = |suffix: &str| {
            let name = format!("{path}.{suffix}");
            if self.contains(&name) {
                self.array(&name)
            } else {
                Err(CheckpointError::MissingTensor {
                    path: path.to_owned(),
                    tensor: name,
                })
            }
        };
        let optional = |suffix: &str| {
            let name = format!("{path}.{suffix}");
            self.contains(&name).then(|| self.array(&name)).transpose()
        };
        let weight = required("weight")?;
        let scales = required("scales")?;
        let biases = if spec.mode.has_biases() {
            Some(required("biases")?)
        } else {
            if self.contains(&format!("{path}.biases")) {
                return Err(CheckpointError::UnexpectedTensor {
                    path: path.to_owned(),
                    tensor: format!("{path}.biases"),
                });
            }
            None
        };
        let payload_error = |source| CheckpointError::Payload {
            path: path.to_owned(),
            source,
        };
        let mut payload =
            QuantizedPayload::new(weight, scales, biases, spec).map_err(payload_error)?;
        // mlx-lm saves a switch layer's per-expert nvfp4 scales as
        // `<path>.global_scale` (`_quantize_experts`).
        if kind == LayerKind::Switch {
            if let Some(gs) = optional("global_scale")? {
                payload = payload.with_global_scale(gs).map_err(payload_error)?;
            }
        }
        if payload.in_features() != in_features {
            return Err(payload_error(PayloadError::InFeatures {
                expected: in_features,
                actual: payload.in_features(),
            }));
        }
        Ok(QuantizedTensors {
            payload,
            bias: optional("bias")?,
            source,
        })
    }
}

impl quant_config::Tensors for Checkpoint {
    fn lookup(&self, name: &str) -> Option<(TensorDtype, &[usize])> {
        let info = self.tensor_info(name).ok()?;
        Some((info.dtype, info.shape.as_slice()))
    }
}
