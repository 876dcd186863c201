//! Why a case reached no verdict: [`CaseError`] (what a case's run returns)
//! and [`ErrorKind`] (what a result row carries).

use oracle::OracleError;
use serde::{Deserialize, Serialize};

/// Who or what stopped a case from reaching a verdict (an ERROR row),
/// or why it was skipped for a substitute: the kind, so no reader parses
/// the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The port refused or failed where the reference did not.
    Port,
    /// The reference raised.
    Reference,
    /// The harness itself (inputs, a case that compares nothing, a panic,
    /// a file it could not write).
    Harness,
    /// A substitute crashed, hung, broke its protocol, or gave nothing
    /// comparable.
    #[serde(rename = "candidate")]
    Substitute,
    /// A substitute does not implement an op the case calls (a skip).
    Unsupported,
    /// The case ran past its time limit.
    Timeout,
    /// The process running the case crashed (a signal, an early exit).
    Crash,
    /// A substitute refused where the reference computed, as a refusal it
    /// declared (a finding row, not an error).
    Policy,
}

/// A case that could not be evaluated (not a verdict), by who raised.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// The reference raised (its traceback and the case name are inside).
    #[error(transparent)]
    Reference(#[from] OracleError),
    /// The port (the `layers` crate) returned an error.
    #[error("the port raised: {0}")]
    Port(String),
    /// The harness itself: building inputs, reading results, its own MLX
    /// calls.
    #[error("harness: {0}")]
    Harness(String),
    /// A substitute ([`crate::hooks::Substitute`]) does not implement an
    /// op the case calls (a skip row with the reason, not a verdict).
    #[error("unsupported by the candidate: {0}")]
    Unsupported(String),
    /// A substitute crashed, hung, or broke its protocol.
    #[error("{0}")]
    Substitute(String),
    /// A substitute raised where the reference computed (the port's kind
    /// of error, said in the substitute's words: no "the port raised").
    #[error("{0}")]
    SubstituteRaised(String),
    /// A substitute refused where the reference computed, as a refusal
    /// it declared ([`crate::scope::Answer::RefusedByPolicy`]).
    #[error("the candidate refuses by policy: {0}")]
    Refused(String),
}

impl CaseError {
    /// Whose error it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CaseError::Reference(_) => ErrorKind::Reference,
            CaseError::Port(_) => ErrorKind::Port,
            CaseError::Harness(_) => ErrorKind::Harness,
            CaseError::Unsupported(_) => ErrorKind::Unsupported,
            CaseError::Substitute(_) => ErrorKind::Substitute,
            CaseError::SubstituteRaised(_) => ErrorKind::Port,
            CaseError::Refused(_) => ErrorKind::Policy,
        }
    }
    /// A port error, with what was being done.
    pub fn port(what: &str, e: impl std::fmt::Display) -> Self {
        CaseError::Port(format!("{what}: {e}"))
    }
    /// A harness error, with what was being done.
    pub fn harness(what: &str, e: impl std::fmt::Display) -> Self {
        CaseError::Harness(format!("{what}: {e}"))
    }
}

/// The harness's own MLX calls (building inputs, copying results to the
/// host, measuring a finding). The port's MLX calls map their errors with
/// [`CaseError::port`] instead.
impl From<mlx_rs::error::Exception> for CaseError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        CaseError::Harness(format!("MLX: {e}"))
    }
}

impl From<oracle::TensorError> for CaseError {
    fn from(e: oracle::TensorError) -> Self {
        CaseError::Harness(e.to_string())
    }
}
