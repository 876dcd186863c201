//! `conformance-gate <candidate> <baseline run dir> <candidate run dir> --out DIR`:
//! compares two runs of the suite (see `conformance::gate`), writes
//! `gate.json` and `gate.md` to DIR, prints the table, exits 0 / 1 / 2 / 3
//! as the README's gate table says. Driven by `cargo xtask gate`.

#[macro_use]
extern crate conformance;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use conformance::gate;

#[derive(Parser)]
#[command(
    name = "conformance-gate",
    about = "Compare a baseline and a candidate run of the suite"
)]
struct Cli {
    /// The candidate's name (for the reports).
    candidate: String,
    /// The baseline run: report.json and outputs/ (from --keep-outputs).
    baseline_run: PathBuf,
    /// The candidate run, likewise.
    candidate_run: PathBuf,
    /// Where gate.json and gate.md are written.
    #[arg(long)]
    out: PathBuf,
    /// Environment errors found before the runs could be compared
    /// (recorded in gate.json; the exit code is then 3).
    #[arg(long = "environment-error", value_name = "TEXT")]
    environment_errors: Vec<String>,
    /// The runs' `--filter` (recorded in the reports).
    #[arg(long)]
    filter: Option<String>,
    /// The candidate run was the self-test (`--perturb`; recorded).
    #[arg(long)]
    perturbed_candidate: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 3 } else { 0 });
        }
    };
    // Nothing to compare when a side did not run: only the errors.
    let mut g = if cli.environment_errors.is_empty() {
        gate::compare_runs(&cli.candidate, &cli.baseline_run, &cli.candidate_run)
    } else {
        gate::Gate::empty(&cli.candidate)
    };
    g.filter = cli.filter;
    g.perturbed_candidate = cli.perturbed_candidate;
    if !cli.environment_errors.is_empty() {
        g.environment_errors.extend(cli.environment_errors);
        g.exit_code = gate::exit::ENVIRONMENT;
    }
    if let Err(e) = std::fs::create_dir_all(&cli.out)
        .and_then(|()| {
            std::fs::write(
                cli.out.join("gate.json"),
                serde_json::to_string_pretty(&g).unwrap_or_default() + "\n",
            )
        })
        .and_then(|()| std::fs::write(cli.out.join("gate.md"), gate::markdown(&g)))
    {
        errln!(
            "error: cannot write the gate reports to {}: {e}",
            cli.out.display()
        );
        return ExitCode::from(3);
    }
    out!("{}", gate::table(&g));
    outln!("gate reports: {}", cli.out.display());
    ExitCode::from(g.exit_code as u8)
}
