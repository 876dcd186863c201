//! `kept/…`: the explorer's shrunk violations, kept as ordinary must-equal
//! cases (`fixtures/explore/kept.json`, written by `cargo xtask explore
//! --keep`), each with the seed of its description. Snapshots pin them
//! like any case, so a regression stays in the suite.

use crate::case::{Case, CaseError};
use crate::explore::read_kept;

const FAMILY: &str = "kept";

pub fn cases() -> Vec<Case> {
    let fixtures = crate::home::Home::get().fixtures_dir();
    match read_kept(&fixtures) {
        Ok(kept) => kept.iter().map(|k| k.description.case(FAMILY)).collect(),
        // An unreadable file is one failing case naming it, never a silent skip.
        Err(e) => vec![Case::must_equal(
            "kept/unreadable",
            FAMILY,
            "fixtures/explore/kept.json",
            move |_| Err(CaseError::Harness(e.clone())),
        )],
    }
}
