//! LoRA adapter directories (`adapter_config.json` + `adapters.safetensors`)
//! as mlx-lm and mlx-vlm write and load them.
//!
//! | format | written by | config | tensors per module | scale |
//! | --- | --- | --- | --- | --- |
//! | [`AdapterFormat::MlxLm`] | `mlx_lm lora` (mlx-lm 0.32.2) | `fine_tune_type`, `num_layers`, `lora_parameters: {rank, scale, dropout[, keys]}` | `<path>.lora_a` `[in, r]`, `<path>.lora_b` `[r, out]` | `scale` as written (`KeyError` without it; mlx-lm never reads `alpha`) |
//! | [`AdapterFormat::MlxVlm`] | `mlx_vlm.trainer` `get_peft_model` (mlx-vlm 0.7.6) | the same keys, `scale = alpha / rank` computed by `_lora_scale` in Python floats (f64) | as mlx-lm | as written |
//! | [`AdapterFormat::MlxVlmLegacy`] | older mlx-vlm (`LoRaLayer`) | `{rank, alpha, dropout}` (alpha default 0.1) | `<path>.A` `[in, r]`, `<path>.B` `[r, out]` | `alpha / rank` in f64, as `LoRaLayer.__init__` |
//!
//! Each scale reaches MLX as a Python float multiplied into a float32
//! array, i.e. rounded once to f32 **after** the f64 division. Dividing in
//! f32 instead (`alpha as f32 / rank as f32`) differs in the last bit for
//! some (alpha, rank) pairs (finding; the `adapters/scale` case lists
//! them). [`lora_scale_from_alpha`] does it the reference's way.
//!
//! Loading mirrors `mlx_lm.tuner.utils.load_adapters` and
//! `mlx_vlm.trainer.utils.apply_lora_layers`: the reference converts the
//! model's modules named by `keys` (or every linear module of the last
//! `num_layers` blocks) to LoRA layers and loads the file into them; the
//! port has no model, so it returns the file's adapters by module path and
//! the engine attaches each to its layer ([`super::QuantizedLinear::attach_adapter`]
//! checks the shapes). DoRA and full fine-tunes are refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::checkpoint::{CheckpointError, SafetensorsFile};

use super::{LayerError, LoraAdapter};

/// Which library's on-disk convention to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdapterFormat {
    /// `mlx_lm.tuner.utils.load_adapters` (mlx-lm 0.32.2).
    MlxLm,
    /// `mlx_vlm.trainer.utils.apply_lora_layers` with `lora_parameters`
    /// (mlx-vlm 0.7.6).
    MlxVlm,
    /// `mlx_vlm.trainer.utils.apply_lora_layers` with a top-level `rank`
    /// (`_apply_legacy_lora_layers`, `LoRaLayer`; mlx-vlm 0.7.6).
    MlxVlmLegacy,
}

impl AdapterFormat {
    /// Which format mlx-vlm's `apply_lora_layers` takes for this config:
    /// `lora_parameters` → [`AdapterFormat::MlxVlm`], else a top-level
    /// `rank` → [`AdapterFormat::MlxVlmLegacy`].
    ///
    /// # Errors
    /// [`AdapterError::NoLoraParameters`] with neither (mlx-vlm's
    /// `ValueError`).
    pub fn detect_mlx_vlm(config: &Map<String, Value>, dir: &Path) -> Result<Self, AdapterError> {
        if config.contains_key("lora_parameters") {
            Ok(AdapterFormat::MlxVlm)
        } else if config.contains_key("rank") {
            Ok(AdapterFormat::MlxVlmLegacy)
        } else {
            Err(AdapterError::NoLoraParameters {
                file: dir.join(ADAPTER_CONFIG),
            })
        }
    }
}

/// The config file of an adapter directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The weights file of an adapter directory.
pub const ADAPTER_WEIGHTS: &str = "adapters.safetensors";

/// An adapter directory that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The directory does not exist (the reference's `FileNotFoundError`).
    #[error("{}: the adapter path does not exist; pass the directory holding adapter_config.json and adapters.safetensors", .dir.display())]
    NoDirectory {
        /// The directory.
        dir: PathBuf,
    },
    /// `adapter_config.json` unreadable or not a JSON object.
    #[error("{}: {message}", .file.display())]
    Config {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A key the library requires.
    #[error("{}: `{key}` is missing: {reference}", .file.display())]
    MissingKey {
        /// The file.
        file: PathBuf,
        /// Dotted key.
        key: String,
        /// What the reference does, and the fix.
        reference: &'static str,
    },
    /// A key of the wrong type or value.
    #[error("{}: `{key}` = {value} is invalid: {expected}", .file.display())]
    InvalidValue {
        /// The file.
        file: PathBuf,
        /// Dotted key.
        key: String,
        /// The value as written.
        value: String,
        /// What is expected.
        expected: &'static str,
    },
    /// mlx-vlm's `ValueError`: neither `lora_parameters` nor `rank`.
    #[error("{}: the adapter does not have lora params in the config (neither `lora_parameters` nor `rank`)", .file.display())]
    NoLoraParameters {
        /// The file.
        file: PathBuf,
    },
    /// A fine-tune type the port does not load.
    #[error("{}: fine_tune_type {got:?} is not supported (only \"lora\"; DoRA and full fine-tunes are not ported)", .file.display())]
    FineTuneType {
        /// The file.
        file: PathBuf,
        /// What the file says.
        got: String,
    },
    /// The weights file could not be read.
    #[error(transparent)]
    Weights(#[from] CheckpointError),
    /// A tensor of an mlx-lm file whose name is not `<module>.lora_a` /
    /// `<module>.lora_b` (mlx-lm's `load_adapters` raises too). mlx-vlm
    /// files keep such tensors aside ([`AdapterSet::extra_tensors`]).
    #[error("{}: tensor `{name}` is not an adapter parameter of the {format:?} format (expected names ending in .{a} and .{b})", .file.display())]
    UnexpectedTensor {
        /// The file.
        file: PathBuf,
        /// The tensor.
        name: String,
        /// The format read.
        format: AdapterFormat,
        /// The A-matrix suffix.
        a: &'static str,
        /// The B-matrix suffix.
        b: &'static str,
    },
    /// A module with a B matrix but no A: the reference keeps A's random
    /// initialisation (reference undefined). A module with an A but no B
    /// is loaded with B's initialisation, zeros, as the reference loads it.
    #[error("{}: module `{module}` has `{present}` but no `{missing}`", .file.display())]
    HalfAdapter {
        /// The file.
        file: PathBuf,
        /// The module path.
        module: String,
        /// The tensor found.
        present: String,
        /// The tensor missing.
        missing: String,
    },
    /// Matrices whose rank is not the config's (the reference's
    /// `load_weights` shape check).
    #[error("{}: module `{module}`: {tensor} has shape {shape:?}, but the config's rank is {rank}", .file.display())]
    Rank {
        /// The file.
        file: PathBuf,
        /// The module path.
        module: String,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<i32>,
        /// The config's rank.
        rank: i64,
    },
    /// The matrices do not form an adapter.
    #[error("module `{module}`: {source}")]
    Adapter {
        /// The module path.
        module: String,
        /// The layer error.
        source: Box<LayerError>,
    },
}

/// `alpha / rank` as the reference computes it (Python floats, f64), then
/// rounded once to f32 as MLX does when the Python float meets a float32
/// array: mlx-vlm's `_lora_scale` and `LoRaLayer.__init__`.
pub fn lora_scale_from_alpha(alpha: f64, rank: i64) -> f32 {
    (alpha / rank as f64) as f32
}

/// The adapters of one directory, by module path.
#[derive(Debug, Clone)]
pub struct AdapterSet {
    format: AdapterFormat,
    rank: i64,
    scale: f32,
    scale_f64: f64,
    adapters: BTreeMap<String, LoraAdapter>,
    extra_tensors: Vec<String>,
}

impl AdapterSet {
    /// Loads `dir` in `format`.
    ///
    /// # Errors
    /// [`AdapterError`]: no directory, an unreadable or invalid config
    /// (naming the key), `fine_tune_type` other than `lora`, a weights file
    /// that cannot be read, tensors that are not adapter matrices of this
    /// format, a module with one matrix, or a rank other than the config's.
    pub fn open(dir: impl AsRef<Path>, format: AdapterFormat) -> Result<Self, AdapterError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(AdapterError::NoDirectory {
                dir: dir.to_path_buf(),
            });
        }
        let file = dir.join(ADAPTER_CONFIG);
        let config = read_config(&file)?;
        let (rank, scale_f64) = match format {
            AdapterFormat::MlxLm | AdapterFormat::MlxVlm => lora_parameters(&config, &file)?,
            AdapterFormat::MlxVlmLegacy => legacy_parameters(&config, &file)?,
        };
        let (a, b) = match format {
            AdapterFormat::MlxLm | AdapterFormat::MlxVlm => ("lora_a", "lora_b"),
            AdapterFormat::MlxVlmLegacy => ("A", "B"),
        };
        // The reference's float scale meets a float32 array: one rounding.
        let scale = scale_f64 as f32;
        let weights_path = dir.join(ADAPTER_WEIGHTS);
        let weights = SafetensorsFile::open(&weights_path)?;
        let mut halves: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        let mut extra_tensors = Vec::new();
        for (name, _) in weights.tensors() {
            let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
            let slot = halves.entry(module.to_string()).or_default();
            if leaf == a && !module.is_empty() {
                slot.0 = Some(name.to_string());
            } else if leaf == b && !module.is_empty() {
                slot.1 = Some(name.to_string());
            } else if format != AdapterFormat::MlxLm {
                // mlx-vlm's `load_weights(strict=False)`: see `extra_tensors`.
                extra_tensors.push(name.to_string());
            } else {
                return Err(AdapterError::UnexpectedTensor {
                    file: weights_path.clone(),
                    name: name.to_string(),
                    format,
                    a,
                    b,
                });
            }
        }
        let mut adapters = BTreeMap::new();
        for (module, (a_name, b_name)) in halves {
            let (a_name, b_name) = match (a_name, b_name) {
                (Some(x), y) => (x, y),
                (None, Some(y)) => {
                    // lora_a would keep its random initialisation.
                    return Err(AdapterError::HalfAdapter {
                        file: weights_path.clone(),
                        missing: format!("{module}.{a}"),
                        module,
                        present: y,
                    });
                }
                (None, None) => continue,
            };
            let lora_a = weights.array(&a_name)?;
            let lora_b = match &b_name {
                Some(name) => weights.array(name)?,
                // The B matrix keeps its initialisation, zeros [r, out] in
                // float32; one zero column [r, 1] adds the same +0.0 to
                // every output (the layer broadcasts it, `LoraAdapter::fits`).
                None => mlx_rs::ops::zeros_dtype(
                    &[lora_a.shape().get(1).copied().unwrap_or(0), 1],
                    mlx_rs::Dtype::Float32,
                )
                .map_err(|e| AdapterError::Adapter {
                    module: module.clone(),
                    source: Box::new(LayerError::Mlx(e.into())),
                })?,
            };
            let b_name = b_name.unwrap_or_else(|| format!("{module}.{b} (absent: zeros)"));
            for (tensor, shape, axis) in
                [(&a_name, lora_a.shape(), 1), (&b_name, lora_b.shape(), 0)]
            {
                if shape.len() != 2 || i64::from(shape[axis]) != rank {
                    return Err(AdapterError::Rank {
                        file: weights_path.clone(),
                        module: module.clone(),
                        tensor: tensor.clone(),
                        shape: shape.to_vec(),
                        rank,
                    });
                }
            }
            let adapter = LoraAdapter::new(lora_a, lora_b, scale).map_err(|source| {
                AdapterError::Adapter {
                    module: module.clone(),
                    source: Box::new(source),
                }
            })?;
            adapters.insert(module, adapter);
        }
        Ok(AdapterSet {
            format,
            rank,
            scale,
            scale_f64,
            adapters,
            extra_tensors,
        })
    }

    /// The format read.
    pub fn format(&self) -> AdapterFormat {
        self.format
    }

    /// The config's rank.
    pub fn rank(&self) -> i64 {
        self.rank
    }

    /// The scale every adapter uses, as MLX sees it (f32).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The scale as the library holds it (a Python float).
    pub fn scale_f64(&self) -> f64 {
        self.scale_f64
    }

    /// Module paths with their adapters, sorted.
    pub fn adapters(&self) -> &BTreeMap<String, LoraAdapter> {
        &self.adapters
    }

    /// Tensors of an mlx-vlm file that are no adapter matrix, by name. The
    /// reference loads the file with `load_weights(strict=False)`: a name
    /// that matches no parameter of its model is ignored, one that matches
    /// a parameter **replaces** it. The port has no model: the engine must
    /// check these names against its own (an empty list is the common case).
    /// mlx-lm refuses such tensors ([`AdapterError::UnexpectedTensor`]).
    pub fn extra_tensors(&self) -> &[String] {
        &self.extra_tensors
    }

    /// The adapter of module `path`.
    pub fn get(&self, path: &str) -> Option<&LoraAdapter> {
        self.adapters.get(path)
    }
}

fn read_config(file: &Path) -> Result<Map<String, Value>, AdapterError> {
    let bytes = std::fs::read(file).map_err(|e| AdapterError::Config {
        file: file.to_path_buf(),
        message: format!("cannot read: {e}"),
    })?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(AdapterError::Config {
            file: file.to_path_buf(),
            message: "must be a JSON object".into(),
        }),
        Err(e) => Err(AdapterError::Config {
            file: file.to_path_buf(),
            message: format!(
                "not valid JSON at line {} column {}: {e}",
                e.line(),
                e.column()
            ),
        }),
    }
}

fn invalid(file: &Path, key: &str, v: &Value, expected: &'static str) -> AdapterError {
    AdapterError::InvalidValue {
        file: file.to_path_buf(),
        key: key.to_string(),
        value: v.to_string(),
        expected,
    }
}

fn positive_rank(file: &Path, key: &str, v: &Value) -> Result<i64, AdapterError> {
    match v.as_i64() {
        Some(r) if r > 0 => Ok(r),
        _ => Err(invalid(file, key, v, "a positive integer")),
    }
}

/// `{fine_tune_type, lora_parameters: {rank, scale, …}}`.
fn lora_parameters(config: &Map<String, Value>, file: &Path) -> Result<(i64, f64), AdapterError> {
    match config.get("fine_tune_type") {
        None => {}
        Some(Value::String(t)) if t == "lora" => {}
        Some(Value::String(t)) => {
            return Err(AdapterError::FineTuneType {
                file: file.to_path_buf(),
                got: t.clone(),
            })
        }
        Some(v) => return Err(invalid(file, "fine_tune_type", v, "a string")),
    }
    let params = match config.get("lora_parameters") {
        Some(Value::Object(p)) => p,
        Some(v) => return Err(invalid(file, "lora_parameters", v, "an object")),
        None => {
            return Err(AdapterError::MissingKey {
                file: file.to_path_buf(),
                key: "lora_parameters".into(),
                reference: "load_adapters reads config.lora_parameters (AttributeError); write \
                            {\"rank\": …, \"scale\": …, \"dropout\": …}",
            })
        }
    };
    let rank = match params.get("rank") {
        Some(v) => positive_rank(file, "lora_parameters.rank", v)?,
        None => {
            return Err(AdapterError::MissingKey {
                file: file.to_path_buf(),
                key: "lora_parameters.rank".into(),
                reference: "linear_to_lora_layers reads config[\"rank\"] (KeyError)",
            })
        }
    };
    let scale = match params.get("scale") {
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite())
            .ok_or_else(|| invalid(file, "lora_parameters.scale", v, "a finite number"))?,
        None => {
            return Err(AdapterError::MissingKey {
                file: file.to_path_buf(),
                key: "lora_parameters.scale".into(),
                reference: if params.contains_key("alpha") {
                    "mlx-lm's LoRA config uses 'scale', not 'alpha' (KeyError); write scale = \
                     alpha / rank"
                } else {
                    "linear_to_lora_layers requires it (KeyError)"
                },
            })
        }
    };
    Ok((rank, scale))
}

/// `{rank, alpha = 0.1, dropout = 0.1}` → `alpha / rank`.
fn legacy_parameters(config: &Map<String, Value>, file: &Path) -> Result<(i64, f64), AdapterError> {
    let rank = match config.get("rank") {
        Some(v) => positive_rank(file, "rank", v)?,
        None => {
            return Err(AdapterError::NoLoraParameters {
                file: file.to_path_buf(),
            })
        }
    };
    let alpha = match config.get("alpha") {
        None => 0.1,
        Some(v) => v
            .as_f64()
            .filter(|a| a.is_finite())
            .ok_or_else(|| invalid(file, "alpha", v, "a finite number"))?,
    };
    Ok((rank, alpha / rank as f64))
}
