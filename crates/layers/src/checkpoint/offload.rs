//! Expert offload: tensors served from page-aligned memory maps.
//!
//! The origin kept the expert weights of MoE layers (most of a MoE model's
//! bytes) out of resident memory by writing them to a file at page-aligned
//! offsets and handing MLX arrays over memory maps of that file. Page
//! alignment is what lets MLX's Metal allocator wrap the mapping without a
//! copy; the CPU allocator of MLX 0.32.2 copies. Either way the array holds
//! the checkpoint's bytes, so results are bit-identical to resident weights.
//!
//! The maps are private copy-on-write (`MAP_PRIVATE`): should MLX ever write
//! into a buffer it believes it owns, the write stays in memory and never
//! reaches the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::MmapOptions;
use mlx_rs::Array;

use super::{mlx_dtype, Checkpoint, CheckpointError, TensorDtype};
use crate::ffi;

/// The system page size (`sysconf(_SC_PAGESIZE)`; 4096 where unknown).
pub fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if let Ok(n) = usize::try_from(n) {
            if n > 0 {
                return n;
            }
        }
    }
    4096
}

/// Why a tensor could not be served from an offload file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// The offset is not a multiple of the page size.
    #[error("offset {offset} is not a multiple of the page size {page_size}")]
    NotPageAligned {
        /// The offset.
        offset: u64,
        /// The page size.
        page_size: usize,
    },
    /// The byte range extends past the end of the file.
    #[error("bytes {offset}..{offset}+{len} extend past the end of the file ({file_len} bytes)")]
    PastEnd {
        /// The offset.
        offset: u64,
        /// The length.
        len: usize,
        /// The file's length.
        file_len: u64,
    },
    /// The offload file does not hold this tensor.
    #[error("the offload file holds no tensor `{0}`")]
    UnknownTensor(String),
    /// The offload entry's dtype or shape differs from the request.
    #[error("`{tensor}` is {found} in the offload file, {expected} was requested")]
    Mismatch {
        /// The tensor.
        tensor: String,
        /// What was requested (dtype and shape).
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A dtype MLX cannot hold, an empty tensor, or MLX rejected the array.
    #[error("cannot map `{tensor}`: {message}")]
    Array {
        /// The tensor.
        tensor: String,
        /// Why.
        message: String,
    },
}

/// An MLX array over `shape`/`dtype` bytes at `offset` of `path`, through a
/// private memory map starting at that page-aligned offset.
///
/// # Errors
/// [`CheckpointError::Io`], or [`CheckpointError::Offload`] when the offset
/// is not page-aligned, the range is past the end of the file, the dtype is
/// not one MLX holds, or the tensor is empty.
pub fn map_page_aligned(
    path: &Path,
    offset: u64,
    dtype: TensorDtype,
    shape: &[usize],
) -> Result<Array, CheckpointError> {
    let fail = |reason| CheckpointError::Offload {
        file: path.to_owned(),
        reason,
    };
    let tensor = path.display().to_string();
    let array_error = |message: String| {
        fail(OffloadError::Array {
            tensor: tensor.clone(),
            message,
        })
    };
    let page = page_size();
    if !offset.is_multiple_of(page as u64) {
        return Err(fail(OffloadError::NotPageAligned {
            offset,
            page_size: page,
        }));
    }
    let mlx = mlx_dtype(dtype)
        .filter(|d| *d != mlx_rs::Dtype::Bool)
        .ok_or_else(|| array_error(format!("dtype {dtype} cannot be mapped")))?;
    let dims = shape
        .iter()
        .map(|&d| i32::try_from(d).ok())
        .collect::<Option<Vec<i32>>>()
        .ok_or_else(|| array_error(format!("shape {shape:?} is too large")))?;
    let len = shape
        .iter()
        .try_fold(ffi::dtype_size(mlx), |n, &d| n.checked_mul(d))
        .ok_or_else(|| array_error(format!("shape {shape:?} is too large")))?;
    if len == 0 {
        return Err(array_error("empty tensors are not mapped".to_owned()));
    }
    let io = |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    if offset
        .checked_add(len as u64)
        .is_none_or(|end| end > file_len)
    {
        return Err(fail(OffloadError::PastEnd {
            offset,
            len,
            file_len,
        }));
    }
    // SAFETY: a private (copy-on-write) map of a range checked to lie inside
    // the file; the file must not be truncated while mapped.
    let map = unsafe { MmapOptions::new().offset(offset).len(len).map_copy(&file) }.map_err(io)?;
    ffi::array_from_owner(map, &dims, mlx).map_err(|e| array_error(e.to_string()))
}

/// One tensor of an offload file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadEntry {
    /// Page-aligned byte offset in the file.
    pub offset: u64,
    /// The element type.
    pub dtype: TensorDtype,
    /// The shape.
    pub shape: Vec<usize>,
}

/// A file of tensors, each at a page-aligned offset, served as memory maps.
#[derive(Debug, Clone)]
pub struct ExpertOffload {
    path: PathBuf,
    entries: BTreeMap<String, OffloadEntry>,
}

impl ExpertOffload {
    /// Writes the bytes of the checkpoint tensors `names` to a new file at
    /// `path`, each at a page-aligned offset (zero padding between them).
    ///
    /// # Errors
    /// [`CheckpointError::TensorNotFound`] for an unknown name,
    /// [`CheckpointError::Io`] for a failed write.
    pub fn create(
        path: impl AsRef<Path>,
        checkpoint: &Checkpoint,
        names: &[&str],
    ) -> Result<Self, CheckpointError> {
        let path = path.as_ref().to_owned();
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        let page = page_size() as u64;
        let mut file = File::create(&path).map_err(io)?;
        let mut entries = BTreeMap::new();
        let mut offset = 0u64;
        for &name in names {
            let view = checkpoint.tensor(name)?;
            file.seek(SeekFrom::Start(offset)).map_err(io)?;
            file.write_all(&view.data).map_err(io)?;
            entries.insert(
                name.to_owned(),
                OffloadEntry {
                    offset,
                    dtype: view.dtype,
                    shape: view.shape.to_vec(),
                },
            );
            offset = (offset + view.data.len() as u64).div_ceil(page) * page;
        }
        file.set_len(offset.max(1)).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(ExpertOffload { path, entries })
    }

    /// An offload file written earlier, with its entries.
    pub fn from_entries(path: impl AsRef<Path>, entries: BTreeMap<String, OffloadEntry>) -> Self {
        ExpertOffload {
            path: path.as_ref().to_owned(),
            entries,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors it holds.
    pub fn entries(&self) -> &BTreeMap<String, OffloadEntry> {
        &self.entries
    }

    /// Tensor `name`, which must have `dtype` and `shape`, as an MLX array
    /// over a page-aligned map ([`map_page_aligned`]).
    ///
    /// # Errors
    /// [`CheckpointError::Offload`] for an unknown tensor, a dtype/shape
    /// mismatch, or any error of [`map_page_aligned`].
    pub fn array(
        &self,
        name: &str,
        dtype: TensorDtype,
        shape: &[usize],
    ) -> Result<Array, CheckpointError> {
        let fail = |reason| CheckpointError::Offload {
            file: self.path.clone(),
            reason,
        };
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| fail(OffloadError::UnknownTensor(name.to_owned())))?;
        if entry.dtype != dtype || entry.shape != shape {
            return Err(fail(OffloadError::Mismatch {
                tensor: name.to_owned(),
                expected: format!("{dtype} {shape:?}"),
                found: format!("{} {:?}", entry.dtype, entry.shape),
            }));
        }
        map_page_aligned(&self.path, entry.offset, dtype, shape)
    }
}
