//! The report's content: what `report.json` holds and every other format
//! (`junit.xml`, `report.md`, the terminal table) renders. The run's
//! environment, a row per case, the summaries over the rows, and the
//! words the tables share.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::mutation::MutationScore;
use crate::result::{CaseResult, Verdict};
use crate::snapshots::Status;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Version of the `report.json` schema. Bump on any breaking change.
pub const SCHEMA_VERSION: u32 = 1;

/// The environment a run saw.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub mlx_version: String,
    /// `cpu`, `metal` or `cuda` (layers::Backend).
    pub backend: String,
    /// What `--device` asked for: `cpu` or `gpu`.
    pub device: String,
    /// The device's own name as MLX reports it (e.g. `NVIDIA H200`).
    pub device_name: String,
    /// The device's architecture string (e.g. `sm_90`, `applegpu_g13s`).
    pub architecture: String,
    /// Host versions that can change GPU bits (CUDA: driver, runtime).
    pub host: BTreeMap<String, String>,
    /// MLX's kernel-affecting settings as this run's MLX read them
    /// (`crate::kernel_settings`: name -> effective value).
    pub kernel_settings: BTreeMap<String, String>,
    /// The snapshot set's device key (see `snapshots::device_key`).
    pub device_family: String,
    /// Whether the key was declared (`--device-family`) rather than derived.
    pub device_family_declared: bool,
    pub snapshot_set: String,
    /// The commands that review and record this set (printed by every
    /// report the same way).
    pub set_commands: crate::snapshots::SetCommands,
    pub lock_sha256: String,
    pub libmlx: String,
    pub seed: u64,
    /// `--filter` of this run (absent: every case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// A proof run (`--perturb`): must-equal cases are meant to fail.
    pub perturb: bool,
    /// `--exact-faults`: faults planted on the reference side, measured.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact_faults: bool,
    /// `--tier` of this run.
    pub tier: crate::case::Tier,
    /// Selected cases this tier does not run (deep-tier cases in a
    /// default run; `--tier deep` runs them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deep_only_not_run: usize,
    /// Whether snapshots were checked (not under `--perturb`, another
    /// `--seed` or `--no-snapshots`).
    pub snapshots_checked: bool,
    /// Whether MLX's buffer cache was poisoned (`MLX_CONFORMANCE_POISON`;
    /// off, an unwritten output may hold a lucky zero or a stale result).
    pub poison: bool,
    /// `--candidate`: the command whose outputs stood for the port's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<String>,
    /// The testing hooks found in the environment (`MLX_CONFORMANCE_PLANT=…`,
    /// which flips port bits on purpose; `MLX_CONFORMANCE_FAULT=…`, which
    /// crashes or stops workers on purpose), each with what it does: named
    /// in every report, so a leftover one never passes for a real FAIL or
    /// a real crash (the run fills it from `config::testing_hooks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testing_hook: Option<String>,
}

impl Environment {
    /// What stood for the port in this run's rows: `candidate` under
    /// `--candidate`, else `port`.
    pub fn side(&self) -> &'static str {
        if self.candidate.is_some() {
            "candidate"
        } else {
            "port"
        }
    }
}

/// One case in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub result: CaseResult,
    pub snapshot: Status,
}

/// Per-family totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FamilySummary {
    pub cases: usize,
    pub wall_ms: f64,
}

/// Counts over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub findings: usize,
    pub skipped: usize,
    pub errors: usize,
    pub drifted: usize,
    pub orphaned_snapshots: Vec<String>,
    /// The one-line diagnosis when the whole snapshot set is missing (the
    /// cases are then not gated one by one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_snapshot_set: Option<String>,
    /// Whether the missing set fails the run (under CI); a user's own run
    /// reports it and keeps the verdicts' exit code.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing_set_fails: bool,
    pub wall_ms: f64,
    /// Must-equal cases that FAILed as `expected-failures.json` lists them
    /// for this backend (they do not fail the run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_failures: Vec<String>,
    /// Listed cases that passed: each fails the run (remove the entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unexpected_passes: Vec<String>,
    /// The compiled-in list could not be read (exit 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_failures_error: Option<String>,
    pub exit_code: i32,
    /// The exact oracle over every output in its scope.
    pub exact: ExactSummary,
    /// `--exact-faults` only: the exact oracle's mutation score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutation: Option<crate::mutation::MutationScore>,
    /// Every run: the latest recorded mutation score per backend and
    /// family, with the run that produced it (`mutation::RECORDED`).
    pub mutation_recorded: Vec<crate::mutation::RecordedScore>,
    /// A proof run (`--perturb`) only: whether every must-equal output can
    /// fail. It decides the run's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proof: Option<Proof>,
}

/// The proof run's verdict: with every perturbable argument perturbed,
/// every must-equal case that ran must FAIL, each output differing unless
/// declared derived.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Proof {
    /// Must-equal outputs that differ, as they must.
    pub outputs_differ: usize,
    /// Outputs no perturbable argument reaches (listed in report.md).
    pub derived: usize,
    /// What the perturbation did not reach: `case · output`, or a
    /// must-equal case that did not FAIL with its verdict.
    pub undetected: Vec<String>,
}

impl Proof {
    fn of(rows: &[Row]) -> Self {
        let mut p = Proof::default();
        for r in rows
            .iter()
            .map(|r| &r.result)
            .filter(|r| r.expect == crate::case::Expect::MustEqual && r.verdict != Verdict::Skip)
        {
            if r.verdict != Verdict::Fail {
                p.undetected.push(format!("{}: {:?}", r.name, r.verdict));
                continue;
            }
            for o in r.output.iter().flat_map(|out| &out.outputs) {
                match &o.derived {
                    Some(_) => p.derived += 1,
                    None if o.comparison.is_equal() => {
                        p.undetected.push(format!("{} · {}", r.name, o.name))
                    }
                    None => p.outputs_differ += 1,
                }
            }
        }
        p
    }
}

/// What the exact oracle found over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExactSummary {
    /// Outputs measured against the exact oracle (both sides each).
    pub outputs_checked: usize,
    /// Within an informative bound (one that zeros would exceed).
    pub within: usize,
    /// `case: output` within a bound wider than every value (zeros would
    /// pass it): checked, but it cannot tell much.
    pub uninformative: Vec<String>,
    /// `case: output` where the reference is outside its bound: the
    /// reference computes the wrong thing there.
    pub reference_outside: Vec<String>,
    /// `case: output` where only the port is outside (a port bug).
    pub port_outside: Vec<String>,
}

impl ExactSummary {
    fn of(rows: &[Row]) -> Self {
        use crate::exactness::ExactClass;
        let mut s = ExactSummary::default();
        for row in rows {
            let Some(out) = &row.result.output else {
                continue;
            };
            for (output, e) in out.exact_checks() {
                s.outputs_checked += 1;
                let name = format!("{}: {output}", row.result.name);
                match e.class {
                    ExactClass::Within if e.informative => s.within += 1,
                    ExactClass::Within => s.uninformative.push(name),
                    ExactClass::ReferenceOutside => s.reference_outside.push(name),
                    ExactClass::PortOutside => s.port_outside.push(name),
                }
            }
        }
        s
    }
}

/// Every output outside the exact bound: (row, output name, check).
pub fn exact_outside(rows: &[Row]) -> Vec<(&Row, &str, &crate::exactness::ExactCheck)> {
    rows.iter()
        .flat_map(|row| {
            row.result.output.iter().flat_map(move |out| {
                out.exact_checks()
                    .filter(|(_, e)| e.class != crate::exactness::ExactClass::Within)
                    .map(move |(name, e)| (row, name, e))
            })
        })
        .collect()
}

/// Findings measured on a GPU backend set against the same cases' findings
/// in the recorded CPU set (same OS, architecture and MLX version).
#[derive(Debug, Clone, Default, Serialize)]
pub struct VsCpu {
    /// The CPU set read.
    pub cpu_set: String,
    /// Findings with the same value on both.
    pub same: usize,
    /// Finding cases with no CPU record (e.g. GPU-only cases).
    pub no_cpu_record: usize,
    /// Every finding whose value differs, with both values.
    pub differing: Vec<FindingDiff>,
}

/// One finding that differs between the CPU set and this run.
#[derive(Debug, Clone, Serialize)]
pub struct FindingDiff {
    pub case: String,
    pub cpu: serde_json::Value,
    pub now: serde_json::Value,
}

impl VsCpu {
    /// Compares this run's findings with the CPU set in `cpu_dir`.
    pub fn compare(cpu_dir: &Path, rows: &[Row]) -> Self {
        let mut vs = VsCpu {
            cpu_set: cpu_dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            ..VsCpu::default()
        };
        for row in rows.iter().filter(|r| r.result.verdict == Verdict::Finding) {
            let Some(now) = row.result.output.as_ref().and_then(|o| o.finding.clone()) else {
                continue;
            };
            let file = cpu_dir.join(crate::snapshots::file_name(&row.result.name));
            let cpu = crate::snapshots::read(&file)
                .ok()
                .flatten()
                .and_then(|body| body.get("finding").cloned())
                .filter(|f| !f.is_null());
            match cpu {
                None => vs.no_cpu_record += 1,
                Some(cpu) if cpu == now => vs.same += 1,
                Some(cpu) => vs.differing.push(FindingDiff {
                    case: row.result.name.clone(),
                    cpu,
                    now,
                }),
            }
        }
        vs
    }
}

/// The whole report (`report.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema_version: u32,
    /// Every selected case has its row. Always true in a written report:
    /// an interrupted run (Ctrl-C, SIGTERM) exits 130 and writes none, and
    /// reports are replaced whole (see `write`), so a reader never sees a
    /// partial one; the field stays so a consumer need not know that.
    pub complete: bool,
    pub environment: Environment,
    pub summary: Summary,
    pub families: BTreeMap<String, FamilySummary>,
    /// On a GPU backend: findings side by side with the recorded CPU set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_cpu: Option<VsCpu>,
    /// On a GPU backend with no CPU set to compare with: the set looked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_cpu_missing: Option<String>,
    pub cases: Vec<Row>,
}

/// Exit codes (documented in the README).
pub mod exit {
    pub const PASS: i32 = 0;
    pub const MUST_EQUAL_FAILURE: i32 = 1;
    pub const DRIFT: i32 = 2;
    pub const ENVIRONMENT: i32 = 3;
}

impl Report {
    pub fn new(
        environment: Environment,
        rows: Vec<Row>,
        orphans: &[PathBuf],
        wall_ms: f64,
    ) -> Self {
        let mut s = Summary {
            total: rows.len(),
            wall_ms,
            ..Summary::default()
        };
        let mut families: BTreeMap<String, FamilySummary> = BTreeMap::new();
        for row in &rows {
            let f = families.entry(row.result.family.clone()).or_default();
            f.cases += 1;
            f.wall_ms += row.result.time_ms;
            match row.result.verdict {
                Verdict::Pass => s.passed += 1,
                Verdict::Fail => s.failed += 1,
                Verdict::Finding => s.findings += 1,
                Verdict::Skip => s.skipped += 1,
                Verdict::Error => s.errors += 1,
            }
            if matches!(
                row.snapshot,
                Status::Drift { .. } | Status::Missing | Status::Invalid { .. }
            ) {
                s.drifted += 1;
            }
        }
        s.orphaned_snapshots = orphans.iter().map(|p| p.display().to_string()).collect();
        s.exact = ExactSummary::of(&rows);
        if environment.exact_faults {
            s.mutation = Some(crate::mutation::MutationScore::of_run(
                &rows,
                &environment.backend,
                crate::mutation::MutationRun {
                    seed: environment.seed,
                    tier: environment.tier.as_str().to_owned(),
                    filter: environment.filter.clone(),
                    mlx_version: environment.mlx_version.clone(),
                    device: environment.device_name.clone(),
                },
            ));
        }
        // The compiled-in list is checked by a unit test; an unreadable
        // one would give no section rather than stop a report.
        s.mutation_recorded =
            crate::mutation::parse_recorded(crate::mutation::RECORDED).unwrap_or_default();
        // Precedence: a broken verdict first, then a run that could not
        // evaluate everything, then drift.
        if environment.perturb {
            s.proof = Some(Proof::of(&rows));
        }
        // Expected failures by design (not in a proof run, whose cases are
        // all meant to fail).
        let mut unlisted_failed = s.failed;
        if s.proof.is_none() {
            match crate::expected::parse(crate::expected::LIST) {
                Ok(list) => {
                    let c = crate::expected::check(
                        &list,
                        &environment.backend,
                        rows.iter().map(|r| &r.result),
                    );
                    unlisted_failed -= c.expected.len();
                    s.expected_failures = c.expected.into_iter().map(|(n, _)| n).collect();
                    s.unexpected_passes = c.unexpected_passes.into_iter().map(|(n, _)| n).collect();
                }
                Err(e) => s.expected_failures_error = Some(e),
            }
        }
        s.exit_code = if let Some(proof) = &s.proof {
            // The proof run: its cases are meant to fail; exit 1 when the
            // perturbation went undetected anywhere.
            if !proof.undetected.is_empty() {
                exit::MUST_EQUAL_FAILURE
            } else if s.errors > 0 {
                exit::ENVIRONMENT
            } else {
                exit::PASS
            }
        } else if unlisted_failed > 0 || !s.unexpected_passes.is_empty() {
            exit::MUST_EQUAL_FAILURE
        } else if s.errors > 0 || s.expected_failures_error.is_some() {
            exit::ENVIRONMENT
        } else if s.drifted > 0 || !s.orphaned_snapshots.is_empty() {
            exit::DRIFT
        } else {
            exit::PASS
        };
        Self {
            schema_version: SCHEMA_VERSION,
            complete: true,
            environment,
            summary: s,
            families,
            vs_cpu: None,
            vs_cpu_missing: None,
            cases: rows,
        }
    }
}

impl Report {
    /// A GPU run's findings beside the CPU set of the same device key
    /// ([`crate::snapshots::cpu_key_beside`]: the declared runner family,
    /// else the CPU's own key) and MLX version, under `fixtures`; when that
    /// set is not recorded, `vs_cpu_missing` names it.
    pub fn compare_with_cpu_set(&mut self, fixtures: &Path) {
        let e = &self.environment;
        let declared = e.device_family_declared.then_some(e.device_family.as_str());
        let cpu_dir = crate::snapshots::set_dir(
            fixtures,
            crate::case::Backend::Cpu.as_str(),
            &crate::snapshots::cpu_key_beside(declared),
            &e.mlx_version,
        );
        if crate::snapshots::set_exists(&cpu_dir).unwrap_or(false) {
            self.vs_cpu = Some(VsCpu::compare(&cpu_dir, &self.cases));
            self.vs_cpu_missing = None;
        } else {
            self.vs_cpu = None;
            self.vs_cpu_missing = cpu_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
        }
    }

    /// Marks the run's snapshot set as missing (`line` says which, where
    /// and how to record it). With `required` (under CI): exit code 2
    /// unless a failure or error already decides it; otherwise the
    /// verdicts decide alone.
    pub fn with_missing_set(mut self, line: String, required: bool) -> Self {
        self.summary.missing_snapshot_set = Some(line);
        self.summary.missing_set_fails = required;
        if required && self.summary.exit_code == exit::PASS {
            self.summary.exit_code = exit::DRIFT;
        }
        self
    }
}

/// The first difference of a row, for tables.
pub fn first_diff(row: &CaseResult) -> (String, String) {
    let Some(out) = &row.output else {
        return ("-".into(), "-".into());
    };
    for o in &out.outputs {
        match &o.comparison {
            oracle::Comparison::Equal => continue,
            oracle::Comparison::Differs(d) => {
                return (
                    format!(
                        "{}{:?}: {} vs ref {}",
                        o.name, d.first_index, d.actual.bits, d.expected.bits
                    ),
                    d.max_ulp.to_string(),
                )
            }
            other => return (format!("{}: {}", o.name, other.summary()), "-".into()),
        }
    }
    (
        "-".into(),
        if out.outputs.is_empty() {
            "-".into()
        } else {
            "0".into()
        },
    )
}

/// What a row's snapshot status asks the reader to do (terminal and
/// report.md print the same words and commands).
pub fn snapshot_note(status: &Status, commands: &crate::snapshots::SetCommands) -> Option<String> {
    match status {
        Status::Invalid { error } => Some(error.clone()),
        Status::Missing => Some(format!(
            "no snapshot recorded for this case (new case?): review with `{}`, record with `{}`",
            commands.review, commands.accept
        )),
        Status::Drift { recorded, now } => {
            let moved = crate::snapshots::moved_outputs(recorded.as_ref(), now);
            let what = if moved.is_empty() {
                "the finding or reference path differs from the snapshot".to_owned()
            } else {
                format!("output bits moved: {}", moved.join(", "))
            };
            Some(format!("{what}: see report.md, or `{}`", commands.review))
        }
        _ => None,
    }
}

/// A short verdict word for tables.
pub fn verdict_word(row: &Row) -> &'static str {
    match (&row.result.verdict, &row.snapshot) {
        (Verdict::Pass, Status::Drift { .. } | Status::Missing | Status::Invalid { .. }) => "DRIFT",
        (Verdict::Finding, Status::Drift { .. } | Status::Missing | Status::Invalid { .. }) => {
            "DRIFT"
        }
        (Verdict::Pass, _) => "pass",
        (Verdict::Fail, _) => "FAIL",
        (Verdict::Finding, _) => "finding",
        (Verdict::Skip, _) => "skip",
        (Verdict::Error, _) => "ERROR",
    }
}

// The mutation score is a summary of the rows, as the others here are.
impl MutationScore {
    /// Over the must-equal rows' planted faults.
    pub fn of(rows: &[Row], backend: &str) -> Self {
        let mut s = MutationScore {
            backend: backend.to_owned(),
            ..Self::default()
        };
        s.add_rows(rows);
        s
    }
    /// [`MutationScore::of`], naming the run that produced it.
    pub fn of_run(rows: &[Row], backend: &str, run: crate::mutation::MutationRun) -> Self {
        let mut s = Self::of(rows, backend);
        s.run = Some(run);
        s
    }
    fn add_rows(&mut self, rows: &[Row]) {
        let s = self;
        for row in rows {
            let r = &row.result;
            if r.expect != crate::case::Expect::MustEqual {
                continue;
            }
            let Some(out) = &r.output else { continue };
            for f in &out.faults {
                let kind = f.kind.name();
                s.total.add(f.flagged);
                s.by_family
                    .entry(r.family.clone())
                    .or_default()
                    .add(f.flagged);
                s.by_kind.entry(kind.to_owned()).or_default().add(f.flagged);
                s.by_family_kind
                    .entry(format!("{} · {kind}", r.family))
                    .or_default()
                    .add(f.flagged);
                if !f.flagged {
                    s.escapes.push(crate::mutation::Escape {
                        case: r.name.clone(),
                        output: f.output.clone(),
                        kind: kind.to_owned(),
                        max_ratio: f.max_ratio,
                        changed: f.changed,
                        total: f.total,
                    });
                }
            }
        }
    }
}
