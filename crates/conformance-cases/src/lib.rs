//! The conformance cases: every family ([`families`]), each family's
//! description and builder ([`families::describe`]), the explorer's data
//! and strategies ([`explore`]), and above them all the registry as a
//! value ([`registry::Registry`]: the fixed, kept and sampled cases). It
//! depends on `conformance-core` only; the tool (`conformance`) drives it.
//! No run mode is named here: a test hook a case needs goes through
//! `conformance_core::hooks`.

pub use conformance_core::{case, exactness, hooks, inputs, reference, relation};

pub mod explore;
pub mod families;
pub mod home;
pub mod registry;
pub mod store;
