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
            snapshots,
        } = gated;
        if let Some(g) = &snapshots {
            for leftover in &g.leftovers {
                let done = if self.mode == Mode::Accept
                    && !leftover.exists()
                    && std::fs::symlink_metadata(leftover).is_err()
                {
                    "removed"
                } else {
                    "not a snapshot; the next successful accept removes it"
                };
                errln!(
                    "note: {} is a temporary file of an unfinished snapshot write ({done})",
                    leftover.display()
                );
            }
        }
        // Accept: a write that failed is the run's failure, said in one
        // line each, and no success line follows.
        let write_failed = snapshots.as_ref().filter(|g| !g.write_errors.is_empty()).map(|g| {
            for e in &g.write_errors {
                errln!("error: {e}");
            }
            format!(
                "{} snapshot write(s) failed in {}; every file is whole, nothing was removed, and the snapshots that could be written were",
                g.write_errors.len(),
                self.set_dir.display()
            )
        });
        let out_dir = &self.out_dir;
        report::write_all(out_dir, &report).map_err(|e| {
            fail(format!(
                "cannot write reports to {}: {e}",
                out_dir.display()
            ))
        })?;
        if let Some(dir) = &self.config.export {
            let environment = serde_json::json!({
                "backend": self.environment.backend,
                "device": self.environment.device,
                "device_name": self.environment.device_name,
                "architecture": self.environment.architecture,
                "mlx_version": self.environment.mlx_version,
                "lock_sha256": self.environment.lock_sha256,
                "kernel_settings": self.environment.kernel_settings,
            });
            let n = conformance::export::write_manifest(dir, environment, self.environment.seed)
                .map_err(|e| fail(format!("--export: {e}")))?;
            errln!("export: {n} must-equal cases' vectors in {}", dir.display());
        }
        if let Some(failed) = write_failed {
            errln!("reports: {}", out_dir.display());
            return Err(fail(failed));
        }
        if let Some(refusal) = refusal {
            errln!(
                "reports: {} (the refused run's verdicts)",
                out_dir.display()
            );
            return Err(fail(refusal));
        }
        match self.cli.format {
            Format::Human => {
                // Off a terminal every case already printed a progress line:
                // repeat only the rows that need attention.
                outln!("{}", report::human::header());
                for row in report
                    .cases
                    .iter()
                    .filter(|r| self.terminal || report::human::notable(r))
                {
                    outln!(
                        "{}",
                        report::human::line(
                            row,
                            &self.environment.set_commands,
                            self.environment.side()
                        )
                    );
                }
                out!("{}", report::human::summary(&report));
                outln!("reports: {}", out_dir.display());
                if let Some(line) = self.accept_line(snapshots.as_ref()) {
                    outln!("{line}");
                }
            }
            _ => {
                if let Some(line) = self.accept_line(snapshots.as_ref()) {
                    errln!("{line}");
                }
            }
        }
        match self.cli.format {
            Format::Human => {}
            Format::Json => outln!("{}", serde_json::to_string_pretty(&report).expect("json")),
            Format::Junit => outln!("{}", report::junit::render(&report)),
            Format::Markdown => outln!("{}", report::markdown::render(&report)),
        }
        let mut code = report.summary.exit_code;
        for case in &report.summary.expected_failures {
            errln!("expected failure: {case} FAILs on {} as crates/conformance/expected-failures.json lists it", report.environment.backend);
        }
        for case in &report.summary.unexpected_passes {
            errln!("unexpected pass: {case} is listed in crates/conformance/expected-failures.json as failing on {}, and passed; remove the entry", report.environment.backend);
        }
        if let Some(e) = &report.summary.expected_failures_error {
            errln!("error: {e}");
        }
        if let Some(linked) = &self.cli.same_verdicts_as {
            let c = conformance::candidate::compare_verdicts(
                report.cases.iter().map(|r| &r.result),
                linked,
            )
            .map_err(|e| fail(format!("--same-verdicts-as: {e}")))?;
            errln!(
                "same verdicts as {}: {} same, {} findings skipped, {} unsupported by the candidate, {} differ",
                linked.display(),
                c.same,
                c.findings,
                c.unsupported.len(),
                c.differ.len()
            );
            for line in &c.differ {
                errln!("  differs: {line}");
            }
            // The same verdicts on every case: an op the candidate does
            // not serve fails the comparison too.
            for (case, why) in &c.unsupported {
                errln!("  unsupported: {case}: {why}");
            }
            if !c.differ.is_empty() || !c.unsupported.is_empty() {
                code = code.max(conformance::report::exit::MUST_EQUAL_FAILURE);
            }
        }
        Ok(ExitCode::from(code as u8))
    }

    /// Accept's closing line: what it did to the set.
    fn accept_line(&self, snapshots: Option<&conformance::snapshots::Gated>) -> Option<String> {
        let g = snapshots.filter(|_| self.mode == Mode::Accept)?;
        let c = g.counts;
        Some(format!(
            "snapshots in {}: {} new, {} changed, {} unchanged, {} removed",
            self.set_dir.display(),
            c.new,
            c.changed,
            c.unchanged,
            c.removed,
        ))
    }
}
