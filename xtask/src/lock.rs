//! `cargo xtask lock [--backend B]`: re-locks a reference environment.
//!
//! Compiles the backend's requirements.in into its requirements.lock (with
//! hashes, no dependency closure: see requirements.in) and records the new
//! lock's SHA-256 beside it, which `cargo xtask setup` checks before
//! installing anything.
//!
//! - default env (`cpu` on Linux, `metal` on macOS; both share one lock):
//!   `reference/requirements.in`, locked `--universal` (markers pick
//!   mlx-cpu on Linux and mlx-metal on macOS);
//! - `cuda`: `reference/cuda/requirements.in`, locked for Linux x86-64
//!   (manylinux_2_35, the tag of the mlx and mlx-cuda-13 wheels) and
//!   CPython 3.11, the only platform those wheels exist for.
//!
//! Locking needs no reference environment and works for any backend on any
//! machine (uv resolves for the named platform).

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::env::{Backend, Layout};
use crate::setup::find_uv;
use crate::util;

/// The platform the CUDA lock is resolved for: the mlx 0.32.2 and
/// mlx-cuda-13 0.32.2 wheels are tagged `manylinux_2_35_x86_64`.
pub const CUDA_PYTHON_PLATFORM: &str = "x86_64-manylinux_2_35";

pub fn run(root: &Path, backend: Option<Backend>, candidate: Option<&str>) -> Result<()> {
    let layout = match candidate {
        Some(name) => crate::env::existing_candidate(root, name)?,
        None => Layout::of(backend.unwrap_or_else(Backend::host_default)),
    };
    let uv = find_uv(None, false)?;
    println!("lock: {} via `{}`", uv.version, uv.describe());
    let input = root.join(layout.requirements_in);
    let dir = input
        .parent()
        .context("requirements.in has no parent directory")?;
    let mut cmd = uv.command();
    // Run beside requirements.in so the lock's header and `# via` comments
    // name plain `requirements.in` (as in the committed locks).
    // `Uv::command` sets UV_NO_CONFIG rather than passing `--no-config`,
    // which uv would copy into the lock's header.
    cmd.current_dir(dir).args(["pip", "compile"]);
    match layout.backend {
        Backend::Cpu | Backend::Metal => {
            cmd.arg("--universal");
        }
        Backend::Cuda => {
            cmd.args(["--python-platform", CUDA_PYTHON_PLATFORM]);
        }
    }
    cmd.args([
        "--generate-hashes",
        "--no-deps",
        "--python-version",
        "3.11",
        "requirements.in",
        "-o",
        "requirements.lock",
    ]);
    let output = util::output(&mut cmd, "uv pip compile")?;
    if !output.status.success() {
        let hint = if util::looks_like_network_failure(&output) {
            "\nPyPI unreachable? locking needs network access to PyPI"
        } else {
            ""
        };
        bail!(
            "uv pip compile of {} failed (exit {}):\n{}{hint}",
            layout.requirements_in,
            util::exit_code(output.status),
            util::tail(&output, 30)
        );
    }
    let sha256 = util::sha256_file(&root.join(layout.lock))?;
    let sha_path = root.join(layout.lock_sha256);
    std::fs::write(&sha_path, format!("{sha256}\n"))
        .with_context(|| format!("writing {}", sha_path.display()))?;
    println!(
        "lock: wrote {} (sha256 {sha256}) and {}; run `{}` to apply it",
        layout.lock,
        layout.lock_sha256,
        layout.setup_command()
    );
    Ok(())
}
