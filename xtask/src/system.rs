//! System packages the build needs (Linux): libclang for bindgen, {fmt}
//! for mlx-c's `std::format` on GCC 12. Installed with apt-get when missing
//! and running as root; otherwise the exact command is printed.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::util;

/// Debian package and a file whose presence shows it is installed.
const PACKAGES: &[(&str, &[&str])] = &[
    (
        "libclang-dev",
        &[
            "/usr/lib/llvm-14/lib/libclang.so",
            "/usr/lib/x86_64-linux-gnu/libclang.so",
            "/usr/lib/aarch64-linux-gnu/libclang.so",
        ],
    ),
    ("libfmt-dev", &["/usr/include/fmt/format.h"]),
];

pub fn ensure() -> Result<()> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(name, files)| {
            !files.iter().any(|f| Path::new(f).exists()) && !dpkg_installed(name)
        })
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!("apt-get install -y {}", missing.join(" "));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc_geteuid() } == 0;
    if !root || Command::new("apt-get").arg("--version").output().is_err() {
        bail!(
            "missing system packages: {}. Fix: `sudo apt-get update && sudo {line}`",
            missing.join(", ")
        );
    }
    println!("setup: installing system packages: {}", missing.join(" "));
    let update = util::status(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    let install = util::status(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(&missing),
        "apt-get install",
    )?;
    if update != 0 || install != 0 {
        bail!(
            "installing {} failed (apt-get exit {update}/{install}); run `{line}` and retry",
            missing.join(", ")
        );
    }
    Ok(())
}

fn dpkg_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
