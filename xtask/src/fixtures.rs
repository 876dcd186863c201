//! `cargo xtask fixtures [--backend B] review|accept [--backend B] [args]`:
//! the only way snapshot fixtures change. `review` runs the suite and prints
//! every drift as a diff without writing; `accept` records (the runner
//! refuses when a must-equal case fails or the environment differs from the
//! lock, and under `CI=true`). `--backend cuda` (before the action, or
//! leading its arguments) runs against `.reference-cuda/`.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Result};

use crate::conformance::explain_loader_failure;
use crate::env::{self, Backend, Layout};
use crate::util;

#[derive(clap::Subcommand)]
pub enum Action {
    /// Run the suite and print each snapshot drift as a diff (writes nothing)
    Review {
        /// Extra runner arguments (e.g. `--device gpu`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Run the suite and record the snapshots of this backend (the only writer)
    Accept {
        /// Extra runner arguments (e.g. `--device gpu`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

pub fn run(root: &Path, backend: Option<Backend>, action: &Action) -> Result<i32> {
    let (mode, args) = match action {
        Action::Review { args } => ("review", util::absolute_path_args(args)),
        Action::Accept { args } => ("accept", util::absolute_path_args(args)),
    };
    let args = &args;
    // A run xtask refuses must not leave the previous run's report looking
    // current (the runner clears its own `--out` once its flags are valid).
    let layout = util::or_clear_reports(root, args, refusals(root, backend, mode, args))?;
    // `--filter` records (or reviews) only the selected cases; snapshots of
    // cases no longer registered are judged and removed on unfiltered runs
    // only (the runner's complete-selection rule).
    if mode == "accept"
        && args
            .iter()
            .any(|a| a.to_string_lossy().starts_with("--filter"))
    {
        println!("fixtures accept --filter: recording the selected cases only; orphaned snapshots are removed by an unfiltered accept");
    }
    let (_, args) = env::peel_backend(args)?;
    // Snapshots are reviewed and recorded over the deep tier (every case)
    // unless `--tier` says otherwise.
    let tier: &[&str] = if !args
        .iter()
        .any(|a| a.to_string_lossy().starts_with("--tier"))
    {
        &["--tier", "deep"]
    } else {
        &[]
    };
    let code = util::status(
        layout
            .cargo(root)
            .args([
                "run",
                "-p",
                "conformance",
                "--bin",
                "conformance",
                "--",
                "--fixtures",
                mode,
            ])
            .args(tier)
            .args(args),
        "the conformance runner",
    )?;
    explain_loader_failure(&layout, code);
    Ok(code)
}

/// The environment of the run, or why xtask refuses it.
fn refusals(
    root: &Path,
    backend: Option<Backend>,
    mode: &str,
    args: &[OsString],
) -> Result<Layout> {
    let leading = args
        .first()
        .is_some_and(|a| a.to_string_lossy().starts_with("--backend"));
    let (peeled, _) = env::peel_backend(args)?;
    let backend = match (backend, leading) {
        (Some(outer), true) if outer != peeled => {
            bail!("two different backends given: --backend {outer} and --backend {peeled}")
        }
        (Some(outer), _) => outer,
        (None, _) => peeled,
    };
    let layout = Layout::for_backend(backend)?;
    env::check_environment(root, &layout)?;
    if mode == "accept" && std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        bail!("snapshots are never written under CI=true; run `cargo xtask fixtures accept` locally and commit");
    }
    Ok(layout)
}
