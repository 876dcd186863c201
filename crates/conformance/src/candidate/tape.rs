//! A case's candidate results, kept beside the reference's (one tape per
//! thread, one case at a time: [`begin`] starts it).
//!
//! A reference array is turned into an [`crate::case::Expected`] by the
//! typed readers of `crate::reference`, which take it out of its result
//! tree by key. The tape pairs the two trees leaf by leaf when the call
//! returns, and keys each candidate leaf by the sha256 of the reference
//! array beside it; the reader's `Expected` then finds its counterpart by
//! its own bits. When two places of a case's results hold identical
//! reference bits, all their candidate arrays are kept, and the comparison
//! takes one that differs if any does: a candidate difference is never
//! hidden, though it may be reported at the twin's place.

use std::cell::RefCell;
use std::collections::HashMap;

use oracle::{HostTensor, Value};

/// The candidate's array at a reference array's place, or why it has none.
pub type Counterpart = Result<HostTensor, String>;

#[derive(Default)]
struct Tape {
    by_reference: HashMap<String, Vec<Counterpart>>,
    /// Whether the candidate raised on the last call (refusal cases).
    last_raised: Option<bool>,
}

thread_local! {
    static TAPE: RefCell<Tape> = RefCell::new(Tape::default());
}

/// Starts a case: nothing of the previous one is kept.
pub fn begin() {
    TAPE.with(|t| *t.borrow_mut() = Tape::default());
}

/// Records one call: the reference's result (or that it raised) and the
/// candidate's reply.
pub fn record(reference: Option<&Value>, candidate: &super::Reply) {
    TAPE.with(|t| {
        let mut tape = t.borrow_mut();
        tape.last_raised = Some(matches!(candidate, super::Reply::Raised(_)));
        let Some(reference) = reference else { return };
        let candidate = match candidate {
            super::Reply::Value(v) => Ok(v),
            super::Reply::Raised(m) => Err(format!("the candidate raised: {m}")),
        };
        pair(reference, candidate, "(the result)", &mut tape.by_reference);
    });
}

fn pair(
    reference: &Value,
    candidate: Result<&Value, String>,
    path: &str,
    out: &mut HashMap<String, Vec<Counterpart>>,
) {
    match reference {
        Value::Tensor(r) => {
            let counterpart = match candidate {
                Ok(Value::Tensor(c)) => Ok(c.clone()),
                Ok(other) => Err(format!("the candidate's `{path}` is {}, not an array", kind(other))),
                Err(e) => Err(e),
            };
            out.entry(crate::case::digest_of(r)).or_default().push(counterpart);
        }
        Value::List(items) => {
            for (i, r) in items.iter().enumerate() {
                let c = match &candidate {
                    Ok(Value::List(cs)) => cs.get(i).ok_or_else(|| {
                        format!("the candidate's `{path}` has {} items, the reference's {}", cs.len(), items.len())
                    }),
                    Ok(other) => Err(format!("the candidate's `{path}` is {}, not a list", kind(other))),
                    Err(e) => Err(e.clone()),
                };
                pair(r, c, &format!("{path}[{i}]"), out);
            }
        }
        Value::Dict(map) => {
            for (k, r) in map {
                let c = match &candidate {
                    Ok(Value::Dict(cs)) => cs
                        .get(k)
                        .ok_or_else(|| format!("the candidate's `{path}` has no key `{k}`")),
                    Ok(other) => Err(format!("the candidate's `{path}` is {}, not a dict", kind(other))),
                    Err(e) => Err(e.clone()),
                };
                pair(r, c, &format!("{path}.{k}"), out);
            }
        }
        // Scalars and strings are read as values, not arrays: the readers
        // that compare them turn them into arrays first (see `reference`).
        _ => {}
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Tensor(_) => "an array",
        Value::Int(_) => "an int",
        Value::Float(_) => "a float",
        Value::Bool(_) => "a bool",
        Value::Str(_) => "a string",
        Value::None => "None",
        Value::List(_) => "a list",
        Value::Dict(_) => "a dict",
    }
}

/// The candidate arrays beside reference array `t` in this case's calls.
pub fn counterparts_of(t: &HostTensor) -> Option<Vec<Counterpart>> {
    TAPE.with(|tape| tape.borrow().by_reference.get(&crate::case::digest_of(t)).cloned())
}

/// Whether the candidate raised on this case's last call.
pub fn last_raised() -> Option<bool> {
    TAPE.with(|t| t.borrow().last_raised)
}
