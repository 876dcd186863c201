//! The explorer's throughput per family: samples per second (each sample:
//! the case on both sides, the exact oracle, and the port's invariances),
//! on the CPU unless `MLX_BENCH_DEVICE=gpu`. Not a timed test: it prints
//! numbers. Shrinking is off, so every second goes to sampling.
//!
//! Two lines per family and seed: the search as `explore` runs it (every
//! shape the strategies draw), and the same strategy's small shapes alone
//! (the goal, at least 50 per second on CPU): the first 200 drawn
//! samples whose point in the regime map (`Description::mkn`: M·K·N for
//! the quantized families, B·L·M for SDPA, B·L·rotary_dim for mRoPE) is at
//! most [`SMALL`], each observed as a search observes it.
//!
//! `cargo bench -p conformance --bench explore [-- FAMILY…]` (families
//! named: only those).

use std::time::{Duration, Instant};

use conformance::explore::{self, strategy, Config};
use oracle::Oracle;
use proptest::strategy::ValueTree;

/// The largest regime-map product of a "small" sample.
const SMALL: usize = 1 << 14;

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    // `cargo bench` passes `--bench`; anything else names families.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let families = explore::strategy::FAMILIES
        .iter()
        .filter(|f| only.is_empty() || only.iter().any(|o| o == *f));
    for (family, seed) in families.flat_map(|f| [(f, 1u64), (f, 2)]) {
        let config = Config {
            seed,
            budget: Duration::from_secs(600),
            max_samples: Some(200),
            families: vec![family.to_string()],
            shard: (0, 1),
            backend,
            max_shrink_steps: 0,
            extent: false,
        };
        let t = Instant::now();
        let search =
            explore::search(&oracle, &config, &|_, _| {}, &|_| None).expect("a search runs");
        let wall = t.elapsed().as_secs_f64();
        let case_ms: f64 = search.samples.iter().map(|s| s.observation.time_ms).sum();
        println!(
            "explore/{} {family} seed {seed}: {} samples in {wall:.2} s = {:.1} samples/s (mean {:.1} ms per sample)",
            backend.as_str(),
            search.samples.len(),
            search.samples.len() as f64 / wall,
            case_ms / search.samples.len() as f64,
        );
        let (_, strat) = strategy::for_families(&[family.to_string()])
            .expect("a known family")
            .remove(0);
        let small: Vec<_> = (0..)
            .map(|j| {
                strategy::draw(&strat, seed, j, family)
                    .expect("draws")
                    .current()
            })
            .filter(|d| {
                let (a, b, c) = d.mkn();
                a * b * c <= SMALL
            })
            .take(200)
            .collect();
        let t = Instant::now();
        for d in &small {
            std::hint::black_box(explore::observe(&oracle, backend, d));
        }
        let wall = t.elapsed().as_secs_f64();
        println!(
            "explore/{} {family} seed {seed} small (M·K·N ≤ {SMALL}): {} samples in {wall:.2} s = {:.1} samples/s",
            backend.as_str(),
            small.len(),
            small.len() as f64 / wall,
        );
    }
}
