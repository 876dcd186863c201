//! Poisoning (`src/poison.rs`) seen where it matters: a buffer MLX's
//! allocator hands out after poisoning reads the sentinel (every byte
//! 0xFF), at every size the ladder covers, and inside a case both before
//! its first reference call and after each one. Without poisoning the same
//! allocation returns a freed buffer's old bytes, so these tests can fail:
//! the sentinel is not what the allocator gives anyway.
//!
//! MLX has no public call that returns an unwritten buffer (every op
//! writes its output), so the tests ask the allocator itself: the one libmlx
//! of this process, which the port and the reference share. Its
//! `mlx::core::allocator::allocator()` and `Buffer::raw_ptr()` are exported;
//! `malloc` and `free` are the first two virtual functions of `Allocator`
//! (the wheel's `mlx/allocator.h`), reached through its vtable (Itanium
//! C++ ABI: Linux and macOS). `Buffer` is one pointer with trivial copy and
//! destructor, so it passes and returns as a pointer does.

use std::ffi::c_void;
use std::sync::Mutex;

use conformance::case::{Backend, Case, CaseOutput};
use conformance::poison;
use conformance::runner::{self, RunOptions, Verdict};
use oracle::{DType, HostTensor, Oracle};

extern "C" {
    #[link_name = "_ZN3mlx4core9allocator9allocatorEv"]
    fn mlx_allocator() -> *mut c_void;
    #[link_name = "_ZN3mlx4core9allocator6Buffer7raw_ptrEv"]
    fn mlx_buffer_raw_ptr(buffer: *mut *mut c_void) -> *mut c_void;
}

type Malloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void, *mut c_void);

/// The allocator cache is one per process and tests run on threads: one
/// test at a time touches it.
static CACHE: Mutex<()> = Mutex::new(());

/// `size` bytes from MLX's allocator, as a kernel's output gets them.
struct Allocation {
    buffer: *mut c_void,
    size: usize,
}

fn vtable() -> (*mut c_void, Malloc, Free) {
    // SAFETY: `allocator()` returns the process's allocator object, whose
    // first word is its vtable pointer; slots 0 and 1 are `malloc(size_t)`
    // and `free(Buffer)` (declaration order in mlx/allocator.h).
    unsafe {
        let this = mlx_allocator();
        let table = *(this as *const *const *const c_void);
        let malloc = *(table as *const Malloc);
        let free = *(table.add(1) as *const Free);
        (this, malloc, free)
    }
}

impl Allocation {
    fn new(size: usize) -> Self {
        let (this, malloc, _) = vtable();
        // SAFETY: a virtual call on the live allocator (see `vtable`).
        let buffer = unsafe { malloc(this, size) };
        assert!(!buffer.is_null(), "MLX could not allocate {size} bytes");
        Allocation { buffer, size }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `raw_ptr` gives the data of a live buffer of `size` bytes.
        unsafe {
            let data = mlx_buffer_raw_ptr(&mut self.buffer) as *mut u8;
            std::slice::from_raw_parts_mut(data, self.size)
        }
    }

    /// Bytes that are not the sentinel.
    fn not_sentinel(&mut self) -> usize {
        self.bytes().iter().filter(|&&b| b != 0xFF).count()
    }
}

impl Drop for Allocation {
    /// Back to MLX's cache, as a freed array's buffer goes.
    fn drop(&mut self) {
        let (this, _, free) = vtable();
        // SAFETY: the buffer came from this allocator and is freed once.
        unsafe { free(this, self.buffer) }
    }
}

/// Output sizes from 16 bytes to the largest poisoned size: every 509th,
/// and both sides of every 4 KiB page boundary (where the ladder's steps
/// change and where MLX's reuse window is counted in pages).
fn sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = (16..=poison::LARGEST).step_by(509).collect();
    for page in 1..=poison::LARGEST / 4096 {
        sizes.extend([page * 4096 - 1, page * 4096, page * 4096 + 1]);
    }
    sizes.retain(|&s| (16..=poison::LARGEST).contains(&s));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// A few sizes for the slower checks: a scalar's few bytes, both sides of
/// a page, a size between the 4 KiB steps, and the largest.
const SOME_SIZES: [usize; 6] = [16, 1000, 4097, 10_000, 70_000, poison::LARGEST];

#[test]
fn a_buffer_allocated_after_poisoning_reads_the_sentinel_at_every_size() {
    let _one = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        poison::enabled(),
        "MLX_CONFORMANCE_POISON turns it off here"
    );
    poison::poison();
    let sizes = sizes();
    assert!(sizes.len() > 500, "{} sizes", sizes.len());
    let unpoisoned: Vec<usize> = sizes
        .into_iter()
        .filter(|&size| Allocation::new(size).not_sentinel() > 0)
        .collect();
    assert!(
        unpoisoned.is_empty(),
        "{} allocation sizes after poisoning hold bytes other than 0xFF: {unpoisoned:?}",
        unpoisoned.len()
    );
}

#[test]
fn without_poisoning_a_freed_buffer_keeps_its_bytes_and_poisoning_replaces_them() {
    let _one = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    for size in SOME_SIZES {
        // A result (zeros here: the "lucky zero") is freed to the cache...
        mlx_rs::memory::clear_cache().unwrap();
        Allocation::new(size).bytes().fill(0);
        // ...and the next output of that size gets it back, unwritten.
        let mut stale = Allocation::new(size);
        assert_eq!(
            stale.bytes().iter().filter(|&&b| b == 0).count(),
            size,
            "{size} bytes: MLX's cache did not hand the freed buffer back, \
             so this test could not tell poisoning from the allocator's own bytes"
        );
        drop(stale);
        poison::poison();
        assert_eq!(Allocation::new(size).not_sentinel(), 0, "{size} bytes");
    }
}

/// Two allocations of `size` held at once (the reference's freed input or
/// output may sit beside a poisoned buffer in the cache): their bytes that
/// are not the sentinel.
fn not_sentinel_in_two(size: usize) -> usize {
    let (mut a, mut b) = (Allocation::new(size), Allocation::new(size));
    a.not_sentinel() + b.not_sentinel()
}

/// Inside a run: at the case's start and after each reference call, the
/// next allocation of an output's size reads the sentinel, though the
/// reference's own result (a correct one) was just freed.
#[test]
fn in_a_case_poisoning_comes_before_the_first_call_and_after_each_reference_call() {
    let _one = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    runner::set_device(Backend::Cpu);
    oracle.set_device(Backend::Cpu).unwrap();
    // Stale bytes left by an earlier case, for the case's start to clear.
    mlx_rs::memory::clear_cache().unwrap();
    Allocation::new(4096).bytes().fill(0);
    let cases = vec![Case::must_equal("t/poisoned", "t", "none", |ctx| {
        let at_start = not_sentinel_in_two(4096);
        let t = HostTensor::new(DType::Uint8, vec![4096], vec![0; 4096]).unwrap();
        let mut out = CaseOutput::new("-");
        let echoed = conformance::reference::selftest::echo(ctx, &t)?;
        let after_call = not_sentinel_in_two(4096);
        out.compare("y", &t, &echoed);
        assert_eq!(at_start, 0, "not poisoned at the case's start");
        assert_eq!(after_call, 0, "not poisoned after the reference call");
        Ok(out)
    })];
    let selected = runner::select(&cases, None).unwrap();
    let options = RunOptions {
        backend: Backend::Cpu,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let results = runner::run(&selected, &oracle, &options, &|_| {});
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0].verdict,
        Verdict::Pass,
        "{:?}",
        results[0].message
    );
}
