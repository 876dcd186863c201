//! `cargo xtask conformance [args...]`: the conformance runner, after the
//! reference environment check. Arguments pass through unchanged and its exit
//! code (0/1/2/3, documented by the runner) is ours.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Result};

use crate::env::check_reference;
use crate::util;

pub fn run(root: &Path, args: &[OsString]) -> Result<i32> {
    // A refused run must not leave the previous run's report looking current.
    crate::util::clear_reports(root);
    check_reference(root)?;
    if !root.join("crates/conformance/Cargo.toml").exists() {
        bail!("crates/conformance does not exist in this workspace");
    }
    util::status(
        util::cargo()
            .current_dir(root)
            .args(["run", "-p", "conformance", "--"])
            .args(args),
        "the conformance runner",
    )
}
