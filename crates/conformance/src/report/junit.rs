//! JUnit XML for CI test tabs.

use quick_junit::{NonSuccessKind, Report as JUnit, TestCase, TestCaseStatus, TestSuite};

use super::model::{first_diff, Report};
use crate::runner::Verdict;
use crate::snapshots::Status;

pub fn render(report: &Report) -> String {
    let mut junit = JUnit::new("mlx-conformance");
    let mut suites: std::collections::BTreeMap<String, TestSuite> = Default::default();
    // A testing hook in the environment can turn passes into failures:
    // every failure and error message names it, as report.md does.
    let hooked = |m: String| match &report.environment.testing_hook {
        Some(hook) => format!("{m} (testing hook set: {hook})"),
        None => m,
    };
    for row in &report.cases {
        let r = &row.result;
        let status = match (&r.verdict, &row.snapshot) {
            (Verdict::Fail, _) => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(hooked(format!("must-equal failure: {}", first_diff(r).0)));
                s
            }
            (Verdict::Error, _) => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Error);
                s.set_message(hooked(r.message.clone().unwrap_or_default()));
                s
            }
            (_, Status::Drift { .. } | Status::Missing | Status::Invalid { .. }) => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(hooked("snapshot drift (see report.md)".into()));
                s
            }
            (Verdict::Skip, _) => {
                let mut s = TestCaseStatus::skipped();
                s.set_message(r.message.clone().unwrap_or_default());
                s
            }
            _ => TestCaseStatus::success(),
        };
        let mut case = TestCase::new(r.name.clone(), status);
        case.set_time(std::time::Duration::from_secs_f64(r.time_ms / 1e3));
        suites
            .entry(r.family.clone())
            .or_insert_with(|| TestSuite::new(r.family.clone()))
            .add_test_case(case);
    }
    // A missing snapshot set is one failing test under CI, not a failure
    // per case; on a user's machine, one skipped test saying so.
    if let Some(line) = &report.summary.missing_snapshot_set {
        let mut status = if report.summary.missing_set_fails {
            TestCaseStatus::non_success(NonSuccessKind::Failure)
        } else {
            TestCaseStatus::skipped()
        };
        status.set_message(line.clone());
        let mut suite = TestSuite::new("snapshot-set");
        suite.add_test_case(TestCase::new(
            report.environment.snapshot_set.clone(),
            status,
        ));
        suites.insert("snapshot-set".into(), suite);
    }
    // Each orphaned snapshot fails as the closing line counts it.
    for orphan in &report.summary.orphaned_snapshots {
        let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
        status.set_message(format!(
            "orphaned snapshot (no case records it): {orphan}; an unfiltered `fixtures accept` removes it"
        ));
        suites
            .entry("snapshot-set".into())
            .or_insert_with(|| TestSuite::new("snapshot-set"))
            .add_test_case(TestCase::new(format!("orphan {orphan}"), status));
    }
    // The exact oracle's outside-the-bound outputs, one test each: a
    // failure unless the case's snapshot pins it (then skipped, with the
    // recorded fault as its message, so it still shows).
    for (row, output, e) in super::model::exact_outside(&report.cases) {
        let pinned = matches!(row.snapshot, Status::Match | Status::Written { .. });
        let mut status = if pinned {
            TestCaseStatus::skipped()
        } else {
            TestCaseStatus::non_success(NonSuccessKind::Failure)
        };
        status.set_message(hooked(format!(
            "{}{}",
            if pinned { "recorded: " } else { "" },
            e.line_as(output, report.environment.side())
        )));
        suites
            .entry("exact-oracle".into())
            .or_insert_with(|| TestSuite::new("exact-oracle"))
            .add_test_case(TestCase::new(
                format!(
                    "{} {output}: {}",
                    row.result.name,
                    e.class.word_as(report.environment.side())
                ),
                status,
            ));
    }
    junit.add_test_suites(suites.into_values());
    junit
        .to_string()
        .unwrap_or_else(|e| format!("<!-- junit rendering failed: {e} -->"))
}
