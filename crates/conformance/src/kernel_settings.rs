//! MLX's kernel-affecting settings: the environment variables of MLX 0.32.2
//! that change which kernel runs or at what precision (read from its
//! source: `mlx/utils.h`, `mlx/compile.cpp`, `mlx/backend/{cuda,metal}`).
//! Scheduling-only variables (buffer sizes, graph and plan cache sizes,
//! CUDA graphs) change no bits and are not listed.
//!
//! Every run pins them: before MLX reads any (its reads are static, once
//! per process), [`pin`] sets each unset one to MLX's default, so workers
//! and the in-process runner see the same values, and a report says which
//! ran ([`current`], in `report.json`'s environment and in each snapshot's
//! provenance). A run that checks snapshots refuses, with one line, a value
//! that differs from the one the set was recorded with ([`check`]).

use std::collections::BTreeMap;

use crate::case::Backend;

/// How MLX reads a variable.
#[derive(Debug, Clone, Copy)]
pub enum Read {
    /// `env::get_var(name, default)`: `atoi` of the value (so `true` is 0).
    Int(i32),
    /// `env::get_var(name, "")`: the string as given.
    Str(&'static str),
    /// `std::getenv(name)` tested for presence: any value, even empty, is "set".
    Presence,
}

/// One kernel-affecting variable.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    /// The backends whose kernels read it.
    pub backends: &'static [Backend],
    pub read: Read,
    /// What it changes.
    pub effect: &'static str,
}

const ALL: &[Backend] = &[Backend::Cpu, Backend::Metal, Backend::Cuda];

/// The kernel-affecting variables of MLX 0.32.2.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "MLX_ENABLE_TF32",
        backends: &[Backend::Cuda],
        read: Read::Int(1),
        effect: "float32 matmuls and convolutions on cuBLASLt/cuDNN compute in TF32 \
                 (CUBLAS_COMPUTE_32F_FAST_TF32) unless 0",
    },
    Setting {
        name: "MLX_CUDA_USE_CUDNN_SDPA",
        backends: &[Backend::Cuda],
        read: Read::Int(1),
        effect: "scaled_dot_product_attention through cuDNN (where it applies) unless 0",
    },
    Setting {
        name: "MLX_SDPA_BLOCKS",
        backends: &[Backend::Metal],
        read: Read::Int(0),
        effect:
            "blocks of the two-pass vector SDPA (the split of its reduction); 0: MLX's heuristic",
    },
    Setting {
        name: "MLX_METAL_GPU_ARCH",
        backends: &[Backend::Metal],
        read: Read::Str(""),
        effect: "the GPU architecture kernels are chosen for; empty: the device's own",
    },
    Setting {
        name: "MLX_CONV_UNFOLD_TILE_ROWS",
        backends: &[Backend::Metal],
        read: Read::Int(0),
        effect: "tile rows of the unfolded convolution; 0: MLX's choice",
    },
    Setting {
        name: "MLX_DISABLE_COMPILE",
        backends: ALL,
        read: Read::Presence,
        effect: "mx.compile'd functions run op by op (no fused kernels) when set",
    },
];

impl Setting {
    /// The value as MLX reads it from `raw` (the variable's text, if set).
    pub fn effective(&self, raw: Option<&str>) -> String {
        match (self.read, raw) {
            (Read::Int(default), None) => default.to_string(),
            (Read::Int(_), Some(text)) => atoi(text).to_string(),
            (Read::Str(default), None) => default.to_owned(),
            (Read::Str(_), Some(text)) => text.to_owned(),
            (Read::Presence, None) => "unset".to_owned(),
            (Read::Presence, Some(_)) => "set".to_owned(),
        }
    }
    fn applies(&self, backend: Backend) -> bool {
        self.backends.contains(&backend)
    }
}

/// C's `atoi`: optional whitespace and sign, then digits; 0 if none.
fn atoi(text: &str) -> i64 {
    let t = text.trim_start();
    let (sign, digits) = match t.as_bytes().first() {
        Some(b'-') => (-1, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let value = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0i64, |v, d| {
            v.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    (sign * value).clamp(i64::from(i32::MIN), i64::from(i32::MAX))
}

/// Sets every unset variable to MLX's default (a presence variable stays
/// unset: unset is its default), so that what runs is written down rather
/// than implied.
///
/// Must run before any other thread starts and before MLX reads them: the
/// first lines of `main`.
pub fn pin() {
    for s in SETTINGS {
        if std::env::var_os(s.name).is_some() {
            continue;
        }
        let default = match s.read {
            Read::Int(d) => d.to_string(),
            Read::Str(d) => d.to_owned(),
            Read::Presence => continue,
        };
        // SAFETY: called first in `main`, while the process has one thread
        // and nothing reads the environment concurrently.
        unsafe { std::env::set_var(s.name, default) };
    }
}

/// The effective value of each variable `backend` reads, by name.
pub fn current(backend: Backend) -> BTreeMap<String, String> {
    SETTINGS
        .iter()
        .filter(|s| s.applies(backend))
        .map(|s| {
            let raw = std::env::var(s.name).ok();
            (s.name.to_owned(), s.effective(raw.as_deref()))
        })
        .collect()
}

/// Refuses settings that differ from those a snapshot set was recorded
/// with: one line naming the variable, the value here and the set's.
pub fn check(
    now: &BTreeMap<String, String>,
    recorded: &BTreeMap<String, String>,
    set: &str,
) -> Result<(), String> {
    for (name, value) in now {
        if let Some(was) = recorded.get(name) {
            if was != value {
                let fix = match was.as_str() {
                    "unset" => format!("unset {name}"),
                    "set" => format!("set {name} (any value)"),
                    _ => format!("run with {name}={was} (unset gives MLX's default)"),
                };
                return Err(format!(
                    "{name} is {value} here, but snapshot set {set} was recorded with \
                     {name} {was}: {fix}, or pass --no-snapshots to run without the set"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_mlx_reads_them() {
        let tf32 = SETTINGS[0];
        assert_eq!(tf32.effective(None), "1");
        assert_eq!(tf32.effective(Some("0")), "0");
        // atoi: "true" is 0, " 2x" is 2.
        assert_eq!(tf32.effective(Some("true")), "0");
        assert_eq!(tf32.effective(Some(" 2x")), "2");
        let compile = SETTINGS
            .iter()
            .find(|s| s.name == "MLX_DISABLE_COMPILE")
            .unwrap();
        assert_eq!(compile.effective(None), "unset");
        assert_eq!(compile.effective(Some("")), "set");
        assert_eq!(compile.effective(Some("0")), "set");
    }

    #[test]
    fn a_differing_value_is_refused_by_name() {
        let now = BTreeMap::from([("MLX_ENABLE_TF32".to_owned(), "0".to_owned())]);
        let recorded = BTreeMap::from([("MLX_ENABLE_TF32".to_owned(), "1".to_owned())]);
        let err = check(&now, &recorded, "cuda-x").unwrap_err();
        assert!(
            err.contains("MLX_ENABLE_TF32=1") && err.contains("cuda-x"),
            "{err}"
        );
        let unset = BTreeMap::from([("MLX_DISABLE_COMPILE".to_owned(), "unset".to_owned())]);
        let set = BTreeMap::from([("MLX_DISABLE_COMPILE".to_owned(), "set".to_owned())]);
        let err = check(&set, &unset, "cpu-x").unwrap_err();
        assert!(err.contains("unset MLX_DISABLE_COMPILE"), "{err}");
        assert!(check(&now, &now, "cuda-x").is_ok());
        // A set recorded before settings were recorded constrains nothing.
        assert!(check(&now, &BTreeMap::new(), "cuda-x").is_ok());
    }
}
