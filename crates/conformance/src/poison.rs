//! Unwritten outputs made deterministic: before and after every reference
//! call, and before each case, MLX's buffer cache is emptied and refilled
//! with buffers holding a sentinel (every byte 0xFF: NaN in bf16, f16 and
//! f32; all ones in integers). A kernel that leaves its output unwritten
//! then returns the sentinel, which the exact oracle always flags (a NaN is
//! outside every bound), instead of a lucky zero or an earlier result's
//! bytes that a recycled buffer happened to hold.
//!
//! MLX's allocators (CPU, CUDA, Metal: `BufferCache::reuse_from_cache`)
//! hand out the smallest cached buffer of at least the requested size and
//! under `min(2 size, size + 2 pages)`; the ladder below has a buffer for
//! every request up to [`LARGEST`] bytes on each of them (powers of two
//! below a page, then 4 KiB steps to 64 KiB, then 8 KiB steps: two 4 KiB
//! pages, the CPU's window; CUDA rounds requests of a page or more to
//! 16 KiB, which these steps include). Larger outputs are not poisoned.
//! `tests/poison.rs` allocates every size through MLX's allocator after
//! poisoning (16 KiB steps above 64 KiB left the first half of each step
//! unpoisoned on the CPU).
//!
//! `MLX_CONFORMANCE_POISON=0` (or `off`, `false`, `no`) turns it off, to
//! measure its cost; report.json's `environment.poison` and report.md say so.

use std::sync::OnceLock;

use crate::case::Backend;

/// The largest output size poisoned, in bytes.
pub const LARGEST: usize = 256 * 1024;
/// Buffers of each size (an output and its intermediates may take several).
const COPIES: usize = 2;

fn sizes() -> &'static [usize] {
    static SIZES: OnceLock<Vec<usize>> = OnceLock::new();
    SIZES.get_or_init(|| {
        let mut s: Vec<usize> = (4..=12).map(|p| 1usize << p).collect();
        s.extend((2..=16).map(|k| k * 4096));
        s.extend((9..=LARGEST / 8192).map(|k| k * 8192));
        s.dedup();
        s
    })
}

/// Whether poisoning is on: `MLX_CONFORMANCE_POISON` unset, or anything
/// but `0`, `off`, `false` or `no` (any case).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| on(std::env::var("MLX_CONFORMANCE_POISON").ok().as_deref()))
}

fn on(setting: Option<&str>) -> bool {
    setting.is_none_or(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    })
}

/// Empties MLX's buffer cache and refills it with sentinel buffers. Errors
/// are ignored on purpose: poisoning only makes faults visible, and a
/// failing allocation here shows in the case's own calls.
pub fn poison() {
    if !enabled() {
        return;
    }
    let _ = mlx_rs::memory::clear_cache();
    let sentinel = mlx_rs::Array::from_slice(&[u32::MAX], &[1]);
    let mut held = Vec::with_capacity(sizes().len() * COPIES);
    for &bytes in sizes() {
        for _ in 0..COPIES {
            if let Ok(a) = mlx_rs::Array::full::<u32>(&[(bytes / 4) as i32], &sentinel) {
                held.push(a);
            }
        }
    }
    let _ = mlx_rs::transforms::eval(held.iter());
    // Dropped together: every buffer goes back to the cache, filled.
    drop(held);
}

/// Poisoning as an interceptor: before each case, and before and after
/// each reference call (the port's next call must not get the reference's
/// freed output buffer either: it holds a correct result).
pub struct Poison;

impl crate::hooks::Interceptor for Poison {
    fn case_start(&self, _case: &crate::case::Case) {
        poison();
    }
    fn before_call(&self, _backend: Backend) {
        poison();
    }
    fn after_call(&self, _call: &crate::hooks::ReferenceCall<'_>) {
        poison();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn poisoning_is_on_unless_turned_off_by_name() {
        assert!(super::on(None));
        assert!(super::on(Some("1")));
        assert!(super::on(Some("")));
        for off in ["0", "off", "OFF", "false", "no", " 0 "] {
            assert!(!super::on(Some(off)), "{off}");
        }
    }
}
