//! Small helpers shared by the subcommands.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of a file's bytes.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let digest = Sha256::digest(&bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        write!(hex, "{byte:02x}").expect("writing to a String");
    }
    Ok(hex)
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), else `cargo` on PATH.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// A child's exit code as a shell would report it (128 + signal if killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    1
}

/// Runs a command with captured output; an error only if it could not start.
pub fn output(cmd: &mut Command, what: &str) -> Result<Output> {
    cmd.output()
        .with_context(|| format!("could not run {what} ({:?})", cmd.get_program()))
}

/// Runs a command with inherited stdio and returns its exit code.
pub fn status(cmd: &mut Command, what: &str) -> Result<i32> {
    let status = cmd
        .status()
        .with_context(|| format!("could not run {what} ({:?})", cmd.get_program()))?;
    Ok(exit_code(status))
}

/// The last `max_lines` lines of a child's stderr (or stdout if stderr is
/// empty), indented, for an error message.
pub fn tail(output: &Output, max_lines: usize) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&output.stdout)
    } else {
        stderr
    };
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines[start..]
        .iter()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a failed download looks like a network problem.
pub fn looks_like_network_failure(output: &Output) -> bool {
    let text = String::from_utf8_lossy(&output.stderr).to_lowercase();
    [
        "failed to fetch",
        "error sending request",
        "dns",
        "connect",
        "timed out",
        "timeout",
        "network",
        "unreachable",
        "failed to download",
        "offline",
        "resolve host",
        "tls",
        "certificate",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// `path` relative to `root` when it is inside it (for messages).
pub fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Removes the conformance reports of a previous run (target/conformance).
pub fn clear_reports(root: &Path) {
    for f in ["report.json", "junit.xml", "report.md"] {
        let _ = std::fs::remove_file(root.join("target/conformance").join(f));
    }
}
