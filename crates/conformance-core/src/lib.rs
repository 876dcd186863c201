//! What a conformance case is, and nothing about how a run is driven.
//!
//! A [`case::Case`] describes seeded inputs ([`inputs`]); its run function
//! calls the port (crate `layers`) and the pinned reference through the
//! typed boundary ([`reference`], the only way to reach the oracle), and
//! compares them bit for bit into a [`case::CaseOutput`], with the exact
//! oracle's bounds beside ([`exactness`]) and measured relations
//! ([`relation`]). What a run mode does around a case reaches it only
//! through the traits of [`hooks`]: this crate names no mode, no pinned
//! record, no driver and no list of cases (`crates/conformance/tests/tidy.rs`
//! checks it).

pub mod case;
pub mod error;
pub mod exactness;
pub mod hooks;
pub mod inputs;
pub mod param;
pub mod reference;
pub mod relation;
pub mod result;
pub mod scope;
