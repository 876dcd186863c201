//! Runner behaviour that users rely on: a crash inside one case is that
//! case's harness error and the run continues; cases that cannot run on
//! this backend are reported skips; an unknown filter names the closest
//! cases.

use conformance::case::{Backend, Case, CaseError, CaseOutput};
use conformance::runner::{self, RunOptions, Verdict};
use oracle::Oracle;

fn cases() -> Vec<Case> {
    vec![
        Case::must_equal("t/panics", "t", "none", |_| panic!("boom inside the case")),
        Case::must_equal("t/errors", "t", "none", |_| {
            Err(CaseError::Port("bad shape".into()))
        }),
        Case::must_equal("t/python-raises", "t", "none", |ctx| {
            conformance::reference::selftest::raise_value_error(ctx, "from python")?;
            Ok(CaseOutput::new("-"))
        }),
        Case::must_equal("t/metal-only", "t", "none", |_| Ok(CaseOutput::new("-")))
            .only_on(&[Backend::Metal], "needs the Metal kernel"),
        Case::must_equal("t/ok", "t", "none", |ctx| {
            let t = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![7]).unwrap();
            let mut out = CaseOutput::new("-");
            out.compare("y", &t, &conformance::reference::selftest::echo(ctx, &t)?);
            Ok(out)
        }),
        // Before: a must-equal case that compared nothing passed.
        Case::must_equal("t/compares-nothing", "t", "none", |_| {
            Ok(CaseOutput::new("-"))
        }),
    ]
}

#[test]
fn a_crash_is_that_cases_error_and_the_run_continues() {
    let oracle = Oracle::start().unwrap();
    let cases = cases();
    let selected = runner::select(&cases, None).unwrap();
    let options = RunOptions {
        backend: Backend::Cpu,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let results = runner::run(&selected, &oracle, &options, &|_| {});
    let verdicts: Vec<&Verdict> = results.iter().map(|r| &r.verdict).collect();
    assert_eq!(
        verdicts,
        [
            &Verdict::Error,
            &Verdict::Error,
            &Verdict::Error,
            &Verdict::Skip,
            &Verdict::Pass,
            &Verdict::Error
        ]
    );
    assert!(results[5]
        .message
        .as_deref()
        .unwrap()
        .contains("compared no output"));
    assert!(results[0]
        .message
        .as_deref()
        .unwrap()
        .contains("boom inside the case"));
    assert!(results[1].message.as_deref().unwrap().contains("bad shape"));
    let python = results[2].message.as_deref().unwrap();
    assert!(
        python.contains("t/python-raises") && python.contains("Traceback"),
        "{python}"
    );
    assert_eq!(
        results[3].message.as_deref(),
        Some("needs the Metal kernel")
    );
}

#[test]
fn an_unknown_filter_lists_the_closest_case_names() {
    let cases = cases();
    let err = runner::select(&cases, Some("t/metal-onyl")).err().unwrap();
    assert!(err.contains("t/metal-only"), "{err}");
    assert_eq!(runner::select(&cases, Some("t/ok")).unwrap().len(), 1);
}
