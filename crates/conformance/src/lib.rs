//! The conformance suite: one registry of cases, a runner, reports, and the
//! snapshot gate.
//!
//! Data flows one way: a [`case::Case`] describes seeded inputs, the port
//! (crate `layers`) computes, the oracle computes the same with the pinned
//! reference, the outputs are compared bit for bit, and the run becomes a
//! report row plus a snapshot of the output digest and findings.

#[macro_use]
pub mod console;
pub mod bench;
pub mod candidate;
pub mod case;
pub mod exactness;
pub mod explore;
pub mod export;
pub mod families;
pub mod gate;
pub mod home;
pub mod inputs;
pub mod kept;
pub mod kernel_settings;
pub mod poison;
pub mod reference;
pub mod relation;
pub mod report;
pub mod runner;
pub mod snapshots;
