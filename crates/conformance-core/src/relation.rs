//! One vocabulary for how two results relate, used by every finding:
//! `equal`, `total`, `differing`, `first_index`, `max_ulp`, and where the
//! result has a position axis, `positions` (how many positions hold a
//! differing element).

use oracle::{compare, Comparison, HostTensor};
use serde::Serialize;

/// How tensor `a` relates to tensor `b`, element by element, bit for bit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Relation {
    pub equal: bool,
    /// Elements compared.
    pub total: usize,
    /// Elements whose bits differ.
    pub differing: usize,
    /// The first differing element (row-major), if any.
    pub first_index: Option<Vec<usize>>,
    /// Largest distance in units in the last place (integers: absolute).
    pub max_ulp: u64,
    /// Positions holding a differing element, where there is a position
    /// axis ([`Relation::with_positions`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub positions: Option<usize>,
    /// A dtype or shape mismatch, when there is one (then every element
    /// counts as differing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
}

impl Relation {
    /// `a` against `b`.
    pub fn of(a: &HostTensor, b: &HostTensor) -> Self {
        let equal = Self {
            equal: true,
            total: a.len(),
            differing: 0,
            first_index: None,
            max_ulp: 0,
            positions: None,
            mismatch: None,
        };
        match compare(a, b) {
            Comparison::Equal => equal,
            Comparison::Differs(d) => Self {
                equal: false,
                total: d.total,
                differing: d.count,
                first_index: Some(d.first_index),
                max_ulp: d.max_ulp,
                ..equal
            },
            other => Self {
                equal: false,
                differing: a.len(),
                mismatch: Some(other.summary()),
                ..equal
            },
        }
    }
    /// Adds the number of positions (along `axis`) holding a differing
    /// element.
    pub fn with_positions(mut self, positions: usize) -> Self {
        self.positions = Some(positions);
        self
    }
    /// Deterministic JSON for a finding.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}
