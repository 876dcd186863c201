//! Case families. Each module declares its cases in one place; [`all`]
//! is the registry.

use crate::case::Case;

pub mod attention;
pub mod configs;
pub mod describe;
pub mod kept;
pub(crate) mod position;
pub mod quantized;
pub mod safetensors;
pub mod smoke;
pub(crate) mod support;

/// Every registered case, in report order.
pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(smoke::cases());
    cases.extend(quantized::cases());
    cases.extend(safetensors::cases());
    cases.extend(position::cases());
    cases.extend(attention::cases());
    cases.extend(configs::cases());
    cases.extend(kept::cases());
    cases
}
