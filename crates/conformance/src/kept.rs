//! `--keep-outputs DIR`: each case's tensors as one safetensors file,
//! `DIR/<case with / as __>.safetensors`, tensors named `port/<output>` and
//! `reference/<output>`. The release gate (`conformance-gate`) reads two
//! such directories and compares them element by element.

use std::path::{Path, PathBuf};

use oracle::{DType, HostTensor};
use safetensors::tensor::{Dtype, TensorView};

/// The largest tensors file read from a candidate (or handed to one):
/// a larger one is refused unread.
pub const MAX_TENSORS_BYTES: u64 = 4 << 30;

/// The file a case's tensors go to.
pub fn file(dir: &Path, case: &str) -> PathBuf {
    dir.join(format!("{}.safetensors", crate::case::file_stem(case)))
}

fn to_safetensors(d: DType) -> Dtype {
    match d {
        DType::Bool => Dtype::BOOL,
        DType::Uint8 => Dtype::U8,
        DType::Uint16 => Dtype::U16,
        DType::Uint32 => Dtype::U32,
        DType::Int32 => Dtype::I32,
        DType::Int64 => Dtype::I64,
        DType::Float16 => Dtype::F16,
        DType::Bfloat16 => Dtype::BF16,
        DType::Float32 => Dtype::F32,
    }
}

fn from_safetensors(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::Uint8,
        Dtype::U16 => DType::Uint16,
        Dtype::U32 => DType::Uint32,
        Dtype::I32 => DType::Int32,
        Dtype::I64 => DType::Int64,
        Dtype::F16 => DType::Float16,
        Dtype::BF16 => DType::Bfloat16,
        Dtype::F32 => DType::Float32,
        _ => return None,
    })
}

/// Writes `tensors` for `case` (temporary name, then rename).
pub fn write(dir: &Path, case: &str, tensors: &[(String, HostTensor)]) -> Result<(), String> {
    write_file(&file(dir, case), tensors, None)
}

/// Writes `tensors` (and string `metadata`) to `path` as one safetensors
/// file: a temporary name beside it, then a rename, so a reader never sees
/// a half-written file. safetensors orders tensors by dtype alignment and
/// name, so the same tensors always give the same bytes.
pub fn write_file(
    path: &Path,
    tensors: &[(String, HostTensor)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<(), String> {
    let views = tensors
        .iter()
        .map(|(name, t)| {
            TensorView::new(to_safetensors(t.dtype), t.shape.clone(), &t.bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    // Serialised in memory, then written with the process's umask (mode
    // 0666 before it): safetensors' own file writer makes files 0600,
    // which another user's verify of an intact export could not read.
    // Never through a link, never over an existing file.
    let bytes =
        safetensors::serialize(views, metadata).map_err(|e| format!("{}: {e}", path.display()))?;
    let written = (|| {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&bytes)
    })()
    .map_err(|e| format!("{}: {e}", tmp.display()))
    .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display())));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads a case's tensors (`None` when the file does not exist).
pub fn read(dir: &Path, case: &str) -> Result<Option<Vec<(String, HostTensor)>>, String> {
    let path = file(dir, case);
    // symlink_metadata: a dangling link is there (and refused), not missing.
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_file(&path).map(Some),
    }
}

/// Reads every tensor of a safetensors file, in the file's order; the
/// error names the file and the tensor.
///
/// Read as a snapshot is ([`conformance_cases::store::read_limited`]): a
/// link, a FIFO or a device there is an error, never followed, blocked on
/// or read without end; so is a file over the candidate protocol's cap.
pub fn read_file(path: &Path) -> Result<Vec<(String, HostTensor)>, String> {
    let bytes = conformance_cases::store::read_limited(
        path,
        MAX_TENSORS_BYTES,
        conformance_cases::store::Role::KeptOutputs,
    )
    .map_err(|e| e.to_string())?
    .ok_or_else(|| format!("{}: no such file", path.display()))?;
    parse(&bytes, path)
}

/// Every tensor of safetensors `bytes` (read from `path`, which errors
/// name), in the file's order.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Vec<(String, HostTensor)>, String> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = from_safetensors(view.dtype()).ok_or_else(|| {
            format!(
                "{}: {name}: dtype {:?} is none of MLX's array dtypes this suite exchanges",
                path.display(),
                view.dtype()
            )
        })?;
        let t = HostTensor::new(dtype, view.shape().to_vec(), view.data().to_vec())
            .map_err(|e| format!("{}: {name}: {e}", path.display()))?;
        out.push((name, t));
    }
    Ok(out)
}

/// `--keep-outputs DIR` as an interceptor: cases keep their compared and
/// digested tensors, and each case that reached a verdict writes them to
/// [`file`] at its end.
pub struct KeepOutputs {
    dir: PathBuf,
}

impl KeepOutputs {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
}

impl crate::hooks::Interceptor for KeepOutputs {
    fn keeps_tensors(&self) -> bool {
        true
    }
    fn case_end(&self, case: &crate::case::Case, result: &mut crate::result::CaseResult) {
        // Only a case with outputs (pass, FAIL, finding) has tensors.
        let Some(output) = result.output.as_mut() else {
            return;
        };
        let kept = std::mem::take(&mut output.tensors);
        if let Err(e) = write(&self.dir, &case.name, &kept) {
            result.verdict = crate::result::Verdict::Error;
            result.message = Some(format!("harness error: --keep-outputs: {e}"));
            result.error_kind = Some(crate::result::ErrorKind::Harness);
        }
    }
}
