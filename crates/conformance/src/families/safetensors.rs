//! `checkpoint/safetensors`: the port's safetensors reader
//! (`layers::checkpoint::SafetensorsFile`) against `mx.load(path,
//! return_metadata=True)` (mlx 0.32.2) on files written by real writers:
//! `mx.save_safetensors` with and without metadata (the latter writes
//! `"__metadata__": null`) and the Hugging Face `safetensors` package with
//! and without metadata (no `__metadata__` key). The files and how they were
//! written: `fixtures/checkpoints/write_safetensors_forms.py`.
//!
//! Must-equal, per file: every tensor's bits, dtype and shape as `mx.load`
//! gives them, the tensor names, and the metadata map. The proof mode hands
//! the reference a perturbed copy of the file (see `perturbed_copy`).

use layers::checkpoint::SafetensorsFile;
use oracle::HostTensor;

use super::describe::{described, Described, Params};
use super::support::{bytes_tensor, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::reference;

const FAMILY: &str = "checkpoint/safetensors";
const REFERENCE: &str = "mlx.core.load(path, return_metadata=True) (mlx 0.32.2)";

/// The fixture files, by the writer that wrote them.
const FORMS: &[&str] = &[
    "mx-no-metadata",
    "mx-metadata",
    "python-safetensors-no-metadata",
    "python-safetensors-metadata",
];

/// One fixture file, by its writer (one of [`FORMS`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetensorsCase {
    pub form: String,
}

impl Params for SafetensorsCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| read(ctx, &self.form))
    }
}

pub fn descriptions() -> Vec<Described> {
    FORMS
        .iter()
        .map(|&form| {
            described(
                format!("{FAMILY}/{form}"),
                &SafetensorsCase { form: form.into() },
            )
        })
        .collect()
}

fn read(ctx: &Ctx, form: &str) -> Result<CaseOutput, CaseError> {
    if !FORMS.contains(&form) {
        return Err(CaseError::Harness(format!(
            "form `{form}` is none of the fixture files ({})",
            FORMS.join(", ")
        )));
    }
    let path = crate::home::Home::get()
        .fixtures_dir()
        .join("checkpoints/safetensors-forms")
        .join(format!("{form}.safetensors"));
    // Proof mode: the reference reads a copy in which every output
    // changes (see `perturbed_copy`).
    let perturbed = ctx
        .perturbed()
        .then(|| perturbed_copy(&path, form))
        .transpose()?;
    let reference_path = perturbed.as_ref().map_or(path.as_path(), |p| p.0.as_path());
    let loaded = reference::checkpoint::safetensors_load(ctx, reference_path)?;

    let file = SafetensorsFile::open(&path).map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    let port_names: Vec<&str> = file.tensors().map(|(n, _)| n).collect();
    out.compare(
        "tensor names",
        &bytes_tensor(&port_names.join("\n")),
        &loaded.names_text(),
    );
    if loaded.arrays.len() != port_names.len() {
        return Err(CaseError::Harness(format!(
            "mx.load gave {} tensors, the port's reader {}",
            loaded.arrays.len(),
            port_names.len()
        )));
    }
    // Both in name order: paired by position, so a renamed tensor (the
    // proof mode renames every one) still compares its bits.
    for (name, expected) in port_names.iter().zip(loaded.arrays.values()) {
        let ours = HostTensor::from_array(&file.array(name).map_err(port)?)?;
        out.compare(name, &ours, expected);
    }
    let port_metadata: Vec<String> = file
        .metadata()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    out.compare(
        "metadata",
        &bytes_tensor(&port_metadata.join("\n")),
        &loaded.metadata_text(),
    );
    Ok(out)
}

/// A perturbed copy of a fixture, removed on drop.
struct Perturbed(std::path::PathBuf);

impl Drop for Perturbed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A copy of `path` in which every must-equal output changes: each tensor's
/// first data byte flipped (an empty tensor declared F16 instead), each
/// name prefixed with `~` (which keeps their order), and each metadata
/// value prefixed with `~` (a file without metadata gets `{"~": "~"}`).
fn perturbed_copy(path: &std::path::Path, form: &str) -> Result<Perturbed, CaseError> {
    let fail =
        |what: String| CaseError::Harness(format!("perturbed copy of {}: {what}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
        .filter(|&n| 8 + n <= bytes.len())
        .ok_or_else(|| fail("no header".into()))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).map_err(|e| fail(e.to_string()))?;
    let mut data = bytes[8 + n..].to_vec();
    let mut out = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    for (name, mut entry) in header {
        if name == "__metadata__" {
            if let serde_json::Value::Object(m) = entry {
                for (k, v) in m {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    metadata.insert(k, format!("~{v}").into());
                }
            }
            continue;
        }
        let start = entry["data_offsets"][0].as_u64().unwrap_or(0) as usize;
        let end = entry["data_offsets"][1].as_u64().unwrap_or(0) as usize;
        if end > start && start < data.len() {
            data[start] ^= 1;
        } else {
            entry["dtype"] = "F16".into();
        }
        out.insert(format!("~{name}"), entry);
    }
    if metadata.is_empty() {
        metadata.insert("~".into(), "~".into());
    }
    out.insert("__metadata__".into(), serde_json::Value::Object(metadata));
    let mut text = serde_json::to_vec(&out).map_err(|e| fail(e.to_string()))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend(text);
    file.extend(data);
    let copy = std::env::temp_dir().join(format!(
        "conformance-perturbed-{}-{form}.safetensors",
        std::process::id()
    ));
    std::fs::write(&copy, file).map_err(|e| fail(e.to_string()))?;
    Ok(Perturbed(copy))
}
