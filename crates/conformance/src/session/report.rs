//! Step 4: the report files, what `--format` prints, and the exit code.

use std::process::ExitCode;

use conformance::report;
use conformance::snapshots::Mode;

use super::{fail, Exit, Gated, Session};
use crate::Format;

impl Session {
    /// Writes every report file, prints the chosen format, and returns the
    /// report's exit code (a refused accept exits 3 after writing).
    pub fn report(&self, gated: Gated) -> Result<ExitCode, Exit> {
        let Gated {
            report,
            refusal,
            orphans,
        } = gated;
        let out_dir = &self.out_dir;
        report::write_all(out_dir, &report).map_err(|e| {
            fail(format!(
                "cannot write reports to {}: {e}",
                out_dir.display()
            ))
        })?;
        if let Some(refusal) = refusal {
            eprintln!(
                "reports: {} (the refused run's verdicts)",
                out_dir.display()
            );
            return Err(fail(refusal));
        }
        match self.cli.format {
            Format::Human => {
                // Off a terminal every case already printed a progress line:
                // repeat only the rows that need attention.
                println!("{}", report::human::header());
                for row in report
                    .cases
                    .iter()
                    .filter(|r| self.terminal || report::human::notable(r))
                {
                    println!(
                        "{}",
                        report::human::line(row, &self.environment.set_commands)
                    );
                }
                print!("{}", report::human::summary(&report));
                println!("reports: {}", out_dir.display());
                if self.mode == Mode::Accept {
                    println!(
                        "snapshots written to {}; orphans removed: {}",
                        self.set_dir.display(),
                        orphans.len()
                    );
                }
            }
            Format::Json => println!("{}", serde_json::to_string_pretty(&report).expect("json")),
            Format::Junit => println!("{}", report::junit::render(&report)),
            Format::Markdown => println!("{}", report::markdown::render(&report)),
        }
        Ok(ExitCode::from(report.summary.exit_code as u8))
    }
}
