//! What the bench targets share: the backend they measure on.
//!
//! Benches run on the CPU unless `MLX_BENCH_DEVICE=gpu`, which selects the
//! GPU backend of the linked libmlx (Metal or CUDA), exactly as the runner's
//! `--device gpu` does. Both sides (Rust and the reference) are routed there.

use oracle::Oracle;

use crate::case::Backend;
use crate::runner;

/// Resolves `MLX_BENCH_DEVICE` (`cpu`, the default, or `gpu`) to a backend,
/// routes the Rust side and the reference to it, and returns it.
///
/// # Panics
/// With a message naming the fix when `gpu` is asked for and this libmlx
/// has no usable GPU backend, or the variable holds anything else (benches
/// are run by hand; a panic is their error report).
pub fn select_backend(oracle: &Oracle) -> Backend {
    let asked = std::env::var("MLX_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let backend = match asked.as_str() {
        "cpu" => Backend::Cpu,
        "gpu" => Backend::linked_gpu()
            .expect("MLX reports its GPU backend")
            .unwrap_or_else(|| {
                panic!("MLX_BENCH_DEVICE=gpu: this libmlx has no usable GPU backend here")
            }),
        other => panic!("MLX_BENCH_DEVICE={other}: expected cpu or gpu"),
    };
    runner::set_device(backend);
    oracle
        .set_device(backend)
        .expect("the reference accepts the backend");
    backend
}

/// The floor of the benches: bytes read plus written per second by
/// `y = x + 1` over an f32 array far larger than any cache (256 MiB on CPU,
/// 2 GiB on a GPU), best of 5.
///
/// # Panics
/// When MLX fails (benches are run by hand; a panic is their report).
pub fn memory_bandwidth(gpu: bool) -> f64 {
    use mlx_rs::{ops, Array, Dtype};
    let n: i32 = if gpu { 1 << 29 } else { 1 << 26 };
    let x = ops::zeros_dtype(&[n], Dtype::Float32).expect("MLX allocates the bandwidth array");
    x.eval().expect("MLX evaluates");
    let one = Array::from_f32(1.0);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        ops::add(&x, &one)
            .and_then(|y| y.eval())
            .expect("MLX evaluates x + 1");
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * 4.0 * f64::from(n) / best
}
