//! The interleaved position selector over a sweep of sections.

use layers::position::interleaved_position_selector;

use super::super::{int32_tensor, port};
use crate::case::{CaseError, CaseOutput, Ctx};
use crate::reference;

/// `(freq_dim, mrope_section)` pairs: the real sections, the class default
/// `[11, 11, 0]`, sections the frequency count clips, and small ones.
const SELECTOR_SWEEP: [(usize, [usize; 3]); 14] = [
    (32, [11, 11, 10]),
    (64, [24, 20, 20]),
    (32, [11, 11, 0]),
    (64, [16, 24, 24]),
    (16, [11, 11, 10]),
    (24, [11, 11, 10]),
    (8, [2, 3, 3]),
    (33, [11, 11, 11]),
    (1, [1, 0, 0]),
    (2, [0, 1, 1]),
    (48, [16, 16, 16]),
    (64, [0, 0, 0]),
    (128, [40, 44, 44]),
    (20, [4, 9, 7]),
];

pub(super) fn run_selector_sweep(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let mut port_values = Vec::new();
    for (freq_dim, section) in SELECTOR_SWEEP {
        port_values.extend(interleaved_position_selector(&section, freq_dim).map_err(port)?);
    }
    let reference = reference::position::position_selectors(ctx, &SELECTOR_SWEEP)?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare(
        "selectors",
        &int32_tensor(&port_values, &[port_values.len()]),
        &reference,
    );
    Ok(out)
}
