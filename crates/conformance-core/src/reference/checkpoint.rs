//! Checkpoints as the reference reads them: `mx.load` of safetensors files
//! and mlx-lm's `load_model` of model directories. A file is a constant of
//! its case; the activations and expert indices are perturbable, and the
//! safetensors family perturbs a copy of the file itself.

use std::collections::BTreeMap;
use std::path::Path;

use oracle::{HostTensor, Value};

use super::quantized::opt_arrays;
use super::{fixed, tensor, text, Fields};
use crate::case::{CaseError, Ctx, Expected};

/// What `mx.load(path, return_metadata=True)` returned.
#[derive(Debug)]
pub struct Loaded {
    /// Every tensor by name.
    pub arrays: BTreeMap<String, Expected>,
    /// The metadata, as strings (`{}` when the file has none).
    pub metadata: BTreeMap<String, String>,
    names: Expected,
    metadata_lines: Expected,
}

impl Loaded {
    /// The tensor names in order, one per line, as UTF-8 bytes.
    pub fn names_text(&self) -> Expected {
        self.names.clone()
    }
    /// The metadata as `key=value` lines in key order, as UTF-8 bytes.
    pub fn metadata_text(&self) -> Expected {
        self.metadata_lines.clone()
    }
}

/// The keys of a dict result, one per line; with `values`, `key=value`
/// lines (string values).
fn dict_lines(v: &Value, values: bool) -> Result<HostTensor, String> {
    let Value::Dict(map) = v else {
        return Err(format!("not a dict: {v:?}"));
    };
    let lines = map
        .iter()
        .map(|(k, v)| match (values, v) {
            (false, _) => Ok(k.clone()),
            (true, Value::Str(s)) => Ok(format!("{k}={s}")),
            (true, other) => Err(format!("metadata `{k}` is {other:?}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(text(&lines.join("\n")).into_tensor())
}

/// `mx.load(path, return_metadata=True)` (mlx 0.32.2).
pub fn safetensors_load(ctx: &Ctx, path: &Path) -> Result<Loaded, CaseError> {
    const F: &str = "safetensors_load";
    let mut r = Fields::of(
        F,
        ctx.call(F, vec![fixed("path", path.to_string_lossy().as_ref())])?,
    )?;
    let arrays_value = r.value("arrays")?;
    let metadata_value = r.value("metadata")?;
    // The texts are derived from the dicts (and so are a substitute's).
    let names =
        Expected::derived(&arrays_value, |v| dict_lines(v, false)).map_err(CaseError::Harness)?;
    let metadata_lines =
        Expected::derived(&metadata_value, |v| dict_lines(v, true)).map_err(CaseError::Harness)?;
    let arrays = Fields::of(F, arrays_value)?
        .into_entries()
        .into_iter()
        .map(|(name, v)| match v {
            Value::Tensor(t) => Ok((name, Expected::from_reference(t))),
            other => Err(CaseError::Harness(format!(
                "`{F}` array `{name}` is {other:?}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let metadata = Fields::of(F, metadata_value)?
        .into_entries()
        .into_iter()
        .map(|(key, v)| match v {
            Value::Str(s) => Ok((key, s)),
            other => Err(CaseError::Harness(format!(
                "`{F}` metadata `{key}` is {other:?}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Loaded {
        arrays,
        metadata,
        names,
        metadata_lines,
    })
}

/// Per module path: the spec `load_model` decided and the loaded module's
/// output.
#[derive(Debug)]
pub struct LoadedModules {
    /// int32 [paths, 3]: `[bits, group_size, mode_id]`, `[0, 0, -1]` for a
    /// module left as a float layer.
    pub specs: Expected,
    /// The module's output on `x[:, :in]` (a switch module with `indices`),
    /// `None` for float layers.
    pub outputs: Vec<Option<Expected>>,
    /// What each side computed from (for the exact oracle: the case adds
    /// each module's tensors as the port loaded them).
    pub calls: crate::exactness::Calls,
}

/// `mlx_lm.utils.load_model(directory)` with the fixtures' tiny model
/// class; each of `paths` run on `x` (and `indices` for switch modules).
pub fn quantized_checkpoint(
    ctx: &Ctx,
    x: &HostTensor,
    indices: &HostTensor,
    directory: &Path,
    paths: &[&str],
) -> Result<LoadedModules, CaseError> {
    const F: &str = "quantized_checkpoint";
    let params = vec![
        tensor("x", x),
        tensor("indices", indices),
        fixed("directory", directory.to_string_lossy().as_ref()),
        fixed(
            "paths",
            oracle::Arg::List(paths.iter().map(|p| oracle::Arg::from(*p)).collect()),
        ),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let mut r = Fields::of(F, value)?;
    Ok(LoadedModules {
        specs: r.tensor("specs")?,
        outputs: opt_arrays(F, r.value("outputs")?)?,
        calls,
    })
}

/// A float module `load_model` built: its class name and output.
#[derive(Debug)]
pub struct FloatModule {
    pub module: String,
    pub y: Expected,
    /// What each side computed from (the case adds the module's tensors as
    /// the port loaded them, for the exact oracle).
    pub calls: crate::exactness::Calls,
}

/// The module `load_model(directory)` built at `path`, on `x[:, :in]`.
pub fn float_checkpoint(
    ctx: &Ctx,
    x: &HostTensor,
    directory: &Path,
    path: &str,
) -> Result<FloatModule, CaseError> {
    const F: &str = "float_checkpoint";
    let params = vec![
        tensor("x", x),
        fixed("directory", directory.to_string_lossy().as_ref()),
        fixed("path", path),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let mut r = Fields::of(F, value)?;
    Ok(FloatModule {
        module: r.string("module")?,
        y: r.tensor("y")?,
        calls,
    })
}
