//! `cargo xtask gate <candidate>` / `cargo xtask gate --wheel <mlx*.whl>…`:
//! the release gate. Runs the suite on the baseline environment and on a
//! candidate environment with the same seeds (snapshots not checked, every
//! case's port and reference tensors kept), then `conformance-gate`
//! compares the runs per case and per output and writes
//! `target/gate/<candidate>/gate.json` and `gate.md`.
//!
//! Exit codes: 0 nothing changed; 2 bits or findings changed but every
//! must-equal case passes on the candidate; 1 a must-equal case fails on
//! the candidate; 3 environment or harness problem (also when the runner
//! does not build against the candidate, or its reference's API moved).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::env::{self, Layout};
use crate::util;

#[derive(clap::Args)]
pub struct Args {
    /// The candidate: a folder of reference/candidates/ (built with
    /// `cargo xtask setup --candidate NAME`), or `baseline` to gate the
    /// baseline against itself
    #[arg(value_name = "CANDIDATE", required_unless_present = "wheels")]
    candidate: Option<String>,
    /// A throwaway candidate: the baseline's pins with its MLX wheels (mlx,
    /// mlx-cpu / mlx-metal) replaced by these local wheels, hashes recorded
    #[arg(long = "wheel", value_name = "PATH", num_args = 1.., conflicts_with = "candidate")]
    wheels: Vec<PathBuf>,
    /// Only cases whose name contains this text, on both sides
    #[arg(long)]
    filter: Option<String>,
    /// Self-test of the gate: the candidate's reference receives perturbed
    /// inputs (`conformance --perturb`), so must-equal cases are "reference
    /// moved alone"
    #[arg(long)]
    perturb_candidate: bool,
    /// Also run the first N samples of the shape explorer (every family) on
    /// both sides as cases `explore/…`, classified like every case (kernel
    /// change review: which shapes change bits, which leave the exact bound)
    #[arg(long, value_name = "N")]
    explore_samples: Option<u32>,
    /// The explorer seed of --explore-samples (the same on both sides)
    #[arg(
        long,
        value_name = "SEED",
        default_value_t = 0,
        requires = "explore_samples"
    )]
    explore_seed: u64,
}

pub fn run(root: &Path, args: &Args) -> Result<i32> {
    let baseline = Layout::host_default();
    let (name, candidate) = match (&args.candidate, args.wheels.is_empty()) {
        (Some(name), _) if name == "baseline" => ("baseline".to_owned(), baseline.clone()),
        (Some(name), _) => (name.clone(), env::existing_candidate(root, name)?),
        (None, false) => wheel_candidate(root, &args.wheels)?,
        (None, true) => {
            bail!("name a candidate (a folder of reference/candidates/) or pass --wheel")
        }
    };
    let out = root.join("target/gate").join(&name);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // One gate of a candidate at a time: a second would delete the first's runs.
    let lock = std::fs::File::create(out.join(".lock"))?;
    if lock.try_lock().is_err() {
        bail!("another `cargo xtask gate {name}` is running on this workspace; wait for it");
    }
    for stale in ["baseline", "candidate"] {
        let _ = std::fs::remove_dir_all(out.join(stale));
    }
    for stale in ["gate.json", "gate.md"] {
        let _ = std::fs::remove_file(out.join(stale));
    }
    let mut errors = Vec::new();
    env::check_environment(root, &baseline).context("the baseline environment")?;
    if let Err(e) = env::check_environment(root, &candidate) {
        errors.push(format!("candidate {name}: {e:#}"));
    }
    let sides = [
        ("baseline", "baseline".to_owned(), &baseline, false),
        (
            "candidate",
            format!("candidate {name}"),
            &candidate,
            args.perturb_candidate,
        ),
    ];
    for (dir, label, layout, perturb) in sides {
        if !errors.is_empty() {
            break;
        }
        println!("gate: {label} run");
        if let Err(e) = suite(root, layout, &out.join(dir), args, perturb) {
            errors.push(format!("{label}: {e:#}"));
        }
    }
    let mut cmd = cargo_run(root, &baseline, "conformance-gate");
    cmd.arg(&name)
        .arg(out.join("baseline"))
        .arg(out.join("candidate"))
        .arg("--out")
        .arg(&out);
    for e in &errors {
        cmd.arg("--environment-error").arg(e);
    }
    if let Some(f) = &args.filter {
        cmd.arg("--filter").arg(f);
    }
    if args.perturb_candidate {
        cmd.arg("--perturbed-candidate");
    }
    util::status(&mut cmd, "conformance-gate")
}

/// `cargo run -q -p conformance --bin <bin> --` built against `layout`.
fn cargo_run(root: &Path, layout: &Layout, bin: &str) -> std::process::Command {
    let mut cmd = layout.cargo(root);
    cmd.args(["run", "-q", "-p", "conformance", "--bin", bin, "--"]);
    cmd
}

/// One run of the suite against `layout` into `dir` (report.json and
/// outputs/). A run that ends without a report is an environment error,
/// with what it printed.
fn suite(root: &Path, layout: &Layout, dir: &Path, args: &Args, perturb: bool) -> Result<()> {
    let mut cmd = cargo_run(root, layout, "conformance");
    // The deep tier: every case, the finders and long windows included
    // (the release gate checks nothing less than the whole suite).
    cmd.args(["--tier", "deep", "--no-snapshots", "--keep-outputs"])
        .arg(dir.join("outputs"))
        .arg("--out")
        .arg(dir);
    if let Some(f) = &args.filter {
        cmd.arg("--filter").arg(f);
    }
    if let Some(n) = args.explore_samples {
        cmd.arg("--explore-samples").arg(n.to_string());
        cmd.arg("--explore-seed").arg(args.explore_seed.to_string());
    }
    if perturb {
        cmd.arg("--perturb");
    }
    let output = util::output(&mut cmd, "the conformance runner")?;
    if !dir.join("report.json").exists() {
        bail!(
            "the suite did not run (exit {}; a runner that does not build or start against this \
             environment is version skew):\n{}",
            util::exit_code(output.status),
            util::tail(&output, 25)
        );
    }
    Ok(())
}

/// A throwaway candidate from local MLX wheels: the baseline lock with its
/// `mlx`, `mlx-cpu` and `mlx-metal` pins replaced by the wheel files (their
/// SHA-256 recorded), built like any candidate.
fn wheel_candidate(root: &Path, wheels: &[PathBuf]) -> Result<(String, Layout)> {
    let mut hashes = Vec::new();
    for w in wheels {
        let file = w.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        wheel_package(file).with_context(|| format!("--wheel {}", w.display()))?;
        hashes.push(read_wheel(w).with_context(|| format!("--wheel {}", w.display()))?);
    }
    let tag = util::sha256_bytes(
        hashes
            .iter()
            .map(|(_, h)| h.as_str())
            .collect::<String>()
            .as_bytes(),
    );
    let name = format!("wheel-{}", &tag[..12]);
    let replaced: Vec<String> = hashes
        .iter()
        .map(|(p, _)| {
            let file = p.file_name().and_then(|f| f.to_str()).unwrap_or_default();
            env::normalize(file.split('-').next().unwrap_or_default())
        })
        .collect();
    let base_lock = std::fs::read_to_string(root.join(env::LOCK))?;
    let mut lock =
        String::from("# Throwaway gate candidate: the baseline lock with local MLX wheels\n");
    let mut skipping = false;
    for line in base_lock.lines() {
        let starts_pin = !line.starts_with(' ') && !line.starts_with('#') && !line.is_empty();
        if starts_pin {
            let pin_name = env::normalize(line.split(['=', ' ', ';']).next().unwrap_or_default());
            let platform_pkg = matches!(pin_name.as_str(), "mlx-cpu" | "mlx-metal");
            skipping = replaced.contains(&pin_name)
                || (platform_pkg && replaced.iter().any(|r| r == "mlx-cpu" || r == "mlx-metal"));
        }
        if !skipping {
            lock.push_str(line);
            lock.push('\n');
        }
    }
    for ((path, sha), name) in hashes.iter().zip(&replaced) {
        lock.push_str(&format!(
            "{name} @ {} \\\n    --hash=sha256:{sha}\n",
            file_url(path)
        ));
    }
    let dir = root.join("target/gate").join(&name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("requirements.lock"), &lock)?;
    let lock_sha = util::sha256_file(&dir.join("requirements.lock"))?;
    std::fs::write(
        dir.join("requirements.lock.sha256"),
        format!("{lock_sha}\n"),
    )?;
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut layout = Layout::candidate(&name)?;
    layout.requirements_in = leak(format!("target/gate/{name}/requirements.lock"));
    layout.lock = leak(format!("target/gate/{name}/requirements.lock"));
    layout.lock_sha256 = leak(format!("target/gate/{name}/requirements.lock.sha256"));
    println!(
        "gate: throwaway candidate {name} from {} wheel(s)",
        hashes.len()
    );
    crate::setup::build(root, &layout, false, None)?;
    Ok((name, layout))
}

/// The largest wheel read (MLX's CUDA wheels are a few hundred MiB).
const MAX_WHEEL_BYTES: u64 = 4 << 30;

/// A `--wheel` file, resolved (a link to a wheel is the user's choice)
/// and hashed through one descriptor: a regular file of at most
/// [`MAX_WHEEL_BYTES`], opened without blocking (a FIFO or device is
/// refused, never waited on or read forever); a path with a control
/// character (a newline would be written into the lock) is refused.
fn read_wheel(w: &Path) -> Result<(PathBuf, String)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::fs::canonicalize(w)?;
    if path.to_string_lossy().chars().any(char::is_control) {
        bail!("the path holds a control character (a newline?); rename the file");
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        bail!("not a regular file (a FIFO, device or directory is not read); give a wheel file");
    }
    if meta.len() > MAX_WHEEL_BYTES {
        bail!(
            "{} bytes, more than any MLX wheel ({MAX_WHEEL_BYTES}); give a wheel file",
            meta.len()
        );
    }
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut limited = (&mut file).take(MAX_WHEEL_BYTES + 1);
    let mut total = 0u64;
    loop {
        let n = limited.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    if total > MAX_WHEEL_BYTES {
        bail!("grew past {MAX_WHEEL_BYTES} bytes while read; give a wheel file");
    }
    Ok((path, format!("{:x}", hasher.finalize())))
}

/// `file://` and the path, percent-encoded (a space or `#` in a path is
/// data, not the lock's syntax).
fn file_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut url = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/._~-".contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    url
}

/// The MLX package a wheel file name carries (`mlx`, `mlx-cpu`,
/// `mlx-metal`); an error for another package or a name that is not a
/// wheel's (`name-version(-build)?-python-abi-platform.whl`).
fn wheel_package(file: &str) -> Result<String> {
    let parts: Vec<&str> = file
        .strip_suffix(".whl")
        .unwrap_or_default()
        .split('-')
        .collect();
    if !file.ends_with(".whl") || !(5..=6).contains(&parts.len()) {
        bail!("not a wheel file name (name-version-python-abi-platform.whl)");
    }
    let package = env::normalize(parts[0]);
    if !matches!(package.as_str(), "mlx" | "mlx-cpu" | "mlx-metal") {
        bail!("a `{package}` wheel; the gate replaces the baseline's MLX wheels only (mlx, mlx-cpu, mlx-metal)");
    }
    Ok(package)
}

#[cfg(test)]
mod wheel_tests {
    use super::{file_url, read_wheel};
    use std::path::Path;

    /// Issue 40, class 6: `gate --wheel` hung on a FIFO, read /dev/zero
    /// without limit and wrote a path's newline raw into the lock.
    #[test]
    fn a_fifo_a_device_or_a_newline_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("xtask-wheel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("mlx-0.32.4-cp311-cp311-manylinux_2_35_x86_64.whl");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let started = std::time::Instant::now();
        assert!(read_wheel(&fifo).is_err());
        let zero = dir.join("mlx-0.32.5-cp311-cp311-manylinux_2_35_x86_64.whl");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read_wheel(&zero).is_err());
        assert!(started.elapsed().as_secs() < 5, "no hang, no endless read");
        let newline = dir.join("a\nb");
        std::fs::create_dir_all(&newline).unwrap();
        let wheel = newline.join("mlx-0.32.4-cp311-cp311-manylinux_2_35_x86_64.whl");
        std::fs::write(&wheel, b"wheel").unwrap();
        assert!(read_wheel(&wheel).is_err());
        let ok = dir.join("mlx-0.32.6-cp311-cp311-manylinux_2_35_x86_64.whl");
        std::fs::write(&ok, b"wheel").unwrap();
        assert!(read_wheel(&ok).unwrap().1.starts_with("ba599261"));
        assert_eq!(
            file_url(Path::new("/a b/c#\n.whl")),
            "file:///a%20b/c%23%0A.whl"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::wheel_package;
    use crate::env::check_candidate_name;

    #[test]
    fn wheel_names_are_checked() {
        assert_eq!(
            wheel_package("mlx-0.32.4-cp311-cp311-manylinux_2_35_x86_64.whl").unwrap(),
            "mlx"
        );
        assert_eq!(
            wheel_package("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl").unwrap(),
            "mlx-cpu"
        );
        for bad in [
            "mlx_bad.whl",
            "mlx-0.32.4.tar.gz",
            "numpy-2.3.5-cp311-cp311-linux_x86_64.whl",
            "",
        ] {
            assert!(wheel_package(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn candidate_names_are_checked() {
        assert!(check_candidate_name("mlx-0.32.4").is_ok());
        for bad in ["", "UPPER", "../x", "a/b", ".", "..", &"x".repeat(65)] {
            assert!(check_candidate_name(bad).is_err(), "{bad}");
        }
    }
}
