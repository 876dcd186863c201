//! `cargo xtask setup [--backend cpu|metal|cuda]`: creates a pinned
//! reference environment (the default one, `.reference/`, or the CUDA one,
//! `.reference-cuda/`; see [`crate::env`] for the layout).
//!
//! Steps, each of which must succeed before the next:
//! 1. preflight: the backend can be built on this machine, the lock matches
//!    its committed hash, a shared-libpython CPython 3.11, 3.12 or 3.13
//!    ([`SUPPORTED_PYTHON`]; the one lock is universal across them) and
//!    `uv` are available (nothing is modified yet);
//! 2. the old fingerprint is deleted (an interrupted set-up never looks ready);
//! 3. `<env>/venv` is (re)created and the lock installed with hashes,
//!    without dependency closure (for CUDA: without the NVIDIA libraries,
//!    which a GPU host provides at run time);
//! 4. mlx-c sources are taken from the crates.io package mlx-sys 0.7.0
//!    (through `cargo fetch`) and copied atomically to `<env>/mlx-c`;
//! 5. `<env>/fingerprint.json` is written last, atomically.
//!
//! The CUDA environment is built and checked without loading its libmlx
//! (which needs the NVIDIA driver and libraries this machine may lack): the
//! venv is queried through package metadata, and libmlx's dynamic section
//! is read from the file. Setup ends by printing what a GPU host needs.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::env::{self, Backend, Fingerprint, Layout};
use crate::system::CudaRuntime;
use crate::util::{self, rel};

/// The uv release installed from PyPI when none is on PATH.
pub const UV_VERSION: &str = "0.13.9";
/// The crates.io package whose sources include mlx-c (the version mlx-rs pins).
const MLX_SYS_VERSION: &str = "0.7.0";
const NETWORK_HINT: &str = "PyPI unreachable? setup needs network access to PyPI and crates.io";

#[derive(clap::Args)]
pub struct Args {
    /// Which environment: `cpu` (Linux) or `metal` (macOS) is the default
    /// `.reference/`; `cuda` (Linux x86-64) is `.reference-cuda/`
    #[arg(long, value_enum, value_name = "BACKEND")]
    backend: Option<Backend>,
    /// A candidate environment for the release gate: the pins in
    /// reference/candidates/<NAME>/, built into .reference-candidates/<NAME>/
    /// (and target/candidates/<NAME>/); the baseline is untouched
    #[arg(long, value_name = "NAME", conflicts_with = "backend")]
    candidate: Option<String>,
    /// Rebuild the environment even if the fingerprint says it is up to date
    #[arg(long)]
    force: bool,
    /// Base CPython interpreter, 3.11 to 3.13 with a shared libpython
    /// (default: the first suitable of `python3.11`, `python3.12`,
    /// `python3.13`, `python3` on PATH). Naming one that differs from the
    /// environment's rebuilds it
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
}

pub fn run(root: &Path, args: &Args) -> Result<()> {
    let layout = match &args.candidate {
        Some(name) => env::existing_candidate(root, name)?,
        None => Layout::for_backend(args.backend.unwrap_or_else(Backend::host_default))?,
    };
    build(root, &layout, args.force, args.python.as_deref())
}

/// Builds (or confirms up to date) the environment of `layout`.
pub fn build(root: &Path, layout: &Layout, force: bool, base_python: Option<&Path>) -> Result<()> {
    let started = Instant::now();
    let layout = layout.clone();
    let backend = layout.backend;
    let fingerprint_path = root.join(layout.fingerprint());

    // Cheap checks first: the lock must be the committed one, whatever state
    // the environment is in.
    let lock_sha256 = verify_lock_hash(root, &layout)?;
    // The build's system packages (cheap file checks when present).
    crate::system::ensure()?;
    // A named interpreter that cannot serve is refused before anything else.
    if base_python.is_some() {
        find_python(base_python)?;
    }
    if !force {
        match env::environment_status(root, &layout).and_then(|fingerprint| {
            match base_python.map(|wanted| same_interpreter(wanted, &fingerprint)) {
                Some(Err(reason)) => Err(reason),
                _ => Ok(fingerprint),
            }
        }) {
            Ok(fingerprint) => {
                println!(
                    "{}{backend} reference environment is up to date ({})",
                    layout
                        .candidate
                        .map_or_else(String::new, |c| format!("candidate {c}: ")),
                    fingerprint_path.display()
                );
                if backend == Backend::Cuda {
                    print!("{}", CudaRuntime::read(&fingerprint)?.render(root));
                }
                return Ok(());
            }
            Err(reason) => println!("setup: {reason}; building it"),
        }
    } else {
        println!("setup: --force: rebuilding the {backend} reference environment");
    }

    // Preflight: nothing is modified until these pass.
    let python = find_python(base_python)?;
    println!(
        "setup: python {} at {} (shared libpython in {})",
        python.version,
        python.executable.display(),
        python.libdir.display()
    );
    let uv = find_uv(Some(&python.executable), true)?;
    println!("setup: {} via `{}`", uv.version, uv.describe());

    // From here on the environment is being rebuilt: it must not look ready.
    // The old fingerprint's text and time are kept: a rebuild that ends
    // with the same fingerprint restores its time, so build scripts that
    // watch it (mlx-sys) rerun on a changed environment, not on a rewrite.
    std::fs::create_dir_all(root.join(layout.dir))?;
    let previous = previous_fingerprint(&fingerprint_path);
    remove_if_exists(&fingerprint_path)?;

    let venv = root.join(layout.venv());
    let venv_python = venv.join("bin/python");
    println!("setup: creating {}", layout.venv());
    let mut cmd = uv.command();
    cmd.current_dir(root)
        .args(["venv", "--clear", "--python"])
        .arg(&python.executable)
        .arg(&venv);
    run_uv(&mut cmd, "uv venv")?;

    let lock = root.join(layout.lock);
    let pins = env::parse_lock(&std::fs::read_to_string(&lock)?)
        .with_context(|| format!("parsing {}", layout.lock))?;
    println!(
        "setup: installing {} pinned packages from {} (--no-deps --require-hashes)",
        pins.len(),
        layout.lock
    );
    let mut cmd = uv.command();
    cmd.current_dir(root)
        .env("VIRTUAL_ENV", &venv)
        .args(["pip", "install", "--no-deps", "--require-hashes", "-r"])
        .arg(&lock)
        .arg("--python")
        .arg(&venv_python);
    run_uv(&mut cmd, "uv pip install")?;

    // The CUDA libmlx cannot be loaded without the NVIDIA driver and
    // libraries, which this machine may lack: ask the package metadata.
    let import_core = backend != Backend::Cuda;
    let installed = query_venv(&venv_python, import_core)?;
    println!(
        "setup: mlx {} {} {}",
        installed.mlx_version,
        if import_core {
            "imports from"
        } else {
            "installed in (not imported: the CUDA libmlx loads only on a GPU host)"
        },
        rel(root, Path::new(&installed.purelib))
    );

    println!("setup: fetching crates.io mlx-sys {MLX_SYS_VERSION} for the mlx-c sources");
    let source = fetch_mlx_c(root, &layout)?;
    let mlx_c = root.join(layout.mlx_c());
    copy_dir_atomically(&source, &mlx_c)?;
    println!("setup: copied mlx-c to {}", layout.mlx_c());

    let site_packages = PathBuf::from(&installed.purelib);
    let mlx_dir = site_packages.join("mlx");
    let packages: BTreeMap<String, String> = installed
        .packages
        .iter()
        .map(|(name, version)| (env::normalize(name), version.clone()))
        .collect();
    let fingerprint = Fingerprint {
        schema: env::SCHEMA,
        backend: Some(backend),
        python: venv_python,
        base_python: installed
            .base_executable
            .map(PathBuf::from)
            .unwrap_or_else(|| python.executable.clone()),
        python_version: installed.version,
        python_libdir: python.libdir.clone(),
        site_packages,
        libmlx: mlx_dir.join("lib").join(env::libmlx_name()),
        mlx_dir,
        mlx_c_dir: layout.mlx_c(),
        mlx_version: installed.mlx_version,
        packages,
        lock_sha256,
        platform: env::platform(),
    };
    // The same check `cargo xtask setup` and every other command will run.
    if let Err(reason) = env::verify(root, &layout, &fingerprint) {
        bail!("the environment just built does not pass its own check: {reason}");
    }
    let cuda = if backend == Backend::Cuda {
        let runtime = CudaRuntime::read(&fingerprint)?;
        if !runtime
            .dynamic
            .needed
            .iter()
            .any(|n| n.starts_with("libcuda.so"))
        {
            bail!(
                "{} is not a CUDA build (no NEEDED libcuda.so.1: {:?})",
                fingerprint.libmlx.display(),
                runtime.dynamic.needed
            );
        }
        Some(runtime)
    } else {
        None
    };
    let text = serde_json::to_string_pretty(&fingerprint)? + "\n";
    write_atomically(&fingerprint_path, &text)?;
    match previous {
        Some((old, modified)) if old == text => {
            set_modified(&fingerprint_path, modified)?;
            println!(
                "setup: the fingerprint is unchanged (its time kept: nothing rebuilds for it)"
            );
        }
        old => {
            let old_python = old.and_then(|(text, _)| {
                serde_json::from_str::<Fingerprint>(&text)
                    .ok()
                    .map(|f| (f.base_python, f.python_version))
            });
            if old_python.as_ref()
                != Some(&(
                    fingerprint.base_python.clone(),
                    fingerprint.python_version.clone(),
                ))
            {
                forget_pyo3_config(root, &layout)?;
            }
        }
    }
    println!(
        "setup: {backend} reference environment ready ({}) in {:.1} s",
        fingerprint_path.display(),
        started.elapsed().as_secs_f64()
    );
    if let Some(name) = layout.candidate {
        build_candidate_runner(root, &layout, name)?;
    }
    if let Some(runtime) = cuda {
        println!(
            "setup: build against it with `cargo xtask conformance --backend cuda` \
             (target dir {}); it links here, runs on a GPU host.",
            layout.target_dir.unwrap_or("target")
        );
        print!("{}", runtime.render(root));
    }
    Ok(())
}

/// Builds the conformance runner against a candidate environment, in its
/// own target dir. A build that fails (mlx-c or mlx-sys against the
/// candidate's headers) is version skew, which is data for the gate: the
/// environment is still set up, the reason is printed, and `cargo xtask
/// gate` reports it as an environment error (exit 3).
fn build_candidate_runner(root: &Path, layout: &Layout, name: &str) -> Result<()> {
    let target = layout.target_dir.unwrap_or("target");
    println!("setup: building the conformance runner against candidate {name} in {target} (a cold build the first time)");
    let output = util::output(
        layout
            .cargo(root)
            .args(["build", "-p", "conformance", "--bin", "conformance"]),
        "cargo build (candidate runner)",
    )?;
    if !output.status.success() {
        println!(
            "setup: warning: candidate {name}: the runner does not build against its MLX (version \
             skew: mlx-c or mlx-sys against the candidate's headers or libmlx); `cargo xtask gate \
             {name}` will report this as an environment error:\n{}",
            util::tail(&output, 30)
        );
        return Ok(());
    }
    println!("setup: candidate {name} runner built");
    Ok(())
}

/// Checks the backend's lock against its committed hash; returns it.
fn verify_lock_hash(root: &Path, layout: &Layout) -> Result<String> {
    let relock = format!("cargo xtask lock{}", layout.flag());
    let recorded_path = root.join(layout.lock_sha256);
    let recorded = std::fs::read_to_string(&recorded_path).with_context(|| {
        format!(
            "cannot read {} — re-lock with `{relock}`",
            layout.lock_sha256
        )
    })?;
    let recorded = recorded.trim();
    let actual = util::sha256_file(&root.join(layout.lock))?;
    if recorded != actual {
        bail!(
            "lock hash mismatch: {} was edited; re-lock with `{relock}` \
             ({} records {recorded}, the file hashes to {actual})",
            layout.lock,
            layout.lock_sha256
        );
    }
    Ok(actual)
}

/// The CPython minors the reference runs on: the lock is universal
/// (`--python-version 3.11` is its lower bound, and it holds the hashes of
/// every wheel of each pin), and each of these was verified to set up and
/// pass `cargo xtask test`.
pub const SUPPORTED_PYTHON: [(u32, u32); 3] = [(3, 11), (3, 12), (3, 13)];

/// A base interpreter fit for the lock and for pyo3 (shared libpython).
struct BasePython {
    executable: PathBuf,
    version: String,
    libdir: PathBuf,
}

#[derive(Deserialize)]
struct PythonInfo {
    version: String,
    major_minor: (u32, u32),
    executable: String,
    shared: Option<i64>,
    framework: Option<String>,
    libdir: Option<String>,
    ldlibrary: Option<String>,
}

const BASE_QUERY: &str = r#"
import json, sys, sysconfig
c = sysconfig.get_config_var
print(json.dumps({"version": "%d.%d.%d" % sys.version_info[:3],
    "major_minor": list(sys.version_info[:2]), "executable": sys.executable,
    "shared": c("Py_ENABLE_SHARED"), "framework": c("PYTHONFRAMEWORK"),
    "libdir": c("LIBDIR"), "ldlibrary": c("LDLIBRARY")}))
"#;

const PYTHON_FIX: &str = "install CPython 3.11, 3.12 or 3.13 built with a shared \
    libpython (e.g. `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.12`, \
    `apt install python3.11 python3.11-dev` on Debian 12, `apt install python3.12 \
    python3.12-dev` on Ubuntu 24.04, `brew install python@3.13`), then run \
    `cargo xtask setup`, or pass `--python /path/to/python3`";

fn find_python(explicit: Option<&Path>) -> Result<BasePython> {
    let candidates: Vec<OsString> = match explicit {
        Some(path) => vec![path.as_os_str().to_owned()],
        None => SUPPORTED_PYTHON
            .iter()
            .map(|(major, minor)| format!("python{major}.{minor}").into())
            .chain(["python3".into()])
            .collect(),
    };
    let mut rejected = Vec::new();
    for candidate in &candidates {
        let shown = candidate.to_string_lossy();
        match probe_python(candidate) {
            Ok(python) => return Ok(python),
            Err(reason) => rejected.push(format!("`{shown}`: {reason}")),
        }
    }
    bail!(
        "no suitable Python ({}) — {PYTHON_FIX}",
        rejected.join("; ")
    )
}

fn probe_python(program: &std::ffi::OsStr) -> std::result::Result<BasePython, String> {
    let output = Command::new(program)
        .args(["-I", "-c", BASE_QUERY])
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "not found".to_owned(),
            _ => format!("cannot run: {e}"),
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first = stderr.lines().next().unwrap_or("").trim();
        return Err(format!("does not run ({first})"));
    }
    let info: PythonInfo = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("unexpected answer to the version query ({e})"))?;
    if !SUPPORTED_PYTHON.contains(&info.major_minor) {
        return Err(format!(
            "is Python {}, need 3.11, 3.12 or 3.13 (the versions the lock was verified on)",
            info.version
        ));
    }
    let framework = info.framework.as_deref().is_some_and(|f| !f.is_empty());
    if info.shared != Some(1) && !framework {
        return Err(format!(
            "Python {} at {} has no shared libpython (Py_ENABLE_SHARED != 1; pyo3 needs it)",
            info.version, info.executable
        ));
    }
    let libdir = PathBuf::from(info.libdir.unwrap_or_default());
    if !framework {
        if let Some(library) = info.ldlibrary.filter(|l| !l.is_empty()) {
            if !libdir.join(&library).exists() {
                return Err(format!(
                    "Python {} at {}: {} not found in LIBDIR {} (install the -dev package)",
                    info.version,
                    info.executable,
                    library,
                    libdir.display()
                ));
            }
        }
    }
    Ok(BasePython {
        executable: PathBuf::from(info.executable),
        version: info.version,
        libdir,
    })
}

/// How to run uv: the `uv` on PATH, or `<python> -m uv` after installing it.
pub struct Uv {
    program: OsString,
    prefix: Vec<OsString>,
    pub version: String,
}

impl Uv {
    /// A uv command that ignores uv.toml / pyproject.toml configuration.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.prefix).env("UV_NO_CONFIG", "1");
        cmd
    }

    pub fn describe(&self) -> String {
        let mut parts = vec![self.program.to_string_lossy().into_owned()];
        parts.extend(self.prefix.iter().map(|p| p.to_string_lossy().into_owned()));
        parts.join(" ")
    }

    fn probe(program: OsString, prefix: Vec<OsString>) -> Option<Uv> {
        let output = Command::new(&program)
            .args(&prefix)
            .arg("--version")
            .output()
            .ok()?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (output.status.success() && version.starts_with("uv ")).then_some(Uv {
            program,
            prefix,
            version,
        })
    }
}

/// Finds uv on PATH, or as a module of `python`; with `install`, installs
/// uv==UV_VERSION from PyPI with `python -m pip` if neither works.
pub fn find_uv(python: Option<&Path>, install: bool) -> Result<Uv> {
    if let Some(uv) = Uv::probe("uv".into(), Vec::new()) {
        return Ok(uv);
    }
    let python: OsString = python.map_or_else(|| "python3".into(), |p| p.as_os_str().to_owned());
    let as_module = || Uv::probe(python.clone(), vec!["-m".into(), "uv".into()]);
    if let Some(uv) = as_module() {
        return Ok(uv);
    }
    let manual = format!(
        "install uv {UV_VERSION} yourself (`pipx install uv=={UV_VERSION}`, \
         `python3 -m pip install --user uv=={UV_VERSION}`, or \
         `curl -LsSf https://astral.sh/uv/{UV_VERSION}/install.sh | sh`) so that `uv` is on PATH, \
         then run `cargo xtask setup`"
    );
    if !install {
        bail!("uv not found on PATH — {manual}");
    }
    println!(
        "setup: uv not found on PATH; installing uv=={UV_VERSION} with `{} -m pip`",
        python.to_string_lossy()
    );
    let output = util::output(
        Command::new(&python).args(["-m", "pip", "install", &format!("uv=={UV_VERSION}")]),
        "pip",
    )?;
    if !output.status.success() {
        bail!(
            "uv not found on PATH, and `{} -m pip install uv=={UV_VERSION}` failed:\n{}\n{manual}",
            python.to_string_lossy(),
            util::tail(&output, 25)
        );
    }
    as_module().with_context(|| {
        format!("installed uv=={UV_VERSION} with pip, but `-m uv` does not run — {manual}")
    })
}

/// Runs a uv command with captured output; on failure surfaces uv's stderr.
fn run_uv(cmd: &mut Command, what: &str) -> Result<()> {
    let output = util::output(cmd, what)?;
    if output.status.success() {
        return Ok(());
    }
    let hint = if util::looks_like_network_failure(&output) {
        format!("\n{NETWORK_HINT}")
    } else {
        String::new()
    };
    bail!(
        "{what} failed (exit {}):\n{}{hint}",
        util::exit_code(output.status),
        util::tail(&output, 30)
    )
}

#[derive(Deserialize)]
struct VenvInfo {
    version: String,
    base_executable: Option<String>,
    purelib: String,
    mlx_version: String,
    packages: BTreeMap<String, String>,
}

/// `{mlx_version}` is `mx.__version__` (after importing `mlx.core`) or the
/// installed distribution's version (nothing of MLX loaded).
const VENV_QUERY: &str = r#"
import json, sys, sysconfig, importlib.metadata as md
{import_core}
print(json.dumps({"version": "%d.%d.%d" % sys.version_info[:3],
    "base_executable": getattr(sys, "_base_executable", None),
    "purelib": sysconfig.get_paths()["purelib"], "mlx_version": {mlx_version},
    "packages": {d.metadata["Name"]: d.version for d in md.distributions()}}))
"#;

/// Asks the new venv what it holds; with `import_core`, importing
/// `mlx.core` is the smoke test.
fn query_venv(venv_python: &Path, import_core: bool) -> Result<VenvInfo> {
    let query = if import_core {
        VENV_QUERY
            .replace("{import_core}", "import mlx.core as mx")
            .replace("{mlx_version}", "mx.__version__")
    } else {
        VENV_QUERY
            .replace("{import_core}", "")
            .replace("{mlx_version}", "md.version(\"mlx\")")
    };
    let output = util::output(
        Command::new(venv_python).args(["-I", "-c", &query]),
        "the venv's python",
    )?;
    if !output.status.success() {
        bail!(
            "the new venv {}:\n{}",
            if import_core {
                "cannot import mlx.core"
            } else {
                "cannot read its package metadata"
            },
            util::tail(&output, 15)
        );
    }
    serde_json::from_slice(&output.stdout).context("unexpected answer from the venv's python")
}

/// `cargo fetch`es crates.io mlx-sys through a throwaway manifest (its own
/// workspace, so our `[patch.crates-io]` does not apply) and returns the
/// unpacked `src/mlx-c` in the cargo registry.
fn fetch_mlx_c(root: &Path, layout: &Layout) -> Result<PathBuf> {
    let dir = root.join(layout.dir).join("fetch-mlx-sys");
    std::fs::create_dir_all(dir.join("src"))?;
    let manifest = dir.join("Cargo.toml");
    std::fs::write(
        &manifest,
        format!(
            "# Written by `cargo xtask setup`: fetches the crates.io mlx-sys\n\
             # package, whose sources include mlx-c. Not part of the workspace.\n\
             [package]\nname = \"fetch-mlx-sys\"\nversion = \"0.0.0\"\n\
             edition = \"2021\"\npublish = false\n\n\
             [dependencies]\nmlx-sys = \"={MLX_SYS_VERSION}\"\n\n[workspace]\n"
        ),
    )?;
    std::fs::write(dir.join("src/lib.rs"), "")?;
    let output = util::output(
        util::cargo()
            .current_dir(&dir)
            .arg("fetch")
            .arg("--manifest-path")
            .arg(&manifest),
        "cargo fetch",
    )?;
    if !output.status.success() {
        let hint = if util::looks_like_network_failure(&output) {
            format!("\n{NETWORK_HINT}")
        } else {
            String::new()
        };
        bail!(
            "cargo fetch of mlx-sys {MLX_SYS_VERSION} failed:\n{}{hint}",
            util::tail(&output, 20)
        );
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let registry = cargo_home.join("registry/src");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&registry)
        .with_context(|| format!("listing {}", registry.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| {
            entry
                .path()
                .join(format!("mlx-sys-{MLX_SYS_VERSION}/src/mlx-c"))
        })
        .filter(|path| path.join("mlx/c").is_dir())
        .collect();
    found.sort();
    found.into_iter().next().with_context(|| {
        format!(
            "cargo fetch succeeded but no {}/*/mlx-sys-{MLX_SYS_VERSION}/src/mlx-c was found",
            registry.display()
        )
    })
}

/// Copies `from` into a temporary sibling of `to`, then renames it into place.
fn copy_dir_atomically(from: &Path, to: &Path) -> Result<()> {
    let name = to
        .file_name()
        .context("target has no name")?
        .to_string_lossy();
    let tmp = to.with_file_name(format!("{name}.tmp"));
    let old = to.with_file_name(format!("{name}.old"));
    remove_if_exists(&tmp)?;
    remove_if_exists(&old)?;
    copy_dir(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    if to.exists() {
        std::fs::rename(to, &old)?;
    }
    std::fs::rename(&tmp, to)
        .with_context(|| format!("renaming {} to {}", tmp.display(), to.display()))?;
    remove_if_exists(&old)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        // Follows symlinks: the copy is self-contained.
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The fingerprint's text and modification time before a rebuild, if it
/// was there.
/// Whether the environment was made from the interpreter `wanted` names
/// (a path or a name on PATH, compared by what it runs as).
fn same_interpreter(wanted: &Path, fingerprint: &Fingerprint) -> std::result::Result<(), String> {
    let python = probe_python(wanted.as_os_str())
        .map_err(|reason| format!("--python `{}`: {reason}", wanted.display()))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if python.version == fingerprint.python_version
        && same(&python.executable, &fingerprint.base_python)
    {
        Ok(())
    } else {
        Err(format!(
            "it was made from Python {} at {}, --python names {} at {}",
            fingerprint.python_version,
            fingerprint.base_python.display(),
            python.version,
            python.executable.display()
        ))
    }
}

/// pyo3 reads the interpreter once per target dir and reruns only when
/// `PYO3_PYTHON`'s value changes, which it does not when the venv at the
/// same path is remade from another Python: its cached configuration would
/// link the old libpython. Cleaning pyo3-build-config makes it read again.
fn forget_pyo3_config(root: &Path, layout: &Layout) -> Result<()> {
    // `<target>/<profile>/build/pyo3-build-config-<hash>/`: only a target
    // dir that built pyo3 has a configuration to forget.
    let target = layout.target_dir(root);
    let configured = ["debug", "release"].iter().any(|profile| {
        std::fs::read_dir(target.join(profile).join("build")).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("pyo3-build-config-")
            })
        })
    });
    if !configured {
        return Ok(());
    }
    println!("setup: the interpreter changed: cleaning pyo3's cached interpreter configuration");
    let output = util::output(
        layout
            .cargo(root)
            .args(["clean", "-q", "-p", "pyo3-build-config"]),
        "cargo clean -p pyo3-build-config",
    )?;
    if !output.status.success() {
        bail!(
            "cargo clean -p pyo3-build-config failed (exit {}):\n{}",
            util::exit_code(output.status),
            util::tail(&output, 20)
        );
    }
    Ok(())
}

fn previous_fingerprint(path: &Path) -> Option<(String, std::time::SystemTime)> {
    let text = std::fs::read_to_string(path).ok()?;
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    Some((text, modified))
}

fn set_modified(path: &Path, time: std::time::SystemTime) -> Result<()> {
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(time))
        .with_context(|| format!("restoring the time of {}", path.display()))
}

fn write_atomically(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

fn remove_if_exists(path: &Path) -> Result<()> {
    let result = if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A named interpreter that is missing, or not a supported minor, is
    /// one line naming what was found and how to fix it.
    #[test]
    fn an_unsuitable_python_is_named_with_the_fix() {
        let err = find_python(Some(Path::new("/nonexistent/python3")))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("`/nonexistent/python3`: not found"), "{err}");
        assert!(err.contains("--python /path/to/python3"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        // A runnable interpreter of another version (a script answering the
        // version query as Python 3.10 would).
        let dir = std::env::temp_dir().join(format!("xtask-python310-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("python3");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho '{\"version\": \"3.10.13\", \"major_minor\": [3, 10], \
             \"executable\": \"/x/python3\", \"shared\": 1, \"framework\": \"\", \
             \"libdir\": \"/x/lib\", \"ldlibrary\": \"\"}'\n",
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let err = find_python(Some(&fake)).err().expect("refused").to_string();
        assert!(
            err.contains("is Python 3.10.13, need 3.11, 3.12 or 3.13"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // Each supported minor is accepted by the version check.
        assert_eq!(SUPPORTED_PYTHON, [(3, 11), (3, 12), (3, 13)]);
    }
}
