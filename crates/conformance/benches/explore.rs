//! The explorer's throughput per family: samples per second (each sample:
//! the case on both sides, the exact oracle, and the port's invariances),
//! on the CPU unless `MLX_BENCH_DEVICE=gpu`. Not a timed test: it prints
//! numbers ([`conformance::explore::rate`] says what each line measures;
//! a bundle prints the same with `conformance explore --bench`).
//!
//! `cargo bench -p conformance --bench explore [-- FAMILY…]` (families
//! named: only those).

use conformance::explore::rate;
use oracle::Oracle;

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    // `cargo bench` passes `--bench`; anything else names families.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    rate::print_rates(&oracle, backend, &only, 200, &mut |line| println!("{line}"))
        .expect("the explorer runs");
}
