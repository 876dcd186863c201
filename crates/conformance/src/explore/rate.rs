//! The explorer's throughput: samples per second per family, on the
//! backend the caller chose (`cargo bench -p conformance --bench explore`
//! on a machine with Rust, `conformance explore --bench` from a bundle).
//! Not a timed test: it prints numbers.
//!
//! Two lines per family and seed: the search as `explore` runs it (every
//! shape the strategies draw; shrinking off, so every second goes to
//! sampling), and the same strategy's small shapes alone (the goal: at
//! least 50 per second on CPU): the first `samples` drawn samples of at
//! most [`SMALL`] multiply-adds a forward ([`Description::work`]), each
//! observed as a search observes it. On CUDA the first line includes
//! kernel compilation (each new kernel class compiles at first use, see
//! explore.md's "first use, ms"); the second runs after it.

use std::time::{Duration, Instant};

use oracle::Oracle;
use proptest::strategy::ValueTree;

use super::{observe, search, strategy, Config};
use crate::case::Backend;

/// The most multiply-adds of a "small" sample's forward.
pub const SMALL: usize = 1 << 18;

/// Prints the two rates of every family in `families` (empty: all) for
/// seeds 1 and 2, `samples` samples each, through `print`.
pub fn print_rates(
    oracle: &Oracle,
    backend: Backend,
    families: &[String],
    samples: usize,
    print: &mut dyn FnMut(String),
) -> Result<(), String> {
    let chosen: Vec<&str> = strategy::FAMILIES
        .iter()
        .copied()
        .filter(|f| families.is_empty() || families.iter().any(|o| o == f))
        .collect();
    if chosen.is_empty() {
        return Err(format!(
            "no family of {} is one the explorer samples ({})",
            families.join(", "),
            strategy::FAMILIES.join(", ")
        ));
    }
    for family in chosen {
        for seed in [1u64, 2] {
            let config = Config {
                seed,
                budget: Duration::from_secs(600),
                max_samples: Some(samples),
                families: vec![family.to_owned()],
                shard: (0, 1),
                backend,
                max_shrink_steps: 0,
                extent: false,
            };
            let t = Instant::now();
            let found = search(oracle, &config, &|_, _| {}, &|_| None)?;
            let wall = t.elapsed().as_secs_f64();
            let n = found.samples.len().max(1) as f64;
            let case_ms: f64 = found.samples.iter().map(|s| s.observation.time_ms).sum();
            print(format!(
                "explore/{} {family} seed {seed}: {} samples in {wall:.2} s = {:.1} samples/s (mean {:.1} ms per sample)",
                backend.as_str(),
                found.samples.len(),
                found.samples.len() as f64 / wall,
                case_ms / n,
            ));
            let (_, strat) = strategy::for_families(&[family.to_owned()])?.remove(0);
            let mut small = Vec::new();
            // Small shapes are common in every strategy; the bound only
            // stops a strategy that never draws one.
            for j in 0..samples.saturating_mul(1000) {
                if small.len() == samples {
                    break;
                }
                let d = strategy::draw(&strat, seed, j, family)?.current();
                if d.work() <= SMALL {
                    small.push(d);
                }
            }
            let t = Instant::now();
            for d in &small {
                std::hint::black_box(observe(oracle, backend, d));
            }
            let wall = t.elapsed().as_secs_f64();
            print(format!(
                "explore/{} {family} seed {seed} small (<= {SMALL} multiply-adds): {} samples in {wall:.2} s = {:.1} samples/s",
                backend.as_str(),
                small.len(),
                small.len() as f64 / wall,
            ));
        }
    }
    Ok(())
}
