//! The conformance suite's tool: the command line, the runner and its
//! workers, snapshots, reports, the gate, the explorer's search, the
//! candidate protocol, golden-vector export, and the run modes as hooks.
//! What a case is lives in `conformance-core`, the cases in
//! `conformance-cases` (re-exported here at their old paths).
//!
//! Data flows one way: a [`case::Case`] describes seeded inputs, the port
//! (crate `layers`) computes, the oracle computes the same with the pinned
//! reference, the outputs are compared bit for bit, and the run becomes a
//! report row plus a snapshot of the output digest and findings.

#[macro_use]
pub mod console;
pub mod bench;
pub mod candidate;
pub mod child;
pub mod config;
pub mod expected;
pub mod explore;
pub mod export;
pub mod gate;
pub mod kept;
pub mod kernel_settings;
pub mod mutation;
pub mod outdir;
pub mod plant;
pub mod poison;
pub mod report;
pub mod runner;
pub mod schema;
pub mod scratch;
pub mod snapshots;

// The core and the cases, at the paths they had before the split.
pub use conformance_cases::{families, home, registry};
pub use conformance_core::{case, exactness, hooks, inputs, reference, relation, result};
