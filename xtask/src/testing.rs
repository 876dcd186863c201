//! `cargo xtask test`: the whole suite on the pinned reference environment:
//! `cargo test --workspace`, then the conformance runner on CPU.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Result;

use crate::env::check_reference;
use crate::util;

pub fn run(root: &Path, extra: &[OsString]) -> Result<i32> {
    // A refused run must not leave the previous run's report looking current.
    crate::util::clear_reports(root);
    check_reference(root)?;
    let code = util::status(
        util::cargo()
            .current_dir(root)
            .args(["test", "--workspace"]),
        "cargo test",
    )?;
    if code != 0 {
        return Ok(code);
    }
    if !root.join("crates/conformance/Cargo.toml").exists() {
        println!("xtask test: crates/conformance does not exist yet; conformance run skipped");
        return Ok(0);
    }
    let mut cmd = util::cargo();
    cmd.current_dir(root)
        .args(["run", "-p", "conformance", "--"]);
    // The CPU run is the default; an explicit `--device` replaces it.
    if !extra
        .iter()
        .any(|arg| arg == "--device" || arg.to_string_lossy().starts_with("--device="))
    {
        cmd.args(["--device", "cpu"]);
    }
    cmd.args(extra);
    util::status(&mut cmd, "the conformance runner")
}
