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
pub use crate::hooks::Counterpart;

#[derive(Default)]
struct Tape {
    /// Reference node hash -> the candidate's nodes at its places.
    by_reference: HashMap<String, Vec<Result<Value, String>>>,
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

/// A content hash of a reference value: an array's is its digest
/// ([`crate::case::digest_of`]), so an array is found by its own bits.
fn node_hash(v: &Value) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    match v {
        Value::Tensor(t) => return crate::case::digest_of(t),
        Value::Int(i) => h.update(format!("int:{i}")),
        Value::Float(f) => h.update(format!("float:{}", f.to_bits())),
        Value::Bool(b) => h.update(format!("bool:{b}")),
        Value::Str(s) => {
            h.update("str:");
            h.update(s.as_bytes());
        }
        Value::None => h.update("none"),
        Value::List(items) => {
            h.update(format!("list:{}", items.len()));
            for item in items {
                h.update(node_hash(item));
            }
        }
        Value::Dict(map) => {
            h.update(format!("dict:{}", map.len()));
            for (k, item) in map {
                h.update(k.as_bytes());
                h.update([0]);
                h.update(node_hash(item));
            }
        }
    }
    format!("{:x}", h.finalize())
}

/// Pairs every node of the reference's tree (arrays, and the lists, dicts
/// and scalars readers derive arrays from) with the candidate's node at the
/// same place.
fn pair(
    reference: &Value,
    candidate: Result<&Value, String>,
    path: &str,
    out: &mut HashMap<String, Vec<Result<Value, String>>>,
) {
    let same_kind = |c: &Value| std::mem::discriminant(c) == std::mem::discriminant(reference);
    let here = match &candidate {
        Ok(c) if same_kind(c) || matches!((reference, c), (Value::Float(_), Value::Int(_))) => {
            Ok((*c).clone())
        }
        Ok(c) => Err(format!(
            "the candidate's `{path}` is {}, the reference's {}",
            kind(c),
            kind(reference)
        )),
        Err(e) => Err(e.clone()),
    };
    out.entry(node_hash(reference)).or_default().push(here);
    match reference {
        Value::List(items) => {
            for (i, r) in items.iter().enumerate() {
                let c = match &candidate {
                    Ok(Value::List(cs)) => cs.get(i).ok_or_else(|| {
                        format!(
                            "the candidate's `{path}` has {} items, the reference's {}",
                            cs.len(),
                            items.len()
                        )
                    }),
                    Ok(other) => Err(format!(
                        "the candidate's `{path}` is {}, not a list",
                        kind(other)
                    )),
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
                    Ok(other) => Err(format!(
                        "the candidate's `{path}` is {}, not a dict",
                        kind(other)
                    )),
                    Err(e) => Err(e.clone()),
                };
                pair(r, c, &format!("{path}.{k}"), out);
            }
        }
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
    let nodes = TAPE.with(|tape| {
        tape.borrow()
            .by_reference
            .get(&crate::case::digest_of(t))
            .cloned()
    })?;
    Some(
        nodes
            .into_iter()
            .map(|n| match n {
                Ok(Value::Tensor(c)) => Ok(c),
                Ok(_) => Err("the candidate's value there is not an array".to_owned()),
                Err(e) => Err(e),
            })
            .collect(),
    )
}

/// The candidate's values beside reference value `v` (any node of a
/// result: a list of floats a reader turns into an array, say).
pub fn values_beside(v: &Value) -> Option<Vec<Result<Value, String>>> {
    TAPE.with(|tape| tape.borrow().by_reference.get(&node_hash(v)).cloned())
}

/// Whether the candidate raised on this case's last call.
pub fn last_raised() -> Option<bool> {
    TAPE.with(|t| t.borrow().last_raised)
}
