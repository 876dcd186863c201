//! `cargo xtask lock`: re-locks the reference environment.
//!
//! Compiles reference/requirements.in into reference/requirements.lock (all
//! platforms, hashes, no dependency closure: see requirements.in) and records
//! the new lock's SHA-256 in reference/requirements.lock.sha256, which
//! `cargo xtask setup` checks before installing anything.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::env;
use crate::setup::find_uv;
use crate::util;

pub fn run(root: &Path) -> Result<()> {
    let uv = find_uv(None, false)?;
    println!("lock: {} via `{}`", uv.version, uv.describe());
    // Run inside reference/ so the lock's header and `# via` comments name
    // plain `requirements.in` (as in the committed lock).
    let output = util::output(
        // `Uv::command` sets UV_NO_CONFIG rather than passing `--no-config`,
        // which uv would copy into the lock's header.
        uv.command().current_dir(root.join("reference")).args([
            "pip",
            "compile",
            "--universal",
            "--generate-hashes",
            "--no-deps",
            "--python-version",
            "3.11",
            "requirements.in",
            "-o",
            "requirements.lock",
        ]),
        "uv pip compile",
    )?;
    if !output.status.success() {
        let hint = if util::looks_like_network_failure(&output) {
            "\nPyPI unreachable? locking needs network access to PyPI"
        } else {
            ""
        };
        bail!(
            "uv pip compile failed (exit {}):\n{}{hint}",
            util::exit_code(output.status),
            util::tail(&output, 30)
        );
    }
    let sha256 = util::sha256_file(&root.join(env::LOCK))?;
    let sha_path = root.join(env::LOCK_SHA256);
    std::fs::write(&sha_path, format!("{sha256}\n"))
        .with_context(|| format!("writing {}", sha_path.display()))?;
    println!(
        "lock: wrote {} (sha256 {sha256}) and {}; run `cargo xtask setup` to apply it",
        env::LOCK,
        env::LOCK_SHA256
    );
    Ok(())
}
