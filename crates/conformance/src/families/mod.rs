//! Case families. Each module declares its cases in one place; [`all`]
//! is the registry.

use crate::case::Case;

pub mod attention;
pub mod configs;
pub mod describe;
pub mod kept;
pub mod position;
pub mod quantized;
pub mod safetensors;
pub mod smoke;
pub(crate) mod support;

/// `--explore-samples N --explore-seed S` of this process (the runner and
/// its workers register the same cases).
static EXPLORE_SAMPLES: std::sync::OnceLock<(usize, u64)> = std::sync::OnceLock::new();

/// Registers the first `n` explorer samples of `seed` as must-equal cases
/// `explore/<case>/s<seed>` after every other case (the release gate's
/// run of explorer samples). Set once, before [`all`].
pub fn register_explore_samples(n: usize, seed: u64) {
    let _ = EXPLORE_SAMPLES.set((n, seed));
}

/// The `(n, seed)` registered by [`register_explore_samples`].
pub fn explore_samples() -> Option<(usize, u64)> {
    EXPLORE_SAMPLES.get().copied()
}

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
    if let Some((n, seed)) = explore_samples() {
        match crate::explore::samples(seed, n) {
            Ok(samples) => cases.extend(samples.iter().map(|d| d.case("explore"))),
            // A strategy that cannot draw is one failing case, never a silent skip.
            Err(e) => cases.push(Case::must_equal(
                "explore/undrawable",
                "explore",
                "the explorer's strategies",
                move |_| Err(crate::case::CaseError::Harness(e.clone())),
            )),
        }
    }
    cases
}
