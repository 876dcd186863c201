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
//!
//! Files the harness writes itself ([`GENERATED`]), for where the format and
//! the reference part ways:
//! - `overlapping-ranges`: two tensors sharing bytes, which the format
//!   forbids and `mx.load` reads (each its own range): must-equal;
//! - `f64-tensor`: an `F64` tensor beside an `F32` one, which `mx.load`
//!   refuses whole (`[safetensor] unsupported dtype F64`): must-equal on
//!   "both refuse", each side's message in the report (the proof mode
//!   gives the reference the file with the tensor as `F32`, which it reads);
//! - `shape-2e62x4-no-data`: a declared shape `[2^62, 4]` with no data, for
//!   which `mx.load` returns a `(0, 4)` array (the byte count 2^62·4·4
//!   wraps to 0 in 64 bits, and the dimension to 0 in 32): a finding about
//!   the reference; the port refuses it (`SizeMismatch`).

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

/// Files the harness writes (see the module docs), by name.
pub const GENERATED: &[&str] = &["overlapping-ranges", "shape-2e62x4-no-data"];

/// Files `mx.load` refuses, and so does the port: `(form, what the
/// reference's message holds, the port's CheckpointError variant)`. Each is
/// a must-equal case on "both refuse"; the proof mode gives the reference
/// the form's valid twin ([`generated_bytes`] with `twin`), which it reads.
pub const REFUSED: &[(&str, &str, &str)] = &[
    (
        "f64-tensor",
        "unsupported dtype F64",
        "UnsupportedArrayDtype",
    ),
    ("file-too-short", "Unable to read", "FileTooShort"),
    (
        "header-length-past-end",
        "The JSON header is",
        "HeaderLengthPastEnd",
    ),
    ("header-not-json", "parse_error", "InvalidHeaderJson"),
    ("unknown-dtype", "unsupported dtype F7", "UnknownDtype"),
    (
        "offsets-past-end",
        "exceeding the size of the file",
        "OffsetsOutOfRange",
    ),
    ("size-mismatch", "Expecting 12 bytes", "SizeMismatch"),
];

/// One fixture file, by its writer (one of [`FORMS`]), or a file of
/// [`GENERATED`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetensorsCase {
    pub form: String,
}

impl Params for SafetensorsCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self.form.as_str() {
            form if REFUSED.iter().any(|r| r.0 == form) => {
                Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
                    both_refuse(ctx, &self.form)
                })
            }
            "shape-2e62x4-no-data" => Case::finding(name, FAMILY, REFERENCE, wrapped_shape),
            _ => Case::must_equal(name, FAMILY, REFERENCE, move |ctx| read(ctx, &self.form)),
        }
    }
}

pub fn descriptions() -> Vec<Described> {
    FORMS
        .iter()
        .chain(GENERATED)
        .chain(REFUSED.iter().map(|r| &r.0))
        .map(|&form| {
            described(
                format!("{FAMILY}/{form}"),
                &SafetensorsCase { form: form.into() },
            )
        })
        .collect()
}

/// A file of [`GENERATED`] or [`REFUSED`]: 8-byte header length, JSON
/// header, data. With `twin`, a refused form's valid twin: the same file
/// with what `mx.load` refuses mended.
fn generated_bytes(form: &str, twin: bool) -> Option<Vec<u8>> {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let file_of = |header: &[u8], data: &[u8]| {
        let mut text = header.to_vec();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let mut file = (text.len() as u64).to_le_bytes().to_vec();
        file.extend(text);
        file.extend(data);
        file
    };
    let json = |v: serde_json::Value| serde_json::to_vec(&v).expect("json");
    let one_f32 = |dtype: &str, shape: usize, end: usize| {
        json(serde_json::json!({"a": {"dtype": dtype, "shape": [shape], "data_offsets": [0, end]}}))
    };
    let data = f32s(&[1.5, -2.25, 3.0]);
    let valid = file_of(&one_f32("F32", 3, 12), &data);
    Some(match (form, twin) {
        (_, true) if form != "f64-tensor" => valid,
        ("overlapping-ranges", _) => file_of(
            &json(serde_json::json!({
                "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]},
            })),
            &f32s(&[1.5, -2.25, 3.0, 0.375]),
        ),
        ("f64-tensor", twin) => {
            let (dtype, shape) = if twin { ("F32", 4) } else { ("F64", 2) };
            file_of(
                &json(serde_json::json!({
                    "w": {"dtype": dtype, "shape": [shape], "data_offsets": [0, 16]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]},
                })),
                &[1.5f64.to_le_bytes(), (-0.5f64).to_le_bytes()]
                    .concat()
                    .into_iter()
                    .chain(f32s(&[2.0]))
                    .collect::<Vec<u8>>(),
            )
        }
        ("shape-2e62x4-no-data", _) => file_of(
            &json(serde_json::json!({
                "a": {"dtype": "F32", "shape": [1u64 << 62, 4], "data_offsets": [0, 0]},
            })),
            &[],
        ),
        ("file-too-short", _) => vec![8, 0, 0, 0, 0],
        ("header-length-past-end", _) => {
            let mut file = valid;
            file[..8].copy_from_slice(&1_000_000u64.to_le_bytes());
            file
        }
        ("header-not-json", _) => file_of(b"{\"a\": [", &data),
        ("unknown-dtype", _) => file_of(&one_f32("F7", 3, 12), &data),
        ("offsets-past-end", _) => file_of(&one_f32("F32", 6, 24), &data),
        ("size-mismatch", _) => file_of(&one_f32("F32", 3, 8), &data[..8]),
        _ => return None,
    })
}

/// The file of `form`: a fixture, or a [`GENERATED`] one written to a
/// scratch file (removed when the guard drops).
fn source(form: &str, twin: bool) -> Result<(std::path::PathBuf, Option<Perturbed>), CaseError> {
    if FORMS.contains(&form) {
        let path = crate::home::Home::get()
            .fixtures_dir()
            .join("checkpoints/safetensors-forms")
            .join(format!("{form}.safetensors"));
        return Ok((path, None));
    }
    let bytes = generated_bytes(form, twin).ok_or_else(|| {
        CaseError::Harness(format!(
            "form `{form}` is none of the fixture files ({}) or generated files ({})",
            FORMS.join(", "),
            GENERATED.join(", ")
        ))
    })?;
    let path = std::env::temp_dir().join(format!(
        "conformance-generated-{}-{form}{}.safetensors",
        std::process::id(),
        if twin { "-twin" } else { "" }
    ));
    std::fs::write(&path, bytes)
        .map_err(|e| CaseError::harness(&format!("writing {}", path.display()), e))?;
    Ok((path.clone(), Some(Perturbed(path))))
}

/// A [`REFUSED`] form: `mx.load` refuses the file, and so must the port,
/// with the variant the table names (an F64 tensor, once loaded by the
/// port, is refused at open now, as `mx.load` refuses it).
fn both_refuse(ctx: &Ctx, form: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = REFUSED
        .iter()
        .find(|r| r.0 == form)
        .ok_or_else(|| CaseError::Harness(format!("`{form}` is not a refused form")))?;
    let (path, _guard) = source(form, false)?;
    // Proof mode: the reference reads the valid twin; "refused" must then differ.
    let twin = ctx.perturbed().then(|| source(form, true)).transpose()?;
    let reference_path = twin.as_ref().map_or(path.as_path(), |t| t.0.as_path());
    let reference = reference::refusal(
        reference::checkpoint::safetensors_load(ctx, reference_path),
        expected,
    )?;
    let (flag, said) =
        crate::families::support::port_refused(SafetensorsFile::open(&path), variant)?;
    let shown = |m: &str| m.replace(&path.display().to_string(), "<file>");
    let reference = reference::Refusal {
        message: shown(&reference.message),
        ..reference
    };
    crate::families::support::refusal_output(ctx, "mlx.core", (flag, shown(&said)), reference)
}

/// `shape-2e62x4-no-data`: what `mx.load` returns, and what the port says.
fn wrapped_shape(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let (path, _guard) = source("shape-2e62x4-no-data", false)?;
    let loaded = reference::checkpoint::safetensors_load(ctx, &path)?;
    let arrays: serde_json::Map<String, serde_json::Value> = loaded
        .arrays
        .iter()
        .map(|(name, e)| {
            let t = e.tensor();
            (
                name.clone(),
                serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape}),
            )
        })
        .collect();
    let port = match SafetensorsFile::open(&path) {
        Ok(_) => "computed".to_owned(),
        Err(e) => e.to_string().replace(&path.display().to_string(), "<file>"),
    };
    Ok(CaseOutput::new("mlx.core").with_finding(serde_json::json!({
        "declared_shape": [1u64 << 62, 4],
        "reference_returns": arrays,
        "port_refuses": port,
        "why": "2^62·4 elements·4 bytes wraps to 0 in 64 bits, so the empty data range passes mx.load's size check, and 2^62 becomes 0 as an int32 dimension",
    })))
}

fn read(ctx: &Ctx, form: &str) -> Result<CaseOutput, CaseError> {
    let (path, _generated) = source(form, false)?;
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
