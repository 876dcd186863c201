//! A safetensors file with a strict, typed header check, read with
//! positioned reads (not memory-mapped).
//!
//! **Contract.** [`SafetensorsFile::open`] reads and validates the header;
//! each tensor's bytes are read from the file when asked for. A file that
//! is truncated or replaced while open gives a typed
//! [`CheckpointError::FileChanged`] on the next read, never a SIGBUS (a
//! memory map of a file that shrinks kills the process when the missing
//! page is touched). Only the expert offload (`super::offload`) maps a
//! file, one this crate wrote and owns.
//!
//! The `safetensors` crate (0.8) is used for its `Dtype` (names, bit sizes)
//! and, in the test-support writer (`checkpoint/writer.rs`), for
//! serialization. Its reader is not used: it
//! reports an unknown dtype as a generic JSON error, a size mismatch without
//! the tensor's name, and out-of-range and overlapping offsets as the same
//! `InvalidOffset`, and it rejects gaps between tensors, which `mx.load`
//! accepts. The header is parsed here instead, against the format (8-byte
//! little-endian header length, JSON header, data section), with one typed
//! [`CheckpointError`] per failure, each naming the file and tensor.
//!
//! Compared with `mx.load` (mlx 0.32.2, probed): the same errors for a
//! header past the end of the file, offsets past the data section and a size
//! that does not match shape × dtype; gaps between tensors and overlapping
//! byte ranges accepted as `mx.load` accepts them (each tensor reads its own
//! range; the format forbids overlaps, the reference reads them, and a port
//! must read what the reference reads); a file holding a dtype `mx.load`
//! refuses (`F64`, `F8_E5M2`, the FNUZ, `F4` and `F6` types) refused at
//! open, whole, as `mx.load` refuses it (`[safetensor] unsupported dtype`).
//! Accepted as `mx.load`
//! accepts them: `__metadata__` absent, `null` (what `mx.save_safetensors`
//! writes without metadata) or a bare string (read as `{"": string}`, as
//! MLX does); unknown fields in a tensor entry; `data_offsets` written as
//! integral floats (`24.0`).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::ffi;

use super::CheckpointError;

/// A safetensors element type (`"F32"`, `"BF16"`, `"U32"`, ...).
pub type TensorDtype = safetensors::Dtype;

/// Where a tensor lives in its file: dtype, shape and byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The element type.
    pub dtype: TensorDtype,
    /// The shape (row-major).
    pub shape: Vec<usize>,
    /// `[start, end)` within the data section (after the header).
    pub data_offsets: (usize, usize),
}

/// A parsed, validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    /// Length of the JSON header in bytes (the first 8 bytes of the file).
    pub header_len: usize,
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The `__metadata__` string map, if present.
    pub metadata: Option<BTreeMap<String, String>>,
}

impl SafetensorsHeader {
    /// Parses and validates the header of a safetensors file held in `bytes`
    /// (the whole file); `file` only names it in errors.
    ///
    /// # Errors
    /// [`CheckpointError::FileTooShort`], [`CheckpointError::HeaderLengthPastEnd`],
    /// [`CheckpointError::InvalidHeaderJson`], [`CheckpointError::UnknownDtype`],
    /// [`CheckpointError::OffsetsOutOfRange`], [`CheckpointError::SizeMismatch`],
    /// [`CheckpointError::UnsupportedArrayDtype`].
    pub fn parse(bytes: &[u8], file: &Path) -> Result<Self, CheckpointError> {
        let header_end = header_len(bytes, bytes.len() as u64, file)?;
        let header = &bytes[8..8 + header_end];
        Self::parse_header(header, (bytes.len() - 8 - header_end) as u64, file)
    }

    /// Parses the JSON header `header` of a file whose data section is
    /// `data_len` bytes long.
    ///
    /// # Errors
    /// As [`SafetensorsHeader::parse`], less the length checks.
    pub fn parse_header(
        header: &[u8],
        data_len: u64,
        file: &Path,
    ) -> Result<Self, CheckpointError> {
        let invalid = |message: String| CheckpointError::InvalidHeaderJson {
            file: file.to_owned(),
            message,
        };
        let data_len = usize::try_from(data_len).unwrap_or(usize::MAX);
        let header_end = header.len();
        let text = std::str::from_utf8(header)
            .map_err(|e| invalid(format!("the header is not UTF-8: {e}")))?;
        let json: Value = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let Value::Object(entries) = json else {
            return Err(invalid("the header is not a JSON object".to_owned()));
        };

        let mut tensors = BTreeMap::new();
        let mut metadata = None;
        for (name, entry) in entries {
            if name == "__metadata__" {
                metadata = parse_metadata(entry).map_err(invalid)?;
                continue;
            }
            let info = parse_entry(&name, entry, data_len, file)?;
            tensors.insert(name, info);
        }
        // `mx.load` refuses the whole file for one such tensor.
        if let Some((name, info)) = tensors.iter().find(|(_, t)| mlx_dtype(t.dtype).is_none()) {
            return Err(CheckpointError::UnsupportedArrayDtype {
                file: file.to_owned(),
                tensor: name.clone(),
                dtype: info.dtype,
            });
        }
        Ok(SafetensorsHeader {
            header_len: header_end,
            tensors,
            metadata,
        })
    }
}

/// The header length from a file's first 8 bytes, checked against the
/// file's length `file_len` (`first` holds at least those 8 bytes if the
/// file has them).
fn header_len(first: &[u8], file_len: u64, file: &Path) -> Result<usize, CheckpointError> {
    let Some((len_bytes, _)) = first.split_first_chunk::<8>() else {
        return Err(CheckpointError::FileTooShort {
            file: file.to_owned(),
            len: usize::try_from(file_len).unwrap_or(usize::MAX),
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > file_len - 8 {
        return Err(CheckpointError::HeaderLengthPastEnd {
            file: file.to_owned(),
            header_len,
            file_len,
        });
    }
    usize::try_from(header_len).map_err(|_| CheckpointError::HeaderLengthPastEnd {
        file: file.to_owned(),
        header_len,
        file_len,
    })
}

fn parse_metadata(entry: Value) -> Result<Option<BTreeMap<String, String>>, String> {
    let map = match entry {
        // `mx.save_safetensors` without metadata writes `null`.
        Value::Null => return Ok(None),
        // MLX reads a bare string as the value of an empty key.
        Value::String(s) => return Ok(Some(BTreeMap::from([(String::new(), s)]))),
        Value::Object(map) => map,
        _ => return Err("`__metadata__` is not an object (nor null)".to_owned()),
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(format!("`__metadata__.{k}` is not a string")),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A non-negative integral JSON number (`24` or `24.0`, as MLX's JSON
/// reader converts both).
fn offset(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
            .map(|f| f as u64)
    })
}

fn parse_entry(
    name: &str,
    entry: Value,
    data_len: usize,
    file: &Path,
) -> Result<TensorInfo, CheckpointError> {
    let invalid = |what: &str| CheckpointError::InvalidHeaderJson {
        file: file.to_owned(),
        message: format!("tensor `{name}`: {what}"),
    };
    let Value::Object(mut fields) = entry else {
        return Err(invalid("the entry is not an object"));
    };
    let dtype_name = match fields.remove("dtype") {
        Some(Value::String(s)) => s,
        _ => return Err(invalid("`dtype` is missing or not a string")),
    };
    let shape = match fields.remove("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| invalid("`shape` holds something other than non-negative integers"))?,
        _ => return Err(invalid("`shape` is missing or not an array")),
    };
    let (start, end) = match fields.remove("data_offsets") {
        Some(Value::Array(offsets)) => match offsets.as_slice() {
            [s, e] => match (offset(s), offset(e)) {
                (Some(s), Some(e)) => (s, e),
                _ => return Err(invalid("`data_offsets` are not non-negative integers")),
            },
            _ => return Err(invalid("`data_offsets` does not hold two offsets")),
        },
        _ => return Err(invalid("`data_offsets` is missing or not an array")),
    };
    let dtype: TensorDtype =
        serde_json::from_value(Value::String(dtype_name.clone())).map_err(|_| {
            CheckpointError::UnknownDtype {
                file: file.to_owned(),
                tensor: name.to_owned(),
                dtype: dtype_name,
            }
        })?;
    let out_of_range = || CheckpointError::OffsetsOutOfRange {
        file: file.to_owned(),
        tensor: name.to_owned(),
        start,
        end,
        data_len: data_len as u64,
    };
    if start > end || end > data_len as u64 {
        return Err(out_of_range());
    }
    let (start, end) = (
        usize::try_from(start).map_err(|_| out_of_range())?,
        usize::try_from(end).map_err(|_| out_of_range())?,
    );
    let expected = shape
        .iter()
        .try_fold(1u128, |n, &d| n.checked_mul(d as u128))
        .and_then(|n| n.checked_mul(dtype.bitsize() as u128))
        .filter(|bits| bits % 8 == 0)
        .map(|bits| bits / 8);
    if expected != Some((end - start) as u128) {
        return Err(CheckpointError::SizeMismatch {
            file: file.to_owned(),
            tensor: name.to_owned(),
            dtype,
            shape,
            expected_bytes: expected.and_then(|n| u64::try_from(n).ok()),
            actual_bytes: (end - start) as u64,
        });
    }
    Ok(TensorInfo {
        dtype,
        shape,
        data_offsets: (start, end),
    })
}

/// One safetensors file with a validated header; tensor bytes are read
/// from the file on request (positioned reads; see the module's contract).
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    /// The file's length when it was opened.
    len: u64,
    header: SafetensorsHeader,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Opens `path` and reads and validates its header
    /// ([`SafetensorsHeader::parse`]); no tensor bytes are read yet.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file cannot be opened or read, and
    /// every error of [`SafetensorsHeader::parse`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let io = |source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut first = [0u8; 8];
        let have = usize::try_from(len.min(8)).unwrap_or(8);
        file.read_exact_at(&mut first[..have], 0).map_err(io)?;
        let header_end = header_len(&first[..have], len, path)?;
        let mut header = vec![0u8; header_end];
        file.read_exact_at(&mut header, 8).map_err(io)?;
        let header = SafetensorsHeader::parse_header(&header, len - 8 - header_end as u64, path)?;
        Ok(SafetensorsFile {
            path: path.to_owned(),
            file,
            len,
            header,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// The `__metadata__` map, if any.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.header.metadata.as_ref()
    }

    /// Tensor names and infos, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorInfo)> {
        self.header.tensors.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The info of tensor `name`, if the file has it.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.get(name)
    }

    /// Tensor `name`: dtype, shape and its raw little-endian bytes, read
    /// from the file now.
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`]; [`CheckpointError::FileChanged`]
    /// when the file no longer holds the bytes its header promised (it was
    /// truncated or replaced since it was opened); [`CheckpointError::Io`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, CheckpointError> {
        let (name, info) = self.header.tensors.get_key_value(name).ok_or_else(|| {
            CheckpointError::TensorNotFound {
                name: name.to_owned(),
            }
        })?;
        let base = 8 + self.header.header_len as u64;
        let (start, end) = info.data_offsets;
        let changed = |now: u64| CheckpointError::FileChanged {
            file: self.path.clone(),
            tensor: name.to_owned(),
            opened_len: self.len,
            now_len: now,
        };
        let now = self
            .file
            .metadata()
            .map_err(|source| CheckpointError::Io {
                path: self.path.clone(),
                source,
            })?
            .len();
        if now < base + end as u64 {
            return Err(changed(now));
        }
        let mut data = vec![0u8; end - start];
        match self.file.read_exact_at(&mut data, base + start as u64) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(changed(self.file.metadata().map_or(0, |m| m.len())))
            }
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        }
        Ok(TensorView {
            file: &self.path,
            name,
            dtype: info.dtype,
            shape: &info.shape,
            data,
        })
    }

    /// Tensor `name` as an MLX array (a copy), see [`TensorView::to_array`].
    ///
    /// # Errors
    /// As [`SafetensorsFile::tensor`] and [`TensorView::to_array`].
    pub fn array(&self, name: &str) -> Result<Array, CheckpointError> {
        self.tensor(name)?.to_array()
    }

    /// Byte offset of tensor `name`'s data from the start of the file.
    pub fn file_offset(&self, name: &str) -> Option<u64> {
        let info = self.header.tensors.get(name)?;
        Some((8 + self.header.header_len + info.data_offsets.0) as u64)
    }
}

/// A tensor of a [`SafetensorsFile`]: its bytes, read from the file.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// The file it comes from.
    pub file: &'a Path,
    /// Its name.
    pub name: &'a str,
    /// Its element type.
    pub dtype: TensorDtype,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its raw little-endian bytes, `prod(shape) * bitsize(dtype) / 8` long.
    pub data: Vec<u8>,
}

/// The MLX dtype `mx.load` (mlx 0.32.2) gives a safetensors dtype, if any.
/// `F8_E4M3` and `F8_E8M0` load as `uint8` (raw bits), as in MLX; `F64`,
/// `F8_E5M2`, the FNUZ variants, `F4` and the `F6` types `mx.load` refuses
/// (`[safetensor] unsupported dtype F64`: probed for every dtype the
/// format names), so a file holding one is refused at open.
pub fn mlx_dtype(dtype: TensorDtype) -> Option<Dtype> {
    use safetensors::Dtype as S;
    Some(match dtype {
        S::BOOL => Dtype::Bool,
        S::U8 | S::F8_E4M3 | S::F8_E8M0 => Dtype::Uint8,
        S::I8 => Dtype::Int8,
        S::U16 => Dtype::Uint16,
        S::I16 => Dtype::Int16,
        S::U32 => Dtype::Uint32,
        S::I32 => Dtype::Int32,
        S::U64 => Dtype::Uint64,
        S::I64 => Dtype::Int64,
        S::F16 => Dtype::Float16,
        S::BF16 => Dtype::Bfloat16,
        S::F32 => Dtype::Float32,
        S::C64 => Dtype::Complex64,
        _ => return None,
    })
}

impl TensorView<'_> {
    /// The MLX dtype this tensor loads as ([`mlx_dtype`]).
    pub fn mlx_dtype(&self) -> Option<Dtype> {
        mlx_dtype(self.dtype)
    }

    /// The shape as MLX dimensions.
    ///
    /// # Errors
    /// [`CheckpointError::ShapeTooLarge`] for a dimension past `i32::MAX`.
    pub fn mlx_shape(&self) -> Result<Vec<i32>, CheckpointError> {
        self.shape
            .iter()
            .map(|&d| i32::try_from(d).ok())
            .collect::<Option<Vec<i32>>>()
            .ok_or_else(|| CheckpointError::ShapeTooLarge {
                file: self.file.to_owned(),
                tensor: self.name.to_owned(),
                shape: self.shape.to_vec(),
            })
    }

    /// A copy of the tensor as an MLX array with the dtype and bits
    /// `mx.load` gives it.
    ///
    /// # Errors
    /// [`CheckpointError::UnsupportedArrayDtype`] for a dtype MLX cannot
    /// hold, [`CheckpointError::ShapeTooLarge`], or
    /// [`CheckpointError::Array`] when MLX rejects it.
    pub fn to_array(&self) -> Result<Array, CheckpointError> {
        let dtype = self
            .mlx_dtype()
            .ok_or_else(|| CheckpointError::UnsupportedArrayDtype {
                file: self.file.to_owned(),
                tensor: self.name.to_owned(),
                dtype: self.dtype,
            })?;
        let shape = self.mlx_shape()?;
        ffi::array_from_bytes(&self.data, &shape, dtype).map_err(|source| CheckpointError::Array {
            file: self.file.to_owned(),
            tensor: self.name.to_owned(),
            source,
        })
    }
}
