//! The reference environments, their fingerprints, and the check every
//! command that needs an environment runs first.
//!
//! Two environments can live side by side in the workspace, each built by
//! `cargo xtask setup [--backend B]` from its own hash-locked lock:
//!
//! | backend | env dir | lock | cargo target dir |
//! | --- | --- | --- | --- |
//! | `cpu` (Linux) / `metal` (macOS) | `.reference/` | `reference/requirements.lock` | cargo's default (`target/`) |
//! | `cuda` (Linux x86-64) | `.reference-cuda/` | `reference/cuda/requirements.lock` | `target/cuda` |
//!
//! Each env dir holds `venv/`, `mlx-c/` and `fingerprint.json` (written
//! last). Builds select an env with the variable `MLX_REFERENCE_DIR` (relative
//! to the workspace root or absolute; default `.reference`):
//! `crates/mlx-sys/build.rs` reads `mlx_dir`, `mlx_c_dir`, `python_libdir`,
//! `mlx_version` and `backend` from `$MLX_REFERENCE_DIR/fingerprint.json`.
//! [`Layout::cargo`] is the one place that sets that variable, `PYO3_PYTHON`
//! and `CARGO_TARGET_DIR` for a backend.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::util::{self, sha256_file};

/// The default environment, relative to the workspace root (the first three
/// are kept for callers that only know the default env; new code goes
/// through [`Layout`]).
#[allow(dead_code)]
pub const FINGERPRINT: &str = ".reference/fingerprint.json";
#[allow(dead_code)]
pub const VENV: &str = ".reference/venv";
#[allow(dead_code)]
pub const MLX_C: &str = ".reference/mlx-c";
pub const REFERENCE_DIR: &str = ".reference";
pub const LOCK: &str = "reference/requirements.lock";
pub const LOCK_SHA256: &str = "reference/requirements.lock.sha256";
/// 2: `backend` added.
pub const SCHEMA: u32 = 2;

/// The variable that selects the environment a build links against.
pub const REFERENCE_DIR_VAR: &str = "MLX_REFERENCE_DIR";

/// An MLX backend, as named everywhere in the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// MLX's CPU backend (`mlx-cpu` wheel; the default env on Linux).
    Cpu,
    /// Apple's Metal GPU (`mlx-metal` wheel; the default env on macOS).
    Metal,
    /// NVIDIA GPUs through CUDA 13 (`mlx-cuda-13` wheel; Linux x86-64).
    Cuda,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Metal => "metal",
            Backend::Cuda => "cuda",
        }
    }

    /// The backend of the default environment `.reference/` on this
    /// machine: Metal on macOS, CPU elsewhere.
    pub fn host_default() -> Backend {
        if cfg!(target_os = "macos") {
            Backend::Metal
        } else {
            Backend::Cpu
        }
    }

    fn parse(text: &str) -> std::result::Result<Backend, BackendError> {
        <Backend as clap::ValueEnum>::from_str(text, false)
            .map_err(|_| BackendError::Unknown(text.to_owned()))
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a backend was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendError {
    /// The backend's environment cannot be built on this machine.
    Unsupported {
        backend: Backend,
        platform: String,
        reason: &'static str,
    },
    /// `--backend` named something else.
    Unknown(String),
    /// `--backend` without a value.
    MissingValue,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Unsupported {
                backend,
                platform,
                reason,
            } => write!(
                f,
                "backend `{backend}` is not available on this machine ({platform}): {reason}"
            ),
            BackendError::Unknown(name) => write!(
                f,
                "unknown backend `{name}`: expected one of cpu, metal, cuda"
            ),
            BackendError::MissingValue => {
                f.write_str("`--backend` needs a value: one of cpu, metal, cuda")
            }
        }
    }
}

impl std::error::Error for BackendError {}

/// Where everything of one backend's environment lives (relative paths are
/// relative to the workspace root).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub backend: Backend,
    /// `.reference` or `.reference-cuda`; holds `venv/`, `mlx-c/`,
    /// `fingerprint.json`.
    pub dir: &'static str,
    /// The hand-edited pins.
    pub requirements_in: &'static str,
    /// The hash-locked lock compiled from them (`cargo xtask lock`).
    pub lock: &'static str,
    /// The lock's recorded SHA-256.
    pub lock_sha256: &'static str,
    /// Cargo's target dir for builds against this env; `None`: cargo's own
    /// (`target/`, or `CARGO_TARGET_DIR`).
    pub target_dir: Option<&'static str>,
    /// A candidate environment's name (`reference/candidates/<name>/`), for
    /// the release gate; `None` for the baseline and CUDA environments.
    pub candidate: Option<&'static str>,
}

/// The candidate `name`, which must exist as reference/candidates/<name>/
/// with its requirements.in.
pub fn existing_candidate(root: &Path, name: &str) -> Result<Layout> {
    let layout = Layout::candidate(name)?;
    if !root.join(layout.requirements_in).is_file() {
        let known: Vec<String> = std::fs::read_dir(root.join("reference/candidates"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        bail!(
            "no candidate `{name}`: {} not found (candidates here: {}); a candidate is a \
             folder of reference/candidates/ with a requirements.in",
            layout.requirements_in,
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        );
    }
    Ok(layout)
}

/// A candidate name: 1 to 64 of lowercase letters, digits, `.`, `_`, `-`.
pub fn check_candidate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !ok {
        bail!(
            "`{name}` is not a candidate name: use 1 to 64 lowercase letters, digits, `.`, `_` \
             or `-` (e.g. `mlx-0.32.4`), as in reference/candidates/<name>/"
        );
    }
    Ok(())
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl Layout {
    /// The environment of `backend`, if it can be built on this machine.
    /// `cpu` and `metal` are the default env `.reference/` of the platform
    /// that has them (Linux and macOS respectively); `cuda` is
    /// `.reference-cuda/`, Linux x86-64 only.
    pub fn for_backend(backend: Backend) -> std::result::Result<Layout, BackendError> {
        let unsupported = |reason| BackendError::Unsupported {
            backend,
            platform: platform(),
            reason,
        };
        match backend {
            Backend::Cuda if !cfg!(all(target_os = "linux", target_arch = "x86_64")) => Err(
                unsupported("the mlx-cuda-13 wheel exists for Linux x86-64 only"),
            ),
            Backend::Cuda => Ok(Layout::of(Backend::Cuda)),
            Backend::Metal if !cfg!(target_os = "macos") => Err(unsupported(
                "Metal is macOS only; here the default environment is `cpu` (`cargo xtask setup`)",
            )),
            Backend::Cpu if cfg!(target_os = "macos") => Err(unsupported(
                "on macOS the default environment is `metal` (mlx-metal also runs MLX's CPU \
                 backend: `cargo xtask setup`, then `--device cpu`)",
            )),
            Backend::Cpu | Backend::Metal => Ok(Layout::of(backend)),
        }
    }

    /// The default environment `.reference/` of this machine.
    #[allow(dead_code)]
    pub fn host_default() -> Layout {
        Layout::of(Backend::host_default())
    }

    /// The candidate environment `name`: pins in
    /// `reference/candidates/<name>/`, built into
    /// `.reference-candidates/<name>/` and `target/candidates/<name>/`, for
    /// this machine's default backend. It shares nothing mutable with the
    /// baseline.
    pub fn candidate(name: &str) -> Result<Layout> {
        check_candidate_name(name)?;
        Ok(Layout {
            backend: Backend::host_default(),
            dir: leak(format!(".reference-candidates/{name}")),
            requirements_in: leak(format!("reference/candidates/{name}/requirements.in")),
            lock: leak(format!("reference/candidates/{name}/requirements.lock")),
            lock_sha256: leak(format!(
                "reference/candidates/{name}/requirements.lock.sha256"
            )),
            target_dir: Some(leak(format!("target/candidates/{name}"))),
            candidate: Some(leak(name.to_owned())),
        })
    }

    /// The layout of `backend` whether or not it can be built here (locking
    /// works on any machine: `cpu` and `metal` share the default lock).
    pub fn of(backend: Backend) -> Layout {
        match backend {
            Backend::Cpu | Backend::Metal => Layout {
                backend,
                dir: REFERENCE_DIR,
                requirements_in: "reference/requirements.in",
                lock: LOCK,
                lock_sha256: LOCK_SHA256,
                target_dir: None,
                candidate: None,
            },
            Backend::Cuda => Layout {
                backend,
                dir: ".reference-cuda",
                requirements_in: "reference/cuda/requirements.in",
                lock: "reference/cuda/requirements.lock",
                lock_sha256: "reference/cuda/requirements.lock.sha256",
                target_dir: Some("target/cuda"),
                candidate: None,
            },
        }
    }

    pub fn fingerprint(&self) -> String {
        format!("{}/fingerprint.json", self.dir)
    }

    pub fn venv(&self) -> String {
        format!("{}/venv", self.dir)
    }

    pub fn mlx_c(&self) -> String {
        format!("{}/mlx-c", self.dir)
    }

    /// The venv's interpreter (what pyo3 builds against), absolute.
    pub fn python(&self, root: &Path) -> PathBuf {
        root.join(self.venv()).join("bin/python")
    }

    /// Cargo's target dir for this env, absolute (`target/` for the default
    /// env unless `CARGO_TARGET_DIR` says otherwise).
    pub fn target_dir(&self, root: &Path) -> PathBuf {
        match self.target_dir {
            Some(dir) => root.join(dir),
            None => std::env::var_os("CARGO_TARGET_DIR")
                .map(|dir| root.join(dir))
                .unwrap_or_else(|| root.join("target")),
        }
    }

    /// ` --backend cuda` for the non-default env, else empty (for commands
    /// printed to the user).
    pub fn flag(&self) -> &'static str {
        if let Some(name) = self.candidate {
            return leak(format!(" --candidate {name}"));
        }
        match self.backend {
            Backend::Cuda => " --backend cuda",
            Backend::Cpu | Backend::Metal => "",
        }
    }

    /// The command that builds (or repairs) this environment.
    pub fn setup_command(&self) -> String {
        format!("cargo xtask setup{}", self.flag())
    }

    /// A `cargo` command in the workspace root that builds and runs against
    /// this environment: `MLX_REFERENCE_DIR` and `PYO3_PYTHON` select it
    /// (an explicitly set variable overrides `.cargo/config.toml`'s
    /// `[env]`), and the CUDA env builds in its own `CARGO_TARGET_DIR` so
    /// the two never invalidate each other's artifacts.
    pub fn cargo(&self, root: &Path) -> Command {
        let mut cmd = util::cargo();
        cmd.current_dir(root)
            .env(REFERENCE_DIR_VAR, self.dir)
            .env("PYO3_PYTHON", self.python(root));
        if let Some(dir) = self.target_dir {
            cmd.env("CARGO_TARGET_DIR", root.join(dir));
        }
        cmd
    }
}

/// Splits an optional leading `--backend B` (or `--backend=B`) off the
/// arguments of a pass-through command; the backend defaults to this
/// machine's default env.
pub fn peel_backend(
    args: &[OsString],
) -> std::result::Result<(Backend, &[OsString]), BackendError> {
    let Some(first) = args.first().and_then(|a| a.to_str()) else {
        return Ok((Backend::host_default(), args));
    };
    if first == "--backend" {
        let value = args
            .get(1)
            .and_then(|v| v.to_str())
            .filter(|v| !v.starts_with('-'))
            .ok_or(BackendError::MissingValue)?;
        return Ok((Backend::parse(value)?, &args[2..]));
    }
    if let Some(value) = first.strip_prefix("--backend=") {
        return Ok((Backend::parse(value)?, &args[1..]));
    }
    Ok((Backend::host_default(), args))
}

/// What `cargo xtask setup` built: `<env dir>/fingerprint.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub schema: u32,
    /// The backend this environment is for. Absent in fingerprints written
    /// before backends existed: such an env is refused as old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
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
    /// Relative to the workspace root: `<env dir>/mlx-c`.
    pub mlx_c_dir: String,
    pub mlx_version: String,
    /// Installed distributions: normalized name -> version.
    pub packages: BTreeMap<String, String>,
    /// SHA-256 of the lock when the venv was installed.
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
        // `name @ file:///…/name-version-….whl`: a local wheel (the gate's
        // `--wheel` candidates); its version is in the file name.
        let local = requirement.split_once(" @ ").and_then(|(name, url)| {
            let file = url.rsplit('/').next()?;
            let version = file.strip_suffix(".whl")?.split('-').nth(1)?;
            Some((name, version))
        });
        let Some((name, version)) = local.or_else(|| requirement.split_once("==")) else {
            bail!(
                "line {}: expected `name==version`, found `{line}`",
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
        bail!("the lock pins no packages");
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

/// Reads an env's fingerprint; `Err(reason)` if absent, unreadable, from
/// an older set-up or for another backend.
fn load(root: &Path, layout: &Layout) -> std::result::Result<Fingerprint, String> {
    let name = layout.fingerprint();
    let path = root.join(&name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} reference environment missing: {name} not found",
                layout.backend
            ))
        }
        Err(e) => return Err(format!("cannot read {name}: {e}")),
    };
    let fingerprint: Fingerprint = serde_json::from_str(&text).map_err(|e| {
        format!(
            "reference environment fingerprint {name} is unreadable or from an older set-up ({e})"
        )
    })?;
    let Some(backend) = fingerprint.backend else {
        return Err(format!(
            "reference environment fingerprint {name} has no `backend` (written by an older set-up)"
        ));
    };
    if fingerprint.schema != SCHEMA {
        return Err(format!(
            "reference environment fingerprint {name} has schema {}, this xtask writes schema {SCHEMA}",
            fingerprint.schema
        ));
    }
    if backend != layout.backend {
        return Err(format!(
            "reference environment {} was set up for backend `{backend}`, not `{}`",
            layout.dir, layout.backend
        ));
    }
    Ok(fingerprint)
}

/// Checks a fingerprint against the workspace and the disk; `Err(reason)`
/// names what is missing or drifted. Cheap: no process is started.
pub fn verify(
    root: &Path,
    layout: &Layout,
    fingerprint: &Fingerprint,
) -> std::result::Result<(), String> {
    if fingerprint.backend != Some(layout.backend) {
        return Err(format!(
            "reference environment {} is for backend `{}`, not `{}`",
            layout.dir,
            fingerprint.backend.map_or("(none)", Backend::name),
            layout.backend
        ));
    }
    let here = platform();
    if fingerprint.platform != here {
        return Err(format!(
            "reference environment was set up for {}, this machine is {here}",
            fingerprint.platform
        ));
    }
    let lock = layout.lock;
    let lock_path = root.join(lock);
    let lock_sha256 = sha256_file(&lock_path).map_err(|e| format!("{e:#}"))?;
    if fingerprint.lock_sha256 != lock_sha256 {
        return Err(format!(
            "reference environment drifted: lock hash {} (set up) != {lock_sha256} ({lock})",
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
    let pins = parse_lock(&lock_text).map_err(|e| format!("{lock}: {e:#}"))?;
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

/// Refuses a missing, half-built or drifted environment of `layout` with a
/// message naming the fix (`cargo xtask setup [--backend cuda]`); returns
/// its fingerprint otherwise.
pub fn check_environment(root: &Path, layout: &Layout) -> Result<Fingerprint> {
    environment_status(root, layout)
        .or_else(|reason| bail!("{reason} — run `{}`", layout.setup_command()))
}

/// Like [`check_environment`], but returns the bare reason (for `setup`,
/// which is the fix).
pub fn environment_status(
    root: &Path,
    layout: &Layout,
) -> std::result::Result<Fingerprint, String> {
    load(root, layout).and_then(|fp| verify(root, layout, &fp).map(|()| fp))
}

/// [`check_environment`] of this machine's default env `.reference/`.
#[allow(dead_code)]
pub fn check_reference(root: &Path) -> Result<Fingerprint> {
    check_environment(root, &Layout::host_default())
}

/// [`environment_status`] of this machine's default env `.reference/`.
#[allow(dead_code)]
pub fn reference_status(root: &Path) -> std::result::Result<Fingerprint, String> {
    environment_status(root, &Layout::host_default())
}

/// The environment selected by an optional leading `--backend B` of a
/// pass-through command, checked; returns its layout and the remaining
/// arguments.
pub fn select_and_check<'a>(
    root: &Path,
    args: &'a [OsString],
) -> Result<(Layout, Fingerprint, &'a [OsString])> {
    let (layout, rest) = peel_env(args)?;
    let fingerprint = check_environment(root, &layout)?;
    Ok((layout, fingerprint, rest))
}

/// Splits an optional leading `--candidate NAME` (or `--candidate=NAME`) or
/// `--backend B` off the arguments of a pass-through command.
pub fn peel_env(args: &[OsString]) -> Result<(Layout, &[OsString])> {
    let first = args.first().and_then(|a| a.to_str()).unwrap_or_default();
    if first == "--candidate" {
        let name = args
            .get(1)
            .and_then(|v| v.to_str())
            .filter(|v| !v.starts_with('-'))
            .context("`--candidate` needs a name (a folder of reference/candidates/)")?;
        return Ok((Layout::candidate(name)?, &args[2..]));
    }
    if let Some(name) = first.strip_prefix("--candidate=") {
        return Ok((Layout::candidate(name)?, &args[1..]));
    }
    let (backend, rest) = peel_backend(args)?;
    Ok((Layout::for_backend(backend)?, rest))
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
    fn peels_a_leading_backend() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let a = args(&["--backend", "cuda", "--list"]);
        let (b, rest) = peel_backend(&a).unwrap();
        assert_eq!(b, Backend::Cuda);
        assert_eq!(rest, &a[2..]);
        let a = args(&["--backend=cuda"]);
        assert_eq!(peel_backend(&a).unwrap(), (Backend::Cuda, &a[1..]));
        let a = args(&["--list", "--backend", "cuda"]);
        assert_eq!(peel_backend(&a).unwrap(), (Backend::host_default(), &a[..]));
        let a = args(&["--backend"]);
        assert_eq!(peel_backend(&a), Err(BackendError::MissingValue));
        let a = args(&["--backend", "rocm"]);
        assert!(matches!(peel_backend(&a), Err(BackendError::Unknown(_))));
        assert_eq!(peel_backend(&[]).unwrap().0, Backend::host_default());
    }

    #[test]
    fn layouts() {
        let cuda = Layout::of(Backend::Cuda);
        assert_eq!(cuda.fingerprint(), ".reference-cuda/fingerprint.json");
        assert_eq!(cuda.setup_command(), "cargo xtask setup --backend cuda");
        assert_eq!(Layout::host_default().dir, ".reference");
        assert_eq!(Layout::host_default().setup_command(), "cargo xtask setup");
        let host_cuda = cfg!(all(target_os = "linux", target_arch = "x86_64"));
        assert_eq!(Layout::for_backend(Backend::Cuda).is_ok(), host_cuda);
        assert!(Layout::for_backend(Backend::host_default()).is_ok());
        let other = if cfg!(target_os = "macos") {
            Backend::Cpu
        } else {
            Backend::Metal
        };
        assert!(matches!(
            Layout::for_backend(other),
            Err(BackendError::Unsupported { .. })
        ));
    }

    #[test]
    fn fingerprint_without_backend_is_old() {
        let dir = std::env::temp_dir().join(format!("xtask-env-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(".reference")).unwrap();
        std::fs::write(
            dir.join(".reference/fingerprint.json"),
            r#"{"schema": 1, "python": "/p", "base_python": "/p", "python_version": "3.11.7",
               "python_libdir": "/l", "site_packages": "/s", "mlx_dir": "/m", "libmlx": "/m/l",
               "mlx_c_dir": ".reference/mlx-c", "mlx_version": "0.32.2", "packages": {},
               "lock_sha256": "00", "platform": "linux-x86_64"}"#,
        )
        .unwrap();
        let layout = Layout::host_default();
        let reason = environment_status(&dir, &layout).unwrap_err();
        assert!(reason.contains("no `backend`"), "{reason}");
        let message = format!("{:#}", check_environment(&dir, &layout).unwrap_err());
        assert!(message.ends_with("run `cargo xtask setup`"), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
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
