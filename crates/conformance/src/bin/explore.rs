//! `cargo xtask explore` runs this binary: the shape explorer (see
//! `conformance::explore` and the README's "Exploring shapes").
//!
//! Exit codes: 0 nothing found; 1 port and reference bits differ somewhere,
//! or the port raised where the reference computed (a port bug, shrunk,
//! written and, with `--keep`, kept); 2 only findings
//! about the reference (outside the exact bound, or a description the
//! reference itself refuses); 3 usage or environment; 130 interrupted.

#[macro_use]
extern crate conformance;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use conformance::case::Backend;
use conformance::config::Device;
use conformance::explore::{self, report, Config};
use conformance::home::Home;
use oracle::Oracle;

#[derive(Parser, Debug)]
#[command(name = "conformance-explore", version)]
struct Cli {
    /// Wall-clock budget (`90s`, `10m`); the search stops drawing samples
    /// when it is spent (a shrink in progress finishes).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    budget: std::time::Duration,
    /// At most this many samples (with the budget, whichever comes first).
    #[arg(long)]
    samples: Option<usize>,
    /// The search seed: the same seed draws the same samples.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sample only this family (repeatable; default all).
    #[arg(long = "family")]
    families: Vec<String>,
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// `i/n`: take every n-th sample starting at i (a CI matrix or one
    /// process per GPU splits one search; `--merge` joins the reports).
    #[arg(long, default_value = "0/1", value_parser = parse_shard)]
    shard: (usize, usize),
    /// Merge these shards' explore.json files into `--out` instead of
    /// searching.
    #[arg(long, num_args = 1.., value_name = "EXPLORE_JSON")]
    merge: Vec<PathBuf>,
    /// Add each violation's shrunk description to fixtures/explore/kept.json
    /// (with --merge: the merged reports' violations, e.g. a GPU run's
    /// explore.json brought back from the bundle).
    #[arg(long)]
    keep: bool,
    /// With --keep: only violations whose shrunk case name contains this.
    #[arg(long, value_name = "TEXT", requires = "keep")]
    keep_filter: Option<String>,
    /// Shrink steps per violation, at most.
    #[arg(long, default_value_t = 200)]
    shrink_steps: usize,
    /// Do not sweep shrunk violations along M, N and K (their extent).
    #[arg(long)]
    no_extent: bool,
    /// Where explore.json, explore.md and repro/ go.
    #[arg(long, default_value = "target/explore")]
    out: PathBuf,
    /// Print samples per second per family (`--family` chooses; default
    /// all): the search as it runs, and its small shapes alone, `--samples`
    /// (default 200) each for seeds 1 and 2; writes no report. The
    /// benchmark of a bundle (no Rust needed).
    #[arg(long, conflicts_with_all = ["merge", "keep", "seed", "shard", "budget"])]
    bench: bool,
    /// (internal) Observe this one description (JSON) in this fresh
    /// process and print the observation as JSON: how a search reruns a
    /// violation alone.
    #[arg(long, hide = true, value_name = "DESCRIPTION_JSON")]
    observe_alone: Option<String>,
}

fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("`{text}` is not a shard `i/n` with i < n");
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if n == 0 || i >= n {
        return Err(bad());
    }
    // Each shard draws every n-th sample: a split into more shards than
    // any search has samples spins its budget to draw one.
    if n > MAX_SHARDS {
        return Err(format!(
            "`{text}`: at most {MAX_SHARDS} shards (each draws every n-th sample; more would spend the budget drawing one)"
        ));
    }
    Ok((i, n))
}

/// The most shards a search may be split into.
const MAX_SHARDS: usize = 1024;

fn fail(message: impl std::fmt::Display) -> ExitCode {
    errln!("error: {message}");
    ExitCode::from(3)
}

fn main() -> ExitCode {
    // First, while the process has one thread and before MLX reads them.
    conformance::kernel_settings::pin();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // The error and the lines that name what is missing, not the
            // usage block.
            let text = e.render().to_string();
            let lines: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .filter(|l| !l.trim().is_empty())
                .collect();
            let joined = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
            return fail(joined.strip_prefix("error: ").unwrap_or(&joined));
        }
    };
    let out = std::path::absolute(&cli.out).unwrap_or(cli.out.clone());
    // `--out` is claimed before anything is written or removed there: a
    // new or empty directory, or one an earlier search made (its marker);
    // anything else is refused, untouched. Locked until this run ends, so
    // two searches never write one directory at once.
    let _claim = if cli.observe_alone.is_none() && !cli.bench {
        match conformance::outdir::claim(&out, conformance::outdir::Kind::Explore) {
            Ok(c) => Some(c),
            Err(e) => return fail(format!("--out: {e}")),
        }
    } else {
        None
    };
    // The reports' directory is made (and found unwritable) before any
    // sample runs, and a previous run's reports are removed: an
    // interrupted or failed search never leaves an older report standing.
    if cli.merge.is_empty() && cli.observe_alone.is_none() && !cli.bench {
        if cli.budget < std::time::Duration::from_secs(1) {
            return fail(format!(
                "--budget {}: a search of under a second checks nothing (one sample takes longer); give a budget such as 60s or 10m",
                humantime::format_duration(cli.budget)
            ));
        }
        if cli.samples == Some(0) {
            return fail("--samples 0: a search of no samples checks nothing; give at least 1");
        }
        let probe = out.join(format!(".explore-probe-{}", std::process::id()));
        if let Err(e) = std::fs::write(&probe, b"") {
            return fail(format!("--out {}: cannot write there ({e})", out.display()));
        }
        let _ = std::fs::remove_file(&probe);
        report::clear(&out);
    }
    if !cli.merge.is_empty() {
        let mut shards = Vec::new();
        for path in &cli.merge {
            // A regular file only (a FIFO or /dev/zero is refused, not read
            // forever), at most 1 GiB.
            let text = match conformance::snapshots::store::read_limited(
                path,
                1 << 30,
                conformance::snapshots::store::Role::ExplorerReport,
            ) {
                Ok(Some(bytes)) => match String::from_utf8(bytes) {
                    Ok(t) => t,
                    Err(_) => return fail(format!("--merge {}: not UTF-8 text", path.display())),
                },
                Ok(None) => return fail(format!("--merge {}: no such file", path.display())),
                Err(conformance::snapshots::store::StoreError::Io { source, .. }) => {
                    return fail(format!("--merge {}: {source}", path.display()))
                }
                Err(_) => {
                    return fail(format!(
                        "--merge {}: not a regular file of at most 1 GiB (a link, FIFO, device or directory is not read); give the explore.json a search wrote",
                        path.display()
                    ))
                }
            };
            match serde_json::from_str(&text) {
                Ok(s) => shards.push(s),
                Err(e) => {
                    return fail(format!(
                        "--merge {}: not an explore.json ({e})",
                        path.display()
                    ))
                }
            }
        }
        let merged = match explore::merge(shards) {
            Ok(m) => m,
            Err(e) => return fail(e),
        };
        if let Err(e) = report::write(&out, &merged) {
            return fail(e);
        }
        outln!(
            "explore: merged {} samples, {} violations; reports: {}",
            merged.samples.len(),
            merged.found.len(),
            out.display()
        );
        if cli.keep {
            if let Err(code) = keep(&cli, &merged) {
                return code;
            }
        }
        return exit_code(&merged);
    }
    let oracle = match Oracle::start() {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let backend =
        match cli.device {
            Device::Cpu => Backend::Cpu,
            Device::Gpu => match Backend::linked_gpu() {
                Ok(Some(gpu)) => gpu,
                _ => return fail(
                    "--device gpu: this libmlx has no usable GPU backend here; use --device cpu",
                ),
            },
        };
    conformance::runner::set_device(backend);
    if let Err(e) = oracle.set_device(backend) {
        return fail(e);
    }
    // A panic inside a case is that sample's error (runner::run_case).
    std::panic::set_hook(Box::new(|_| {}));
    if let Some(json) = &cli.observe_alone {
        conformance::runner::worker::die_with_runner();
        let d: explore::Description = match serde_json::from_str(json) {
            Ok(d) => d,
            Err(e) => return fail(format!("--observe-alone: not a description ({e})")),
        };
        outln!(
            "{}",
            serde_json::to_string(&explore::observe(&oracle, backend, &d)).expect("json")
        );
        return ExitCode::SUCCESS;
    }
    if cli.bench {
        let samples = cli.samples.unwrap_or(200);
        if samples == 0 {
            return fail(
                "--bench --samples 0: a rate of no samples measures nothing; give at least 1",
            );
        }
        return match explore::rate::print_rates(
            &oracle,
            backend,
            &cli.families,
            samples,
            &mut |l| outln!("{l}"),
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        };
    }
    conformance::runner::catch_interrupts();
    let config = Config {
        seed: cli.seed,
        budget: cli.budget,
        max_samples: cli.samples,
        families: cli.families.clone(),
        shard: cli.shard,
        backend,
        max_shrink_steps: cli.shrink_steps,
        extent: !cli.no_extent,
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if terminal {
        indicatif::ProgressBar::new_spinner()
    } else {
        indicatif::ProgressBar::hidden()
    };
    let progress = |samples: usize, found: usize| {
        bar.set_message(format!("{samples} samples, {found} violations"));
        bar.tick();
    };
    let device = cli.device;
    let alone = |d: &explore::Description| observe_alone(device, d);
    let search = match explore::search(&oracle, &config, &progress, &alone) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    bar.finish_and_clear();
    if conformance::runner::interrupted() {
        errln!(
            "interrupted: {} samples ran; no report written",
            search.samples.len()
        );
        return ExitCode::from(130);
    }
    // A search that ran no sample checked nothing: never a green exit.
    if search.samples.is_empty() {
        return fail(format!(
            "the search ran no sample within --budget {} (shard {}/{}); give a longer budget",
            humantime::format_duration(cli.budget),
            cli.shard.0,
            cli.shard.1
        ));
    }
    if let Err(e) = report::write(&out, &search) {
        return fail(e);
    }
    for (i, f) in search.found.iter().enumerate() {
        outln!(
            "violation {i}: {:?} at {} ({} shrink steps from {}); reproducer {}",
            f.kind,
            f.minimal.name("explore"),
            f.shrink_steps,
            f.original.name("explore"),
            out.join(format!("repro/{i}.py")).display()
        );
    }
    if cli.keep {
        if let Err(code) = keep(&cli, &search) {
            return code;
        }
    }
    outln!(
        "explore: {} samples in {:.1} s ({:.1} per second), {} violations; reports: {}",
        search.samples.len(),
        search.wall_s,
        search.samples.len() as f64 / search.wall_s.max(1e-9),
        search.found.len(),
        out.display()
    );
    exit_code(&search)
}

/// `--keep [--keep-filter TEXT]`: the search's violations into kept.json.
fn keep(cli: &Cli, search: &explore::Search) -> Result<(), ExitCode> {
    let mut chosen = search.clone();
    if let Some(text) = &cli.keep_filter {
        chosen
            .found
            .retain(|f| f.minimal.name("explore").contains(text.as_str()));
    }
    if chosen.found.is_empty() {
        return Ok(());
    }
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10]
        .to_owned();
    let fixtures = Home::get().fixtures_dir();
    match report::keep(&fixtures, &chosen, &date) {
        Ok(added) => {
            outln!(
                "kept: {added} new case(s) in {}",
                report::kept_file(&fixtures).display()
            );
            Ok(())
        }
        Err(e) => Err(fail(e)),
    }
}

/// `d` observed alone in a fresh process of this binary (`None`, with a
/// line on stderr, when that process fails: the search goes on).
fn observe_alone(device: Device, d: &explore::Description) -> Option<explore::Observation> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--observe-alone")
        .arg(serde_json::to_string(d).ok()?)
        .arg("--device")
        .arg(match device {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
        .env(
            conformance::runner::worker::RUNNER_PID_ENV,
            std::process::id().to_string(),
        )
        .stdin(std::process::Stdio::null());
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            errln!("explore: could not rerun {} alone: {e}", d.name("explore"));
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    match text
        .lines()
        .last()
        .map(serde_json::from_str::<explore::Observation>)
    {
        Some(Ok(o)) if out.status.success() => Some(o),
        _ => {
            errln!(
                "explore: the rerun of {} alone ended with {}: {}",
                d.name("explore"),
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            None
        }
    }
}

/// 1 for a bits violation or a port error, 2 for findings only, 0 for
/// nothing.
fn exit_code(search: &explore::Search) -> ExitCode {
    if search.found.iter().any(|f| {
        matches!(
            f.kind,
            explore::Violation::Bits | explore::Violation::PortError
        )
    }) {
        ExitCode::from(1)
    } else if search.found.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
