//! Wall time of the whole default suite (warm: after build and set-up),
//! per family, so a slowdown is seen. Not a timed test: it prints numbers.
//!
//! `cargo bench -p conformance --bench suite`

use std::collections::BTreeMap;
use std::time::Instant;

use conformance::runner::{self, RunOptions};
use oracle::Oracle;

fn main() {
    let started = Instant::now();
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    let startup = started.elapsed();
    let cases = conformance::registry::all();
    let selected = runner::select(&cases, None).expect("all");
    for jobs in [1, 2] {
        // Cold per pass: the attention family memoises its M=1 runs.
        conformance::families::attention::reset_memo();
        let t = Instant::now();
        let results = runner::run(
            &selected,
            &oracle,
            &RunOptions {
                backend,
                seed: 0,
                jobs,
                perturb: false,
            },
            &|_| {},
        );
        let wall = t.elapsed();
        let mut families: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
        for r in &results {
            let f = families.entry(r.family.as_str()).or_default();
            f.0 += 1;
            f.1 += r.time_ms;
        }
        println!(
            "suite (jobs={jobs}): {} cases in {:.2} s (interpreter start {:.2} s)",
            results.len(),
            wall.as_secs_f64(),
            startup.as_secs_f64()
        );
        for (family, (n, ms)) in families {
            println!("  {family:<28} {n:>4} cases {:>10.1} ms", ms);
        }
    }
}
