//! The single `mach_sys` item mlx-rs 0.33 uses, on every target.

pub mod mach_time {
    #[cfg(target_vendor = "apple")]
    extern "C" {
        /// Mach absolute time units (libSystem).
        pub fn mach_approximate_time() -> u64;
    }

    /// Nanoseconds of a monotonic clock; mlx-rs only uses it to seed a
    /// time-based random state.
    ///
    /// # Safety
    /// Always safe; `unsafe` only to match the Apple signature.
    #[cfg(not(target_vendor = "apple"))]
    pub unsafe fn mach_approximate_time() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }
}
