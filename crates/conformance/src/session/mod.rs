//! One run of the suite as four steps: [`Session::prepare`] (flags,
//! reference, device, snapshot set, selection), [`Session::run`] (the
//! cases), [`Session::gate`] (snapshots, the report) and
//! [`Session::report`] (files, stdout, exit code).

mod fingerprint;
mod gate;
mod prepare;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use conformance::case::{Backend, Case};
use conformance::home::Home;
use conformance::report::{exit, Environment};
use conformance::runner::RunOptions;
use conformance::snapshots::Mode;
use oracle::Oracle;

use crate::Cli;
use fingerprint::Fingerprint;
pub use gate::Gated;
pub use run::Ran;

/// An early end of the session: its message (if any) is already printed,
/// and this is the process's exit code.
pub struct Exit(pub ExitCode);

/// A harness problem: prints `error: …` and exits 3.
pub fn fail(message: impl std::fmt::Display) -> Exit {
    errln!("error: {message}");
    Exit(ExitCode::from(exit::ENVIRONMENT as u8))
}

/// What [`Session::prepare`] settled, read by the later steps.
pub struct Session {
    cli: Cli,
    /// Where fixtures, fingerprint, lock and default reports are.
    home: &'static Home,
    /// The snapshot gate's mode (`--fixtures`).
    mode: Mode,
    fingerprint: Fingerprint,
    oracle: Oracle,
    backend: Backend,
    /// The cases to run, in registry order.
    selected: Vec<Case>,
    /// The snapshot file name of every registered case (orphans are
    /// files none of them names).
    registered: std::collections::BTreeSet<String>,
    out_dir: PathBuf,
    /// The snapshot set this device checks against.
    set_dir: PathBuf,
    environment: Environment,
    options: RunOptions,
    /// The run's modes, built once from the flags: its hooks and its
    /// workers' command line.
    config: conformance::config::RunConfig,
    /// Whether stderr is a terminal: a progress bar then, else a line per
    /// case (human format).
    terminal: bool,
    /// `--export DIR` claimed and locked until the manifest is written.
    _export_claim: Option<conformance::outdir::Claim>,
}
