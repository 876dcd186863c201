//! Step 3: the snapshot gate (or why it is skipped) and the report object.

use conformance::report::{Report, Row};
use conformance::runner::{self, Verdict};
use conformance::snapshots::{self, Mode, Provenance};

use super::fingerprint::check_lock;
use super::{Ran, Session};

/// A gated run: its report, not yet written.
pub struct Gated {
    pub report: Report,
    /// Accept mode only: why nothing was recorded (the run still reports).
    pub refusal: Option<String>,
    /// What the snapshot pass found and did (its statuses are in the
    /// report's rows); `None` when snapshots were not gated.
    pub snapshots: Option<snapshots::Gated>,
}

impl Session {
    /// Checks (or, in accept mode, records) the results against the
    /// snapshot set, and builds the report.
    pub fn gate(&self, ran: Ran) -> Gated {
        let Ran { results, started } = ran;
        let mode = self.mode;
        let cli = &self.cli;
        // An accept that must be refused still writes its reports (they show
        // why), but records nothing.
        // A failed must-equal case has wrong bits, an errored one none:
        // either way the set would not describe this MLX.
        let refusal = if mode == Mode::Accept {
            let named = |verdict: Verdict| -> Vec<&str> {
                results
                    .iter()
                    .filter(|r| r.verdict == verdict)
                    .map(|r| r.name.as_str())
                    .collect()
            };
            let (failed, errored) = (named(Verdict::Fail), named(Verdict::Error));
            if !failed.is_empty() {
                Some(format!(
                    "refusing to accept snapshots: {} must-equal case(s) fail: {}",
                    failed.len(),
                    first_names(&failed)
                ))
            } else if !errored.is_empty() {
                Some(format!(
                    "refusing to accept snapshots: {} case(s) ended in ERROR (fix them, or record the rest with --filter): {}",
                    errored.len(),
                    first_names(&errored)
                ))
            } else {
                check_lock(self.home, &self.fingerprint)
                    .err()
                    .map(|e| format!("refusing to accept snapshots: {e}"))
            }
        } else {
            None
        };
        let environment = &self.environment;
        let provenance = Provenance {
            mlx_version: environment.mlx_version.clone(),
            backend: self.backend.as_str().into(),
            device: environment.device_family.clone(),
            device_name: environment.device_name.clone(),
            architecture: environment.architecture.clone(),
            host: environment.host.clone(),
            lock_sha256: self.fingerprint.lock_sha256.clone(),
            date: today(),
            kernel_settings: environment.kernel_settings.clone(),
        };
        let complete = runner::is_complete_selection(cli.filter.as_deref()) && !cli.perturb;
        let registered = complete.then_some(&self.registered);
        // Snapshots pin the default seed's outputs; other seeds explore inputs
        // and are judged by their verdicts alone.
        if cli.seed != 0 && !cli.perturb {
            errln!(
                "note: --seed {} differs from the pinned seed 0: snapshots are not checked",
                cli.seed
            );
        }
        // A whole missing set is one line, not a DRIFT row per case (an
        // unusable set path was refused before any case ran).
        let missing_set = (mode != Mode::Accept
            && cli.snapshots_checked()
            && !snapshots::set_exists(&self.set_dir).unwrap_or(false))
        .then(|| {
            snapshots::missing_set_line(
                &self.set_dir,
                &environment.set_commands,
                snapshots::RunPlace::here(),
            )
        });
        let mut gated = (cli.snapshots_checked() && missing_set.is_none() && refusal.is_none())
            .then(|| snapshots::gate(&self.set_dir, &results, mode, &provenance, registered));
        let statuses = match &mut gated {
            Some(g) => std::mem::take(&mut g.statuses),
            None => vec![snapshots::Status::NotChecked; results.len()],
        };
        let orphans = gated
            .as_ref()
            .map(|g| g.orphans.clone())
            .unwrap_or_default();
        let rows: Vec<Row> = results
            .into_iter()
            .zip(statuses)
            .map(|(result, snapshot)| Row { result, snapshot })
            .collect();
        let mut report = Report::new(
            environment.clone(),
            rows,
            if mode == Mode::Accept { &[] } else { &orphans },
            started.elapsed().as_secs_f64() * 1e3,
        );
        if let Some(line) = missing_set {
            report = report.with_missing_set(line, snapshots::RunPlace::here().requires_set());
        }
        if self.backend.is_gpu() {
            report.compare_with_cpu_set(&self.home.fixtures_dir());
        }
        Gated {
            report,
            refusal,
            snapshots: gated,
        }
    }
}

/// Up to five case names, then how many more.
fn first_names(names: &[&str]) -> String {
    let mut text = names
        .iter()
        .take(5)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 5 {
        text.push_str(&format!(" and {} more", names.len() - 5));
    }
    text
}

fn today() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10].to_owned()
}
