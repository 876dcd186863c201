//! macOS build prerequisites: mlx-c is compiled with the SDK's clang, and
//! bindgen needs the SDK's headers, so Xcode or the Command Line Tools must
//! be installed. Checked with `xcrun --show-sdk-path`, which fails when
//! neither is.

use std::process::Command;

use anyhow::{bail, Result};

/// What to run when the SDK is missing.
pub const INSTALL_HINT: &str = "xcode-select --install";

/// Fails with the install command when `xcrun --show-sdk-path` finds no SDK.
pub fn ensure_sdk() -> Result<()> {
    let output = Command::new("xcrun").arg("--show-sdk-path").output();
    let (ok, stdout, stderr) = match &output {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ),
        Err(e) => (false, String::new(), e.to_string()),
    };
    verdict(ok, &stdout, &stderr)
}

/// The decision, separated from running `xcrun` so that it is testable
/// anywhere.
fn verdict(ok: bool, stdout: &str, stderr: &str) -> Result<()> {
    if ok && !stdout.trim().is_empty() {
        return Ok(());
    }
    bail!(
        "no macOS SDK found (`xcrun --show-sdk-path` failed: {}). Install the Command Line Tools with `{INSTALL_HINT}` (or Xcode), then run `cargo xtask setup` again",
        stderr.trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_sdk_names_the_install_command() {
        let err = verdict(false, "", "xcrun: error: invalid active developer path")
            .unwrap_err()
            .to_string();
        assert!(err.contains("xcode-select --install"), "{err}");
        assert!(err.contains("invalid active developer path"), "{err}");
        assert!(
            verdict(true, "", "").is_err(),
            "an empty SDK path is no SDK"
        );
        assert!(verdict(
            true,
            "/Library/Developer/CommandLineTools/SDKs/MacOSX.sdk\n",
            ""
        )
        .is_ok());
    }
}
