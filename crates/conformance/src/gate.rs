//! The release gate's comparison: two runs of the suite (a baseline and a
//! candidate reference environment, same seeds), each a `report.json` plus
//! the `--keep-outputs` tensors, compared per case and per output. Every
//! case gets one [`Class`]; `gate.json` and `gate.md` say why, with the
//! first differing element's bits and ULP on both sides.
//!
//! Driven by `cargo xtask gate` through the `conformance-gate` binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use oracle::{compare, Comparison, HostTensor};
use serde::Serialize;
use serde_json::Value;

use crate::result::Verdict;
use crate::schema::{ReportCase, ReportFile};

/// What happened to a case between the baseline and the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Same verdict, same port bits, same reference bits, same finding.
    Unchanged,
    /// An MLX kernel or op changed and the port still matches: port and
    /// reference bits moved, the must-equal case still passes (or a
    /// finding's tensors moved with the same relation).
    BothMovedTogether,
    /// The reference changed and the port must follow: a must-equal FAIL on
    /// the candidate with the port's bits unchanged (or both moved apart).
    ReferenceMovedAlone,
    /// The port's bits changed and the reference's did not: a must-equal
    /// FAIL on the candidate.
    PortMovedAlone,
    /// A finding's measured relation changed.
    FindingChanged,
    /// The case exists in one run only (or runs in one only).
    NewOrRemoved,
    /// The case errored on the candidate (e.g. a reference function renamed
    /// or given a new keyword).
    CandidateError,
    /// The baseline itself does not pass this case, or a run's kept
    /// outputs are missing or unreadable: fix that first.
    HarnessProblem,
}

impl Class {
    pub fn word(self) -> &'static str {
        match self {
            Class::Unchanged => "unchanged",
            Class::BothMovedTogether => "both moved together",
            Class::ReferenceMovedAlone => "reference moved alone",
            Class::PortMovedAlone => "port moved alone",
            Class::FindingChanged => "finding changed",
            Class::NewOrRemoved => "new or removed case",
            Class::CandidateError => "candidate error",
            Class::HarnessProblem => "harness problem",
        }
    }
}

/// How one side's bits of an output moved from the baseline run to the
/// candidate run.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Bits {
    Unchanged,
    Moved {
        count: usize,
        total: usize,
        first_index: Vec<usize>,
        baseline: oracle::compare::ElementValue,
        candidate: oracle::compare::ElementValue,
        max_ulp: u64,
    },
    /// Another dtype or shape.
    Mismatch {
        what: String,
    },
}

impl From<Comparison> for Bits {
    fn from(c: Comparison) -> Self {
        match c {
            Comparison::Equal => Bits::Unchanged,
            Comparison::Differs(d) => Bits::Moved {
                count: d.count,
                total: d.total,
                first_index: d.first_index,
                baseline: d.actual,
                candidate: d.expected,
                max_ulp: d.max_ulp,
            },
            other => Bits::Mismatch {
                what: other.summary().replace("reference", "candidate"),
            },
        }
    }
}

/// One output compared across the runs: the port's bits (baseline vs
/// candidate) and the reference's.
#[derive(Debug, Clone, Serialize)]
pub struct OutputChange {
    pub name: String,
    pub port: Bits,
    /// The same for the reference's bits (must-equal outputs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<Bits>,
    /// `baseline` or `candidate` when the output exists in one run only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only_in: Option<&'static str>,
}

/// An output whose exact-oracle class moved between the runs, per side
/// (`within`, `outside`; absent: not in the oracle's scope there).
#[derive(Debug, Clone, Serialize)]
pub struct ExactChange {
    pub output: String,
    /// `port` or `reference`.
    pub side: &'static str,
    pub baseline: Option<String>,
    pub candidate: Option<String>,
}

/// Per output and side, whether it was within its exact bound
/// (`report.json`'s `exact` object of each output).
fn exact_classes(row: &ReportCase) -> BTreeMap<(String, &'static str), String> {
    let mut out = BTreeMap::new();
    for o in row.output.iter().flat_map(|o| &o.outputs) {
        for side in ["port", "reference"] {
            if let Some(outside) = o.outside(side) {
                let class = if outside == 0 { "within" } else { "outside" };
                out.insert((o.name.clone(), side), class.to_owned());
            }
        }
    }
    out
}

/// One case's classification.
#[derive(Debug, Clone, Serialize)]
pub struct CaseChange {
    pub name: String,
    pub family: String,
    pub expect: String,
    pub class: Class,
    pub baseline_verdict: Option<String>,
    pub candidate_verdict: Option<String>,
    /// Outputs whose bits moved (every output when the tensors are absent).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputChange>,
    /// A finding's top-level keys that changed: key → [baseline, candidate].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub finding: BTreeMap<String, [Value; 2]>,
    /// Outputs whose exact-oracle class changed on a side (the exact value
    /// depends on the inputs only, so this comes with moved bits).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exact: Vec<ExactChange>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The whole comparison (`gate.json`, schema version 1).
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub schema_version: u32,
    pub candidate: String,
    /// `--filter` of both runs (`None`: every case).
    pub filter: Option<String>,
    /// The self-test: the candidate's reference received perturbed inputs.
    pub perturbed_candidate: bool,
    pub baseline_environment: Value,
    pub candidate_environment: Value,
    pub summary: BTreeMap<String, usize>,
    pub exit_code: i32,
    /// Environment or harness problems that stopped the comparison.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub environment_errors: Vec<String>,
    pub cases: Vec<CaseChange>,
}

/// Exit codes of the gate (README: "Gating an MLX upgrade").
pub mod exit {
    pub const UNCHANGED: i32 = 0;
    pub const MUST_EQUAL_FAILS: i32 = 1;
    pub const CHANGED: i32 = 2;
    pub const ENVIRONMENT: i32 = 3;
}

/// A run directory: `report.json` and `outputs/`.
struct Run {
    environment: Value,
    cases: BTreeMap<String, ReportCase>,
    outputs: std::path::PathBuf,
}

fn load(dir: &Path) -> Result<Run, String> {
    let report = ReportFile::read(&dir.join("report.json"))?;
    let cases = report
        .cases
        .into_iter()
        .map(|c| (c.name.clone(), c))
        .collect();
    Ok(Run {
        environment: report.environment,
        cases,
        outputs: dir.join("outputs"),
    })
}

/// A case's kept tensors; an error when the file is unreadable, or missing
/// although the run recorded outputs for the case.
fn tensors(
    dir: &Path,
    case: &str,
    row: &ReportCase,
) -> Result<BTreeMap<String, HostTensor>, String> {
    match crate::kept::read(dir, case)? {
        Some(t) => Ok(t.into_iter().collect()),
        None if row.output.as_ref().is_some_and(|o| !o.digests.is_empty()) => Err(format!(
            "{} is missing although the run recorded outputs for `{case}`",
            crate::kept::file(dir, case).display()
        )),
        None => Ok(BTreeMap::new()),
    }
}

impl Gate {
    /// A gate with nothing compared yet.
    pub fn empty(candidate_name: &str) -> Gate {
        Gate {
            schema_version: 1,
            candidate: candidate_name.to_owned(),
            filter: None,
            perturbed_candidate: false,
            baseline_environment: Value::Null,
            candidate_environment: Value::Null,
            summary: BTreeMap::new(),
            exit_code: exit::UNCHANGED,
            environment_errors: Vec::new(),
            cases: Vec::new(),
        }
    }
}

/// Compares the runs in `baseline` and `candidate`.
pub fn compare_runs(candidate_name: &str, baseline: &Path, candidate: &Path) -> Gate {
    let mut gate = Gate::empty(candidate_name);
    let (base, cand) = match (load(baseline), load(candidate)) {
        (Ok(b), Ok(c)) => (b, c),
        (b, c) => {
            gate.environment_errors
                .extend(b.err().into_iter().chain(c.err()));
            gate.exit_code = exit::ENVIRONMENT;
            return gate;
        }
    };
    gate.baseline_environment = base.environment.clone();
    gate.candidate_environment = cand.environment.clone();
    let names: BTreeSet<&String> = base.cases.keys().chain(cand.cases.keys()).collect();
    for name in names {
        gate.cases.push(classify(
            name,
            base.cases.get(name),
            cand.cases.get(name),
            &base,
            &cand,
        ));
    }
    for c in &gate.cases {
        *gate.summary.entry(c.class.word().to_owned()).or_default() += 1;
    }
    let has = |class: Class| gate.cases.iter().any(|c| c.class == class);
    gate.exit_code = if has(Class::ReferenceMovedAlone) || has(Class::PortMovedAlone) {
        exit::MUST_EQUAL_FAILS
    } else if has(Class::CandidateError) || has(Class::HarnessProblem) {
        exit::ENVIRONMENT
    } else if gate.cases.iter().any(|c| c.class != Class::Unchanged) {
        exit::CHANGED
    } else {
        exit::UNCHANGED
    };
    gate
}

/// A verdict as gate.json writes it (report.json's word for it).
fn verdict_name(v: &Verdict) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|j| j.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn verdict(c: Option<&ReportCase>) -> Option<String> {
    c.map(|c| verdict_name(&c.verdict))
}

fn classify(
    name: &str,
    base: Option<&ReportCase>,
    cand: Option<&ReportCase>,
    b: &Run,
    c: &Run,
) -> CaseChange {
    let any = base.or(cand);
    let mut change = CaseChange {
        name: name.to_owned(),
        family: any.map(|r| r.family.clone()).unwrap_or_default(),
        expect: any
            .and_then(|r| serde_json::to_value(r.expect).ok())
            .and_then(|j| j.as_str().map(str::to_owned))
            .unwrap_or_default(),
        class: Class::Unchanged,
        baseline_verdict: verdict(base),
        candidate_verdict: verdict(cand),
        outputs: Vec::new(),
        finding: BTreeMap::new(),
        exact: Vec::new(),
        note: None,
    };
    let (Some(base), Some(cand)) = (base, cand) else {
        change.class = Class::NewOrRemoved;
        change.note = Some(
            if base.is_some() {
                "removed on the candidate"
            } else {
                "new on the candidate"
            }
            .into(),
        );
        return change;
    };
    let (bv, cv) = (&base.verdict, &cand.verdict);
    if matches!(bv, Verdict::Error | Verdict::Fail) {
        change.class = Class::HarnessProblem;
        change.note = base.message.clone();
        return change;
    }
    if *cv == Verdict::Error {
        change.class = Class::CandidateError;
        change.note = cand.message.clone();
        return change;
    }
    if (*bv == Verdict::Skip) != (*cv == Verdict::Skip) {
        change.class = Class::NewOrRemoved;
        change.note = Some(format!(
            "runs on one side only ({} vs {})",
            verdict_name(bv),
            verdict_name(cv)
        ));
        return change;
    }
    if *bv == Verdict::Skip {
        return change;
    }
    // Output bits, baseline vs candidate, port and reference.
    let (bt, ct) = match (
        tensors(&b.outputs, name, base),
        tensors(&c.outputs, name, cand),
    ) {
        (Ok(bt), Ok(ct)) => (bt, ct),
        (b, c) => {
            change.class = Class::HarnessProblem;
            change.note = Some(format!(
                "kept outputs: {}",
                b.err().or(c.err()).unwrap_or_default()
            ));
            return change;
        }
    };
    let keys: BTreeSet<String> = bt
        .keys()
        .chain(ct.keys())
        .filter_map(|k| k.split_once('/').map(|(_, n)| n.to_owned()))
        .collect();
    let side = |prefix: &str, key: &str| -> Option<Comparison> {
        let k = format!("{prefix}/{key}");
        match (bt.get(&k), ct.get(&k)) {
            (Some(x), Some(y)) => Some(compare(x, y)),
            _ => None,
        }
    };
    let (mut port_moved, mut reference_moved) = (false, false);
    for key in keys {
        let present = |t: &BTreeMap<String, HostTensor>| {
            t.contains_key(&format!("port/{key}")) || t.contains_key(&format!("reference/{key}"))
        };
        let only_in = match (present(&bt), present(&ct)) {
            (true, false) => Some("baseline"),
            (false, true) => Some("candidate"),
            _ => None,
        };
        let port = side("port", &key).unwrap_or(Comparison::Equal);
        let reference = side("reference", &key);
        port_moved |= !port.is_equal() || only_in.is_some();
        reference_moved |= reference.as_ref().is_some_and(|r| !r.is_equal());
        if only_in.is_some()
            || !port.is_equal()
            || reference.as_ref().is_some_and(|r| !r.is_equal())
        {
            change.outputs.push(OutputChange {
                name: key,
                port: port.into(),
                reference: reference.map(Bits::from),
                only_in,
            });
        }
    }
    if bt.is_empty() && ct.is_empty() {
        change.note =
            Some("no kept tensors for this case: compared by verdicts and digests".into());
        let digests = |v: &ReportCase| v.output.as_ref().map(|o| o.digests.clone());
        port_moved = digests(base) != digests(cand);
    }
    // Findings: top-level keys that changed.
    let finding = |v: &ReportCase| {
        v.output
            .as_ref()
            .and_then(|o| o.finding.clone())
            .unwrap_or(Value::Null)
    };
    let (bf, cf) = (&finding(base), &finding(cand));
    if bf != cf {
        match (bf.as_object(), cf.as_object()) {
            (Some(x), Some(y)) => {
                for k in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                    if x.get(k) != y.get(k) {
                        change.finding.insert(
                            k.clone(),
                            [
                                x.get(k).cloned().unwrap_or(Value::Null),
                                y.get(k).cloned().unwrap_or(Value::Null),
                            ],
                        );
                    }
                }
            }
            _ => {
                change
                    .finding
                    .insert("(value)".into(), [bf.clone(), cf.clone()]);
            }
        }
    }
    // The exact oracle's class per output and side.
    let (be, ce) = (exact_classes(base), exact_classes(cand));
    for key in be.keys().chain(ce.keys()).collect::<BTreeSet<_>>() {
        if be.get(key) != ce.get(key) {
            change.exact.push(ExactChange {
                output: key.0.clone(),
                side: key.1,
                baseline: be.get(key).cloned(),
                candidate: ce.get(key).cloned(),
            });
        }
    }
    change.class = if *cv == Verdict::Fail {
        if !port_moved {
            Class::ReferenceMovedAlone
        } else if !reference_moved {
            Class::PortMovedAlone
        } else {
            change.note = Some(
                "port and reference both moved, apart: the port must follow the reference".into(),
            );
            Class::ReferenceMovedAlone
        }
    } else if !change.finding.is_empty() {
        Class::FindingChanged
    } else if port_moved || reference_moved {
        Class::BothMovedTogether
    } else {
        Class::Unchanged
    };
    change
}

/// `gate.md`: a summary, then each changed case with its first differing
/// element on both sides.
pub fn markdown(g: &Gate) -> String {
    use std::fmt::Write;
    let mut md = String::new();
    let env = |v: &Value| {
        format!(
            "MLX {} · lock `{}`",
            v["mlx_version"].as_str().unwrap_or("?"),
            &v["lock_sha256"].as_str().unwrap_or("?")
                [..12.min(v["lock_sha256"].as_str().unwrap_or("?").len())]
        )
    };
    let _ = writeln!(md, "# Release gate: baseline → `{}`\n", g.candidate);
    if let Some(f) = &g.filter {
        let _ = writeln!(md, "> filtered: only cases whose name contains `{f}`\n");
    }
    if g.perturbed_candidate {
        let _ = writeln!(md, "> self-test: the candidate's reference received perturbed inputs (`--perturb-candidate`)\n");
    }
    let _ = writeln!(
        md,
        "baseline {} → candidate {} · exit code **{}**\n",
        env(&g.baseline_environment),
        env(&g.candidate_environment),
        g.exit_code
    );
    for e in &g.environment_errors {
        let _ = writeln!(md, "> environment error: {}\n", e.replace('\n', "\n> "));
    }
    let _ = writeln!(md, "| class | cases |\n|---|---:|");
    for (class, n) in &g.summary {
        let _ = writeln!(md, "| {class} | {n} |");
    }
    let left: Vec<&CaseChange> = g
        .cases
        .iter()
        .filter(|c| {
            c.exact
                .iter()
                .any(|e| e.candidate.as_deref() == Some("outside"))
        })
        .collect();
    let _ = writeln!(md, "\n{} cases have an output that leaves its exact bound on the candidate (within on the baseline or not checked there){}", left.len(), if left.is_empty() { "." } else { ":" });
    for c in &left {
        let _ = writeln!(md, "- `{}`", c.name);
    }
    // The explorer's samples (`--explore-samples`): which shapes moved.
    let samples: Vec<&CaseChange> = g
        .cases
        .iter()
        .filter(|c| c.name.starts_with("explore/"))
        .collect();
    if !samples.is_empty() {
        let moved: Vec<&&CaseChange> = samples
            .iter()
            .filter(|c| c.class != Class::Unchanged)
            .collect();
        let _ = writeln!(
            md,
            "\nExplorer samples: {} run, {} changed (their shapes are in the case names; each is under Changed cases).",
            samples.len(),
            moved.len()
        );
    }
    let changed: Vec<&CaseChange> = g
        .cases
        .iter()
        .filter(|c| c.class != Class::Unchanged)
        .collect();
    let _ = writeln!(md, "\n## Changed cases ({})\n", changed.len());
    for c in changed {
        let _ = writeln!(
            md,
            "### `{}`\n\n**{}** · {} · baseline `{}` → candidate `{}`\n",
            c.name,
            c.class.word(),
            c.expect,
            c.baseline_verdict.as_deref().unwrap_or("-"),
            c.candidate_verdict.as_deref().unwrap_or("-")
        );
        if let Some(note) = &c.note {
            let _ = writeln!(md, "- {}", note.lines().next().unwrap_or(""));
        }
        for o in &c.outputs {
            if let Some(run) = o.only_in {
                let _ = writeln!(md, "- `{}`: recorded by the {run} run only", o.name);
                continue;
            }
            let _ = writeln!(md, "- `{}`: port {}", o.name, side(&o.port));
            if let Some(r) = &o.reference {
                let _ = writeln!(md, "  reference {}", side(r));
            }
        }
        for (k, [old, new]) in &c.finding {
            let _ = writeln!(md, "- finding `{k}`: `{}` → `{}`", short(old), short(new));
        }
        for e in &c.exact {
            let _ = writeln!(
                md,
                "- exact bound of `{}` ({}): {} → {}",
                e.output,
                e.side,
                e.baseline.as_deref().unwrap_or("not checked"),
                e.candidate.as_deref().unwrap_or("not checked")
            );
        }
        md.push('\n');
    }
    md
}

fn side(b: &Bits) -> String {
    match b {
        Bits::Unchanged => "unchanged".into(),
        Bits::Moved { count, total, first_index, baseline, candidate, max_ulp } => format!(
            "{count}/{total} elements moved; first at {first_index:?}: baseline {} ({}) → candidate {} ({}); max {max_ulp} ulp",
            baseline.value, baseline.bits, candidate.value, candidate.bits
        ),
        Bits::Mismatch { what } => what.clone(),
    }
}

fn short(v: &Value) -> String {
    let t = v.to_string();
    if t.chars().count() > 200 {
        format!("{}…", t.chars().take(200).collect::<String>())
    } else {
        t
    }
}

/// The terminal table: the class counts and every changed case.
pub fn table(g: &Gate) -> String {
    let mut out = String::new();
    for e in &g.environment_errors {
        out.push_str(&format!("environment error: {e}\n"));
    }
    for (class, n) in &g.summary {
        out.push_str(&format!("{n:>5}  {class}\n"));
    }
    for c in g.cases.iter().filter(|c| c.class != Class::Unchanged) {
        out.push_str(&format!("{:<22} {}\n", c.class.word(), c.name));
    }
    out.push_str(&format!("gate: exit {}\n", g.exit_code));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oracle::DType;
    use serde_json::json;

    fn t(v: u8) -> HostTensor {
        HostTensor::new(DType::Uint8, vec![2], vec![v, 1]).unwrap()
    }

    /// (name, expect, verdict, port, reference, finding).
    type Row<'a> = (&'a str, &'a str, &'a str, Option<u8>, Option<u8>, Value);

    /// A run dir with these cases.
    fn run_dir(tag: &str, cases: &[Row]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gate-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("outputs")).unwrap();
        let mut rows = Vec::new();
        for (name, expect, verdict, port, reference, finding) in cases {
            let mut kept = Vec::new();
            if let Some(p) = port {
                kept.push(("port/y".to_owned(), t(*p)));
            }
            if let Some(r) = reference {
                kept.push(("reference/y".to_owned(), t(*r)));
            }
            crate::kept::write(&dir.join("outputs"), name, &kept).unwrap();
            rows.push(json!({"name": name, "family": "f", "expect": expect, "verdict": verdict,
                "message": if *verdict == "error" { json!("TypeError: new keyword") } else { Value::Null },
                "output": {"finding": finding, "digests": []}}));
        }
        std::fs::write(
            dir.join("report.json"),
            json!({"environment": {"mlx_version": tag, "lock_sha256": "0123456789abcdef"}, "cases": rows}).to_string(),
        )
        .unwrap();
        dir
    }

    #[test]
    fn every_class_is_told_apart_and_the_exit_code_follows_the_table() {
        let n = Value::Null;
        let base = run_dir(
            "base",
            &[
                ("same", "must_equal", "pass", Some(1), Some(1), n.clone()),
                (
                    "together",
                    "must_equal",
                    "pass",
                    Some(1),
                    Some(1),
                    n.clone(),
                ),
                (
                    "reference",
                    "must_equal",
                    "pass",
                    Some(1),
                    Some(1),
                    n.clone(),
                ),
                ("port", "must_equal", "pass", Some(1), Some(1), n.clone()),
                (
                    "finding",
                    "finding",
                    "finding",
                    Some(1),
                    None,
                    json!({"equal": true}),
                ),
                ("errors", "must_equal", "pass", Some(1), Some(1), n.clone()),
                ("removed", "must_equal", "pass", Some(1), Some(1), n.clone()),
            ],
        );
        let cand = run_dir(
            "cand",
            &[
                ("same", "must_equal", "pass", Some(1), Some(1), n.clone()),
                (
                    "together",
                    "must_equal",
                    "pass",
                    Some(2),
                    Some(2),
                    n.clone(),
                ),
                (
                    "reference",
                    "must_equal",
                    "fail",
                    Some(1),
                    Some(3),
                    n.clone(),
                ),
                ("port", "must_equal", "fail", Some(4), Some(1), n.clone()),
                (
                    "finding",
                    "finding",
                    "finding",
                    Some(1),
                    None,
                    json!({"equal": false}),
                ),
                ("errors", "must_equal", "error", None, None, n.clone()),
                ("new", "must_equal", "pass", Some(1), Some(1), n.clone()),
            ],
        );
        let g = compare_runs("c", &base, &cand);
        let class = |name: &str| g.cases.iter().find(|c| c.name == name).unwrap().class;
        assert_eq!(class("same"), Class::Unchanged);
        assert_eq!(class("together"), Class::BothMovedTogether);
        assert_eq!(class("reference"), Class::ReferenceMovedAlone);
        assert_eq!(class("port"), Class::PortMovedAlone);
        assert_eq!(class("finding"), Class::FindingChanged);
        assert_eq!(class("errors"), Class::CandidateError);
        assert_eq!(class("removed"), Class::NewOrRemoved);
        assert_eq!(class("new"), Class::NewOrRemoved);
        assert_eq!(g.exit_code, exit::MUST_EQUAL_FAILS);
        let md = markdown(&g);
        assert!(
            md.contains("baseline 1 (0x01) → candidate 3 (0x03)"),
            "{md}"
        );
        // Without the failing cases: a candidate error is an environment problem (3);
        // without it, changes alone are 2; a run against itself is 0.
        let g = compare_runs("c", &base, &base);
        assert_eq!(g.exit_code, exit::UNCHANGED);
        assert!(g.cases.iter().all(|c| c.class == Class::Unchanged));
    }

    #[test]
    fn unreadable_or_missing_kept_outputs_are_a_harness_problem() {
        let n = Value::Null;
        let rows: &[Row] = &[("c", "must_equal", "pass", Some(1), Some(1), n.clone())];
        let base = run_dir("kept-base", rows);
        let cand = run_dir("kept-cand", rows);
        let file = crate::kept::file(&cand.join("outputs"), "c");
        std::fs::write(&file, b"junk").unwrap();
        // The case recorded outputs: make its digests non-empty.
        let report = std::fs::read_to_string(cand.join("report.json")).unwrap();
        std::fs::write(
            cand.join("report.json"),
            report.replace("\"digests\":[]", "\"digests\":[[\"y\",\"ab\"]]"),
        )
        .unwrap();
        let g = compare_runs("c", &base, &cand);
        assert_eq!(g.cases[0].class, Class::HarnessProblem, "{:?}", g.cases[0]);
        assert_eq!(g.exit_code, exit::ENVIRONMENT);
        std::fs::remove_file(&file).unwrap();
        let g = compare_runs("c", &base, &cand);
        assert_eq!(g.cases[0].class, Class::HarnessProblem);
        assert!(g.cases[0].note.as_deref().unwrap_or("").contains("missing"));
    }

    #[test]
    fn a_missing_run_is_an_environment_error() {
        let g = compare_runs(
            "c",
            Path::new("/nonexistent/a"),
            Path::new("/nonexistent/b"),
        );
        assert_eq!(g.exit_code, exit::ENVIRONMENT);
        assert!(!g.environment_errors.is_empty());
    }
}
