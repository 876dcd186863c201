//! Reports: a human table on the terminal and, under `target/conformance/`,
//! `report.json` (versioned schema), `junit.xml` and `report.md`.
//!
//! Files are written to a temporary name and renamed at the very end, and
//! old reports are removed when a run starts: an interrupted run leaves no
//! report that looks complete. What they hold (the environment, the rows,
//! the summaries) is the `model` submodule's, re-exported here; this file
//! writes it.

pub mod human;
pub mod junit;
pub mod markdown;
mod model;

pub use model::{
    exact_outside, exit, first_diff, snapshot_note, verdict_word, Environment, ExactSummary,
    FamilySummary, FindingDiff, Proof, Report, Row, Summary, VsCpu, SCHEMA_VERSION,
};

use std::path::Path;

/// Checks before a run that `dir` is (or can be made) a writable directory,
/// so a run never ends with reports it cannot write.
pub fn check_writable(dir: &Path) -> Result<(), String> {
    let fail = |why: String| {
        format!(
            "--out {}: {why}; choose a writable directory with --out",
            dir.display()
        )
    };
    if dir.as_os_str().is_empty() {
        return Err("--out is empty; give a directory (default: target/conformance)".into());
    }
    // The lock must be a file (a FIFO or link there is refused before any
    // case runs, not after them all).
    let lock = dir.join(".conformance-reports.lock");
    match std::fs::symlink_metadata(&lock) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(fail(format!(
                "{} is a symbolic link; remove it",
                lock.display()
            )))
        }
        Ok(m) if !m.is_file() => {
            return Err(fail(format!(
                "{} is not a regular file (a FIFO?); remove it",
                lock.display()
            )))
        }
        _ => {}
    }
    // Each report name must be free for a file (a directory there would
    // fail the final rename, after report.json was already replaced).
    for f in ["report.json", "junit.xml", "report.md"] {
        if std::fs::symlink_metadata(dir.join(f)).is_ok_and(|m| m.is_dir()) {
            return Err(fail(format!("{f} there is a directory")));
        }
    }
    if dir.exists() && !dir.is_dir() {
        return Err(fail("exists and is not a directory".into()));
    }
    // The run removes and replaces these names: only where a run of this
    // tool wrote reports before (every such run leaves the lock file), so
    // a user's own `report.md` in a directory given as --out is never lost.
    if std::fs::symlink_metadata(&lock).is_err() {
        for f in ["report.json", "junit.xml", "report.md"] {
            if std::fs::symlink_metadata(dir.join(f)).is_ok() {
                return Err(fail(format!(
                    "holds a {f} that no run of this tool wrote (there is no .conformance-reports.lock), so nothing was removed; give a new or empty directory, or move {f} away"
                )));
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot be created ({e})")))?;
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| fail(format!("is not writable ({e})")))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// The report directory's lock, held while its files are removed or
/// replaced, so that runs sharing one `--out` never leave a mix of two
/// runs' files: the directory holds one run's complete reports, those of
/// the run that finished last (README "Reading a report").
///
/// The lock file is never a link or a FIFO (opened `O_NOFOLLOW |
/// O_NONBLOCK`, then checked: a FIFO there would block the run forever,
/// a link would create a file at its target), and a run that must wait
/// for another's lock says so.
fn lock_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(".conformance-reports.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            let why = if e.raw_os_error() == Some(libc::ELOOP) {
                "is a symbolic link".to_owned()
            } else {
                e.to_string()
            };
            std::io::Error::new(e.kind(), format!("{}: {why}", path.display()))
        })?;
    if !lock.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file; remove it",
            path.display()
        )));
    }
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            errln!(
                "note: waiting for another run's lock on {} (it holds these reports)",
                path.display()
            );
            lock.lock()?;
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    Ok(lock)
}

/// Removes the reports of a previous run.
pub fn clear(dir: &Path) {
    let Ok(_lock) = lock_dir(dir) else { return };
    for f in ["report.json", "junit.xml", "report.md"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
}

/// Writes all three report files: each to a temporary name unique to this
/// run, then, under the directory's lock, renamed into place together.
pub fn write_all(dir: &Path, report: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let files = [
        (
            "report.json",
            serde_json::to_string_pretty(report).expect("report serialises"),
        ),
        ("junit.xml", junit::render(report)),
        ("report.md", markdown::render(report)),
    ];
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let partial = |name: &str| dir.join(format!(".{name}.{}-{nanos}.partial", std::process::id()));
    let written: std::io::Result<()> = files
        .iter()
        .try_for_each(|(name, text)| std::fs::write(partial(name), text));
    if let Err(e) = written {
        for (name, _) in &files {
            let _ = std::fs::remove_file(partial(name));
        }
        return Err(e);
    }
    let renamed = lock_dir(dir).and_then(|_lock| {
        files
            .iter()
            .try_for_each(|(name, _)| std::fs::rename(partial(name), dir.join(name)))
    });
    // No `.partial` file outlives a failed write.
    for (name, _) in &files {
        let _ = std::fs::remove_file(partial(name));
    }
    renamed
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::case::{CaseOutput, Expect};
    use crate::result::{CaseResult, Verdict};
    use crate::snapshots::{self, Mode, Provenance, Status};
    use std::collections::BTreeMap;

    fn finding(name: &str) -> CaseResult {
        CaseResult {
            name: name.into(),
            family: "f".into(),
            reference: "r".into(),
            glue_composed: Vec::new(),
            expect: Expect::Finding,
            verdict: Verdict::Finding,
            output: Some(CaseOutput::new("p").with_finding(serde_json::json!({"parts": 3}))),
            message: None,
            error_kind: None,
            time_ms: 1.0,
        }
    }

    pub(crate) fn environment(backend: &str, family: &str, declared: bool) -> Environment {
        Environment {
            mlx_version: "0.32.2".into(),
            backend: backend.into(),
            device: "gpu".into(),
            device_name: "Apple M1 (Virtual)".into(),
            architecture: "air64_v26".into(),
            host: BTreeMap::new(),
            kernel_settings: BTreeMap::new(),
            device_family: family.into(),
            device_family_declared: declared,
            snapshot_set: format!("{backend}-{family}-mlx0.32.2"),
            set_commands: snapshots::SetCommands::new("", "--device gpu"),
            lock_sha256: "l".into(),
            libmlx: "x".into(),
            seed: 0,
            filter: None,
            perturb: false,
            exact_faults: false,
            snapshots_checked: true,
            poison: true,
            tier: crate::case::Tier::Default,
            deep_only_not_run: 0,
            candidate: None,
            testing_hook: None,
        }
    }

    /// A Metal run that declares its runner family (`gha-macos-14`, as the
    /// apple-silicon workflow does) reads the CPU set recorded under that
    /// family, not the CPU's derived key; a run with no such CPU set says
    /// so in report.md instead of leaving the section out.
    #[test]
    fn the_metal_vs_cpu_section_reads_the_cpu_set_of_the_declared_family() {
        let fixtures =
            std::env::temp_dir().join(format!("conformance-vs-cpu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&fixtures);
        let cpu_set = fixtures
            .join("snapshots")
            .join("cpu-gha-macos-14-mlx0.32.2");
        std::fs::create_dir_all(&cpu_set).unwrap();
        let provenance = Provenance {
            mlx_version: "0.32.2".into(),
            backend: "cpu".into(),
            device: "gha-macos-14".into(),
            device_name: String::new(),
            architecture: String::new(),
            host: BTreeMap::new(),
            kernel_settings: BTreeMap::new(),
            lock_sha256: "l".into(),
            date: "2026-12-02".into(),
        };
        let g = snapshots::gate(&cpu_set, &[finding("f/a")], Mode::Accept, &provenance, None);
        assert!(g.write_errors.is_empty(), "{:?}", g.write_errors);
        let rows = || {
            vec![Row {
                result: finding("f/a"),
                snapshot: Status::Match,
            }]
        };

        let mut declared =
            Report::new(environment("metal", "gha-macos-14", true), rows(), &[], 1.0);
        declared.compare_with_cpu_set(&fixtures);
        let vs = declared
            .vs_cpu
            .as_ref()
            .expect("the declared family's CPU set is read");
        assert_eq!(vs.cpu_set, "cpu-gha-macos-14-mlx0.32.2");
        assert_eq!((vs.same, vs.no_cpu_record), (1, 0));
        assert!(markdown::render(&declared)
            .contains("CPU values from the recorded set `cpu-gha-macos-14-mlx0.32.2`"));

        let mut derived = Report::new(environment("metal", "air64_v26", false), rows(), &[], 1.0);
        derived.compare_with_cpu_set(&fixtures);
        assert!(derived.vs_cpu.is_none());
        let looked_for = format!(
            "cpu-{}-{}-mlx0.32.2",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        assert_eq!(derived.vs_cpu_missing.as_deref(), Some(looked_for.as_str()));
        let md = markdown::render(&derived);
        assert!(
            md.contains(&format!("Not compared: the CPU set `{looked_for}`")),
            "{md}"
        );
        let _ = std::fs::remove_dir_all(&fixtures);
    }

    /// A missing set fails a CI run (exit 2) and leaves a user's run to its
    /// verdicts (exit 0 when they pass), counted apart in the closing line.
    #[test]
    fn a_missing_set_fails_under_ci_only() {
        // With the whole set missing, cases are not gated one by one.
        let rows = || {
            vec![Row {
                result: finding("f/a"),
                snapshot: Status::NotChecked,
            }]
        };
        let ci = Report::new(environment("metal", "k", false), rows(), &[], 1.0)
            .with_missing_set("line".into(), true);
        assert_eq!(ci.summary.exit_code, exit::DRIFT);
        assert!(
            human::summary(&ci).contains("1 failed"),
            "{}",
            human::summary(&ci)
        );
        let local = Report::new(environment("metal", "k", false), rows(), &[], 1.0)
            .with_missing_set("line".into(), false);
        assert_eq!(local.summary.exit_code, exit::PASS);
        assert!(
            human::summary(&local).contains("0 failed"),
            "{}",
            human::summary(&local)
        );
    }

    /// Under `--perturb` the proof decides the exit: 0 when every
    /// must-equal case FAILs with each output differing, 1 naming any
    /// output (or case) the perturbation did not reach.
    #[test]
    fn the_proof_run_exits_on_what_the_perturbation_reached() {
        let mut e = environment("cpu", "k", false);
        e.perturb = true;
        let must = |verdict: Verdict, equal: bool| {
            let mut out = CaseOutput::new("p");
            let t = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![1]).unwrap();
            let other = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![2]).unwrap();
            let reference = crate::case::Expected::for_tests(if equal { t.clone() } else { other });
            out.compare("y", &t, &reference);
            Row {
                result: CaseResult {
                    expect: Expect::MustEqual,
                    verdict,
                    output: Some(out),
                    ..finding("m/a")
                },
                snapshot: Status::NotChecked,
            }
        };
        let held = Report::new(e.clone(), vec![must(Verdict::Fail, false)], &[], 1.0);
        let proof = held.summary.proof.as_ref().unwrap();
        assert_eq!((proof.outputs_differ, proof.undetected.len()), (1, 0));
        assert_eq!(held.summary.exit_code, exit::PASS);
        let missed = Report::new(e, vec![must(Verdict::Pass, true)], &[], 1.0);
        assert_eq!(
            missed.summary.proof.as_ref().unwrap().undetected,
            vec!["m/a: Pass".to_owned()]
        );
        assert_eq!(missed.summary.exit_code, exit::MUST_EQUAL_FAILURE);
        assert!(human::summary(&missed).contains("1 UNDETECTED"));
    }

    /// Issue 40, class 18: a testing hook in the environment is named in
    /// junit.xml's failure and error messages too, as the warning promises
    /// ("Every report names it"); without one, the messages are unchanged.
    #[test]
    fn junit_failures_name_a_testing_hook() {
        let fail = |hook: Option<&str>| {
            let mut e = environment("cpu", "k", false);
            e.testing_hook = hook.map(str::to_owned);
            let mut out = CaseOutput::new("p");
            let t = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![1]).unwrap();
            let other = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![2]).unwrap();
            out.compare("y", &t, &crate::case::Expected::for_tests(other));
            let row = |verdict, name: &str| Row {
                result: CaseResult {
                    name: name.into(),
                    expect: Expect::MustEqual,
                    verdict,
                    output: Some(out.clone()),
                    message: Some("boom".into()),
                    ..finding("m/a")
                },
                snapshot: Status::NotChecked,
            };
            let rows = vec![row(Verdict::Fail, "m/fail"), row(Verdict::Error, "m/error")];
            junit::render(&Report::new(e, rows, &[], 1.0))
        };
        let hooked = fail(Some("MLX_CONFORMANCE_PLANT=m/fail"));
        assert_eq!(
            hooked
                .matches("testing hook set: MLX_CONFORMANCE_PLANT=m/fail")
                .count(),
            2,
            "{hooked}"
        );
        assert!(!fail(None).contains("testing hook"));
    }

    /// `expected-failures.json` both ways, through the run's exit code: its
    /// listed case FAILing on its backend does not fail the run, the same
    /// case passing does, and elsewhere the list says nothing.
    #[test]
    fn a_listed_failure_is_expected_and_a_listed_pass_fails_the_run() {
        let list = crate::expected::parse(crate::expected::LIST).unwrap();
        let Some(listed) = list.first() else {
            // An empty list: the both-ways check is expected::tests'.
            return;
        };
        let row = |verdict: Verdict| Row {
            result: CaseResult {
                expect: Expect::MustEqual,
                verdict,
                ..finding(&listed.case)
            },
            snapshot: Status::NotChecked,
        };
        let run = |backend: &str, verdict: Verdict| {
            Report::new(
                environment(backend, "k", false),
                vec![row(verdict)],
                &[],
                1.0,
            )
            .summary
        };
        let failed = run(&listed.backend, Verdict::Fail);
        assert_eq!(failed.exit_code, exit::PASS);
        assert_eq!(failed.expected_failures, vec![listed.case.clone()]);
        let passed = run(&listed.backend, Verdict::Pass);
        assert_eq!(passed.exit_code, exit::MUST_EQUAL_FAILURE);
        assert_eq!(passed.unexpected_passes, vec![listed.case.clone()]);
        let other = if listed.backend == "cpu" {
            "metal"
        } else {
            "cpu"
        };
        assert_eq!(
            run(other, Verdict::Fail).exit_code,
            exit::MUST_EQUAL_FAILURE
        );
        assert_eq!(run(other, Verdict::Pass).exit_code, exit::PASS);
    }
}
