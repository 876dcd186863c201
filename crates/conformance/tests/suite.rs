//! The registry, run in-process: every must-equal case passes, and every
//! must-equal case fails when the reference's input carries one flipped bit
//! (so no case is a test that cannot fail).

use conformance::case::{Backend, Expect};
use conformance::families;
use conformance::runner::{self, RunOptions, Verdict};
use oracle::Oracle;

fn run(perturb: bool) -> Vec<runner::CaseResult> {
    let oracle = Oracle::start().expect("oracle starts");
    runner::set_device(Backend::Cpu);
    oracle.set_device(Backend::Cpu).unwrap();
    let cases = families::all();
    let selected = runner::select(&cases, None).unwrap();
    let options = RunOptions {
        backend: Backend::Cpu,
        seed: 0,
        jobs: 1,
        perturb,
    };
    runner::run(&selected, &oracle, &options, &|_| {})
}

#[test]
fn every_case_runs_and_must_equal_cases_pass_on_cpu() {
    let results = run(false);
    let bad: Vec<String> = results
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Fail | Verdict::Error))
        .map(|r| format!("{} {:?} {:?}", r.name, r.verdict, r.message))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn every_must_equal_case_fails_on_a_flipped_input_bit() {
    let results = run(true);
    let undetected: Vec<&str> = results
        .iter()
        .filter(|r| r.expect == Expect::MustEqual && r.verdict != Verdict::Skip)
        .filter(|r| r.verdict != Verdict::Fail)
        .map(|r| r.name.as_str())
        .collect();
    assert!(
        undetected.is_empty(),
        "perturbation not detected by: {undetected:#?}"
    );
}
