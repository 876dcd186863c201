//! What running a case gave: its verdict and result row (a report.json
//! row, and the line a worker process answers with).

use serde::{Deserialize, Serialize};

use crate::case::{CaseOutput, Expect};
pub use crate::error::ErrorKind;

/// A case's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Must-equal and every output bit-identical.
    Pass,
    /// Must-equal and some output differs.
    Fail,
    /// A finding was measured (whether it matches the record is the
    /// gate's business).
    Finding,
    /// Cannot run on this backend.
    Skip,
    /// The case could not be evaluated (exception, panic, bad setup).
    Error,
}

impl Verdict {
    /// The word reports use (`pass`, `FAIL`, `finding`, `skip`, `ERROR`).
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Finding => "finding",
            Verdict::Skip => "skip",
            Verdict::Error => "ERROR",
        }
    }
}

/// The result of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    pub name: String,
    pub family: String,
    pub reference: String,
    /// Set when no single reference function exists for the case: the
    /// reference pieces the glue composes (see `Case::glue_composed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub glue_composed: Vec<String>,
    pub expect: Expect,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<CaseOutput>,
    /// Skip reason or error message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Set on an ERROR (and on a skip for an unsupported op): whose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    pub time_ms: f64,
}

impl CaseResult {
    /// A result with no verdict yet (a skip until run), no output and no
    /// message.
    pub fn new(name: &str, family: &str, reference: &str, expect: Expect) -> Self {
        CaseResult {
            name: name.to_owned(),
            family: family.to_owned(),
            reference: reference.to_owned(),
            glue_composed: Vec::new(),
            expect,
            verdict: Verdict::Skip,
            output: None,
            message: None,
            error_kind: None,
            time_ms: 0.0,
        }
    }
}
