//! Writing safetensors files and model directories, for test fixtures
//! (feature `test-support`; not part of the user API).

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};

use super::{CheckpointError, TensorDtype};

/// A tensor to write: name, dtype, shape and raw little-endian bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTensor {
    /// The name.
    pub name: String,
    /// The element type.
    pub dtype: TensorDtype,
    /// The shape.
    pub shape: Vec<usize>,
    /// `prod(shape) * bitsize(dtype) / 8` bytes.
    pub data: Vec<u8>,
}

impl RawTensor {
    /// The bytes of an MLX array (evaluated, made row-major).
    ///
    /// # Errors
    /// [`CheckpointError::Array`] when MLX fails to evaluate it.
    pub fn from_array(name: impl Into<String>, array: &Array) -> Result<Self, CheckpointError> {
        let name = name.into();
        let fail = |message: String| CheckpointError::Array {
            file: Default::default(),
            tensor: name.clone(),
            source: crate::ffi::MlxError {
                op: "array bytes",
                message,
            },
        };
        let a = array.contiguous().map_err(|e| fail(e.what().to_owned()))?;
        a.eval().map_err(|e| fail(e.what().to_owned()))?;
        macro_rules! bytes {
            ($t:ty, $st:ident) => {{
                let v = a
                    .try_as_slice::<$t>()
                    .map_err(|e| fail(e.to_string()))?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>();
                (TensorDtype::$st, v)
            }};
        }
        let (dtype, data) = match a.dtype() {
            Dtype::Bool => {
                let v = a.try_as_slice::<bool>().map_err(|e| fail(e.to_string()))?;
                (TensorDtype::BOOL, v.iter().map(|&b| u8::from(b)).collect())
            }
            Dtype::Uint8 => bytes!(u8, U8),
            Dtype::Uint16 => bytes!(u16, U16),
            Dtype::Uint32 => bytes!(u32, U32),
            Dtype::Uint64 => bytes!(u64, U64),
            Dtype::Int8 => bytes!(i8, I8),
            Dtype::Int16 => bytes!(i16, I16),
            Dtype::Int32 => bytes!(i32, I32),
            Dtype::Int64 => bytes!(i64, I64),
            Dtype::Float16 => bytes!(half::f16, F16),
            Dtype::Bfloat16 => bytes!(half::bf16, BF16),
            Dtype::Float32 => bytes!(f32, F32),
            Dtype::Float64 => bytes!(f64, F64),
            Dtype::Complex64 => {
                let v = a
                    .try_as_slice::<mlx_rs::complex64>()
                    .map_err(|e| fail(e.to_string()))?;
                let data = v
                    .iter()
                    .flat_map(|c| [c.re.to_le_bytes(), c.im.to_le_bytes()])
                    .flatten()
                    .collect();
                (TensorDtype::C64, data)
            }
        };
        let shape = a.shape().iter().map(|&d| d as usize).collect();
        Ok(RawTensor {
            name,
            dtype,
            shape,
            data,
        })
    }
}

/// Writes `tensors` (plus `__metadata__`) as a safetensors file with the
/// `safetensors` crate's serializer.
///
/// # Errors
/// [`CheckpointError::Io`] (serializer errors included, e.g. a byte length
/// that does not match the shape).
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[RawTensor],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let io = |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    };
    let views = tensors
        .iter()
        .map(|t| {
            safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map(|v| (t.name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| io(std::io::Error::other(e.to_string())))
}

/// Writes MLX arrays as a safetensors file ([`RawTensor::from_array`] +
/// [`write_safetensors`]).
///
/// # Errors
/// As those two.
pub fn write_arrays(
    path: impl AsRef<Path>,
    arrays: &[(&str, &Array)],
) -> Result<(), CheckpointError> {
    let tensors = arrays
        .iter()
        .map(|(n, a)| RawTensor::from_array(*n, a))
        .collect::<Result<Vec<_>, _>>()?;
    write_safetensors(path, &tensors, None)
}

/// Writes a model directory: `config.json` and one safetensors file per
/// shard (`model.safetensors` for one shard; `model-0000i-of-0000n.safetensors`
/// and `model.safetensors.index.json` for several).
///
/// # Errors
/// [`CheckpointError::Io`].
pub fn write_model_dir(
    dir: impl AsRef<Path>,
    config: &serde_json::Value,
    shards: &[Vec<RawTensor>],
) -> Result<(), CheckpointError> {
    let dir = dir.as_ref();
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CheckpointError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| io(&config_path)(std::io::Error::other(e)))?;
    std::fs::write(&config_path, text).map_err(io(&config_path))?;
    if let [single] = shards {
        return write_safetensors(dir.join("model.safetensors"), single, None);
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        write_safetensors(dir.join(&name), shard, None)?;
        for t in shard {
            weight_map.insert(t.name.clone(), name.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    let index_path = dir.join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).map_err(io(&index_path))
}
