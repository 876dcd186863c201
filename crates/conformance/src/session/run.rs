//! Step 2: the cases, in worker processes or in this one, with a progress
//! bar (terminal) or a line per case; Ctrl-C ends the run here.

use std::process::ExitCode;
use std::time::Instant;

use conformance::case::Case;
use conformance::runner::{self, CaseResult};

use super::{fail, Exit, Session};
use crate::Format;

/// The results of a run that was not interrupted.
pub struct Ran {
    /// One per selected case, in selection order.
    pub results: Vec<CaseResult>,
    /// When the first case was handed out (the report's wall time).
    pub started: Instant,
}

impl Session {
    /// Runs the selected cases. Interrupted: exit 130, no report.
    pub fn run(&self) -> Result<Ran, Exit> {
        let workers = if self.cli.in_process {
            None
        } else {
            match runner::worker::WorkerCommand::for_run(&self.config, self.cli.case_timeout()) {
                Ok(command) => Some(command),
                Err(e) => {
                    return Err(fail(format!(
                        "cannot find this executable to start workers: {e}; use --in-process"
                    )))
                }
            }
        };
        let selected: Vec<&Case> = self.selected.iter().collect();
        let started = Instant::now();
        let terminal = self.terminal;
        let bar = if terminal {
            indicatif::ProgressBar::new(selected.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
                .expect("template"),
        );
        let human = matches!(self.cli.format, Format::Human);
        // A panic inside a case becomes that case's harness error (with its
        // message) in the report; the default hook's backtrace would only be noise.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let progress = |r: &CaseResult| {
            if terminal {
                bar.set_message(r.name.clone());
                bar.inc(1);
            } else if human {
                outln!("{:<7} {} ({:.1} ms)", r.verdict.word(), r.name, r.time_ms);
            }
        };
        // Ctrl-C or SIGTERM: no new case starts, the run exits 130, no report.
        runner::catch_interrupts();
        let results = match &workers {
            Some(command) => runner::worker::run(&selected, command, &self.options, &progress),
            None => {
                let hooks = self.config.hooks();
                runner::run_hooked(&selected, &self.oracle, &self.options, &hooks, &progress)
            }
        };
        bar.finish_and_clear();
        std::panic::set_hook(default_hook);
        if runner::interrupted() {
            errln!(
                "interrupted: {} of {} cases ran; no report written",
                results.len(),
                selected.len()
            );
            return Err(Exit(ExitCode::from(130)));
        }
        Ok(Ran { results, started })
    }
}
