//! `cargo xtask conformance` runs this binary (see the README).

#[macro_use]
extern crate conformance;

mod session;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use conformance::config::Device;
use conformance::config::RunConfig;
use conformance::registry::Registry;
use conformance::report::exit;
use conformance::runner::{self, RunOptions};
use oracle::Oracle;
use session::{fail, Exit, Session};

/// Bit-exact conformance of the layers against the pinned MLX reference.
#[derive(Parser, Debug)]
#[command(name = "conformance", version)]
struct Cli {
    /// Device to run on: `gpu` is the GPU backend of the linked libmlx
    /// (Metal on macOS, CUDA with the CUDA environment); default: gpu when
    /// available, else cpu.
    #[arg(long, value_enum)]
    device: Option<Device>,
    /// Declare the snapshot set's device key instead of deriving it from
    /// the device (e.g. a CI runner family such as `gha-macos-14`); the
    /// device's own architecture is still recorded as provenance.
    #[arg(long, env = "MLX_CONFORMANCE_DEVICE_FAMILY", value_name = "KEY")]
    device_family: Option<String>,
    /// Run only cases whose name contains this text (with `--list`, list
    /// only those; an empty text selects every case).
    #[arg(long)]
    filter: Option<String>,
    /// Print the selected cases' descriptions (name, builder, seed, the
    /// family's parameters) as JSON, one per line, and exit: what
    /// `--cases FILE` runs.
    #[arg(long, conflicts_with = "list")]
    describe: bool,
    /// Run the cases these descriptions describe (a file of
    /// `--describe` lines, or a JSON array of them) instead of the
    /// registered ones. Edited seeds or parameters have no snapshots, so
    /// this needs `--no-snapshots`.
    #[arg(long, value_name = "FILE", conflicts_with = "explore_samples")]
    cases: Option<PathBuf>,
    /// Print the registered cases and exit.
    #[arg(long)]
    list: bool,
    /// Select only the must-equal cases whose every op (docs/ops.md) is in
    /// this comma-separated list: the cases a candidate serving these ops
    /// can serve completely. `all` selects every must-equal case; with
    /// `--list`, each case's ops are printed.
    #[arg(long, value_name = "OPS")]
    ops: Option<String>,
    /// Base seed for every case's inputs (each case adds its own offset).
    /// Snapshots pin seed 0; with another seed they are not checked.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cases run concurrently: worker processes (default: the machine's
    /// CPU count, at most 4). Never changes a bit: each case's inputs come
    /// from its own seed.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    jobs: Option<u16>,
    /// Run the cases in this process instead of worker processes: no crash
    /// isolation (a crash in native code ends the run) and no case
    /// timeout; for debuggers.
    #[arg(long)]
    in_process: bool,
    /// Seconds one case may run in its worker before it is an ERROR and the
    /// worker is killed (0: no limit). Generous by default: a cold CUDA
    /// kernel cache compiles each kernel at a case's first use.
    #[arg(long, value_name = "SECONDS", conflicts_with = "in_process")]
    case_timeout: Option<u64>,
    /// (internal) Serve cases to a parent run on stdin/stdout.
    #[arg(long, hide = true)]
    worker: bool,
    /// (internal) The worker's backend.
    #[arg(long, hide = true, requires = "worker")]
    worker_backend: Option<String>,
    /// What to print on stdout (all report files are written regardless).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Snapshot gate: check (default; never writes), review (prints diffs),
    /// accept (writes; used by `cargo xtask fixtures accept`).
    #[arg(long, value_enum, default_value_t = GateMode::Check)]
    fixtures: GateMode,
    /// Proof mode: the reference receives every perturbable argument
    /// perturbed (one ulp of every element, the next theta, ...); every
    /// must-equal output must then differ, unless declared derived.
    #[arg(long)]
    perturb: bool,
    /// The exact oracle's mutation score: each applicable fault of the
    /// catalogue (a dropped K tail, a neighbour group's scale, a KV row
    /// from another request, ...) planted into a copy of every must-equal
    /// output's reference side and measured against the exact bound;
    /// report.md / report.json give the fraction flagged per family and
    /// kind, and each escape. Verdicts are unchanged.
    #[arg(long)]
    exact_faults: bool,
    /// Which cases run: `default` every must-equal case and the findings
    /// of a single comparison over a short window (the run a user waits
    /// for); `deep` also the findings that sweep a range (the rows-regime
    /// and attention finders), re-run a whole model over another schedule,
    /// or cover more than 32k positions, as `cargo xtask test`, CI, the
    /// release gate, `fixtures accept` and the Apple bootstrap run. A
    /// default run names how many selected cases it left to the deep tier.
    #[arg(long, value_enum, default_value_t = conformance::case::Tier::Default)]
    tier: conformance::case::Tier,
    /// Do not check snapshots (runs of the release gate, which compares two
    /// environments' runs with each other instead).
    #[arg(long)]
    no_snapshots: bool,
    /// Also write each case's port and reference tensors to
    /// DIR/<case>.safetensors (what `cargo xtask gate` compares).
    #[arg(long, value_name = "DIR")]
    keep_outputs: Option<PathBuf>,
    /// Also run the first N samples of the shape explorer (seed
    /// `--explore-seed`, every family, as `cargo xtask explore --samples N`
    /// draws them) as must-equal cases `explore/<case>/s<seed>`: the
    /// release gate's run of explorer samples. They have no snapshots, so
    /// this needs `--no-snapshots`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    explore_samples: Option<u32>,
    /// The explorer seed of `--explore-samples`.
    #[arg(
        long,
        value_name = "SEED",
        default_value_t = 0,
        requires = "explore_samples"
    )]
    explore_seed: u64,
    /// Check an external implementation instead of the linked port: the
    /// shell command that starts it, spoken to through the candidate
    /// protocol (docs/src/guide/candidate.md; ops in docs/ops.md).
    /// Findings are skipped (they measure the reference).
    #[arg(
        long,
        value_name = "CMD",
        value_parser = non_blank_command,
        conflicts_with_all = ["in_process", "explore_samples"]
    )]
    candidate: Option<String>,
    /// Seconds the candidate may take to answer one call (its start
    /// included) before the case is an ERROR and the candidate is killed.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        value_parser = at_least_a_second,
        requires = "candidate"
    )]
    candidate_timeout: u64,
    /// With `--candidate`: compare every case's verdict with a linked run's
    /// report.json (same selection and seed); a differing verdict, or a
    /// case the candidate does not support, exits 1 (findings are skipped
    /// by design; the protocol's self-test, docs/src/guide/candidate.md).
    #[arg(long, value_name = "REPORT", requires = "candidate")]
    same_verdicts_as: Option<PathBuf>,
    /// Also write golden vectors: every must-equal case's reference calls
    /// (inputs, the reference's outputs) as safetensors, and
    /// DIR/manifest.json (`cargo xtask export`).
    // Not of a --perturb run: its reference results are not the goldens.
    #[arg(long, value_name = "DIR", conflicts_with = "perturb")]
    export: Option<PathBuf>,
    /// Re-read an export (DIR/manifest.json and its files): every file's
    /// and every output's sha256 as the manifest says; exit 0, 1 with
    /// every problem listed, or 3 when DIR holds no readable manifest.
    /// Runs no case.
    #[arg(long, value_name = "DIR")]
    verify_export: Option<PathBuf>,
    /// With `--verify-export`: also require every must-equal case of this
    /// report.json that reached a verdict to be in the manifest.
    #[arg(long, value_name = "REPORT", requires = "verify_export")]
    verify_against: Option<PathBuf>,
    /// Print the op vocabulary (docs/ops.md, `cargo xtask ops-doc`) and exit.
    #[arg(long)]
    ops_doc: bool,
    /// Print what an export's cases send to each op and compare of its
    /// result (docs/ops.json, `cargo xtask ops-doc`) and exit.
    #[arg(long, value_name = "DIR")]
    ops_signatures: Option<PathBuf>,
    /// Where reports are written.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Human,
    Json,
    Junit,
    Markdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GateMode {
    Check,
    Review,
    Accept,
}

/// One run, in four steps (session/): prepare (flags, oracle, device,
/// snapshot set, selection), run (the cases), gate (snapshots, the report)
/// and report (files, stdout, exit code). An early exit carries its code.
fn main() -> ExitCode {
    // A candidate's launcher (started by a worker) does nothing else.
    #[cfg(target_os = "linux")]
    {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if args
            .get(1)
            .is_some_and(|a| a == conformance::candidate::launcher::FLAG)
        {
            let code = conformance::candidate::launcher::main(&args[2..]);
            return ExitCode::from(u8::try_from(code).unwrap_or(3));
        }
    }
    // First, while the process has one thread and before MLX reads them.
    conformance::kernel_settings::pin();
    let steps = || -> Result<ExitCode, Exit> {
        let cli = parse()?;
        if cli.worker {
            return worker_main(&cli);
        }
        if cli.ops_doc {
            out!("{}", conformance::candidate::ops::markdown());
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(dir) = &cli.ops_signatures {
            return Ok(ops_signatures(dir));
        }
        if let Some(dir) = &cli.verify_export {
            return Ok(verify_export(dir, cli.verify_against.as_deref()));
        }
        let session = Session::prepare(cli)?;
        let ran = session.run()?;
        let gated = session.gate(ran);
        session.report(gated)
    };
    // The run's registry is dropped with its session: the workers' copy of
    // `--cases` goes with it.
    steps().unwrap_or_else(|Exit(code)| code)
}

/// `--ops-signatures DIR`: the export's signatures as JSON on stdout.
fn ops_signatures(dir: &std::path::Path) -> ExitCode {
    let read = || -> Result<String, String> {
        let path = dir.join("manifest.json");
        let bytes = conformance::snapshots::store::read_limited(
            &path,
            conformance::export::MAX_MANIFEST_BYTES,
            conformance::snapshots::store::Role::Export,
        )
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{}: no such file", path.display()))?;
        let m: conformance::schema::Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not an export manifest: {e}", path.display()))?;
        if m.cases
            .iter()
            .flat_map(|c| &c.calls)
            .any(|c| c.types.is_empty())
        {
            return Err(format!(
                "{}: calls without `types` (an older runner's export): export again",
                path.display()
            ));
        }
        let families: std::collections::BTreeMap<String, &str> = conformance::registry::all()
            .into_iter()
            .map(|c| (c.name, c.family))
            .collect();
        let sigs = conformance::candidate::signatures::documented_from(&m, |case| {
            families.get(case).map(|f| (*f).to_owned())
        });
        serde_json::to_string_pretty(&sigs).map_err(|e| e.to_string())
    };
    match read() {
        Ok(text) => {
            outln!("{text}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            errln!("--ops-signatures: {why}");
            ExitCode::from(exit::ENVIRONMENT as u8)
        }
    }
}

/// `--verify-export DIR`: 0 when every digest matches, 1 with the list.
fn verify_export(dir: &std::path::Path, report: Option<&std::path::Path>) -> ExitCode {
    match conformance::export::verify(dir, report) {
        Ok(v) => {
            outln!(
                "export {}: {} cases, {} calls, {} outputs: every file and output matches its sha256{}{}",
                dir.display(),
                v.cases,
                v.calls,
                v.outputs,
                if report.is_some() { "; every must-equal case of the report is in it" } else { "" },
                if v.doc_checked {
                    "; every argument and compared output is in docs/ops.md"
                } else {
                    "; not checked against docs/ops.md (generated from a CPU export)"
                }
            );
            ExitCode::SUCCESS
        }
        Err(conformance::export::VerifyError::Problems(problems)) => {
            for p in problems.iter().take(50) {
                errln!("export {}: {p}", dir.display());
            }
            errln!("export {}: {} problems", dir.display(), problems.len());
            ExitCode::from(exit::MUST_EQUAL_FAILURE as u8)
        }
        // Not an export to check (exit 3, as a bad flag).
        Err(conformance::export::VerifyError::Unreadable(why)) => {
            errln!("--verify-export: {why}");
            ExitCode::from(exit::ENVIRONMENT as u8)
        }
    }
}

/// The flags. `--help` and `--version` print and exit 0.
fn parse() -> Result<Cli, Exit> {
    // Usage errors exit 3 (harness problem), not clap's 2 (which means drift here).
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(Exit(ExitCode::SUCCESS))
        }
        Err(e) => {
            // One line, not clap's usage block: its first paragraph (for
            // a missing argument, the header and the names that follow it).
            let text = e.render().to_string();
            let first = usage_line(&text);
            errln!("{first} (see `conformance --help`)");
            Err(Exit(ExitCode::from(exit::ENVIRONMENT as u8)))
        }
    }
}

/// clap's message up to its first blank line, joined into one line:
/// "error: the following required arguments were not provided: --candidate
/// <CMD>" (its first line alone dropped the names).
fn usage_line(text: &str) -> String {
    let first: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .collect();
    if first.is_empty() {
        "error: bad usage".into()
    } else {
        first.join(" ")
    }
}

/// `--case-timeout`'s default, in seconds (README "Reliability").
pub const DEFAULT_CASE_TIMEOUT_S: u64 = 600;

impl Cli {
    /// The per-case limit of worker runs (`None`: no limit).
    fn case_timeout(&self) -> Option<std::time::Duration> {
        match self.case_timeout.unwrap_or(DEFAULT_CASE_TIMEOUT_S) {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        }
    }

    /// `--candidate-timeout` (at least a second: its parser refuses 0).
    fn candidate_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.candidate_timeout.max(1))
    }

    /// Whether this run checks snapshots: they pin seed 0's unperturbed
    /// outputs.
    fn snapshots_checked(&self) -> bool {
        !self.perturb && self.seed == 0 && !self.no_snapshots
    }
}

/// The run's configuration from the flags, built the same way by the
/// runner (`session/prepare.rs`) and by each worker: `keep_outputs` and
/// `export` are the flags' directories as the runner resolved them.
pub(crate) fn run_config(
    cli: &Cli,
    backend: conformance::case::Backend,
    registry: Registry,
    keep_outputs: Option<PathBuf>,
    export: Option<PathBuf>,
) -> RunConfig {
    RunConfig {
        backend,
        seed: cli.seed,
        perturb: cli.perturb,
        keep_outputs,
        candidate: cli
            .candidate
            .as_ref()
            .map(|command| conformance::candidate::Config {
                command: command.clone(),
                timeout: cli.candidate_timeout(),
                backend: backend.as_str().into(),
            }),
        export,
        exact_faults: cli.exact_faults,
        registry,
    }
}

/// `--candidate-timeout`: a whole number of seconds, at least 1 (0 is no
/// "no limit" here, as it is for `--case-timeout`: a candidate that never
/// answers must end its call).
fn at_least_a_second(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("it must be at least 1 (seconds; there is no unlimited candidate timeout: --case-timeout bounds the whole case)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `--candidate CMD`: a command, not blank (a blank one would start
/// nothing and make every case an ERROR).
fn non_blank_command(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("the command is empty; give the shell command that starts your candidate".into())
    } else {
        Ok(text.to_owned())
    }
}

/// `--worker`: one interpreter serving the parent's cases (runner/worker.rs).
fn worker_main(cli: &Cli) -> Result<ExitCode, Exit> {
    runner::worker::die_with_runner();
    // A worker that serves a candidate adopts what escapes the candidate's
    // launcher (a candidate that kills its launcher): the client then kills
    // and reaps it (candidate/client.rs).
    #[cfg(target_os = "linux")]
    if cli.candidate.is_some() {
        // SAFETY: prctl on this process.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    }
    let Some(backend) = cli
        .worker_backend
        .as_deref()
        .and_then(runner::worker::parse_backend)
    else {
        return Err(fail("--worker needs --worker-backend cpu|metal|cuda"));
    };
    let mut registry = Registry::new();
    if let Some(n) = cli.explore_samples {
        registry = registry.with_explore_samples(n as usize, cli.explore_seed);
    }
    if let Some(file) = &cli.cases {
        registry = registry
            .with_cases_file(file)
            .map_err(|e| fail(format!("worker: {e}")))?;
    }
    let cases = registry.cases();
    // The parent passed its paths absolute.
    let config = run_config(
        cli,
        backend,
        registry,
        cli.keep_outputs.clone(),
        cli.export.clone(),
    );
    let hooks = config.hooks();
    let oracle = Oracle::start().map_err(|e| fail(format!("worker: {e}")))?;
    runner::set_device(backend);
    oracle
        .set_device(backend)
        .map_err(|e| fail(format!("worker: {e}")))?;
    let options = RunOptions {
        backend,
        seed: cli.seed,
        jobs: 1,
        perturb: cli.perturb,
    };
    // A panic inside a case is that case's harness error (runner::run_one).
    std::panic::set_hook(Box::new(|_| {}));
    let code = runner::worker::serve(&cases, &oracle, &options, &hooks);
    // Ends the candidate's process, if any.
    drop(hooks);
    Ok(ExitCode::from(code as u8))
}
