//! Step 1: the flags, the reference, the device, the snapshot set and the
//! cases; everything a run needs before its first case.

use std::io::IsTerminal;

use conformance::case::{Backend, Case};
use conformance::config::Device;
use conformance::home::Home;
use conformance::registry::Registry;
use conformance::report::{self, Environment};
use conformance::runner::{self, RunOptions};
use conformance::snapshots::{self, Mode};
use oracle::Oracle;

use super::fingerprint::read_fingerprint;
use super::{fail, Exit, Session};
use crate::{Cli, GateMode};

impl Session {
    /// Checks the flags, starts the reference, resolves `--device` and
    /// the snapshot set, and selects the cases. `--list` ends here.
    pub fn prepare(cli: Cli) -> Result<Session, Exit> {
        // Where fixtures, fingerprint, lock and default reports are: the
        // workspace, or a bundle (`MLX_CONFORMANCE_HOME`, see home.rs).
        let home = Home::get();
        let mode = gate_mode(&cli)?;
        let (selected, deep_only_not_run, registered, registry) = select(&cli)?;
        // Relative paths are resolved once, against the directory the run
        // was started in, and printed absolute everywhere.
        let absolute =
            |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let out_dir = absolute(
            &cli.out
                .clone()
                .unwrap_or_else(|| home.default_reports_dir()),
        );
        // The export directory first (the reports may go inside it, as
        // `cargo xtask export` puts them): claimed only when it is new, empty
        // or an earlier export's (its marker), locked for the whole run, and
        // only then emptied of the earlier export's files.
        let export = cli.export.as_deref().map(absolute);
        let export_claim = match &export {
            None => None,
            Some(dir) => {
                let claim = conformance::outdir::claim(dir, conformance::outdir::Kind::Export)
                    .map_err(|e| fail(format!("--export: {e}")))?;
                conformance::export::clear(&claim).map_err(|e| fail(format!("--export: {e}")))?;
                Some(claim)
            }
        };
        // The candidate's directory (`cargo xtask` sets it to the caller's):
        // one that is not a directory would make every case an ERROR with a
        // bare spawn error, so it ends the run before any case.
        if cli.candidate.is_some() {
            if let Some(dir) = conformance::candidate::cwd() {
                if !dir.is_dir() {
                    return Err(fail(format!(
                        "{}={}: not a directory, so the --candidate command cannot run in it; unset it (the candidate then runs in this directory) or name an existing directory",
                        conformance::candidate::CWD_ENV,
                        dir.display()
                    )));
                }
            }
        }
        // `--same-verdicts-as REPORT` is read now, not after the whole run:
        // a missing file, a FIFO or a file that is no report.json ends the
        // run before any case (and is read again, whole, at the end).
        if let Some(path) = &cli.same_verdicts_as {
            let linked = conformance::schema::ReportFile::read(path)
                .map_err(|e| fail(format!("--same-verdicts-as: {e}")))?;
            // Its verdicts are comparable only when it ran the same inputs:
            // the same seed, and not a proof run's perturbed ones.
            let env = &linked.environment;
            if let Some(seed) = env.get("seed").and_then(serde_json::Value::as_u64) {
                if seed != cli.seed {
                    return Err(fail(format!(
                        "--same-verdicts-as {}: that run used seed {seed}, this one seed {}; compare runs of the same seed (--seed {seed}, or a linked run of --seed {})",
                        path.display(),
                        cli.seed,
                        cli.seed
                    )));
                }
            }
            let perturbed = env.get("perturb").and_then(serde_json::Value::as_bool);
            if perturbed.is_some_and(|p| p != cli.perturb) {
                let (theirs, ours) = if cli.perturb {
                    ("without", "with")
                } else {
                    ("with", "without")
                };
                return Err(fail(format!(
                    "--same-verdicts-as {}: that run was {theirs} --perturb, this one {ours}; compare runs of the same inputs",
                    path.display()
                )));
            }
        }
        // Before any case runs (a GPU run can take minutes): the reports must
        // be writable, and a declared set key must be usable as a name.
        report::check_writable(&out_dir).map_err(fail)?;
        report::clear(&out_dir);
        let keep_outputs = cli.keep_outputs.as_deref().map(absolute);
        if let Some(dir) = &keep_outputs {
            std::fs::create_dir_all(dir).map_err(|e| {
                fail(format!(
                    "--keep-outputs {}: {e}; choose a writable directory",
                    dir.display()
                ))
            })?;
        }
        let declared = match cli.device_family.as_deref().filter(|k| !k.is_empty()) {
            None => None,
            Some(key) => {
                snapshots::check_device_key(key).map_err(fail)?;
                Some(key.to_owned())
            }
        };

        let fingerprint = read_fingerprint(home).map_err(fail)?;
        let oracle = Oracle::start().map_err(fail)?;
        let (device, backend) = resolve_device(&cli, &oracle)?;
        runner::set_device(backend);
        oracle.set_device(backend).map_err(fail)?;
        let mut device_info = oracle.device_info(backend).map_err(fail)?;
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
        // A set path that is a link, a file or a link loop is refused
        // before any case runs (never diagnosed as a set to record).
        let set_recorded = if cli.snapshots_checked() {
            snapshots::set_exists(&set_dir)
                .map_err(|e| fail(format!("snapshot set {}: {e}", set_dir.display())))?
        } else {
            false
        };
        // MLX's kernel-affecting settings (pinned by `kernel_settings::pin`
        // at start-up) must be the set's: other values give other bits.
        let kernel_settings = conformance::kernel_settings::current(backend);
        if mode != Mode::Accept && set_recorded {
            let recorded = snapshots::recorded_kernel_settings(&set_dir).map_err(fail)?;
            let set = set_dir.file_name().unwrap_or_default().to_string_lossy();
            conformance::kernel_settings::check(&kernel_settings, &recorded, &set).map_err(fail)?;
        }
        // Said at the start too, so nobody waits for a whole run to learn it.
        if mode != Mode::Accept && cli.snapshots_checked() && !set_recorded {
            errln!(
                "note: {}",
                snapshots::missing_set_line(&set_dir, &set_commands, snapshots::RunPlace::here())
            );
        }
        let environment = Environment {
            mlx_version: oracle.info().mlx_version.clone(),
            backend: backend.as_str().into(),
            device: device.name().into(),
            device_name,
            architecture,
            host: device_info,
            kernel_settings,
            device_family,
            device_family_declared: declared.is_some(),
            snapshot_set: set_dir.file_name().unwrap().to_string_lossy().into_owned(),
            set_commands,
            lock_sha256: fingerprint.lock_sha256.clone(),
            libmlx: oracle.info().libmlx.clone(),
            seed: cli.seed,
            filter: cli.filter.clone().filter(|f| !f.is_empty()),
            perturb: cli.perturb,
            exact_faults: cli.exact_faults,
            tier: cli.tier,
            deep_only_not_run,
            snapshots_checked: cli.snapshots_checked(),
            poison: conformance::poison::enabled(),
            candidate: cli.candidate.clone(),
            testing_hook: conformance::config::testing_hooks(),
        };
        if let Some(hook) = &environment.testing_hook {
            errln!(
                "warning: testing hook set: {hook}. Every report names it; unset it for a real run"
            );
        }
        let config = crate::run_config(&cli, backend, registry, keep_outputs, export);

        let options = RunOptions {
            backend,
            seed: cli.seed,
            jobs: cli.jobs.map_or_else(default_jobs, usize::from),
            perturb: cli.perturb,
        };
        Ok(Session {
            cli,
            home,
            mode,
            fingerprint,
            oracle,
            backend,
            selected,
            registered,
            out_dir,
            set_dir,
            environment,
            options,
            config,
            terminal: std::io::stderr().is_terminal(),
            _export_claim: export_claim,
        })
    }
}

/// `--fixtures` as the gate's mode; refuses accept under CI.
fn gate_mode(cli: &Cli) -> Result<Mode, Exit> {
    let ci = snapshots::in_ci();
    let mode = match cli.fixtures {
        GateMode::Check => Mode::Check,
        GateMode::Review => Mode::Review,
        GateMode::Accept => Mode::Accept,
    };
    if mode == Mode::Accept && cli.candidate.is_some() {
        return Err(fail("--candidate runs never write snapshots: the set pins this repository's port (check a candidate against it with --fixtures check)"));
    }
    if mode == Mode::Accept && ci {
        return Err(fail("snapshots are never written under CI=true; run `cargo xtask fixtures accept` locally and commit"));
    }
    // Snapshots pin seed 0's unperturbed outputs: an accept that would not
    // check them would write nothing, so it is refused, saying why.
    if mode == Mode::Accept && !cli.snapshots_checked() {
        let why = if cli.no_snapshots {
            "--no-snapshots turns the snapshot gate off".to_owned()
        } else if cli.perturb {
            "--perturb hands the reference perturbed inputs".to_owned()
        } else {
            format!("--seed {} is not the pinned seed 0", cli.seed)
        };
        return Err(fail(format!(
            "refusing to accept snapshots: {why}, so this run checks none and would record none; run accept without it"
        )));
    }
    Ok(mode)
}

/// The cases `--filter` selects that `--tier` runs, how many selected
/// ones only a deeper tier runs, and every registered case's snapshot
/// file name; `--list` and `--describe` print the whole selection (every
/// tier) and end the run.
#[allow(clippy::type_complexity)]
fn select(
    cli: &Cli,
) -> Result<
    (
        Vec<Case>,
        usize,
        std::collections::BTreeSet<String>,
        Registry,
    ),
    Exit,
> {
    let mut registry = Registry::new();
    if let Some(n) = cli.explore_samples {
        if !cli.no_snapshots {
            return Err(fail(
                "--explore-samples: explorer samples have no snapshots; add --no-snapshots (as `cargo xtask gate` does)",
            ));
        }
        registry = registry.with_explore_samples(n as usize, cli.explore_seed);
    }
    if let Some(file) = &cli.cases {
        if !cli.no_snapshots && !cli.describe && !cli.list {
            return Err(fail(
                "--cases: described cases may differ from the registered ones of their names; add --no-snapshots",
            ));
        }
        registry = registry.with_cases_file(file).map_err(fail)?;
    }
    let cases = registry.cases();
    if let Err(dup) = unique_names(&cases) {
        return Err(fail(format!(
            "two cases are named `{dup}`; case names must be unique"
        )));
    }
    let mut selected = runner::select(&cases, cli.filter.as_deref()).map_err(fail)?;
    if let Some(allowed) = &cli.ops {
        selected = by_ops(selected, allowed)?;
    }
    if cli.describe {
        let chosen: std::collections::BTreeSet<&str> =
            selected.iter().map(|c| c.name.as_str()).collect();
        let described = registry.descriptions();
        let have: std::collections::BTreeSet<&str> =
            described.iter().map(|d| d.name.as_str()).collect();
        let without: Vec<&str> = chosen
            .iter()
            .copied()
            .filter(|n| !have.contains(n))
            .collect();
        if !without.is_empty() {
            // Never a silent gap between --describe and the registry.
            return Err(fail(format!(
                "--describe: {} selected case(s) have no description: {} (an unreadable fixtures/explore/kept.json, or explorer samples that cannot be drawn; run them to see why)",
                without.len(),
                without.join(", ")
            )));
        }
        // Each line also says which ops the case calls (docs/ops.json;
        // `--cases` reads the line back without them).
        let documented = conformance::candidate::signatures::documented().map_err(fail)?;
        let family: std::collections::BTreeMap<&str, &str> = selected
            .iter()
            .map(|c| (c.name.as_str(), c.family))
            .collect();
        for d in described
            .iter()
            .filter(|d| chosen.contains(d.name.as_str()))
        {
            let mut line = serde_json::to_value(d).unwrap_or_default();
            if let (Some(o), Some((ops, of_family))) = (
                line.as_object_mut(),
                documented.ops_of(&d.name, family.get(d.name.as_str()).copied().unwrap_or("")),
            ) {
                o.insert("ops".into(), serde_json::json!(ops));
                if of_family {
                    o.insert("ops_of_family".into(), serde_json::json!(true));
                }
            }
            match serde_json::to_string(&line) {
                Ok(line) => outln!("{line}"),
                Err(e) => return Err(fail(format!("--describe `{}`: {e}", d.name))),
            }
        }
        return Err(Exit(std::process::ExitCode::SUCCESS));
    }
    if cli.list {
        let documented = cli
            .ops
            .is_some()
            .then(conformance::candidate::signatures::documented)
            .transpose()
            .map_err(fail)?;
        for c in selected {
            let ops = documented
                .as_ref()
                .and_then(|d| d.ops_of(&c.name, c.family))
                .map(|(ops, _)| format!(" ops: {}", ops.join(",")))
                .unwrap_or_default();
            outln!(
                "{:<64} {:<11} {}{ops}",
                c.name,
                format!("{:?}", c.expect),
                c.reference
            );
        }
        return Err(Exit(std::process::ExitCode::SUCCESS));
    }
    let registered = cases
        .iter()
        .map(|c| snapshots::file_name(&c.name))
        .collect();
    let (run, deeper): (Vec<&Case>, Vec<&Case>) =
        selected.into_iter().partition(|c| c.tier <= cli.tier);
    if run.is_empty() && !deeper.is_empty() {
        return Err(fail(format!(
            "--filter selects only cases of a deeper tier than `{}` ({}, e.g. `{}`); add `--tier deep` to run them",
            cli.tier.as_str(),
            deeper.len(),
            deeper[0].name
        )));
    }
    Ok((
        run.into_iter().cloned().collect(),
        deeper.len(),
        registered,
        registry,
    ))
}

/// `--ops LIST`: the must-equal cases whose every op (docs/ops.json) is
/// in `allowed` (comma-separated op names; `all`: every op, to list the
/// ops). A case whose ops are not documented is left out, and so are
/// findings (a candidate run skips them).
fn by_ops<'a>(selected: Vec<&'a Case>, allowed: &str) -> Result<Vec<&'a Case>, Exit> {
    use conformance::candidate::ops;
    let allowed: Vec<&str> = allowed
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = allowed
        .iter()
        .find(|a| **a != "all" && ops::by_name(a).is_none())
    {
        return Err(fail(format!(
            "--ops: `{bad}` is no op of the vocabulary (docs/ops.md)"
        )));
    }
    let documented = conformance::candidate::signatures::documented().map_err(fail)?;
    let serves = |op: &String| allowed.contains(&"all") || allowed.contains(&op.as_str());
    let chosen: Vec<&Case> = selected
        .into_iter()
        .filter(|c| {
            c.expect == conformance::case::Expect::MustEqual
                && documented
                    .ops_of(&c.name, c.family)
                    .is_some_and(|(ops, _)| {
                        ops.iter().all(|op| serves(op) || !candidate_receives(op))
                    })
        })
        .collect();
    if chosen.is_empty() {
        return Err(fail(format!(
            "--ops {}: no selected must-equal case calls only these ops (`--list --ops all` lists each case's ops)",
            allowed.join(",")
        )));
    }
    Ok(chosen)
}

/// Whether a candidate receives `op` (setup ops it never does).
fn candidate_receives(op: &str) -> bool {
    conformance::candidate::ops::by_name(op).is_none_or(|o| o.sent())
}

/// `--device` (default: gpu when available, else cpu) and the backend it
/// names.
fn resolve_device(cli: &Cli, oracle: &Oracle) -> Result<(Device, Backend), Exit> {
    // One backend vocabulary: `--device gpu` is the linked libmlx's GPU
    // backend, and the Rust side and the reference must agree on it.
    let port_gpu = Backend::linked_gpu()
        .map_err(|e| fail(format!("MLX cannot report its GPU backend: {e}")))?;
    let reference_gpu = oracle.info().gpu_backend;
    if port_gpu != reference_gpu {
        return Err(fail(format!(
            "the port's libmlx reports GPU backend {port_gpu:?} but the reference's MLX reports {reference_gpu:?}; both must load the same libmlx (run `cargo xtask setup`)"
        )));
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
            return Err(fail(format!(
                "--device gpu: this libmlx ({}) has no usable GPU backend here (Metal needs the mlx-metal wheel on Apple Silicon; CUDA needs `cargo xtask setup --backend cuda` and an NVIDIA GPU with its libraries, README \"Running on an NVIDIA GPU\"); use --device cpu",
                oracle.info().libmlx
            )))
        }
    };
    Ok((device, backend))
}

fn unique_names(cases: &[Case]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for c in cases {
        if !seen.insert(c.name.as_str()) {
            return Err(c.name.clone());
        }
    }
    Ok(())
}

/// The default `--jobs`: the CPUs this process may use, at most 4 (more
/// workers than that mostly add interpreter start-ups and memory).
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}
