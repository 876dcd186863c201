//! Workspace tasks, run as `cargo xtask <command>` (alias in .cargo/config.toml).
//!
//! xtask depends on nothing that needs the reference environment (no mlx-sys,
//! layers, oracle or pyo3), so it builds on a fresh checkout and can create
//! that environment.
//!
//! Exit codes: a wrapped child's code is passed through unchanged; a failure
//! of xtask itself (missing, half-built or drifted environment, a set-up step
//! that failed) exits 3 after printing `error: <message>`. SIGINT, SIGTERM
//! and SIGHUP are forwarded to the running child's process group
//! (supervise.rs); xtask then exits with the child's code and starts no
//! further step.

// Shadows std's print macros in every module below (see console.rs).
#[macro_use]
mod console;
mod book;
mod bundle;
mod conformance;
mod cpp_candidate;
mod env;
mod fixtures;
mod gate;
mod libmlx;
mod lock;
mod macos;
mod setup;
mod supervise;
mod system;
mod testing;
mod util;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Exit code for a problem with the environment (the conformance runner uses
/// the same code for the same meaning).
const EXIT_ENVIRONMENT: i32 = 3;

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Workspace tasks for the MLX conformance suite"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a pinned reference environment: .reference/ (default), or
    /// .reference-cuda/ with `--backend cuda` (idempotent)
    Setup(setup::Args),
    /// Re-lock a backend's requirements.in into its requirements.lock and .sha256
    /// (default: reference/; `--backend cuda`: reference/cuda/)
    Lock {
        /// `cpu` and `metal` share the default lock; `cuda` has its own
        #[arg(long, value_enum, value_name = "BACKEND")]
        backend: Option<env::Backend>,
        /// Lock the candidate reference/candidates/<NAME>/ instead
        #[arg(long, value_name = "NAME", conflicts_with = "backend")]
        candidate: Option<String>,
    },
    /// Check the reference environment, run `cargo test --workspace`, then the CPU conformance run
    /// (a leading `--backend cuda` selects the CUDA environment)
    Test {
        /// [--backend B] then extra arguments for the conformance runner (after the default `--device cpu`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Check the reference environment, then run the conformance runner with these arguments
    /// (a leading `--backend cuda` selects the CUDA environment)
    #[command(disable_help_flag = true)]
    Conformance {
        /// [--backend B] then arguments passed unchanged to the conformance runner (`--help` included)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Review or accept the snapshot fixtures of this backend
    /// (`--backend cuda` before or after the action selects the CUDA environment)
    Fixtures {
        /// The environment to run against (default: this machine's default env)
        #[arg(long, value_enum, value_name = "BACKEND")]
        backend: Option<env::Backend>,
        #[command(subcommand)]
        action: fixtures::Action,
    },
    /// Search shapes where kernels switch: sample, check (bits, exact oracle,
    /// invariances), shrink and keep violations (a leading `--backend cuda`
    /// selects the CUDA environment, `--candidate NAME` a gate candidate's);
    /// writes target/explore/explore.{json,md}
    #[command(disable_help_flag = true)]
    Explore {
        /// [--backend B] then arguments passed unchanged to conformance-explore (`--help` included)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Write golden vectors: every must-equal case's reference calls (inputs,
    /// the reference's outputs) as safetensors plus DIR/manifest.json (a
    /// conformance run with `--export DIR`; reports go to DIR/report)
    #[command(disable_help_flag = true)]
    Export {
        /// [--backend B] `--out DIR` (required: where the vectors go, emptied of an
        /// earlier export's files) and runner arguments (`--filter`, `--device`, `--seed`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Write docs/ops.json (what the cases send to each op and compare) from a whole
    /// export (`--from DIR`, default target/conformance-vectors, which `cargo xtask
    /// test` writes), then docs/ops.md from it and crates/conformance/src/candidate/ops.rs
    OpsDoc {
        /// The export to read (its manifest.json)
        #[arg(long, value_name = "DIR")]
        from: Option<std::path::PathBuf>,
    },
    /// Write a self-contained runner directory (binary, CPython, reference packages,
    /// fixtures) for a Linux x86-64 machine without Rust, uv or network; `--archive`
    /// also writes it as <out>.tar.zst parts of at most 60 MiB
    Bundle(bundle::Args),
    /// Release gate: run the suite on the baseline and on a candidate reference environment
    /// (same seeds) and classify every case's change; writes target/gate/<candidate>/gate.json
    /// and gate.md; exit 0 unchanged, 2 changed, 1 a must-equal case fails on the candidate, 3
    /// environment
    Gate(gate::Args),
    /// The pinned libmlx (the reference environment's file) and its sha256; with FILE,
    /// whether FILE is that build (exit 0) or another (exit 1): a candidate must load it
    Libmlx {
        /// The environment whose libmlx is pinned (default: this machine's default env)
        #[arg(long, value_enum, value_name = "BACKEND")]
        backend: Option<env::Backend>,
        /// A libmlx file to compare with the pinned one (the one your candidate loads)
        file: Option<PathBuf>,
    },
    /// The book under docs/ (mdBook): write the generated reference pages (CLI, exit
    /// codes, environment; `--check` or CI=true: fail when one is stale), check every
    /// relative link and anchor, and build it into target/book
    Book(book::Args),
}

/// The workspace root: xtask lives in `<root>/xtask`.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("xtask has a parent directory");
    root.canonicalize().unwrap_or_else(|_| root.to_path_buf())
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { EXIT_ENVIRONMENT } else { 0 });
        }
    };
    let root = workspace_root();
    let result = match cli.command {
        Command::Setup(args) => setup::run(&root, &args).map(|()| 0),
        Command::Lock { backend, candidate } => {
            lock::run(&root, backend, candidate.as_deref()).map(|()| 0)
        }
        Command::Test { args } => testing::run(&root, &args),
        Command::Conformance { args } => conformance::run(&root, &args),
        Command::Explore { args } => conformance::explore(&root, &args),
        Command::Export { args } => conformance::export(&root, &args),
        Command::OpsDoc { from } => conformance::ops_doc(&root, from),
        Command::Fixtures { backend, action } => fixtures::run(&root, backend, &action),
        Command::Bundle(args) => bundle::run(&root, &args),
        Command::Gate(args) => gate::run(&root, &args),
        Command::Book(args) => book::run(&root, &args),
        Command::Libmlx { backend, file } => libmlx::run(&root, backend, file.as_deref()),
    };
    match result {
        Ok(code) => std::process::exit(code),
        // A step refused because the run was stopped exits as stopped.
        Err(_) if supervise::signalled().is_some() => {
            std::process::exit(128 + supervise::signalled().unwrap_or(0))
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(EXIT_ENVIRONMENT);
        }
    }
}
