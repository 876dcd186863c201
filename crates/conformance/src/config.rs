//! One run's configuration, built once from the command line (`main.rs`),
//! by the runner and by each of its workers alike: it gives the run's
//! hooks ([`RunConfig::hooks`]: poisoning, kept outputs, the export, the
//! candidate, a planted fault) and the worker's command line
//! ([`RunConfig::worker_args`]), so no mode lives in a process global.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::case::Backend;
use crate::hooks::{Hooks, Substitute};
use crate::registry::Registry;
use crate::runner::worker::{WorkerCommand, WORKER_FLAG};

/// The device asked for on the command line (`--device cpu|gpu`). `gpu` is
/// the GPU backend of the linked libmlx (Metal on macOS, CUDA with the
/// CUDA environment); the run resolves it to one [`Backend`] at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

/// What one run does besides running its cases.
#[derive(Debug)]
pub struct RunConfig {
    /// The backend `--device` resolved to (a worker's `--worker-backend`).
    pub backend: Backend,
    /// `--seed`.
    pub seed: u64,
    /// `--perturb`: the proof mode.
    pub perturb: bool,
    /// `--keep-outputs DIR`.
    pub keep_outputs: Option<PathBuf>,
    /// `--candidate CMD` (with its timeout).
    pub candidate: Option<crate::candidate::Config>,
    /// `--export DIR`.
    pub export: Option<PathBuf>,
    /// `--exact-faults`: the exact oracle's mutation score.
    pub exact_faults: bool,
    /// The registered cases (`--cases FILE`, `--explore-samples N`).
    pub registry: Registry,
}

/// The testing hooks set in the environment, each with what it does, for
/// the warning and every report (`None` when none is): a leftover one
/// never passes for a real FAIL or a real crash. Whatever a value says
/// (even one that does nothing) is named.
pub fn testing_hooks() -> Option<String> {
    let hooks: Vec<String> = [
        (
            crate::plant::PLANT_ENV,
            "port bits flipped on purpose; FAIL rows of its region are planted",
        ),
        (
            crate::runner::worker::FAULT_ENV,
            "the worker of a case it names is sent that signal on purpose; its rows are planted crashes",
        ),
    ]
    .into_iter()
    .filter_map(|(name, what)| {
        std::env::var_os(name).map(|v| format!("{name}={} ({what})", v.to_string_lossy()))
    })
    .collect();
    (!hooks.is_empty()).then(|| hooks.join("; "))
}

impl RunConfig {
    /// The run's hooks, in the order they act: poisoning (before and after
    /// each reference call, at each case's start), a planted fault, kept
    /// outputs, then the export (which records each call after poisoning
    /// and writes at a case's end after the kept outputs); the candidate
    /// as the substitute.
    pub fn hooks(&self) -> Hooks {
        let mut interceptors = crate::runner::environment_interceptors();
        if let Some(dir) = &self.keep_outputs {
            interceptors.push(Box::new(crate::kept::KeepOutputs::new(dir.clone())));
        }
        if let Some(dir) = &self.export {
            interceptors.push(Box::new(crate::export::Recorder::new(dir.clone())));
        }
        if self.exact_faults {
            interceptors.push(Box::new(crate::mutation::PlantFaults));
        }
        Hooks {
            interceptors,
            substitute: self.candidate.clone().map(|config| {
                Box::new(crate::candidate::Candidate::new(config)) as Box<dyn Substitute>
            }),
        }
    }

    /// The arguments that make this executable a worker of this run (after
    /// [`crate::runner::worker::WORKER_FLAG`]). Paths stay raw OS strings.
    pub fn worker_args(&self) -> std::io::Result<Vec<OsString>> {
        let mut args: Vec<OsString> = vec![
            "--worker-backend".into(),
            self.backend.as_str().into(),
            "--seed".into(),
            self.seed.to_string().into(),
        ];
        if self.perturb {
            args.push("--perturb".into());
        }
        if self.exact_faults {
            args.push("--exact-faults".into());
        }
        if let Some(dir) = &self.keep_outputs {
            args.push("--keep-outputs".into());
            args.push(dir.as_os_str().to_owned());
        }
        if let Some(config) = &self.candidate {
            args.extend(["--candidate".into(), config.command.clone().into()]);
            args.push("--candidate-timeout".into());
            args.push(config.timeout.as_secs().to_string().into());
        }
        if let Some(dir) = &self.export {
            args.push("--export".into());
            args.push(dir.as_os_str().to_owned());
        }
        if self.registry.has_cases_file() {
            // What a runner killed with SIGKILL left (its owner is gone).
            crate::scratch::reclaim_stale(&std::env::temp_dir());
        }
        let prefix = crate::scratch::own_prefix(crate::scratch::CASES);
        if let Some(file) = self.registry.worker_cases_file(&prefix) {
            let file = file.map_err(std::io::Error::other)?;
            args.extend(["--cases".into(), file.as_os_str().to_owned()]);
        }
        if let Some((n, seed)) = self.registry.explore_samples() {
            args.extend(["--explore-samples".into(), n.to_string().into()]);
            args.extend(["--explore-seed".into(), seed.to_string().into()]);
        }
        Ok(args)
    }
}

// The worker's command line is the run's configuration: it is built here,
// where the configuration is, so the runner never names `RunConfig`.
impl WorkerCommand {
    /// This executable as a worker of the run `config` describes.
    pub fn for_run(config: &RunConfig, case_timeout: Option<Duration>) -> std::io::Result<Self> {
        let mut args: Vec<OsString> = vec![WORKER_FLAG.into()];
        args.extend(config.worker_args()?);
        Ok(WorkerCommand {
            program: std::env::current_exe()?,
            args,
            case_timeout,
        })
    }
}
