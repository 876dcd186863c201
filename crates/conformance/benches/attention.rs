//! Wall time of check (a) (M = 1 versus chunked append, every boundary
//! window: the must-equal M = 1 cases and the append findings) and of the
//! boundary finder, on CPU. Each is measured cold (the family's memo of
//! scenarios dropped first); the finder also warm (after check (a), whose
//! windows it reuses), as it runs inside the suite. Not a timed test: it
//! prints numbers.
//!
//! `cargo bench -p conformance --bench attention`

use std::time::Instant;

use conformance::families::attention;
use conformance::runner::{self, RunOptions, Verdict};
use oracle::Oracle;

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    let options = RunOptions {
        backend,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let cases = conformance::registry::all();
    let check_a: Vec<_> = cases
        .iter()
        .filter(|c| {
            c.name.starts_with("attention/decode/") || c.name.starts_with("attention/append/")
        })
        .collect();
    let finder: Vec<_> = cases
        .iter()
        .filter(|c| c.name.starts_with("attention/boundary-finder/"))
        .collect();

    attention::reset_memo();
    let t = Instant::now();
    let results = runner::run(&check_a, &oracle, &options, &|_| {});
    let check_a_wall = t.elapsed().as_secs_f64();
    println!("check (a), all boundary windows, cold: {check_a_wall:.2} s");
    for r in &results {
        if r.verdict != Verdict::Skip {
            println!("  {:<92} {:>9.1} ms  {:?}", r.name, r.time_ms, r.verdict);
        }
    }

    let t = Instant::now();
    let warm = runner::run(&finder, &oracle, &options, &|_| {});
    let finder_warm = t.elapsed().as_secs_f64();

    attention::reset_memo();
    let t = Instant::now();
    let search = attention::find_on(0, backend).expect("finder runs");
    let finder_cold = t.elapsed().as_secs_f64();
    println!(
        "boundary finder, cold: {finder_cold:.2} s ({} probes, boundaries {:?}, never matches: {})",
        search.probes.len(),
        search.boundaries,
        search.never_matches
    );
    println!(
        "boundary finder, warm (after check (a), as in the suite): {finder_warm:.2} s ({:?})",
        warm[0].verdict
    );
    println!(
        "attention family as the suite runs it: {:.2} s",
        check_a_wall + finder_warm
    );
}
