//! The perturbation proof of the whole suite, run as a user runs it: the
//! built `conformance` binary with its worker processes, `--perturb`. With
//! every perturbable argument perturbed, every must-equal case must FAIL
//! and each of its outputs differ, except outputs declared derived (no
//! perturbable argument reaches them). What it checks is pinned in
//! `tests/data/perturbation-proof.txt`: a floor on the number of
//! must-equal cases that failed as they must (a run that selected or ran
//! fewer cannot pass), and the derived outputs, both ways (a new one, or one
//! that is no longer derived, fails).
//!
//! Only the must-equal cases run: findings measure the reference and have
//! nothing to prove. `--describe` gives every registered case as data,
//! `--cases` runs the must-equal ones, and the report must name each
//! must-equal case `--list` names. That the unperturbed suite passes is
//! `cargo xtask test`'s runner step.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;

/// What this test reads of report.json (kept local and small: the
/// report's own types live with the runner).
#[derive(Deserialize)]
struct Report {
    summary: Summary,
    cases: Vec<Row>,
}

#[derive(Deserialize)]
struct Summary {
    exit_code: i32,
    proof: Option<Proof>,
}

#[derive(Deserialize)]
struct Proof {
    outputs_differ: usize,
    derived: usize,
    undetected: Vec<String>,
}

#[derive(Deserialize)]
struct Row {
    name: String,
    expect: String,
    verdict: String,
    output: Option<CaseOutput>,
}

#[derive(Deserialize)]
struct CaseOutput {
    outputs: Vec<NamedOutput>,
}

#[derive(Deserialize)]
struct NamedOutput {
    name: String,
    derived: Option<String>,
}

/// `tests/data/perturbation-proof.txt`: `checked >= N`, then one
/// `case · output` per derived output.
struct Pinned {
    path: PathBuf,
    checked_at_least: usize,
    derived: BTreeSet<String>,
}

fn pinned() -> Pinned {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/perturbation-proof.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut checked_at_least = None;
    let mut derived = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(n) = line.strip_prefix("checked >= ") {
            checked_at_least = Some(n.parse().expect("`checked >= N`: N a number"));
        } else {
            assert!(line.contains(" · "), "not `case · output`: {line}");
            assert!(derived.insert(line.to_owned()), "listed twice: {line}");
        }
    }
    Pinned {
        checked_at_least: checked_at_least.expect("no `checked >= N` line"),
        derived,
        path,
    }
}

fn conformance(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(args)
        .env("CI", "true")
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .output()
        .expect("the conformance binary starts")
}

fn stdout(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The registered must-equal cases (`--list`), and their descriptions
/// (`--describe`), one JSON line each.
fn must_equal_cases() -> (BTreeSet<String>, String) {
    let names: BTreeSet<String> = stdout(&conformance(&["--list"]))
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            (words.next()? == "MustEqual").then(|| name.to_owned())
        })
        .collect();
    let mut described = String::new();
    for line in stdout(&conformance(&["--describe"])).lines() {
        let d: serde_json::Value = serde_json::from_str(line).unwrap();
        if names.contains(d["name"].as_str().unwrap()) {
            described.push_str(line);
            described.push('\n');
        }
    }
    assert_eq!(
        described.lines().count(),
        names.len(),
        "every must-equal case is described"
    );
    (names, described)
}

fn difference(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

/// The proof, per output, over every registered must-equal case.
#[test]
fn every_must_equal_output_differs_on_perturbed_inputs() {
    let pinned = pinned();
    let (names, described) = must_equal_cases();
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("must-equal.jsonl");
    std::fs::write(&cases, described).unwrap();
    let out_dir = dir.path().join("report");
    let run = conformance(&[
        "--device",
        "cpu",
        "--perturb",
        "--no-snapshots",
        "--cases",
        cases.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Report = serde_json::from_slice(
        &std::fs::read(out_dir.join("report.json"))
            .unwrap_or_else(|e| panic!("no report.json ({e}): {said}")),
    )
    .unwrap();
    let proof = report
        .summary
        .proof
        .expect("a --perturb report has a proof");
    assert!(
        proof.undetected.is_empty(),
        "perturbation not detected by {} outputs or cases: {:#?}",
        proof.undetected.len(),
        proof.undetected
    );
    assert_eq!(report.summary.exit_code, 0, "{said}");
    assert_eq!(run.status.code(), Some(0), "{said}");

    let ran: BTreeSet<String> = report.cases.iter().map(|r| r.name.clone()).collect();
    assert_eq!(ran, names, "the run's cases are --list's must-equal cases");
    let mut checked = 0;
    let mut derived = BTreeSet::new();
    for r in &report.cases {
        assert_eq!(r.expect, "must_equal", "{}", r.name);
        match r.verdict.as_str() {
            "skip" => continue,
            "fail" => checked += 1,
            other => panic!("{}: {other} under --perturb", r.name),
        }
        for o in r.output.iter().flat_map(|out| &out.outputs) {
            if o.derived.is_some() {
                derived.insert(format!("{} · {}", r.name, o.name));
            }
        }
    }
    assert_eq!(derived.len(), proof.derived, "the report's own count");
    eprintln!(
        "proof: {checked} must-equal cases failed as they must, {} outputs differ, {} derived",
        proof.outputs_differ,
        derived.len()
    );
    assert!(
        checked >= pinned.checked_at_least,
        "{checked} must-equal cases checked, fewer than the {} pinned in {}",
        pinned.checked_at_least,
        pinned.path.display()
    );
    let (new, gone) = (
        difference(&derived, &pinned.derived),
        difference(&pinned.derived, &derived),
    );
    assert!(
        new.is_empty() && gone.is_empty(),
        "derived outputs differ from {} (edit it when the change means it)\n\
         newly derived ({}):\n{}\nno longer derived ({}):\n{}",
        pinned.path.display(),
        new.len(),
        new.join("\n"),
        gone.len(),
        gone.join("\n")
    );
}
