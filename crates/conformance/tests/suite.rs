//! The registry, run in-process: every must-equal case fails when the
//! reference's input carries one flipped bit (so no case is a test that
//! cannot fail). That the unperturbed suite passes is `cargo xtask test`'s
//! runner step (the whole default suite through the CLI, its exit code),
//! which this file no longer repeats in-process: CI's time budget.

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

/// The proof, per output: with every perturbable argument perturbed (see
/// `conformance::reference::Perturb`), every must-equal case fails and each
/// of its outputs differs, except outputs declared derived (listed).
#[test]
fn every_must_equal_output_differs_on_perturbed_inputs() {
    let results = run(true);
    let mut undetected = Vec::new();
    let mut derived = Vec::new();
    for r in results
        .iter()
        .filter(|r| r.expect == Expect::MustEqual && r.verdict != Verdict::Skip)
    {
        if r.verdict != Verdict::Fail {
            undetected.push(format!("{}: {:?} {:?}", r.name, r.verdict, r.message));
            continue;
        }
        for o in r.output.iter().flat_map(|out| &out.outputs) {
            match &o.derived {
                Some(why) => derived.push(format!("{} · {}: {why}", r.name, o.name)),
                None if o.comparison.is_equal() => {
                    undetected.push(format!("{} · {}", r.name, o.name))
                }
                None => {}
            }
        }
    }
    eprintln!(
        "{} outputs declared derived:\n{}",
        derived.len(),
        derived.join("\n")
    );
    assert!(
        undetected.is_empty(),
        "perturbation not detected by {} outputs: {undetected:#?}",
        undetected.len()
    );
}
