//! The conformance cases: every family ([`families`]), the registry as a
//! value ([`families::Registry`]), each family's description and builder
//! ([`families::describe`]), and the explorer's data and strategies
//! ([`explore`]). It depends on `conformance-core` only; the tool
//! (`conformance`) drives it. No run mode is named here: a test hook a
//! case needs goes through `conformance_core::hooks`.

pub use conformance_core::{case, exactness, hooks, inputs, reference, relation};

pub mod explore;
pub mod families;
pub mod home;
pub mod store;
