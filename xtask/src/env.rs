//! The reference environment's fingerprint, and the check every command that
//! needs the environment runs first.
//!
//! `cargo xtask setup` writes `.reference/fingerprint.json` last, after
//! everything else succeeded; `crates/mlx-sys/build.rs` reads `mlx_dir`,
//! `mlx_c_dir`, `python_libdir` and `mlx_version` from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::util::sha256_file;

/// Relative to the workspace root.
pub const FINGERPRINT: &str = ".reference/fingerprint.json";
pub const REFERENCE_DIR: &str = ".reference";
pub const VENV: &str = ".reference/venv";
pub const MLX_C: &str = ".reference/mlx-c";
pub const LOCK: &str = "reference/requirements.lock";
pub const LOCK_SHA256: &str = "reference/requirements.lock.sha256";
pub const SCHEMA: u32 = 1;

const FIX: &str = "run `cargo xtask setup`";

/// `.reference/fingerprint.json`: what `cargo xtask setup` built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub schema: u32,
    /// Absolute path of the venv's python.
    pub python: PathBuf,
    /// Absolute path of the base interpreter the venv was made from.
    pub base_python: PathBuf,
    /// `3.11.x`.
    pub python_version: String,
    /// The base interpreter's LIBDIR (holds the shared libpython).
    pub python_libdir: PathBuf,
    pub site_packages: PathBuf,
    /// `<site_packages>/mlx` (include/, lib/, share/cmake/MLX).
    pub mlx_dir: PathBuf,
    /// `<mlx_dir>/lib/libmlx.so` (or `.dylib`).
    pub libmlx: PathBuf,
    /// Relative to the workspace root: `.reference/mlx-c`.
    pub mlx_c_dir: String,
    pub mlx_version: String,
    /// Installed distributions: normalized name -> version.
    pub packages: BTreeMap<String, String>,
    /// SHA-256 of reference/requirements.lock when the venv was installed.
    pub lock_sha256: String,
    /// `<os>-<arch>`, e.g. `linux-x86_64`.
    pub platform: String,
}

/// `<os>-<arch>` of this machine, as recorded in the fingerprint.
pub fn platform() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

/// File name of the MLX shared library on this platform.
pub fn libmlx_name() -> &'static str {
    if cfg!(target_os = "macos") {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    }
}

/// PEP 503 name normalization: lowercase, runs of `-_.` become `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
        } else {
            if separator && !out.is_empty() {
                out.push('-');
            }
            separator = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// One `name==version [; marker]` pin of the lock.
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    pub name: String,
    pub version: String,
    pub marker: Option<String>,
}

/// The pins of a `uv pip compile --generate-hashes` lock (hash and comment
/// lines are skipped).
pub fn parse_lock(text: &str) -> Result<Vec<Pin>> {
    let mut pins = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with([' ', '\t', '#']) {
            continue;
        }
        let line = line.trim_end().trim_end_matches('\\').trim();
        let (requirement, marker) = match line.split_once(';') {
            Some((r, m)) => (r.trim(), Some(m.trim().to_owned())),
            None => (line, None),
        };
        let Some((name, version)) = requirement.split_once("==") else {
            bail!(
                "{LOCK}:{}: expected `name==version`, found `{line}`",
                number + 1
            );
        };
        let name = name.split('[').next().unwrap_or(name);
        pins.push(Pin {
            name: normalize(name),
            version: version.trim().to_owned(),
            marker,
        });
    }
    if pins.is_empty() {
        bail!("{LOCK} pins no packages");
    }
    Ok(pins)
}

/// Distributions installed in `site_packages`, from the `*.dist-info`
/// directory names (cheap: one directory listing, nothing imported).
pub fn installed_distributions(site_packages: &Path) -> Result<BTreeMap<String, String>> {
    let mut found = BTreeMap::new();
    let entries = std::fs::read_dir(site_packages)
        .with_context(|| format!("listing {}", site_packages.display()))?;
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".dist-info") {
            if let Some((dist, version)) = stem.split_once('-') {
                found.insert(normalize(dist), version.to_owned());
            }
        }
    }
    Ok(found)
}

/// Compares installed distributions with the lock. Pins with an environment
/// marker may be absent (uv skipped them on this platform); everything else
/// must be installed at exactly the pinned version, and nothing more.
pub fn compare_with_lock(
    pins: &[Pin],
    installed: &BTreeMap<String, String>,
) -> std::result::Result<(), String> {
    for pin in pins {
        match installed.get(&pin.name) {
            Some(version) if *version == pin.version => {}
            Some(version) => {
                return Err(format!(
                    "{} {version} is installed but the lock pins {}",
                    pin.name, pin.version
                ))
            }
            None if pin.marker.is_none() => {
                return Err(format!("{}=={} is not installed", pin.name, pin.version))
            }
            None => {}
        }
    }
    for (name, version) in installed {
        if !pins.iter().any(|pin| pin.name == *name) {
            return Err(format!("{name} {version} is installed but not in the lock"));
        }
    }
    Ok(())
}

/// Reads the fingerprint; `Err(reason)` if absent or unreadable.
fn load(root: &Path) -> std::result::Result<Fingerprint, String> {
    let path = root.join(FINGERPRINT);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "reference environment missing: {FINGERPRINT} not found"
            ))
        }
        Err(e) => return Err(format!("cannot read {FINGERPRINT}: {e}")),
    };
    let fingerprint: Fingerprint = serde_json::from_str(&text).map_err(|e| {
        format!("reference environment fingerprint {FINGERPRINT} is unreadable or from an older set-up ({e})")
    })?;
    if fingerprint.schema != SCHEMA {
        return Err(format!(
            "reference environment fingerprint has schema {}, this xtask writes schema {SCHEMA}",
            fingerprint.schema
        ));
    }
    Ok(fingerprint)
}

/// Checks a fingerprint against the workspace and the disk; `Err(reason)`
/// names what is missing or drifted. Cheap: no process is started.
pub fn verify(root: &Path, fingerprint: &Fingerprint) -> std::result::Result<(), String> {
    let here = platform();
    if fingerprint.platform != here {
        return Err(format!(
            "reference environment was set up for {}, this machine is {here}",
            fingerprint.platform
        ));
    }
    let lock_path = root.join(LOCK);
    let lock_sha256 = sha256_file(&lock_path).map_err(|e| format!("{e:#}"))?;
    if fingerprint.lock_sha256 != lock_sha256 {
        return Err(format!(
            "reference environment drifted: lock hash {} (set up) != {lock_sha256} ({LOCK})",
            fingerprint.lock_sha256
        ));
    }
    let mlx_c = root.join(&fingerprint.mlx_c_dir);
    let paths: [(&str, &Path); 7] = [
        ("venv python", &fingerprint.python),
        ("base python", &fingerprint.base_python),
        ("python LIBDIR", &fingerprint.python_libdir),
        ("site-packages", &fingerprint.site_packages),
        ("mlx package", &fingerprint.mlx_dir),
        ("libmlx", &fingerprint.libmlx),
        ("mlx-c sources", &mlx_c.join("mlx/c")),
    ];
    for (what, path) in paths {
        if !path.exists() {
            return Err(format!(
                "reference environment half-built: {what} {} does not exist",
                path.display()
            ));
        }
    }
    let installed = installed_distributions(&fingerprint.site_packages)
        .map_err(|e| format!("reference environment half-built: {e:#}"))?;
    if installed != fingerprint.packages {
        return Err(format!(
            "reference environment drifted: installed packages changed since set-up ({})",
            describe_difference(&fingerprint.packages, &installed)
        ));
    }
    let lock_text = std::fs::read_to_string(&lock_path)
        .map_err(|e| format!("cannot read {}: {e}", lock_path.display()))?;
    let pins = parse_lock(&lock_text).map_err(|e| format!("{e:#}"))?;
    compare_with_lock(&pins, &installed)
        .map_err(|e| format!("reference environment drifted: {e}"))?;
    match installed.get("mlx") {
        Some(version) if *version == fingerprint.mlx_version => Ok(()),
        other => Err(format!(
            "reference environment drifted: fingerprint says mlx {}, installed is {}",
            fingerprint.mlx_version,
            other.map_or("nothing", String::as_str)
        )),
    }
}

fn describe_difference(
    before: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> String {
    let mut changes = Vec::new();
    for (name, version) in before {
        match now.get(name) {
            None => changes.push(format!("{name} {version} removed")),
            Some(v) if v != version => changes.push(format!("{name} {version} -> {v}")),
            Some(_) => {}
        }
    }
    for (name, version) in now {
        if !before.contains_key(name) {
            changes.push(format!("{name} {version} added"));
        }
    }
    changes.join(", ")
}

/// Refuses a missing, half-built or drifted reference environment with a
/// message naming the fix; returns its fingerprint otherwise.
pub fn check_reference(root: &Path) -> Result<Fingerprint> {
    reference_status(root).or_else(|reason| bail!("{reason} — {FIX}"))
}

/// Like [`check_reference`], but returns the bare reason (for `setup`, which
/// is the fix).
pub fn reference_status(root: &Path) -> std::result::Result<Fingerprint, String> {
    load(root).and_then(|fp| verify(root, &fp).map(|()| fp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_names() {
        assert_eq!(normalize("Markdown_It.py"), "markdown-it-py");
        assert_eq!(normalize("mlx_cpu"), "mlx-cpu");
        assert_eq!(normalize("Pygments"), "pygments");
    }

    #[test]
    fn parses_uv_lock() {
        let text = "# header\nmlx==0.32.2 \\\n    --hash=sha256:00\n    # via -r requirements.in\n\
                    mlx-cpu==0.32.2 ; sys_platform == 'linux' \\\n    --hash=sha256:11\n";
        let pins = parse_lock(text).unwrap();
        assert_eq!(pins.len(), 2);
        assert_eq!(pins[0].name, "mlx");
        assert_eq!(pins[0].version, "0.32.2");
        assert_eq!(pins[1].marker.as_deref(), Some("sys_platform == 'linux'"));
    }

    #[test]
    fn compares_with_lock() {
        let pins = parse_lock("a==1\nb==2 ; sys_platform == 'darwin'\n").unwrap();
        let mut installed = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        assert!(compare_with_lock(&pins, &installed).is_ok());
        installed.insert("a".into(), "2".into());
        assert!(compare_with_lock(&pins, &installed).is_err());
        installed.insert("a".into(), "1".into());
        installed.insert("c".into(), "3".into());
        assert!(compare_with_lock(&pins, &installed).is_err());
    }
}
