//! `conformance --candidate CMD`: an external implementation checked in
//! place of the linked port, through a documented protocol
//! (docs/src/guide/candidate.md).
//!
//! The seam is the typed reference boundary. Every reference call a
//! must-equal case makes ([`crate::case::Ctx::call_sent`]) is also sent to
//! the candidate as an op of the vocabulary ([`ops`]), with the arguments
//! the reference received (unperturbed under `--perturb`, as the port's
//! are). Each reference array the case then reads as an
//! [`crate::case::Expected`] carries the candidate's array from the same
//! place in its result, and [`crate::case::CaseOutput::compare`] compares
//! that one instead of the linked port's. Reports, exit codes, first
//! differences and the snapshot gate are the linked run's.
//!
//! - [`wire`]: the value encoding (JSON tree + safetensors).
//! - [`client`]: the process, its hello, calls, timeouts, failures.
//! - [`tape`]: a case's candidate results, looked up by the reference
//!   array they stand beside.

pub mod client;
#[cfg(target_os = "linux")]
pub mod launcher;
pub mod ops;
pub mod signatures;
pub mod tape;
pub mod wire;

use std::sync::Mutex;

use oracle::{Arg, HostTensor, Value};

pub use client::{cwd, CallError, Config, Reply, CWD_ENV};

use crate::hooks::{Answer, Counterpart, Substitute, SubstituteError};

/// Whether glue function `glue`'s call goes to the candidate: every op
/// but a setup op ([`ops::SETUP`]); a glue in no op goes, and fails there.
pub fn sends(glue: &str) -> bool {
    ops::by_glue(glue).is_none_or(|op| op.sent())
}

/// `--candidate CMD` as the substitute for the linked port: its process
/// (started on first use, and again after a failure killed it) and the
/// case's tape of its results.
pub struct Candidate {
    config: Config,
    client: Mutex<Option<client::Client>>,
    /// Failed starts since the last one that completed its hello, and the
    /// last one's reason.
    failed_starts: Mutex<(u32, String)>,
}

/// Failed starts in a row after which a worker starts the candidate no
/// more: one that never completes its hello (hangs, or is not found)
/// would otherwise cost `--candidate-timeout` for every case.
const START_ATTEMPTS: u32 = 2;

impl Candidate {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            client: Mutex::new(None),
            failed_starts: Mutex::new((0, String::new())),
        }
    }

    /// Starts the candidate, unless its last starts in this worker failed.
    fn start(&self) -> Result<client::Client, CallError> {
        let mut failed = self.failed_starts.lock().unwrap_or_else(|e| e.into_inner());
        if failed.0 >= START_ATTEMPTS {
            return Err(CallError::Failed(format!(
                "the candidate was not started again: its last {} starts in this worker failed, the last with: {}",
                failed.0, failed.1
            )));
        }
        match client::Client::start(&self.config) {
            Ok(c) => {
                *failed = (0, String::new());
                Ok(c)
            }
            Err(why) => {
                *failed = (failed.0 + 1, why.clone());
                Err(CallError::Failed(why))
            }
        }
    }

    /// Sends glue function `glue`'s call to the candidate; with a raise,
    /// the refusal of its hello it matches, if any.
    fn call(
        &self,
        case: &str,
        glue: &str,
        args: &[(&str, Arg)],
    ) -> Result<(Reply, Option<String>), CallError> {
        let op = ops::by_glue(glue).ok_or_else(|| {
            CallError::Failed(format!(
                "harness: reference call `{glue}` is in no op of the vocabulary (candidate/ops.rs)"
            ))
        })?;
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_none_or(client::Client::is_dead) {
            *slot = None;
            *slot = Some(self.start()?);
        }
        let client = slot.as_mut().expect("started above");
        if let Err(why) = client.supports(op) {
            return Err(CallError::Unsupported(lacking(client, case, why)));
        }
        let reply = client.call(case, op, args);
        let policy = match &reply {
            Ok(Reply::Raised(m)) => client.refusal(op.name, m).map(str::to_owned),
            _ => None,
        };
        if client.is_dead() {
            *slot = None;
        }
        reply.map(|r| (r, policy))
    }
}

/// Why a case is skipped when the candidate lacks op `why` names: with
/// every op of the case (docs/ops.json) it lacks, so one skip row says
/// all it would have to serve.
fn lacking(client: &client::Client, case: &str, why: String) -> String {
    let Some(ops) = signatures::documented()
        .ok()
        .and_then(|d| d.cases.get(case).cloned())
    else {
        return why;
    };
    let missing: Vec<String> = ops
        .iter()
        .filter_map(|name| ops::by_name(name))
        .filter(|op| op.sent() && client.supports(op).is_err())
        .map(|op| format!("`{}` v{}", op.name, op.version))
        .collect();
    format!(
        "{why}; the case calls {} op(s) it lacks: {}",
        missing.len(),
        missing.join(", ")
    )
}

impl Substitute for Candidate {
    fn case_start(&self) {
        tape::begin();
    }
    fn sends(&self, function: &str) -> bool {
        sends(function)
    }
    fn call(
        &self,
        case: &str,
        function: &'static str,
        args: &[(&str, Arg)],
        reference: Option<&Value>,
    ) -> Result<Answer, SubstituteError> {
        match Candidate::call(self, case, function, args) {
            Ok((reply, policy)) => {
                let op = ops::by_glue(function).map_or(function, |op| op.name);
                tape::record(op, reference, &reply);
                Ok(match (reply, policy) {
                    // Where the reference computed: a declared refusal.
                    (Reply::Raised(m), Some(policy)) if reference.is_some() => {
                        Answer::RefusedByPolicy(format!(
                            "declared refusal \"{policy}\" on op `{op}`: {m}"
                        ))
                    }
                    (Reply::Raised(m), _) => Answer::Raised(format!("op `{op}`: {m}")),
                    (Reply::Value(_), _) => Answer::Computed,
                })
            }
            Err(CallError::Unsupported(why)) => Err(SubstituteError::Unsupported(why)),
            Err(CallError::Failed(why)) => Err(SubstituteError::Failed(why)),
        }
    }
    fn counterparts_of(&self, t: &HostTensor) -> Option<Vec<Counterpart>> {
        tape::counterparts_of(t)
    }
    fn values_beside(&self, v: &Value) -> Option<Vec<Result<Value, String>>> {
        tape::values_beside(v)
    }
    fn last_raised(&self) -> Option<bool> {
        tape::last_raised()
    }
    fn last_refusal(&self) -> Option<String> {
        tape::last_refusal()
    }
    fn place_of(&self, origin: &str) -> Option<String> {
        tape::place_of(origin)
    }
    fn omitted_internal(&self, origin: &str) -> Option<String> {
        tape::omitted_internal(origin)
    }
}

/// How a candidate run's verdicts compare with a linked run's
/// (`--same-verdicts-as REPORT`, the protocol's self-test).
#[derive(Debug, Default)]
pub struct VerdictComparison {
    /// Cases with the linked run's verdict.
    pub same: usize,
    /// Findings, which a candidate run skips by design.
    pub findings: usize,
    /// Cases the candidate does not implement an op of: `(case, reason)`.
    pub unsupported: Vec<(String, String)>,
    /// Cases whose verdict differs: `case: linked -> candidate (message)`.
    pub differ: Vec<String>,
}

/// Compares `results` (this candidate run) with the cases of `report`
/// (a linked run's report.json, same selection and seed).
pub fn compare_verdicts<'a>(
    results: impl IntoIterator<Item = &'a crate::result::CaseResult>,
    report: &std::path::Path,
) -> Result<VerdictComparison, String> {
    use crate::result::Verdict;
    let file = crate::schema::ReportFile::read(report)?;
    let linked: std::collections::BTreeMap<&str, Verdict> = file
        .cases
        .iter()
        .map(|c| (c.name.as_str(), c.verdict.clone()))
        .collect();
    let mut out = VerdictComparison::default();
    for r in results {
        let Some(theirs) = linked.get(r.name.as_str()) else {
            out.differ
                .push(format!("{}: not in {}", r.name, report.display()));
            continue;
        };
        let message = r.message.clone().unwrap_or_default();
        if *theirs == r.verdict {
            out.same += 1;
        } else if *theirs == Verdict::Finding && r.verdict == Verdict::Skip {
            out.findings += 1;
        } else if r.verdict == Verdict::Skip
            && r.error_kind == Some(crate::result::ErrorKind::Unsupported)
        {
            out.unsupported.push((r.name.clone(), message));
        } else {
            out.differ.push(format!(
                "{}: linked {} -> candidate {} ({message})",
                r.name,
                theirs.word(),
                r.verdict.word()
            ));
        }
    }
    Ok(out)
}
