//! Expected failures by design, as data (`crates/conformance/expected-failures.json`,
//! compiled in: a bundle carries it): a must-equal case that FAILs on a
//! backend for a known, written-down reason. Checked both ways, as
//! wasmtime's should-fail list is: a listed case that FAILs does not fail
//! the run (the report names it), a listed case that passes fails it (the
//! entry must go), and every other FAIL fails it as always.

use serde::Deserialize;

use crate::result::{CaseResult, Verdict};

/// The list, as compiled in.
pub const LIST: &str = include_str!("../expected-failures.json");

/// One listed case.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailure {
    /// The case's full name.
    pub case: String,
    /// The backend it fails on (`cpu`, `metal`, `cuda`).
    pub backend: String,
    /// Why, and what removes the entry.
    pub reason: String,
}

/// Parses a list (an error names the problem).
pub fn parse(text: &str) -> Result<Vec<ExpectedFailure>, String> {
    let list: Vec<ExpectedFailure> =
        serde_json::from_str(text).map_err(|e| format!("expected-failures.json: {e}"))?;
    for e in &list {
        if e.backend.parse::<crate::case::Backend>().is_err() {
            return Err(format!(
                "expected-failures.json: `{}`: backend `{}` is none of cpu, metal, cuda",
                e.case, e.backend
            ));
        }
        if e.reason.trim().is_empty() {
            return Err(format!("expected-failures.json: `{}`: no reason", e.case));
        }
    }
    Ok(list)
}

/// What the list says of one run's results on `backend`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Listed cases that FAILed as listed: `(case, reason)`.
    pub expected: Vec<(String, String)>,
    /// Listed cases that passed: each fails the run.
    pub unexpected_passes: Vec<(String, String)>,
}

/// Checks `results` of a run on `backend` against `list` (cases the run
/// did not select are not judged).
pub fn check<'a>(
    list: &[ExpectedFailure],
    backend: &str,
    results: impl IntoIterator<Item = &'a CaseResult>,
) -> Checked {
    let mut out = Checked::default();
    for r in results {
        let Some(e) = list
            .iter()
            .find(|e| e.case == r.name && e.backend == backend)
        else {
            continue;
        };
        match r.verdict {
            Verdict::Fail => out.expected.push((r.name.clone(), e.reason.clone())),
            Verdict::Pass => out
                .unexpected_passes
                .push((r.name.clone(), e.reason.clone())),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Expect;

    fn result(name: &str, verdict: Verdict) -> CaseResult {
        CaseResult {
            verdict,
            ..CaseResult::new(name, "f", "r", Expect::MustEqual)
        }
    }

    #[test]
    fn the_compiled_list_parses() {
        parse(LIST).unwrap();
    }

    #[test]
    fn a_listed_case_is_judged_both_ways_on_its_backend_only() {
        let list = parse(
            r#"[{"case": "a/x", "backend": "cuda", "reason": "known"},
                {"case": "a/y", "backend": "cuda", "reason": "fixed?"}]"#,
        )
        .unwrap();
        let results = [
            result("a/x", Verdict::Fail),
            result("a/y", Verdict::Pass),
            result("a/z", Verdict::Fail),
        ];
        let c = check(&list, "cuda", &results);
        assert_eq!(c.expected, vec![("a/x".to_owned(), "known".to_owned())]);
        assert_eq!(
            c.unexpected_passes,
            vec![("a/y".to_owned(), "fixed?".to_owned())]
        );
        // Another backend: nothing is listed there.
        assert_eq!(check(&list, "cpu", &results), Checked::default());
    }

    #[test]
    fn a_bad_list_is_refused_naming_the_case() {
        let e = parse(r#"[{"case": "a", "backend": "tpu", "reason": "r"}]"#).unwrap_err();
        assert!(e.contains("`a`") && e.contains("tpu"), "{e}");
        let e = parse(r#"[{"case": "a", "backend": "cuda", "reason": " "}]"#).unwrap_err();
        assert!(e.contains("no reason"), "{e}");
        assert!(parse(r#"[{"case": "a", "backend": "cuda"}]"#).is_err());
    }
}
