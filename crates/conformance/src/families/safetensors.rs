//! `checkpoint/safetensors`: the port's safetensors reader
//! (`layers::checkpoint::SafetensorsFile`) against `mx.load(path,
//! return_metadata=True)` (mlx 0.32.2) on files written by real writers:
//! `mx.save_safetensors` with and without metadata (the latter writes
//! `"__metadata__": null`) and the Hugging Face `safetensors` package with
//! and without metadata (no `__metadata__` key). The files and how they were
//! written: `fixtures/checkpoints/write_safetensors_forms.py`.
//!
//! Must-equal, per file: every tensor's bits, dtype and shape as `mx.load`
//! gives them, the tensor names, and the metadata map.

use layers::checkpoint::SafetensorsFile;
use oracle::{Arg, DType, HostTensor, Value};

use crate::case::{Case, CaseError, CaseOutput, Ctx};

const FAMILY: &str = "checkpoint/safetensors";
const REFERENCE: &str = "mlx.core.load(path, return_metadata=True) (mlx 0.32.2)";

/// The fixture files, by the writer that wrote them.
const FORMS: &[&str] = &[
    "mx-no-metadata",
    "mx-metadata",
    "python-safetensors-no-metadata",
    "python-safetensors-metadata",
];

pub fn cases() -> Vec<Case> {
    FORMS
        .iter()
        .map(|&form| {
            Case::must_equal(format!("{FAMILY}/{form}"), FAMILY, REFERENCE, move |ctx| {
                read(ctx, form)
            })
        })
        .collect()
}

fn port(e: impl std::fmt::Display) -> CaseError {
    CaseError::Port(e.to_string())
}

/// Text as a uint8 tensor, so names and metadata are compared like bits.
fn text_tensor(text: &str) -> HostTensor {
    HostTensor::new(DType::Uint8, vec![text.len()], text.as_bytes().to_vec())
        .expect("sized by construction")
}

fn read(ctx: &Ctx, form: &str) -> Result<CaseOutput, CaseError> {
    let path = crate::home::Home::get()
        .fixtures_dir()
        .join("checkpoints/safetensors-forms")
        .join(format!("{form}.safetensors"));
    // Proof mode: the reference reads a copy with the file's last byte (the
    // end of the last tensor's data) flipped, so the case must fail.
    let perturbed = ctx
        .perturb
        .then(|| perturbed_copy(&path, form))
        .transpose()?;
    let reference_path = perturbed.as_ref().map_or(path.as_path(), |p| p.0.as_path());
    let reference = ctx.reference(
        "safetensors_load",
        &[Arg::from(reference_path.to_string_lossy().as_ref())],
        &[],
    )?;
    let Value::Dict(mut reference) = reference else {
        return Err(CaseError::Harness(
            "`safetensors_load` did not return a dict".into(),
        ));
    };
    let Some(Value::Dict(arrays)) = reference.remove("arrays") else {
        return Err(CaseError::Harness(
            "`safetensors_load` returned no `arrays`".into(),
        ));
    };
    let Some(Value::Dict(metadata)) = reference.remove("metadata") else {
        return Err(CaseError::Harness(
            "`safetensors_load` returned no `metadata`".into(),
        ));
    };

    let file = SafetensorsFile::open(&path).map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    let port_names: Vec<&str> = file.tensors().map(|(n, _)| n).collect();
    let reference_names: Vec<&str> = arrays.keys().map(String::as_str).collect();
    out.compare(
        "tensor names",
        &text_tensor(&port_names.join("\n")),
        &text_tensor(&reference_names.join("\n")),
    );
    for (name, value) in arrays {
        let Value::Tensor(expected) = value else {
            return Err(CaseError::Harness(format!("`{name}` is not an array")));
        };
        let ours = match file.array(&name) {
            Ok(a) => HostTensor::from_array(&a)?,
            Err(e) => return Err(port(e)),
        };
        out.digest_tensor(&ours);
        out.compare(&name, &ours, &expected);
    }
    let port_metadata: Vec<String> = file
        .metadata()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    let reference_metadata: Vec<String> = metadata
        .into_iter()
        .map(|(k, v)| match v {
            Value::Str(s) => format!("{k}={s}"),
            other => format!("{k}={other:?}"),
        })
        .collect();
    out.compare(
        "metadata",
        &text_tensor(&port_metadata.join("\n")),
        &text_tensor(&reference_metadata.join("\n")),
    );
    Ok(out)
}

/// A copy of `path` with its last byte flipped, removed on drop.
struct Perturbed(std::path::PathBuf);

impl Drop for Perturbed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn perturbed_copy(path: &std::path::Path, form: &str) -> Result<Perturbed, CaseError> {
    let harness = |e: std::io::Error| {
        CaseError::Harness(format!("perturbed copy of {}: {e}", path.display()))
    };
    let mut bytes = std::fs::read(path).map_err(harness)?;
    if let Some(last) = bytes.last_mut() {
        *last ^= 1;
    }
    let copy = std::env::temp_dir().join(format!(
        "conformance-perturbed-{}-{form}.safetensors",
        std::process::id()
    ));
    std::fs::write(&copy, bytes).map_err(harness)?;
    Ok(Perturbed(copy))
}
