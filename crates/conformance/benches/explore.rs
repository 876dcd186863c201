//! The explorer's throughput per family: samples per second (each sample:
//! the case on both sides, the exact oracle, and the port's invariances),
//! on the CPU unless `MLX_BENCH_DEVICE=gpu`. Not a timed test: it prints
//! numbers. Shrinking is off, so every second goes to sampling.
//!
//! `cargo bench -p conformance --bench explore`

use std::time::{Duration, Instant};

use conformance::explore::{self, Config};
use oracle::Oracle;

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    for (family, seed) in explore::strategy::FAMILIES.iter().flat_map(|f| [(f, 1u64), (f, 2)]) {
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
        let search = explore::search(&oracle, &config, &|_, _| {}, &|_| None).expect("a search runs");
        let wall = t.elapsed().as_secs_f64();
        let case_ms: f64 = search.samples.iter().map(|s| s.observation.time_ms).sum();
        println!(
            "explore/{} {family} seed {seed}: {} samples in {wall:.2} s = {:.1} samples/s (mean {:.1} ms per sample)",
            backend.as_str(),
            search.samples.len(),
            search.samples.len() as f64 / wall,
            case_ms / search.samples.len() as f64,
        );
    }
}
