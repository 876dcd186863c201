//! Case family `quantized` (in progress).

use crate::case::Case;

pub fn cases() -> Vec<Case> {
    Vec::new()
}
