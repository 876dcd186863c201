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

use super::client::Reply;

/// The candidate's array at a reference array's place, or why it has none.
pub use crate::hooks::Counterpart;

#[derive(Default)]
struct Tape {
    /// Reference node hash -> the candidate's nodes at its places.
    by_reference: HashMap<String, Vec<Result<Value, String>>>,
    /// Whether the candidate raised on the last call (refusal cases).
    last_raised: Option<bool>,
    /// The candidate's message when it raised on the last call.
    last_refusal: Option<String>,
    /// Reference node hash -> the first place it was returned at
    /// (`op `x`, result `y``), for report rows.
    places: HashMap<String, String>,
    /// Reference node hash -> its internal place ([`super::ops::INTERNAL`])
    /// the candidate's result left out.
    omitted: HashMap<String, String>,
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
pub fn record(op: &str, reference: Option<&Value>, candidate: &Reply) {
    TAPE.with(|t| {
        let mut tape = t.borrow_mut();
        tape.last_raised = Some(matches!(candidate, Reply::Raised(_)));
        tape.last_refusal = match candidate {
            Reply::Raised(m) => Some(format!("op `{op}`: {m}")),
            Reply::Value(_) => None,
        };
        let Some(reference) = reference else { return };
        for (path, _, digest) in super::signatures::value_nodes(reference) {
            tape.places
                .entry(digest)
                .or_insert_with(|| format!("op `{op}`, result `{path}`"));
        }
        if let (Value::Dict(r), Reply::Value(Value::Dict(c))) = (reference, candidate) {
            let internal = super::ops::by_name(op).map_or(&[][..], super::ops::Op::internal);
            for (k, v) in r {
                if internal.contains(&k.as_str()) && !c.contains_key(k) {
                    tape.omitted
                        .insert(node_hash(v), format!("op `{op}`, result `{k}`"));
                }
            }
        }
        let candidate = match candidate {
            Reply::Value(v) => Ok(v),
            Reply::Raised(m) => Err(format!("the candidate raised: {m}")),
        };
        pair(reference, candidate, "(the result)", &mut tape.by_reference);
    });
}

/// A content hash of a reference value: [`crate::case::node_digest`]
/// (an array's is its digest, so an array is found by its own bits).
fn node_hash(v: &Value) -> String {
    crate::case::node_digest(v)
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

/// The candidate's message when it raised on the case's last call.
pub fn last_refusal() -> Option<String> {
    TAPE.with(|t| t.borrow().last_refusal.clone())
}

/// Where reference node `origin` was returned in this case's calls.
pub fn place_of(origin: &str) -> Option<String> {
    TAPE.with(|t| t.borrow().places.get(origin).cloned())
}

/// Where reference node `origin` is, when every place it was returned at
/// is an internal one the candidate left out (a twin at a compared place
/// the candidate answered keeps it compared).
pub fn omitted_internal(origin: &str) -> Option<String> {
    TAPE.with(|t| {
        let tape = t.borrow();
        let place = tape.omitted.get(origin)?;
        let answered = tape
            .by_reference
            .get(origin)
            .is_some_and(|nodes| nodes.iter().any(Result::is_ok));
        (!answered).then(|| place.clone())
    })
}
