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
