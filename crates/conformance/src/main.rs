//! `cargo xtask conformance` runs this binary (see the README).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use conformance::case::{Backend, Device};
use conformance::families;
use conformance::home::Home;
use conformance::report::{self, exit, Environment, Report, Row};
use conformance::runner::{self, RunOptions};
use conformance::snapshots::{self, Mode, Provenance};
use oracle::Oracle;

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
    /// Print the registered cases and exit.
    #[arg(long)]
    list: bool,
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
    /// isolation (a crash in native code ends the run); for debuggers.
    #[arg(long)]
    in_process: bool,
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
    /// Proof mode: flip one bit of each case's reference input; every
    /// must-equal case must then fail.
    #[arg(long)]
    perturb: bool,
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

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(exit::ENVIRONMENT as u8)
}

fn main() -> ExitCode {
    // Usage errors exit 3 (harness problem), not clap's 2 (which means drift here).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line (clap's first), not its usage block.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: bad usage");
            eprintln!("{first} (see `conformance --help`)");
            return ExitCode::from(exit::ENVIRONMENT as u8);
        }
    };
    if cli.worker {
        return worker_main(&cli);
    }
    // Where fixtures, fingerprint, lock and default reports are: the
    // workspace, or a bundle (`MLX_CONFORMANCE_HOME`, see home.rs).
    let home = Home::get();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let mode = match cli.fixtures {
        GateMode::Check => Mode::Check,
        GateMode::Review => Mode::Review,
        GateMode::Accept => Mode::Accept,
    };
    if mode == Mode::Accept && ci {
        return fail("snapshots are never written under CI=true; run `cargo xtask fixtures accept` locally and commit");
    }
    // insta writes only in accept mode. Set before any thread starts.
    std::env::set_var(
        "INSTA_UPDATE",
        if mode == Mode::Accept { "always" } else { "no" },
    );
    std::env::set_var("INSTA_FORCE_PASS", "0");

    let cases = families::all();
    if let Err(dup) = unique_names(&cases) {
        return fail(format!(
            "two cases are named `{dup}`; case names must be unique"
        ));
    }
    if cli.list {
        let listed = match runner::select(&cases, cli.filter.as_deref()) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        for c in listed {
            println!(
                "{:<64} {:<11} {}",
                c.name,
                format!("{:?}", c.expect),
                c.reference
            );
        }
        return ExitCode::SUCCESS;
    }
    let selected = match runner::select(&cases, cli.filter.as_deref()) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let out_dir = cli
        .out
        .clone()
        .unwrap_or_else(|| home.default_reports_dir());
    // Before any case runs (a GPU run can take minutes): the reports must
    // be writable, and a declared set key must be usable as a name.
    if let Err(e) = report::check_writable(&out_dir) {
        return fail(e);
    }
    report::clear(&out_dir);
    let declared = match cli.device_family.as_deref().filter(|k| !k.is_empty()) {
        None => None,
        Some(key) => match snapshots::check_device_key(key) {
            Ok(()) => Some(key.to_owned()),
            Err(e) => return fail(e),
        },
    };

    let fingerprint = match read_fingerprint(home) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let oracle = match Oracle::start() {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // One backend vocabulary: `--device gpu` is the linked libmlx's GPU
    // backend, and the Rust side and the reference must agree on it.
    let port_gpu = match Backend::linked_gpu() {
        Ok(gpu) => gpu,
        Err(e) => return fail(format!("MLX cannot report its GPU backend: {e}")),
    };
    let reference_gpu = oracle.info().gpu_backend;
    if port_gpu != reference_gpu {
        return fail(format!(
            "the port's libmlx reports GPU backend {port_gpu:?} but the reference's MLX reports {reference_gpu:?}; both must load the same libmlx (run `cargo xtask setup`)"
        ));
    }
    let device = cli.device.unwrap_or(if port_gpu.is_some() {
        Device::Gpu
    } else {
        Device::Cpu
    });
    let backend = match (device, port_gpu) {
        (Device::Cpu, _) => Backend::Cpu,
        (Device::Gpu, Some(gpu)) => gpu,
        (Device::Gpu, None) => {
            return fail(format!(
                "--device gpu: this libmlx ({}) has no usable GPU backend here (Metal needs the mlx-metal wheel on Apple Silicon; CUDA needs `cargo xtask setup --backend cuda` and an NVIDIA GPU with its libraries, README \"Running on an NVIDIA GPU\"); use --device cpu",
                oracle.info().libmlx
            ))
        }
    };
    runner::set_device(backend);
    if let Err(e) = oracle.set_device(backend) {
        return fail(e);
    }
    let mut device_info = match oracle.device_info(backend) {
        Ok(info) => info,
        Err(e) => return fail(e),
    };
    let device_name = device_info.remove("name").unwrap_or_default();
    let architecture = device_info.remove("architecture").unwrap_or_default();
    let device_family = declared
        .clone()
        .unwrap_or_else(|| snapshots::device_key(backend, &architecture, &device_name));
    let set_dir = snapshots::set_dir(
        &home.fixtures_dir(),
        backend.as_str(),
        &device_family,
        &oracle.info().mlx_version,
    );
    // The flags that select this set, for the review/accept commands.
    let mut selecting = vec![format!("--device {}", device.name())];
    if let Some(key) = &declared {
        selecting.push(format!("--device-family {key}"));
    }
    let xtask_prefix = if backend == Backend::Cuda {
        " --backend cuda"
    } else {
        ""
    };
    let set_commands = if home.bundle {
        snapshots::SetCommands::for_bundle(&home.root.join("conformance"), &selecting.join(" "))
    } else {
        snapshots::SetCommands::new(xtask_prefix, &selecting.join(" "))
    };
    // Said at the start too, so nobody waits for a whole run to learn it.
    if mode != Mode::Accept && !cli.perturb && cli.seed == 0 && !snapshots::set_exists(&set_dir) {
        eprintln!(
            "note: {}",
            snapshots::missing_set_line(&set_dir, &set_commands)
        );
    }
    let environment = Environment {
        mlx_version: oracle.info().mlx_version.clone(),
        backend: backend.as_str().into(),
        device: device.name().into(),
        device_name: device_name.clone(),
        architecture: architecture.clone(),
        host: device_info.clone(),
        device_family: device_family.clone(),
        device_family_declared: declared.is_some(),
        snapshot_set: set_dir.file_name().unwrap().to_string_lossy().into_owned(),
        set_commands: set_commands.clone(),
        lock_sha256: fingerprint.lock_sha256.clone(),
        libmlx: oracle.info().libmlx.clone(),
        seed: cli.seed,
    };

    let options = RunOptions {
        backend,
        seed: cli.seed,
        jobs: cli.jobs.map_or_else(default_jobs, usize::from),
        perturb: cli.perturb,
    };
    let workers = if cli.in_process {
        None
    } else {
        match runner::worker::WorkerCommand::for_run(&options) {
            Ok(command) => Some(command),
            Err(e) => {
                return fail(format!(
                    "cannot find this executable to start workers: {e}; use --in-process"
                ))
            }
        }
    };
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let bar = if terminal {
        indicatif::ProgressBar::new(selected.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
            .expect("template"),
    );
    let human = matches!(cli.format, Format::Human);
    // A panic inside a case becomes that case's harness error (with its
    // message) in the report; the default hook's backtrace would only be noise.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let progress = |r: &runner::CaseResult| {
        if terminal {
            bar.set_message(r.name.clone());
            bar.inc(1);
        } else if human {
            println!("{:<7} {} ({:.1} ms)", r.verdict.word(), r.name, r.time_ms);
        }
    };
    // Ctrl-C or SIGTERM: no new case starts, the run exits 130, no report.
    runner::catch_interrupts();
    let results = match &workers {
        Some(command) => runner::worker::run(&selected, command, &options, &progress),
        None => runner::run(&selected, &oracle, &options, &progress),
    };
    bar.finish_and_clear();
    std::panic::set_hook(default_hook);
    if runner::interrupted() {
        eprintln!(
            "interrupted: {} of {} cases ran; no report written",
            results.len(),
            selected.len()
        );
        return ExitCode::from(130);
    }

    // An accept that must be refused still writes its reports (they show
    // why), but records nothing.
    let refusal = if mode == Mode::Accept {
        if let Some(bad) = results.iter().find(|r| r.verdict == runner::Verdict::Fail) {
            Some(format!(
                "refusing to accept snapshots: must-equal case `{}` fails",
                bad.name
            ))
        } else {
            check_lock(home, &fingerprint)
                .err()
                .map(|e| format!("refusing to accept snapshots: {e}"))
        }
    } else {
        None
    };
    let provenance = Provenance {
        mlx_version: environment.mlx_version.clone(),
        backend: backend.as_str().into(),
        device: device_family.clone(),
        device_name,
        architecture,
        host: device_info,
        lock_sha256: fingerprint.lock_sha256.clone(),
        date: today(),
    };
    let complete = runner::is_complete_selection(cli.filter.as_deref()) && !cli.perturb;
    // Snapshots pin the default seed's outputs; other seeds explore inputs
    // and are judged by their verdicts alone.
    if cli.seed != 0 && !cli.perturb {
        eprintln!(
            "note: --seed {} differs from the pinned seed 0: snapshots are not checked",
            cli.seed
        );
    }
    // A whole missing set is one line, not a DRIFT row per case.
    let missing_set =
        (mode != Mode::Accept && !cli.perturb && cli.seed == 0 && !snapshots::set_exists(&set_dir))
            .then(|| snapshots::missing_set_line(&set_dir, &set_commands));
    let (statuses, orphans) =
        if cli.perturb || cli.seed != 0 || missing_set.is_some() || refusal.is_some() {
            (vec![snapshots::Status::NotChecked; results.len()], vec![])
        } else {
            snapshots::gate(&set_dir, &results, mode, &provenance, complete)
        };
    let rows: Vec<Row> = results
        .into_iter()
        .zip(statuses)
        .map(|(result, snapshot)| Row { result, snapshot })
        .collect();
    let mut report = Report::new(
        environment,
        rows,
        if mode == Mode::Accept { &[] } else { &orphans },
        started.elapsed().as_secs_f64() * 1e3,
    );
    if let Some(line) = missing_set {
        report = report.with_missing_set(line);
    }
    if backend.is_gpu() {
        let cpu_dir = snapshots::set_dir(
            &home.fixtures_dir(),
            Backend::Cpu.as_str(),
            &snapshots::device_key(Backend::Cpu, "", ""),
            &report.environment.mlx_version,
        );
        if snapshots::set_exists(&cpu_dir) {
            report.vs_cpu = Some(report::VsCpu::compare(&cpu_dir, &report.cases));
        }
    }
    if let Err(e) = report::write_all(&out_dir, &report) {
        return fail(format!(
            "cannot write reports to {}: {e}",
            out_dir.display()
        ));
    }
    if let Some(refusal) = refusal {
        eprintln!(
            "reports: {} (the refused run's verdicts)",
            out_dir.display()
        );
        return fail(refusal);
    }
    match cli.format {
        Format::Human => {
            // Off a terminal every case already printed a progress line:
            // repeat only the rows that need attention.
            println!("{}", report::human::header());
            for row in report
                .cases
                .iter()
                .filter(|r| terminal || report::human::notable(r))
            {
                println!("{}", report::human::line(row, &set_commands));
            }
            print!("{}", report::human::summary(&report));
            println!("reports: {}", out_dir.display());
            if mode == Mode::Accept {
                println!(
                    "snapshots written to {}; orphans removed: {}",
                    set_dir.display(),
                    orphans.len()
                );
            }
        }
        Format::Json => println!("{}", serde_json::to_string_pretty(&report).expect("json")),
        Format::Junit => println!("{}", report::junit::render(&report)),
        Format::Markdown => println!("{}", report::markdown::render(&report)),
    }
    ExitCode::from(report.summary.exit_code as u8)
}

/// The default `--jobs`: the CPUs this process may use, at most 4 (more
/// workers than that mostly add interpreter start-ups and memory).
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// `--worker`: one interpreter serving the parent's cases (runner/worker.rs).
fn worker_main(cli: &Cli) -> ExitCode {
    let Some(backend) = cli
        .worker_backend
        .as_deref()
        .and_then(runner::worker::parse_backend)
    else {
        return fail("--worker needs --worker-backend cpu|metal|cuda");
    };
    let cases = families::all();
    let oracle = match Oracle::start() {
        Ok(o) => o,
        Err(e) => return fail(format!("worker: {e}")),
    };
    runner::set_device(backend);
    if let Err(e) = oracle.set_device(backend) {
        return fail(format!("worker: {e}"));
    }
    let options = RunOptions {
        backend,
        seed: cli.seed,
        jobs: 1,
        perturb: cli.perturb,
    };
    // A panic inside a case is that case's harness error (runner::run_one).
    std::panic::set_hook(Box::new(|_| {}));
    ExitCode::from(runner::worker::serve(&cases, &oracle, &options) as u8)
}

fn unique_names(cases: &[conformance::case::Case]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for c in cases {
        if !seen.insert(c.name.as_str()) {
            return Err(c.name.clone());
        }
    }
    Ok(())
}

struct Fingerprint {
    lock_sha256: String,
}

fn read_fingerprint(home: &Home) -> Result<Fingerprint, String> {
    let path = home.fingerprint();
    let text = std::fs::read_to_string(&path).map_err(|_| {
        format!(
            "reference environment missing ({} not found); {}",
            path.display(),
            home.setup_fix()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is malformed ({e}); {}",
            path.display(),
            if home.bundle {
                home.setup_fix()
            } else {
                "run `cargo xtask setup --force`".to_owned()
            }
        )
    })?;
    let lock = v
        .get("lock_sha256")
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_owned();
    Ok(Fingerprint { lock_sha256: lock })
}

fn check_lock(home: &Home, fingerprint: &Fingerprint) -> Result<(), String> {
    use sha2::Digest;
    let lock = std::fs::read(home.lock())
        .map_err(|e| format!("cannot read the lock {}: {e}", home.lock().display()))?;
    let now = format!("{:x}", sha2::Sha256::digest(lock));
    if now != fingerprint.lock_sha256 {
        return Err(format!(
            "the reference environment was built from lock {} but {} is {now}; {}",
            fingerprint.lock_sha256,
            home.lock_display(),
            home.setup_fix()
        ));
    }
    Ok(())
}

fn today() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10].to_owned()
}
