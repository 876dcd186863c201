//! The one error type of checkpoint loading, offload and writing.

use std::path::PathBuf;

use super::{NotQuantizedReason, OffloadError, TensorDtype, Unresolvable};
use crate::ffi::MlxError;
use crate::quantized::{PayloadError, SpecError};

/// Any error of checkpoint loading.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An I/O error on `path`.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file that no longer holds the bytes its header promised when it
    /// was opened (truncated or replaced while open).
    #[error("{}: tensor `{tensor}` cannot be read: the file was {opened_len} bytes when opened and is {now_len} now (changed while open); reopen the checkpoint", .file.display())]
    FileChanged {
        /// The file.
        file: PathBuf,
        /// The tensor being read.
        tensor: String,
        /// Its length when opened.
        opened_len: u64,
        /// Its length now.
        now_len: u64,
    },
    /// A file shorter than the 8-byte header length.
    #[error("{}: {len} bytes is too short for a safetensors file (the header length alone takes 8)", .file.display())]
    FileTooShort {
        /// The file.
        file: PathBuf,
        /// Its length.
        len: usize,
    },
    /// The header length points past the end of the file.
    #[error("{}: the header length {header_len} extends past the end of the file ({file_len} bytes)", .file.display())]
    HeaderLengthPastEnd {
        /// The file.
        file: PathBuf,
        /// The declared header length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not the expected JSON.
    #[error("{}: invalid header JSON: {message}", .file.display())]
    InvalidHeaderJson {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A dtype name safetensors does not define.
    #[error("{}: tensor `{tensor}` has unknown dtype {dtype:?}", .file.display())]
    UnknownDtype {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype string found.
        dtype: String,
    },
    /// `data_offsets` reversed or past the data section.
    #[error("{}: tensor `{tensor}` has data offsets [{start}, {end}) outside the {data_len}-byte data section", .file.display())]
    OffsetsOutOfRange {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// shape × dtype is not the byte range's length.
    #[error("{}: tensor `{tensor}` ({dtype} {shape:?}) needs {} bytes but its data offsets span {actual_bytes}",
        .file.display(), .expected_bytes.map_or_else(|| "an impossible number of".to_owned(), |n| n.to_string()))]
    SizeMismatch {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: TensorDtype,
        /// Its shape.
        shape: Vec<usize>,
        /// `prod(shape) * bitsize / 8`, `None` on overflow or a partial byte.
        expected_bytes: Option<u64>,
        /// `end - start`.
        actual_bytes: u64,
    },
    /// A dtype `mx.load` refuses (`F64`, `F8_E5M2`, ...): the whole file is
    /// refused at open, as `mx.load` refuses it.
    #[error("{}: tensor `{tensor}` has dtype {dtype}, which mx.load (mlx 0.32.2) refuses (`[safetensor] unsupported dtype {dtype}`); convert it, e.g. to F32", .file.display())]
    UnsupportedArrayDtype {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: TensorDtype,
    },
    /// A dimension past `i32::MAX`.
    #[error("{}: tensor `{tensor}` has shape {shape:?}, too large for MLX", .file.display())]
    ShapeTooLarge {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// MLX rejected an array built from a tensor.
    #[error("{}: tensor `{tensor}`: {source}", .file.display())]
    Array {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// MLX's error.
        source: MlxError,
    },
    /// No `config.json` in the directory.
    #[error("{}: config.json not found", .path.display())]
    ConfigMissing {
        /// The expected path.
        path: PathBuf,
    },
    /// `config.json` is not a JSON object.
    #[error("{}: malformed config: {message}", .path.display())]
    ConfigMalformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// No `model*.safetensors` (the reference's `FileNotFoundError`).
    #[error("No safetensors found in {}", .dir.display())]
    NoWeightFiles {
        /// The directory.
        dir: PathBuf,
    },
    /// A tensor name in two shards.
    #[error("tensor `{tensor}` is in both {} and {}", .first.display(), .second.display())]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// One file.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// No tensor of this name.
    #[error("no tensor `{name}` in the checkpoint")]
    TensorNotFound {
        /// The name.
        name: String,
    },
    /// A tensor a quantized layer needs is missing (`.weight`, `.scales`, or
    /// affine `.biases`).
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor {
        /// The module path.
        path: String,
        /// The missing tensor.
        tensor: String,
    },
    /// A tensor the layer cannot hold (`.biases` for a mode without zero
    /// points: the reference's strict `load_weights` rejects it).
    #[error("{path}: unexpected tensor `{tensor}` for this quantization mode")]
    UnexpectedTensor {
        /// The module path.
        path: String,
        /// The tensor.
        tensor: String,
    },
    /// The module's in_features must be positive.
    #[error("{path}: in_features={in_features} is not positive")]
    InvalidInFeatures {
        /// The module path.
        path: String,
        /// The value given.
        in_features: i32,
    },
    /// The path's spec cannot be resolved.
    #[error("{path}: cannot resolve the quantization spec: {reason}")]
    QuantSpecUnresolvable {
        /// The module path.
        path: String,
        /// Why.
        reason: Unresolvable,
    },
    /// The resolved spec is one the reference rejects (unknown mode, or a
    /// mode/bits/group_size combination `mx.quantize` refuses).
    #[error("{path}: {source}")]
    InvalidSpec {
        /// The module path.
        path: String,
        /// The rejection.
        source: SpecError,
    },
    /// A quantized layer was requested for a path that is not quantized.
    #[error("{path}: not quantized ({reason:?})")]
    NotQuantized {
        /// The module path.
        path: String,
        /// Why.
        reason: NotQuantizedReason,
    },
    /// The path's tensors do not fit each other, the spec, or in_features.
    #[error("{path}: {source}")]
    Payload {
        /// The module path.
        path: String,
        /// What does not fit.
        source: PayloadError,
    },
    /// An offload file cannot serve a tensor.
    #[error("{}: {reason}", .file.display())]
    Offload {
        /// The offload file.
        file: PathBuf,
        /// Why.
        reason: OffloadError,
    },
}
