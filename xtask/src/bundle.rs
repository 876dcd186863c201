//! `cargo xtask bundle --backend <cpu|cuda> --out <dir> [--archive]`: a
//! self-contained copy of the conformance runner for a Linux x86-64 machine
//! with no Rust, no uv, no network and any (or no) system Python.
//!
//! Layout of `<dir>`:
//!
//! ```text
//! conformance                     launcher (sh): same flags and exit codes as
//!                                 `cargo xtask conformance`
//! bin/conformance                 the runner, built against the backend's env
//! bin/conformance-explore         the shape explorer (`<bundle>/conformance explore …`)
//! bin/bench-<name>                (`--benches`) the release bench targets
//!                                 (`<bundle>/conformance bench serving`)
//! python/lib/libpython3.X.so.1.0  the embedded interpreter's own libpython
//! python/lib/python3.X/           its standard library (tests, tkinter, idle,
//!                                 ensurepip and the static-build config left out)
//! python/lib/python3.X/site-packages/
//!                                 the reference venv's site-packages (mlx +
//!                                 libmlx, mlx_lm, mlx_vlm, optiq, numpy, PIL, rich…)
//! fixtures/                       snapshot sets and small checkpoints
//! kernel-cache/ptx/, TARGET       (cuda, `--kernel-cache DIR`) MLX's PTX
//!                                 kernel cache and its `.target` (sm_90a)
//! fingerprint.json                the environment's fingerprint (provenance)
//! requirements.lock               the lock the environment was installed from
//! BUNDLE.json, README.txt         what this is, from which commit, requirements
//! ```
//!
//! The launcher sets `MLX_CONFORMANCE_HOME` to the bundle directory (the
//! runner then reads fixtures, fingerprint and lock from there, and the
//! oracle configures CPython with `home = <dir>/python`, isolated) and
//! `LD_LIBRARY_PATH` to the bundle's libpython and libmlx directories (plus,
//! for `cuda`, the host's NVIDIA libraries). Bytecode is compiled at bundle
//! time: a run never writes into the bundle, except `--fixtures accept`.
//!
//! `--archive` also writes `<dir>.tar.zst` as parts of at most 60 MiB
//! (`<dir>.tar.zst.part-00`, `-01`, …) and `<dir>.tar.zst.sha256` (one line
//! per part, plus the joined archive), for size-limited transfers.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::env::{Backend, Layout};
use crate::util;

/// The variable the launcher sets (read by crates/conformance-cases/src/home.rs and
/// crates/oracle/src/interpreter.rs).
const HOME_ENV: &str = "MLX_CONFORMANCE_HOME";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BundleBackend {
    /// MLX's CPU backend: the default environment `.reference/`.
    Cpu,
    /// NVIDIA GPUs through CUDA 13: `.reference-cuda/` (`cargo xtask setup --backend cuda`).
    Cuda,
}

impl BundleBackend {
    fn name(self) -> &'static str {
        match self {
            BundleBackend::Cpu => "cpu",
            BundleBackend::Cuda => "cuda",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which reference environment (and libmlx) to bundle.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BundleBackend,
    /// The bundle directory to write (a previous bundle there is replaced).
    #[arg(long)]
    out: PathBuf,
    /// Also write `<out>.tar.zst` as parts (`.part-00`, `-01`, …) plus a
    /// sha256 list; join with `cat <out>.tar.zst.part-* > <out>.tar.zst`.
    #[arg(long)]
    archive: bool,
    /// Largest archive part, in MiB.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    part_mib: u64,
    /// zstd compression level of the archive (1-19).
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(u32).range(1..=19))]
    level: u32,
    /// (cuda) An MLX PTX kernel cache directory (what `MLX_PTX_CACHE_DIR`
    /// held after a run on a GPU) to carry in the bundle, so that a run on a
    /// GPU of the same architecture skips NVRTC compilation.
    #[arg(long, value_name = "DIR")]
    kernel_cache: Option<PathBuf>,
    /// Also build the bench targets (release) into `bin/bench-<name>`, run
    /// as `<bundle>/conformance bench <name>` (e.g. `serving`, `quantized`)
    /// on a machine with no Rust.
    #[arg(long)]
    benches: bool,
}

impl BundleBackend {
    /// The environment layout shared with setup and the runner commands.
    fn layout(self) -> Layout {
        Layout::of(match self {
            BundleBackend::Cpu => Backend::Cpu,
            BundleBackend::Cuda => Backend::Cuda,
        })
    }
}

/// What the bundle needs to know about the venv's interpreter.
#[derive(Debug, serde::Deserialize)]
struct PythonFacts {
    /// `3.11.7`.
    version: String,
    /// `python3.11`.
    lib_dir_name: String,
    /// The base interpreter's standard library.
    stdlib: PathBuf,
    /// The base interpreter's LIBDIR.
    libdir: PathBuf,
    /// `libpython3.11.so.1.0`: the name the runner's ELF asks for.
    soname: String,
    site_packages: PathBuf,
    /// The base interpreter's executable (it links the shared libpython):
    /// `<bundle>/conformance python` runs Python candidates with it.
    executable: PathBuf,
}

const PYTHON_FACTS: &str = r#"
import json, sys, sysconfig, site
v = sysconfig.get_config_var
print(json.dumps({
    "version": "%d.%d.%d" % sys.version_info[:3],
    "lib_dir_name": "python%d.%d" % sys.version_info[:2],
    "stdlib": sysconfig.get_path("stdlib"),
    "libdir": v("LIBDIR"),
    "soname": v("INSTSONAME") or v("LDLIBRARY"),
    "site_packages": site.getsitepackages()[0],
    "executable": getattr(sys, "_base_executable", sys.executable),
}))
"#;

/// Top-level stdlib entries left out: tests, GUI, the bundled pip wheels,
/// the static-build `config-*` directory, and the base interpreter's own
/// site-packages (the venv's replaces it).
fn stdlib_excluded(name: &str) -> bool {
    matches!(
        name,
        "site-packages" | "test" | "idlelib" | "tkinter" | "turtledemo" | "ensurepip"
    ) || name.starts_with("config-")
}

pub fn run(root: &Path, args: &Args) -> Result<i32> {
    if !cfg!(target_os = "linux") {
        bail!("`cargo xtask bundle` builds Linux bundles only (LD_LIBRARY_PATH launcher, ELF libpython)");
    }
    let backend = args.backend;
    let env = backend.layout();
    let setup = env.setup_command();
    let out = absolute(&args.out)?;
    for source in [
        root.join(env.dir),
        root.join("fixtures"),
        root.to_path_buf(),
    ] {
        if source.starts_with(&out) {
            bail!(
                "--out {} would replace {}; choose a new directory",
                out.display(),
                source.display()
            );
        }
    }

    // 1. The environment, as `cargo xtask setup` left it.
    let fingerprint_path = root.join(env.dir).join("fingerprint.json");
    let fingerprint_text = fs::read_to_string(&fingerprint_path).with_context(|| {
        format!(
            "the {} reference environment is missing ({} unreadable); run `{setup}`",
            backend.name(),
            fingerprint_path.display()
        )
    })?;
    let fingerprint: serde_json::Value = serde_json::from_str(&fingerprint_text)
        .with_context(|| format!("{} is not JSON; run `{setup}`", fingerprint_path.display()))?;
    let field = |name: &str| fingerprint.get(name).and_then(|v| v.as_str());
    if let Some(recorded) = field("backend") {
        if recorded != backend.name() {
            bail!(
                "{} is a `{recorded}` environment, not `{}`; run `{setup}`",
                fingerprint_path.display(),
                backend.name()
            );
        }
    }
    let lock_path = root.join(env.lock);
    let lock_sha256 = util::sha256_file(&lock_path)?;
    if field("lock_sha256") != Some(lock_sha256.as_str()) {
        bail!(
            "the {} environment was installed from another lock than {} (drifted); run `{setup}`",
            backend.name(),
            env.lock
        );
    }
    let venv_python = root.join(env.dir).join("venv/bin/python");
    let facts = python_facts(&venv_python)?;
    let site_packages = field("site_packages")
        .map(PathBuf::from)
        .unwrap_or_else(|| facts.site_packages.clone());
    let libpython = facts.libdir.join(&facts.soname);
    for (what, path) in [
        ("standard library", facts.stdlib.join("os.py")),
        ("shared libpython", libpython.clone()),
        ("reference site-packages", site_packages.join("mlx")),
    ] {
        if !path.exists() {
            bail!(
                "the {what} {} does not exist; run `{setup}`",
                path.display()
            );
        }
    }

    let kernel_cache = match (&args.kernel_cache, backend) {
        (None, _) => None,
        (Some(_), BundleBackend::Cpu) => {
            bail!("--kernel-cache is MLX's CUDA PTX cache: it goes with --backend cuda only")
        }
        (Some(dir), BundleBackend::Cuda) => Some((dir.clone(), ptx_target(dir)?)),
    };

    // 2. The runner, built against that environment.
    println!(
        "bundle: building the conformance runner against {} (target dir {})",
        env.dir,
        env.target_dir(root).display()
    );
    // Before minutes of building: an --out that is not ours is refused now.
    check_out(&out)?;
    let (binary, explorer) = build_runner(root, &env)?;
    let benches = if args.benches {
        build_benches(root, &env)?
    } else {
        Vec::new()
    };

    // 3. The directory.
    prepare_out(&out)?;
    let python_home = out.join("python");
    let lib = python_home.join("lib");
    let stdlib = lib.join(&facts.lib_dir_name);
    let bundled_site = stdlib.join("site-packages");
    fs::create_dir_all(out.join("bin"))?;
    copy_file(&binary, &out.join("bin/conformance"))?;
    copy_file(&explorer, &out.join("bin/conformance-explore"))?;
    // The candidate protocol (docs/src/guide/candidate.md): this
    // repository's port as a candidate, the Python example candidates, the
    // op vocabulary, and the interpreter to run Python candidates with.
    let port_candidate = explorer.with_file_name("conformance-port-candidate");
    copy_file(&port_candidate, &out.join("bin/conformance-port-candidate"))?;
    copy_tree(&root.join("candidates"), &out.join("candidates"), &|rel| {
        rel.components().any(|c| c.as_os_str() == "__pycache__")
    })?;
    fs::create_dir_all(out.join("docs"))?;
    copy_file(&root.join("docs/ops.md"), &out.join("docs/ops.md"))?;
    fs::create_dir_all(python_home.join("bin"))?;
    copy_file(&facts.executable, &python_home.join("bin/python3"))?;
    for (name, path) in &benches {
        copy_file(path, &out.join(format!("bin/bench-{name}")))?;
    }
    copy_file(&libpython, &lib.join(&facts.soname))?;
    println!(
        "bundle: python {} standard library from {}",
        facts.version,
        facts.stdlib.display()
    );
    copy_tree(&facts.stdlib, &stdlib, &|rel| {
        rel.components().count() == 1 && stdlib_excluded(&rel.to_string_lossy())
    })?;
    println!(
        "bundle: reference packages from {}",
        site_packages.display()
    );
    copy_tree(&site_packages, &bundled_site, &|_| false)?;
    copy_tree(&root.join("fixtures"), &out.join("fixtures"), &|_| false)?;
    if let Some((dir, target)) = &kernel_cache {
        copy_tree(dir, &out.join("kernel-cache/ptx"), &|_| false)?;
        fs::write(out.join("kernel-cache/TARGET"), format!("{target}\n"))?;
        println!("bundle: kernel cache for {target} from {}", dir.display());
    }
    fs::write(out.join("fingerprint.json"), &fingerprint_text)?;
    copy_file(&lock_path, &out.join("requirements.lock"))?;

    // 4. Bytecode, so that a run never writes into the (maybe read-only)
    // bundle and starts as fast as in the workspace.
    let compiled = Command::new(&venv_python)
        .args(["-I", "-W", "ignore", "-m", "compileall", "-qq", "-j", "0"])
        .arg(&stdlib)
        .env_remove("PYTHONHOME")
        .env_remove("PYTHONPATH")
        .status()
        .context("running compileall")?;
    if !compiled.success() {
        // Some stdlib test-data files are not Python 3; nothing imports them.
        println!("bundle: note: compileall skipped files that do not compile (not imported by the runner)");
    }

    // 5. Launcher and description.
    let libmlx = if cfg!(target_os = "macos") {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    };
    let launcher = LAUNCHER
        .replace("@BACKEND@", backend.name())
        .replace("@PYVER@", &facts.lib_dir_name)
        .replace("@LIBPYTHON@", &facts.soname)
        .replace("@LIBMLX@", libmlx);
    write_executable(&out.join("conformance"), &launcher)?;
    let requires = elf_requirements(&out)?;
    let manifest = serde_json::json!({
        "schema": 1,
        "backend": backend.name(),
        "created": command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"], root),
        "commit": command_line("git", &["rev-parse", "HEAD"], root),
        "worktree_modified": command_line("git", &["status", "--porcelain", "--untracked-files=no"], root)
            .map(|s| !s.is_empty()),
        "mlx_version": field("mlx_version"),
        "python_version": facts.version,
        "lock_sha256": lock_sha256,
        "libpython": facts.soname,
        "platform": format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        "requires": requires,
        "home_variable": HOME_ENV,
        "kernel_cache_target": kernel_cache.as_ref().map(|(_, target)| target),
    });
    fs::write(
        out.join("BUNDLE.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    fs::write(
        out.join("README.txt"),
        README_TXT
            .replace("@BACKEND@", backend.name())
            .replace("@GLIBC@", requires["glibc"].as_str().unwrap_or("?"))
            .replace("@GLIBCXX@", requires["glibcxx"].as_str().unwrap_or("?")),
    )?;

    // 6. It starts: no Rust, Python or workspace paths in the environment.
    check_bundle(&out, backend)?;
    let (files, bytes) = tree_size(&out)?;
    println!("bundle: {} ({files} files, {})", out.display(), mib(bytes));

    // 7. The archive.
    if args.archive {
        let parts = archive(&out, args.part_mib * 1024 * 1024, args.level)?;
        let total: u64 = parts.iter().map(|(_, size)| size).sum();
        println!(
            "bundle: archive {} in {} part(s), {} in all:",
            archive_name(&out)?.display(),
            parts.len(),
            mib(total)
        );
        for (part, size) in &parts {
            println!("  {} ({})", part.display(), mib(*size));
        }
        let name = out.file_name().unwrap().to_string_lossy().into_owned();
        println!(
            "bundle: on the target: cat {name}.tar.zst.part-* > {name}.tar.zst && sha256sum -c --ignore-missing {name}.tar.zst.sha256 && zstd -dc {name}.tar.zst | tar -x"
        );
    }
    println!(
        "bundle: run it with `{}/conformance --device {}` (reports in ./target/conformance, or --out)",
        out.display(),
        match backend {
            BundleBackend::Cpu => "cpu",
            BundleBackend::Cuda => "gpu",
        }
    );
    Ok(0)
}

/// The one GPU architecture (`sm_90a`) of the modules in an MLX kernel
/// cache. MLX names cached modules without the architecture, so the bundle
/// records it and the launcher uses the cache only on a matching GPU. The
/// `.ptx` files hold PTX text (`.target sm_90a`) or, as NVRTC writes them
/// for a known GPU, a cubin whose tool note says `-arch sm_90a`.
fn ptx_target(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)
        .with_context(|| format!("--kernel-cache {}: not a readable directory", dir.display()))?;
    let mut targets = std::collections::BTreeSet::new();
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "ptx"))
    {
        let bytes = fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let at = [&b".target "[..], &b"-arch "[..]]
            .iter()
            .find_map(|key| find(&bytes, key).map(|i| i + key.len()));
        let target = at.map(|i| {
            let rest = &bytes[i..];
            let end = rest
                .iter()
                .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                .unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).into_owned()
        });
        match target {
            Some(t) if t.starts_with("sm_") => targets.insert(t),
            _ => bail!(
                "--kernel-cache: {} names no `sm_` target; is this an MLX PTX cache?",
                file.display()
            ),
        };
    }
    match targets.len() {
        0 => bail!(
            "--kernel-cache {} holds no .ptx files; point it at the MLX_PTX_CACHE_DIR of a CUDA run",
            dir.display()
        ),
        1 => Ok(targets.into_iter().next().unwrap_or_default()),
        _ => bail!(
            "--kernel-cache {} mixes GPU architectures {targets:?}; keep one per cache",
            dir.display()
        ),
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    let path = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    // Normalise `..` through the parent that exists.
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if parent.exists() => Ok(parent.canonicalize()?.join(name)),
        _ => Ok(path),
    }
}

fn python_facts(python: &Path) -> Result<PythonFacts> {
    let output = Command::new(python)
        .args(["-I", "-c", PYTHON_FACTS])
        .env_remove("PYTHONHOME")
        .env_remove("PYTHONPATH")
        .output()
        .with_context(|| format!("could not run {}", python.display()))?;
    if !output.status.success() {
        bail!("{} failed:\n{}", python.display(), util::tail(&output, 10));
    }
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("unexpected answer from {}", python.display()))
}

/// `cargo build -p conformance` against the backend's env; the runner's
/// and the explorer's executables as cargo reports them.
fn build_runner(root: &Path, env: &Layout) -> Result<(PathBuf, PathBuf)> {
    // The layout's cargo: MLX_REFERENCE_DIR, PYO3_PYTHON and its target dir.
    let mut cmd = env.cargo(root);
    cmd.args([
        "build",
        "-p",
        "conformance",
        "--bin",
        "conformance",
        "--bin",
        "conformance-explore",
        "--bin",
        "conformance-port-candidate",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let mut child = cmd.spawn().context("could not run cargo build")?;
    let (mut executable, mut explorer) = (None, None);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact" {
            let path = message["executable"].as_str().map(PathBuf::from);
            match message["target"]["name"].as_str() {
                Some("conformance") if path.is_some() => executable = path,
                Some("conformance-explore") if path.is_some() => explorer = path,
                _ => {}
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "cargo build -p conformance failed (exit {})",
            util::exit_code(status)
        );
    }
    Ok((
        executable.context("cargo reported no `conformance` executable")?,
        explorer.context("cargo reported no `conformance-explore` executable")?,
    ))
}

/// `cargo bench -p conformance --no-run` (release) against the backend's
/// env; every bench target's name and executable as cargo reports them.
fn build_benches(root: &Path, env: &Layout) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = env.cargo(root);
    cmd.args([
        "bench",
        "-p",
        "conformance",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let mut child = cmd.spawn().context("could not run cargo bench --no-run")?;
    let mut benches = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let is_bench = message["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "bench"));
        if message["reason"] == "compiler-artifact" && is_bench {
            if let (Some(name), Some(path)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            ) {
                benches.push((name.to_owned(), PathBuf::from(path)));
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "cargo bench -p conformance --no-run failed (exit {})",
            util::exit_code(status)
        );
    }
    if benches.is_empty() {
        bail!("cargo reported no bench executables");
    }
    Ok(benches)
}

/// The ownership marker a bundle carries: `prepare_out` empties only a
/// directory holding it (or an empty one).
const MARKER: &str = ".mlx-conformance-owned";
const MARKER_TEXT: &str = "{\"tool\": \"mlx-conformance\", \"kind\": \"bundle\"}\n";

/// Whether `out` may be replaced: missing, empty, or a bundle this tool
/// made (its marker, a small regular file with the bundle's text). Anything
/// else (a user's `~/.local` holding `bin/conformance`, a file, a link) is
/// refused in one line naming what is there, before anything is built.
fn check_out(out: &Path) -> Result<()> {
    match fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("--out {}", out.display())),
        Ok(m) if m.file_type().is_symlink() => bail!(
            "--out {} is a symbolic link; nothing was removed. Fix: give a real directory (a link's target is never emptied)",
            out.display()
        ),
        Ok(m) if !m.is_dir() => bail!(
            "--out {} is a file, not a directory; nothing was removed. Fix: give a new or empty directory",
            out.display()
        ),
        Ok(_) => {}
    }
    let marker = out.join(MARKER);
    let ours = fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file() && m.len() < 4096)
        && fs::read_to_string(&marker).is_ok_and(|t| t == MARKER_TEXT);
    if ours {
        return Ok(());
    }
    let mut names: Vec<String> = fs::read_dir(out)
        .with_context(|| format!("--out {}", out.display()))?
        .filter_map(|e| e.ok())
        .map(|e| format!("`{}`", e.file_name().to_string_lossy()))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let more = names.len().saturating_sub(3);
    names.truncate(3);
    bail!(
        "--out {} holds {}{} but no {MARKER}: it is not a bundle this tool made, so nothing in it was removed. Fix: give a new or empty --out directory (or remove this one yourself)",
        out.display(),
        names.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    )
}

/// Empties `out` if it is a previous bundle (its marker) or empty, and
/// marks it; refuses anything else ([`check_out`]).
fn prepare_out(out: &Path) -> Result<()> {
    check_out(out)?;
    if out.exists() {
        make_writable(out)?;
        fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    fs::write(out.join(MARKER), MARKER_TEXT)
        .with_context(|| format!("writing {}", out.join(MARKER).display()))
}

#[cfg(test)]
mod out_tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("xtask-bundle-out-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// Issue 40, class 1: a directory merely holding `bin/conformance`
    /// (a user's `~/.local`) was deleted whole, exit 0.
    #[test]
    fn only_a_marked_bundle_or_an_empty_directory_is_replaced() {
        let local = scratch("local");
        fs::create_dir_all(local.join("bin")).unwrap();
        fs::write(local.join("bin/conformance"), "").unwrap();
        fs::write(local.join("notes.txt"), "mine").unwrap();
        let e = prepare_out(&local).unwrap_err().to_string();
        assert!(
            e.contains("`bin`") && e.contains("`notes.txt`") && e.contains(MARKER),
            "{e}"
        );
        assert_eq!(fs::read_to_string(local.join("notes.txt")).unwrap(), "mine");
        // A BUNDLE.json alone is not the marker either.
        fs::write(local.join("BUNDLE.json"), "{}").unwrap();
        assert!(prepare_out(&local).is_err());
        assert!(local.join("notes.txt").exists());
        // A forged marker of other text: refused.
        fs::write(local.join(MARKER), "x").unwrap();
        assert!(prepare_out(&local).is_err());
        // A link: refused, its target untouched.
        let link = scratch("link");
        std::os::unix::fs::symlink(&local, &link).unwrap();
        assert!(prepare_out(&link).is_err());
        assert!(local.join("notes.txt").exists());
        // Missing, then a marked bundle: made, then emptied and marked again.
        let fresh = scratch("fresh");
        prepare_out(&fresh).unwrap();
        fs::write(fresh.join("old"), "").unwrap();
        prepare_out(&fresh).unwrap();
        assert!(!fresh.join("old").exists());
        assert!(fresh.join(MARKER).is_file());
        for d in [&local, &fresh] {
            fs::remove_dir_all(d).unwrap();
        }
        fs::remove_file(&link).unwrap();
    }
}

/// A read-only bundle (as carried) can still be replaced.
fn make_writable(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::symlink_metadata(dir)?;
    if meta.is_dir() {
        let mut perms = meta.permissions();
        perms.set_mode(perms.mode() | 0o700);
        fs::set_permissions(dir, perms)?;
        for entry in fs::read_dir(dir)? {
            make_writable(&entry?.path())?;
        }
    }
    Ok(())
}

/// Copies a file's bytes, mode and modification time (bytecode validity
/// is checked against the source's mtime). Symlinks are followed.
fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    let modified = fs::metadata(from)?.modified()?;
    fs::File::options()
        .write(true)
        .open(to)?
        .set_modified(modified)?;
    Ok(())
}

/// Copies a tree (following symlinks), leaving out entries whose path
/// relative to `from` is `excluded`, and optimised bytecode
/// (`*.opt-1.pyc`, `*.opt-2.pyc`: never loaded by the runner).
fn copy_tree(from: &Path, to: &Path, excluded: &dyn Fn(&Path) -> bool) -> Result<()> {
    fn walk(base: &Path, dir: &Path, to: &Path, excluded: &dyn Fn(&Path) -> bool) -> Result<()> {
        fs::create_dir_all(to)?;
        let mut entries: Vec<_> = fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let rel = path.strip_prefix(base).expect("under base");
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if excluded(rel) || (name.ends_with(".pyc") && name.contains(".opt-")) {
                continue;
            }
            let meta = match fs::metadata(&path) {
                Ok(meta) => meta,
                // A dangling symlink: nothing to copy.
                Err(_) if entry.file_type()?.is_symlink() => continue,
                Err(e) => return Err(e).with_context(|| path.display().to_string()),
            };
            let target = to.join(&*name);
            if meta.is_dir() {
                walk(base, &path, &target, excluded)?;
            } else if meta.is_file() {
                copy_file(&path, &target)?;
            }
        }
        Ok(())
    }
    walk(from, from, to, excluded)
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn command_line(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The newest glibc and libstdc++ symbol versions any bundled ELF file
/// asks for: the target's system libraries must be at least these.
fn elf_requirements(out: &Path) -> Result<serde_json::Value> {
    let mut glibc = (0u32, 0u32, 0u32);
    let mut glibcxx = (0u32, 0u32, 0u32);
    let mut scan = |path: &Path| -> Result<()> {
        let bytes = fs::read(path)?;
        if !bytes.starts_with(b"\x7fELF") {
            return Ok(());
        }
        for (prefix, best) in [
            (&b"GLIBC_"[..], &mut glibc),
            (&b"GLIBCXX_"[..], &mut glibcxx),
        ] {
            let mut at = 0;
            while let Some(found) = find(&bytes[at..], prefix) {
                let start = at + found + prefix.len();
                let end = bytes[start..]
                    .iter()
                    .position(|b| !(b.is_ascii_digit() || *b == b'.'))
                    .map_or(bytes.len(), |n| start + n);
                let mut parts = std::str::from_utf8(&bytes[start..end])
                    .unwrap_or("")
                    .split('.')
                    .map(|p| p.parse::<u32>().unwrap_or(0));
                let version = (
                    parts.next().unwrap_or(0),
                    parts.next().unwrap_or(0),
                    parts.next().unwrap_or(0),
                );
                // GLIBC_PRIVATE and the like carry no number.
                if start != end && version > *best {
                    *best = version;
                }
                at = end.max(start);
            }
        }
        Ok(())
    };
    let mut files = Vec::new();
    collect_files(out, &mut files)?;
    for file in files {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        if name.contains(".so")
            || file.ends_with("bin/conformance")
            || file.ends_with("bin/conformance-explore")
            || file.ends_with("bin/conformance-port-candidate")
            || name.starts_with("bench-")
        {
            scan(&file)?;
        }
    }
    let show = |(a, b, c): (u32, u32, u32)| {
        if c > 0 {
            format!("{a}.{b}.{c}")
        } else {
            format!("{a}.{b}")
        }
    };
    Ok(serde_json::json!({
        "glibc": show(glibc),
        "glibcxx": show(glibcxx),
    }))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_files(&entry.path(), files)?;
        } else if kind.is_file() {
            files.push(entry.path());
        }
    }
    Ok(())
}

fn tree_size(dir: &Path) -> Result<(u64, u64)> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    let mut bytes = 0;
    for file in &files {
        bytes += fs::metadata(file)?.len();
    }
    Ok((files.len() as u64, bytes))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Starts the bundle the way a target machine would: `env -i` with a bare
/// PATH, from another directory. CPU: one case runs (the oracle starts
/// from the bundle); CUDA: the NVIDIA libraries are the host's, so only
/// `--list` (which still loads every library) when they are found here.
fn check_bundle(out: &Path, backend: BundleBackend) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("xtask-bundle-check-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    let launcher = out.join("conformance");
    let run = |args: &[&str]| -> Result<std::process::Output> {
        Command::new(&launcher)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &scratch)
            .current_dir(&scratch)
            .output()
            .with_context(|| format!("could not run {}", launcher.display()))
    };
    let listed = run(&["--list"])?;
    let result = if backend == BundleBackend::Cuda && listed.status.code() == Some(3) {
        println!(
            "bundle: note: the CUDA bundle's libraries are not all found on this machine (expected off a GPU host); not started here:\n{}",
            util::tail(&listed, 9)
        );
        Ok(())
    } else if !listed.status.success() {
        Err(anyhow::anyhow!(
            "the bundle's runner does not start (`conformance --list` exit {:?}):\n{}",
            listed.status.code(),
            util::tail(&listed, 12)
        ))
    } else if backend == BundleBackend::Cpu {
        let reports = scratch.join("reports");
        let ran = run(&[
            "--device",
            "cpu",
            "--seed",
            "1",
            "--filter",
            "smoke/",
            "--out",
            reports.to_str().unwrap_or("reports"),
        ])?;
        if ran.status.success() {
            println!("bundle: checked: `env -i PATH=/usr/bin:/bin <bundle>/conformance --list` and a smoke run start from the bundle");
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "the bundle's runner does not run a smoke case (exit {:?}):\n{}",
                ran.status.code(),
                util::tail(&ran, 20)
            ))
        }
    } else {
        println!("bundle: checked: `env -i PATH=/usr/bin:/bin <bundle>/conformance --list` starts (CUDA: cases need the GPU host)");
        Ok(())
    };
    let _ = fs::remove_dir_all(&scratch);
    result
}

fn archive_name(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .context("--out has no file name")?
        .to_string_lossy()
        .into_owned();
    Ok(out.with_file_name(format!("{name}.tar.zst")))
}

/// `tar | zstd`, split into parts of at most `part_bytes`; writes the sha256
/// list. Returns the parts and their sizes.
fn archive(out: &Path, part_bytes: u64, level: u32) -> Result<Vec<(PathBuf, u64)>> {
    let parent = out.parent().context("--out has no parent")?;
    let name = out
        .file_name()
        .context("--out has no file name")?
        .to_string_lossy()
        .into_owned();
    let archive_file = format!("{name}.tar.zst");
    for entry in fs::read_dir(parent)? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.starts_with(&format!("{archive_file}.part-"))
            || file == format!("{archive_file}.sha256")
        {
            fs::remove_file(entry.path())?;
        }
    }
    if Command::new("zstd")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        bail!("--archive needs the `zstd` command (Debian/Ubuntu: apt-get install zstd)");
    }
    println!("bundle: compressing (tar | zstd -{level} -T0) …");
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(parent)
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-cf",
            "-",
        ])
        .arg(&name)
        .stdout(Stdio::piped())
        .spawn()
        .context("could not run tar")?;
    let mut zstd = Command::new("zstd")
        .args(["-q", "-T0", &format!("-{level}"), "-c", "-"])
        .stdin(tar.stdout.take().expect("piped"))
        .stdout(Stdio::piped())
        .spawn()
        .context("could not run zstd")?;
    let mut compressed = zstd.stdout.take().expect("piped");
    let mut whole = Sha256::new();
    let mut parts: Vec<(PathBuf, u64, String)> = Vec::new();
    let mut current: Option<(fs::File, PathBuf, u64, Sha256)> = None;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = compressed.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        let mut chunk = &buffer[..n];
        whole.update(chunk);
        while !chunk.is_empty() {
            if current
                .as_ref()
                .is_none_or(|(_, _, size, _)| *size == part_bytes)
            {
                if let Some((mut file, path, size, hash)) = current.take() {
                    file.flush()?;
                    parts.push((path, size, hex(hash)));
                }
                let path = parent.join(format!("{archive_file}.part-{:02}", parts.len()));
                current = Some((fs::File::create(&path)?, path, 0, Sha256::new()));
            }
            let (file, _, size, hash) = current.as_mut().expect("a part is open");
            let take = chunk.len().min((part_bytes - *size) as usize);
            file.write_all(&chunk[..take])?;
            hash.update(&chunk[..take]);
            *size += take as u64;
            chunk = &chunk[take..];
        }
    }
    if let Some((mut file, path, size, hash)) = current.take() {
        file.flush()?;
        parts.push((path, size, hex(hash)));
    }
    let zstd_status = zstd.wait()?;
    let tar_status = tar.wait()?;
    if !tar_status.success() || !zstd_status.success() {
        bail!(
            "tar | zstd failed (tar exit {:?}, zstd exit {:?})",
            tar_status.code(),
            zstd_status.code()
        );
    }
    let mut list = String::new();
    for (path, _, hash) in &parts {
        list.push_str(&format!(
            "{hash}  {}\n",
            path.file_name().unwrap().to_string_lossy()
        ));
    }
    list.push_str(&format!("{}  {archive_file}\n", hex(whole)));
    fs::write(parent.join(format!("{archive_file}.sha256")), list)?;
    Ok(parts
        .into_iter()
        .map(|(path, size, _)| (path, size))
        .collect())
}

fn hex(hash: Sha256) -> String {
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The bundle's entry point. `@…@` are filled in by `run`.
const LAUNCHER: &str = r#"#!/bin/sh
# mlx-conformance bundle launcher (written by `cargo xtask bundle`).
#
# Runs bin/conformance, the bit-exact MLX conformance runner, with this
# bundle's CPython (@PYVER@ and its standard library), reference packages
# and snapshot fixtures. Flags and exit codes are the runner's, exactly as
# with `cargo xtask conformance` (0 pass, 1 fail, 2 drift, 3 environment).
# Reports go to ./target/conformance unless --out says otherwise.
#
# Environment read here:
#   MLX_CONFORMANCE_NVIDIA_LIBS  (cuda bundle) colon-separated directories
#       with the NVIDIA libraries libmlx needs (CUDA runtime, cuBLAS, cuDNN,
#       NCCL, cuFFT, NVRTC); default: every nvidia/*/lib directory in the
#       site-packages of the `python3` first on PATH, if any.
#   MLX_PTX_CACHE_DIR  (cuda bundle) MLX's kernel cache; when unset and the
#       bundle carries kernel-cache/ for this GPU's architecture, a writable
#       copy of it under ${TMPDIR:-/tmp} (MLX adds the kernels it compiles).
# PYTHONHOME, PYTHONPATH and the other PYTHON* variables are ignored.
set -u
self=$0
if command -v readlink >/dev/null 2>&1; then
    resolved=$(readlink -f -- "$0" 2>/dev/null) && [ -n "$resolved" ] && self=$resolved
fi
here=$(CDPATH= cd -P -- "$(dirname -- "$self")" && pwd) || {
    echo "conformance bundle: cannot find the bundle directory of $0" >&2
    exit 3
}
backend='@BACKEND@'
site="$here/python/lib/@PYVER@/site-packages"
libmlx="$site/mlx/lib/@LIBMLX@"
for f in "$here/bin/conformance" "$here/python/lib/@LIBPYTHON@" "$libmlx" "$here/fingerprint.json"; do
    if [ ! -e "$f" ]; then
        echo "conformance bundle: $f is missing: the bundle at $here is incomplete; rebuild it with \`cargo xtask bundle\`" >&2
        exit 3
    fi
done

# The runner configures its Python from MLX_CONFORMANCE_HOME alone
# (isolated); the PYTHON* variables are also cleared for anything it starts.
unset PYTHONHOME PYTHONPATH PYTHONSTARTUP PYTHONUSERBASE PYTHONEXECUTABLE \
    PYTHONPLATLIBDIR PYTHONSAFEPATH PYTHONNOUSERSITE PYTHONINSPECT VIRTUAL_ENV
MLX_CONFORMANCE_HOME=$here
export MLX_CONFORMANCE_HOME

libs="$here/python/lib:$site/mlx/lib"
if [ "$backend" = cuda ]; then
    nvidia=${MLX_CONFORMANCE_NVIDIA_LIBS:-}
    searched="MLX_CONFORMANCE_NVIDIA_LIBS=$nvidia"
    if [ -z "$nvidia" ]; then
        searched="MLX_CONFORMANCE_NVIDIA_LIBS unset; no python3 on PATH"
        if command -v python3 >/dev/null 2>&1; then
            py=$(command -v python3)
            sites=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null) || sites=
            searched="MLX_CONFORMANCE_NVIDIA_LIBS unset; searched nvidia/*/lib in the site-packages of $py: $(echo $sites)"
            old_ifs=$IFS
            IFS='
'
            for sp in $sites; do
                for d in "$sp"/nvidia/*/lib; do
                    if [ -d "$d" ]; then
                        nvidia="${nvidia:+$nvidia:}$d"
                    fi
                done
            done
            IFS=$old_ifs
        fi
    fi
    if [ -n "$nvidia" ]; then
        libs="$libs:$nvidia"
    fi
fi
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

if [ "$backend" = cuda ] && command -v ldd >/dev/null 2>&1; then
    missing=$(ldd "$libmlx" 2>/dev/null | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
    if [ -n "$missing" ]; then
        {
            echo "conformance bundle: the CUDA libmlx needs libraries that are not found: $missing"
            echo "  ($searched)"
            case " $missing" in
                *" libcuda.so"*) echo "  libcuda.so.1 is the NVIDIA driver's library: is this a GPU host with the driver installed?" ;;
            esac
            echo "  fix: MLX_CONFORMANCE_NVIDIA_LIBS=<dir>:<dir>... naming the lib directories of the NVIDIA CUDA 13 pip"
            echo "  packages (nvidia-cuda-runtime, nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-cufft,"
            echo "  nvidia-cuda-nvrtc), e.g. \"\$(ls -d /path/to/venv/lib/python3.*/site-packages/nvidia/*/lib | paste -sd:)\","
            echo "  or put the python3 of an environment that has them first on PATH"
        } >&2
        exit 3
    fi
fi

# The carried kernel cache: MLX compiles each CUDA kernel with NVRTC at first
# use (minutes for the whole suite); its cache names do not say the GPU
# architecture, so it is used only on a GPU of the one it was recorded on.
if [ "$backend" = cuda ] && [ -z "${MLX_PTX_CACHE_DIR:-}" ] && [ -f "$here/kernel-cache/TARGET" ]; then
    target=$(cat "$here/kernel-cache/TARGET")
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    if [ "sm_$cap" = "${target%a}" ]; then
        cache="${TMPDIR:-/tmp}/mlx-conformance-ptx-$(id -u)/$(cksum < "$here/BUNDLE.json" | cut -d ' ' -f 1)"
        if mkdir -p "$cache" && cp -Rn "$here/kernel-cache/ptx/." "$cache/" 2>/dev/null; then
            MLX_PTX_CACHE_DIR=$cache
            export MLX_PTX_CACHE_DIR
        else
            echo "conformance bundle: note: could not copy the kernel cache to $cache; kernels compile at first use" >&2
        fi
    else
        echo "conformance bundle: note: the carried kernel cache is for $target, this GPU is ${cap:+sm_}${cap:-unknown (no nvidia-smi)}; kernels compile at first use" >&2
    fi
fi

prev=
for arg in "$@"; do
    case "$prev $arg" in
        "--fixtures accept" | *" --fixtures=accept")
            if [ ! -w "$here/fixtures/snapshots" ]; then
                echo "conformance bundle: --fixtures accept writes into $here/fixtures/snapshots, which is read-only here; copy the bundle somewhere writable first" >&2
                exit 3
            fi
            echo "conformance bundle: --fixtures accept records the snapshot set under $here/fixtures/snapshots/<set>/ (the run names it); copy that directory into a checkout's fixtures/snapshots/ and commit it there" >&2
            ;;
    esac
    prev=$arg
done

# `<bundle>/conformance python …` is this bundle's CPython with the reference
# packages (mlx.core included): for Python candidates (`--candidate`).
if [ "${1:-}" = python ]; then
    shift
    PYTHONHOME="$here/python"
    export PYTHONHOME
    exec "$here/python/bin/python3" "$@"
fi
# `<bundle>/conformance port-candidate` is this repository's port served
# through the candidate protocol.
if [ "${1:-}" = port-candidate ]; then
    shift
    exec "$here/bin/conformance-port-candidate" "$@"
fi
# `<bundle>/conformance explore …` is the shape explorer.
if [ "${1:-}" = explore ]; then
    shift
    exec "$here/bin/conformance-explore" "$@"
fi
# `<bundle>/conformance bench NAME …` runs a bench target (`bundle --benches`).
if [ "${1:-}" = bench ]; then
    if [ -z "${2:-}" ] || [ ! -x "$here/bin/bench-$2" ]; then
        echo "conformance bundle: bench ${2:-<name>}: not in this bundle; it has: $(cd "$here/bin" && ls bench-* 2>/dev/null | sed 's/^bench-//' | tr '\n' ' ')(build one with \`cargo xtask bundle --benches\`)" >&2
        exit 3
    fi
    name=$2
    shift 2
    exec "$here/bin/bench-$name" "$@"
fi
exec "$here/bin/conformance" "$@"
"#;

const README_TXT: &str = r#"mlx-conformance bundle (@BACKEND@), written by `cargo xtask bundle`
=================================================================

A self-contained copy of the bit-exact MLX conformance runner: its binary,
CPython with its standard library, the pinned reference packages (mlx and
its libmlx, mlx-lm, mlx-vlm, mlx-optiq, numpy, ...) and the snapshot sets.
Needs no Rust, uv, network or system Python; needs Linux x86-64 with glibc
>= @GLIBC@ and libstdc++ (GLIBCXX) >= @GLIBCXX@.

    ./conformance --device cpu            # the whole suite; exit 0/1/2/3
    ./conformance --list                  # every case
    ./conformance --filter quantized/linear --out /tmp/reports

Flags, reports and exit codes are those of `cargo xtask conformance` (see
the repository README). Reports go to ./target/conformance of the current
directory unless --out names another place; the bundle itself may be
read-only. `--fixtures accept` records the snapshot set into
fixtures/snapshots/<set>/ of this bundle: copy it back into a checkout.

CUDA bundles need the host's NVIDIA libraries (CUDA 13 runtime, cuBLAS,
cuDNN, NCCL, cuFFT, NVRTC): set MLX_CONFORMANCE_NVIDIA_LIBS to their
directories, or put the python3 of an environment with the NVIDIA pip
packages first on PATH (its site-packages' nvidia/*/lib are used).
MLX compiles each CUDA kernel at first use (minutes for a whole cold run);
a bundle written with `--kernel-cache DIR` carries MLX's PTX cache in
kernel-cache/ and, on a GPU of the architecture in kernel-cache/TARGET,
the launcher points MLX_PTX_CACHE_DIR at a writable copy of it.

BUNDLE.json records the commit, backend, versions and lock hash.
"#;

#[cfg(test)]
mod kernel_cache_tests {
    use super::ptx_target;
    use std::fs;

    fn cache(files: &[(&str, &str)]) -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtask-ptx-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (name, text) in files {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        dir
    }

    const PTX: &str = "//\n.version 9.0\n.target sm_90a\n.address_size 64\n";

    #[test]
    fn one_target_is_read_from_the_ptx_files() {
        // NVRTC's cubin for a known GPU: an ELF whose tool note names the arch.
        let cubin = "\x7fELF\x02\x01\x01A .note.nv.tkinfo ptxas -arch sm_90a -m64\0";
        let dir = cache(&[("a.ptx", PTX), ("a.txt", "k\tm\n"), ("long/b.ptx", cubin)]);
        assert_eq!(ptx_target(&dir).unwrap(), "sm_90a");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mixed_missing_or_empty_caches_are_refused() {
        let mixed = cache(&[("a.ptx", PTX), ("b.ptx", ".target sm_80\n")]);
        assert!(ptx_target(&mixed)
            .unwrap_err()
            .to_string()
            .contains("mixes GPU architectures"));
        let empty = cache(&[("a.txt", "")]);
        assert!(ptx_target(&empty)
            .unwrap_err()
            .to_string()
            .contains("no .ptx files"));
        let odd = cache(&[("a.ptx", "not ptx")]);
        assert!(ptx_target(&odd)
            .unwrap_err()
            .to_string()
            .contains("names no `sm_` target"));
        let missing = std::env::temp_dir().join("xtask-ptx-does-not-exist");
        assert!(ptx_target(&missing)
            .unwrap_err()
            .to_string()
            .contains("not a readable directory"));
        for dir in [mixed, empty, odd] {
            fs::remove_dir_all(dir).unwrap();
        }
    }
}
