//! Host-side tensors: what crosses between mlx-rs and the reference.
//!
//! A [`HostTensor`] is a dtype, a row-major shape and the raw little-endian
//! bytes of the elements. Nothing is converted on the way: bf16 travels as
//! its 16 bits, so a comparison sees exactly what each side produced.

use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};

/// Element types the oracle transfers (names as in `mlx.core`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Int32,
    Int64,
    Float16,
    Bfloat16,
    Float32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::Uint8 => 1,
            DType::Uint16 | DType::Float16 | DType::Bfloat16 => 2,
            DType::Uint32 | DType::Int32 | DType::Float32 => 4,
            DType::Int64 => 8,
        }
    }
    /// The `mlx.core` dtype name (`"bfloat16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Uint8 => "uint8",
            DType::Uint16 => "uint16",
            DType::Uint32 => "uint32",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Float32 => "float32",
        }
    }
    /// Inverse of [`DType::name`].
    pub fn from_name(name: &str) -> Result<Self, TensorError> {
        Ok(match name {
            "bool" => DType::Bool,
            "uint8" => DType::Uint8,
            "uint16" => DType::Uint16,
            "uint32" => DType::Uint32,
            "int32" => DType::Int32,
            "int64" => DType::Int64,
            "float16" => DType::Float16,
            "bfloat16" => DType::Bfloat16,
            "float32" => DType::Float32,
            other => return Err(TensorError::UnsupportedDtype(other.to_owned())),
        })
    }
    /// The float dtypes activations are tested in.
    pub const FLOATS: [DType; 3] = [DType::Bfloat16, DType::Float16, DType::Float32];

    /// Short name used in case names (`bf16`, `f16`, `f32`, else [`DType::name`]).
    pub fn tag(self) -> &'static str {
        match self {
            DType::Bfloat16 => "bf16",
            DType::Float16 => "f16",
            DType::Float32 => "f32",
            other => other.name(),
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::Float16 | DType::Bfloat16 | DType::Float32)
    }
    /// The mlx-rs dtype.
    pub fn to_mlx(self) -> Dtype {
        match self {
            DType::Bool => Dtype::Bool,
            DType::Uint8 => Dtype::Uint8,
            DType::Uint16 => Dtype::Uint16,
            DType::Uint32 => Dtype::Uint32,
            DType::Int32 => Dtype::Int32,
            DType::Int64 => Dtype::Int64,
            DType::Float16 => Dtype::Float16,
            DType::Bfloat16 => Dtype::Bfloat16,
            DType::Float32 => Dtype::Float32,
        }
    }
    fn from_mlx(d: Dtype) -> Result<Self, TensorError> {
        Ok(match d {
            Dtype::Bool => DType::Bool,
            Dtype::Uint8 => DType::Uint8,
            Dtype::Uint16 => DType::Uint16,
            Dtype::Uint32 => DType::Uint32,
            Dtype::Int32 => DType::Int32,
            Dtype::Int64 => DType::Int64,
            Dtype::Float16 => DType::Float16,
            Dtype::Bfloat16 => DType::Bfloat16,
            Dtype::Float32 => DType::Float32,
            other => return Err(TensorError::UnsupportedDtype(format!("{other:?}"))),
        })
    }
}

/// Errors building or converting a [`HostTensor`].
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("dtype {0} is not transferred by the oracle (supported: bool, uint8, uint16, uint32, int32, int64, float16, bfloat16, float32)")]
    UnsupportedDtype(String),
    #[error("{len} bytes do not hold shape {shape:?} of {dtype} ({expected} bytes expected)")]
    SizeMismatch {
        len: usize,
        shape: Vec<usize>,
        dtype: &'static str,
        expected: usize,
    },
    #[error("MLX failed while materialising the array: {0}")]
    Mlx(String),
}

/// A tensor on the host: dtype, row-major shape, raw element bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// Checks that `bytes` holds exactly `shape` elements of `dtype`.
    pub fn new(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Result<Self, TensorError> {
        let expected = shape.iter().product::<usize>() * dtype.size();
        if bytes.len() != expected {
            return Err(TensorError::SizeMismatch {
                len: bytes.len(),
                shape,
                dtype: dtype.name(),
                expected,
            });
        }
        Ok(Self {
            dtype,
            shape,
            bytes,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bits of element `i` (row-major), zero-extended.
    pub fn bits(&self, i: usize) -> u64 {
        let n = self.dtype.size();
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&self.bytes[i * n..(i + 1) * n]);
        u64::from_le_bytes(b)
    }

    /// Evaluates `array` and copies its elements (row-major, whatever its
    /// strides) to the host.
    pub fn from_array(array: &Array) -> Result<Self, TensorError> {
        let dtype = DType::from_mlx(array.dtype())?;
        if array.size() == 0 {
            // Nothing to read (MLX gives an empty array no data pointer).
            let shape = array.shape().iter().map(|&d| d as usize).collect();
            return Self::new(dtype, shape, Vec::new());
        }
        // A contiguous copy makes broadcast or transposed views row-major.
        let dense = array
            .contiguous()
            .map_err(|e| TensorError::Mlx(e.to_string()))?;
        dense.eval().map_err(|e| TensorError::Mlx(e.to_string()))?;
        let shape: Vec<usize> = dense.shape().iter().map(|&d| d as usize).collect();
        let n = shape.iter().product::<usize>() * dtype.size();
        // Same bytes under an integer view of the same width: no conversion.
        let bytes = match dtype.size() {
            1 => raw::<u8>(&dense, Dtype::Uint8, n)?,
            2 => raw::<u16>(&dense, Dtype::Uint16, n)?,
            4 => raw::<u32>(&dense, Dtype::Uint32, n)?,
            _ => raw::<u64>(&dense, Dtype::Uint64, n)?,
        };
        Self::new(dtype, shape, bytes)
    }

    /// A new mlx-rs array holding exactly these bits.
    pub fn to_array(&self) -> Array {
        let shape: Vec<i32> = self.shape.iter().map(|&d| d as i32).collect();
        // SAFETY: `bytes` holds shape × dtype.size() bytes (checked in `new`);
        // MLX copies them.
        unsafe { Array::from_raw_data(self.bytes.as_ptr().cast(), &shape, self.dtype.to_mlx()) }
    }

    /// Elements as f64 (for reporting; floats decoded from their bits).
    pub fn value(&self, i: usize) -> f64 {
        let b = self.bits(i);
        match self.dtype {
            DType::Bool | DType::Uint8 | DType::Uint16 | DType::Uint32 => b as f64,
            DType::Int32 => b as u32 as i32 as f64,
            DType::Int64 => b as i64 as f64,
            DType::Float16 => half::f16::from_bits(b as u16).to_f64(),
            DType::Bfloat16 => half::bf16::from_bits(b as u16).to_f64(),
            DType::Float32 => f32::from_bits(b as u32) as f64,
        }
    }
}

fn raw<T: mlx_rs::ArrayElement>(
    a: &Array,
    view: Dtype,
    nbytes: usize,
) -> Result<Vec<u8>, TensorError> {
    let v = a
        .view_dtype(view)
        .map_err(|e| TensorError::Mlx(e.to_string()))?;
    v.eval().map_err(|e| TensorError::Mlx(e.to_string()))?;
    let s = v
        .try_as_slice::<T>()
        .map_err(|e| TensorError::Mlx(e.to_string()))?;
    // SAFETY: `s` is a live slice of plain integers; reading its storage as
    // bytes is valid. MLX and both supported targets are little-endian.
    let bytes =
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) };
    debug_assert_eq!(bytes.len(), nbytes);
    Ok(bytes.to_vec())
}

#[cfg(not(target_endian = "little"))]
compile_error!("the oracle assumes little-endian element storage, as MLX does");
