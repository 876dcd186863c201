//! Safe wrappers over `mlx_sys` for the mode-aware quantization ops.
//!
//! mlx-rs 0.33 hard-codes `mode = "affine"` in `quantize`, `dequantize`,
//! `quantized_matmul` and `gather_qmm`, and its `quantize` rejects any result
//! that is not three arrays, so the floating-point modes (`mxfp4`, `mxfp8`,
//! `nvfp4`) cannot go through it. This module calls the mlx-c functions of the
//! pinned MLX 0.32.2 directly, with the same argument order and defaults as the
//! Python bindings (`mlx.core.quantize`, `mlx.core.dequantize`,
//! `mlx.core.quantized_matmul`, `mlx.core.gather_qmm`).
//!
//! # Errors carry MLX's message
//!
//! mlx-c reports a failed call through a process-global error handler; its
//! default handler prints and calls `exit(-1)`. mlx-rs installs its own handler
//! lazily (on its first op) and keeps the message in a private thread-local.
//! Before the first raw call this module therefore:
//!
//! 1. runs one mlx-rs op, so mlx-rs's one-time registration has happened and
//!    cannot later overwrite ours;
//! 2. registers `capture_handler`, which stores the message in this
//!    module's thread-local and then chains to mlx-rs's exported
//!    `default_mlx_error_handler`, so mlx-rs keeps working exactly as before.
//!
//! Every wrapper clears the thread-local before the call and takes the message
//! after a non-zero status, so an [`MlxError`] always holds the text MLX
//! raised for *that* call (e.g. `[quantize] The requested group size 16 is not
//! supported. ...`, followed by mlx-c's ` at <file>:<line>` suffix).
//! Nothing here panics, and the default mlx-c handler never runs once
//! [`install_error_handler`] has returned.
//!
//! Every other module of this crate that calls `mlx_sys` directly should go
//! through [`try_array`] so there is exactly one handler registration.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::str::FromStr;
use std::sync::Once;

use mlx_rs::{Array, Dtype, Stream};
use mlx_sys::{mlx_array, mlx_optional_dtype, mlx_optional_int};

/// A quantization mode of MLX 0.32.2 (`mlx::core::QuantizationMode`), spelled
/// as the Python `mode=` strings.
///
/// Only `Affine` stores zero points (`biases`); the three floating-point
/// modes store `uint8` scales and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `"affine"`: `w ≈ scales * q + biases` per group; scales and biases in
    /// the dtype of the quantized matrix.
    Affine,
    /// `"mxfp4"`: OCP MX fp4 (e2m1) elements, e8m0 (`uint8`) scale per 32.
    Mxfp4,
    /// `"mxfp8"`: OCP MX fp8 (e4m3) elements, e8m0 (`uint8`) scale per 32.
    Mxfp8,
    /// `"nvfp4"`: NVIDIA fp4 (e2m1) elements, e4m3 (`uint8`) scale per 16.
    Nvfp4,
}

impl Mode {
    /// Every mode, in the order of `mlx.nn.layers.quantized._defaults_for_mode`.
    pub const ALL: [Mode; 4] = [Mode::Affine, Mode::Mxfp4, Mode::Nvfp4, Mode::Mxfp8];

    /// The string MLX takes as `mode=`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Affine => "affine",
            Mode::Mxfp4 => "mxfp4",
            Mode::Mxfp8 => "mxfp8",
            Mode::Nvfp4 => "nvfp4",
        }
    }

    /// The same string, NUL-terminated for mlx-c.
    const fn as_cstr(self) -> &'static CStr {
        match self {
            Mode::Affine => c"affine",
            Mode::Mxfp4 => c"mxfp4",
            Mode::Mxfp8 => c"mxfp8",
            Mode::Nvfp4 => c"nvfp4",
        }
    }

    /// `(group_size, bits)` used when either is `None`: mirrors
    /// `mlx.nn.layers.quantized._defaults_for_mode` (mlx 0.32.2), which
    /// agrees with `mx.quantize`'s own defaults: affine (64, 4), mxfp4 (32, 4),
    /// nvfp4 (16, 4), mxfp8 (32, 8).
    pub const fn defaults(self) -> (i32, i32) {
        match self {
            Mode::Affine => (64, 4),
            Mode::Mxfp4 => (32, 4),
            Mode::Nvfp4 => (16, 4),
            Mode::Mxfp8 => (32, 8),
        }
    }

    /// Whether the mode stores zero points (`biases`). Only affine does.
    pub const fn has_biases(self) -> bool {
        matches!(self, Mode::Affine)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `mode` string MLX does not know. The message is the one
/// `mlx.nn.layers.quantized._defaults_for_mode` raises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid quantization mode '{0}'. Valid modes are: affine, mxfp4, nvfp4, mxfp8.")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}

/// A failed MLX call: the operation and MLX's own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct MlxError {
    /// The mlx-c function (or mlx-rs op) that failed, e.g. `mlx_quantize`.
    pub op: &'static str,
    /// The text MLX raised, verbatim (mlx-c appends ` at <file>:<line>`).
    pub message: String,
}

impl From<mlx_rs::error::Exception> for MlxError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        MlxError {
            op: "mlx-rs",
            message: e.what().to_owned(),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" {
    /// mlx-rs 0.33's handler (`#[no_mangle]` in `mlx_rs::error`): stores the
    /// message in mlx-rs's thread-local stash, from which mlx-rs builds its
    /// `Exception`s.
    fn default_mlx_error_handler(msg: *const c_char, data: *mut c_void);
}

/// The handler this module registers: keep the message for the wrappers of
/// this module, then hand it to mlx-rs so its own error reporting is intact.
extern "C" fn capture_handler(msg: *const c_char, data: *mut c_void) {
    if !msg.is_null() {
        // SAFETY: mlx-c passes a NUL-terminated buffer that outlives the call.
        let text = unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned();
        // `try_with`/`try_borrow_mut`: never panic inside a C callback (the
        // thread-local may be gone during thread teardown).
        let _ = LAST_ERROR.try_with(|slot| {
            if let Ok(mut slot) = slot.try_borrow_mut() {
                *slot = Some(text);
            }
        });
    }
    // SAFETY: same contract as the handler mlx-rs registers itself.
    unsafe { default_mlx_error_handler(msg, data) };
}

static INSTALL: Once = Once::new();

/// Registers `capture_handler` once per process (idempotent, thread-safe).
///
/// Called by every wrapper here; call it yourself before any other raw
/// `mlx_sys` call whose failure must not reach mlx-c's exiting default handler.
pub fn install_error_handler() {
    INSTALL.call_once(|| {
        // Any op that goes through mlx-rs's `Guarded::try_from_op` runs
        // mlx-rs's `INIT_ERR_HANDLER.call_once`; after that mlx-rs never
        // registers again, so ours stays in place.
        let _ = mlx_rs::ops::abs(Array::from_int(0));
        // SAFETY: a plain function pointer and no user data.
        unsafe {
            mlx_sys::mlx_set_error_handler(Some(capture_handler), std::ptr::null_mut(), None)
        };
    });
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = None;
        }
    });
}

fn take_last_error() -> Option<String> {
    LAST_ERROR
        .try_with(|slot| slot.try_borrow_mut().ok().and_then(|mut s| s.take()))
        .ok()
        .flatten()
}

/// Turns an mlx-c status into a `Result`, with the message MLX raised.
fn check(op: &'static str, status: c_int) -> Result<(), MlxError> {
    if status == 0 {
        return Ok(());
    }
    let message = take_last_error()
        .unwrap_or_else(|| format!("failed with status {status} and no message from MLX"));
    Err(MlxError { op, message })
}

/// Runs one mlx-c call that writes a single array, and wraps the result.
///
/// `f` receives a fresh (empty) `mlx_array` to write into and returns the
/// mlx-c status. On failure the partially written array is freed and the
/// error carries MLX's message. This is the one place other modules should
/// use for raw calls (it installs the error handler first).
pub fn try_array(
    op: &'static str,
    f: impl FnOnce(*mut mlx_array) -> c_int,
) -> Result<Array, MlxError> {
    install_error_handler();
    clear_last_error();
    // SAFETY: `mlx_array_new` returns an empty handle; ownership passes to
    // `Array` on success, and it is freed here on failure.
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    let status = f(&mut res);
    match check(op, status) {
        Ok(()) => Ok(unsafe { Array::from_ptr(res) }),
        Err(e) => {
            unsafe { mlx_sys::mlx_array_free(res) };
            Err(e)
        }
    }
}

fn optional_int(v: Option<i32>) -> mlx_optional_int {
    mlx_optional_int {
        value: v.unwrap_or(0),
        has_value: v.is_some(),
    }
}

/// The null handle mlx-c reads as "argument not given".
fn null_array() -> mlx_array {
    // SAFETY: an empty handle; mlx-c checks `ctx` for NULL.
    unsafe { mlx_sys::mlx_array_new() }
}

fn opt_ptr(a: Option<&Array>) -> mlx_array {
    a.map_or_else(null_array, Array::as_ptr)
}

/// Quantizes the last axis of `w`: mirrors `mlx.core.quantize(w, group_size,
/// bits, mode=mode)` (mlx 0.32.2, no `global_scale`).
///
/// * `w`: a real floating array with at least 2 dimensions whose last
///   dimension `K` is divisible by `group_size`.
/// * `group_size`, `bits`: `None` picks the mode's default
///   ([`Mode::defaults`]), like Python's `None`.
///
/// Returns `(wq, scales, biases)`: `wq` is `uint32 [.., K * bits / 32]`;
/// `scales` is `[.., K / group_size]`, in the dtype of `w` for affine and
/// `uint8` otherwise; `biases` (same shape and dtype as `scales`) only for
/// [`Mode::Affine`].
///
/// # Errors
/// [`MlxError`] with MLX's message for every combination `mx.quantize`
/// rejects (group size checked before bits), a 1-D or integer `w`, or a last
/// dimension not divisible by `group_size`.
pub fn quantize(
    w: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
) -> Result<(Array, Array, Option<Array>), MlxError> {
    const OP: &str = "mlx_quantize";
    install_error_handler();
    clear_last_error();
    let stream = Stream::thread_local_or_default();
    // SAFETY: a fresh vector; freed below on every path.
    let mut out = unsafe { mlx_sys::mlx_vector_array_new() };
    let status = unsafe {
        mlx_sys::mlx_quantize(
            &mut out,
            w.as_ptr(),
            optional_int(group_size.into()),
            optional_int(bits.into()),
            mode.as_cstr().as_ptr(),
            null_array(),
            stream.as_ptr(),
        )
    };
    let result = check(OP, status).and_then(|()| {
        let n = unsafe { mlx_sys::mlx_vector_array_size(out) };
        let mut arrays = Vec::with_capacity(n);
        for i in 0..n {
            let mut a = null_array();
            let st = unsafe { mlx_sys::mlx_vector_array_get(&mut a, out, i) };
            if let Err(e) = check("mlx_vector_array_get", st) {
                unsafe { mlx_sys::mlx_array_free(a) };
                return Err(e);
            }
            arrays.push(unsafe { Array::from_ptr(a) });
        }
        Ok(arrays)
    });
    unsafe { mlx_sys::mlx_vector_array_free(out) };
    let mut arrays = result?.into_iter();
    match (arrays.next(), arrays.next(), arrays.next(), arrays.next()) {
        (Some(wq), Some(scales), biases, None) => Ok((wq, scales, biases)),
        _ => Err(MlxError {
            op: OP,
            message: "MLX returned an unexpected number of arrays".to_owned(),
        }),
    }
}

/// Reconstructs the floating matrix: mirrors `mlx.core.dequantize(w, scales,
/// biases, group_size, bits, mode=mode, dtype=dtype)` (mlx 0.32.2, no
/// `global_scale`).
///
/// Shapes as returned by [`quantize`]; the result is `[.., K]` in `dtype`, or
/// when `None` in the dtype of `scales` for affine and `bfloat16` for the
/// floating-point modes (measured on the pinned reference, also for `float32`
/// inputs to `quantize`).
///
/// # Errors
/// [`MlxError`] with MLX's message (e.g. affine without `biases`, shapes that
/// do not match `group_size` and `bits`).
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
    dtype: Option<Dtype>,
) -> Result<Array, MlxError> {
    let stream = Stream::thread_local_or_default();
    let dtype = mlx_optional_dtype {
        value: dtype.map_or(0, u32::from),
        has_value: dtype.is_some(),
    };
    let (group_size, bits) = (optional_int(group_size.into()), optional_int(bits.into()));
    try_array("mlx_dequantize", |res| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            opt_ptr(biases),
            group_size,
            bits,
            mode.as_cstr().as_ptr(),
            null_array(),
            dtype,
            stream.as_ptr(),
        )
    })
}

/// `x @ dequantize(w).T` (or without the transpose): mirrors
/// `mlx.core.quantized_matmul(x, w, scales, biases, transpose, group_size,
/// bits, mode=mode)` (mlx 0.32.2).
///
/// * `x`: `[.., M, K]` floating; `w`: `uint32 [N, K * bits / 32]` when
///   `transpose` (the layout `mlx.nn.QuantizedLinear` uses); `scales` (and
///   `biases`, affine only): `[N, K / group_size]`.
/// * Result `[.., M, N]`; dtype `promote(x, scales)` for affine, `x.dtype`
///   for the floating-point modes (measured on the reference).
///
/// # Errors
/// [`MlxError`] with MLX's message, e.g. `Biases must be provided for affine
/// quantization`, `Biases must be null for quantization mode 'mxfp4'`, or a
/// `K` that does not match the expanded matrix.
#[allow(clippy::too_many_arguments)] // mirrors the MLX signature one to one
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
) -> Result<Array, MlxError> {
    let stream = Stream::thread_local_or_default();
    let (group_size, bits) = (optional_int(group_size.into()), optional_int(bits.into()));
    try_array("mlx_quantized_matmul", |res| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            opt_ptr(biases),
            transpose,
            group_size,
            bits,
            mode.as_cstr().as_ptr(),
            stream.as_ptr(),
        )
    })
}

/// Quantized matmul with gathered operands: mirrors `mlx.core.gather_qmm(x,
/// w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits,
/// mode=mode, sorted_indices=sorted_indices)` (mlx 0.32.2, which has no
/// `global_scale`).
///
/// * `w`: stacked matrices `uint32 [E, N, K * bits / 32]` (with `transpose`);
///   `scales`/`biases`: `[E, N, K / group_size]`.
/// * `rhs_indices` picks the matrix of `w` per batch element, `lhs_indices`
///   the batch element of `x`; `None` means the identity.
/// * `sorted_indices`: promise that `rhs_indices` is sorted (a performance
///   hint; MLX may take a different kernel).
///
/// MLX does not bound-check the indices on every backend: callers holding
/// untrusted indices must check them first (as
/// [`crate::quantized::QuantizedSwitchLinear::forward`] does).
///
/// # Errors
/// [`MlxError`] with MLX's message (prefix `[gather_qmm]`).
#[allow(clippy::too_many_arguments)] // mirrors the MLX signature one to one
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
    sorted_indices: bool,
) -> Result<Array, MlxError> {
    let stream = Stream::thread_local_or_default();
    let (group_size, bits) = (optional_int(group_size.into()), optional_int(bits.into()));
    try_array("mlx_gather_qmm", |res| unsafe {
        mlx_sys::mlx_gather_qmm(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            opt_ptr(biases),
            opt_ptr(lhs_indices),
            opt_ptr(rhs_indices),
            transpose,
            group_size,
            bits,
            mode.as_cstr().as_ptr(),
            sorted_indices,
            stream.as_ptr(),
        )
    })
}

/// Bytes of one element of `dtype`.
pub fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
    }
}

fn element_count(shape: &[i32]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
    })
}

fn check_len(op: &'static str, len: usize, shape: &[i32], dtype: Dtype) -> Result<(), MlxError> {
    let expected = element_count(shape).and_then(|n| n.checked_mul(dtype_size(dtype)));
    if expected != Some(len) {
        return Err(MlxError {
            op,
            message: format!("{len} bytes cannot hold a {dtype:?} array of shape {shape:?}"),
        });
    }
    Ok(())
}

/// Wraps an `mlx_array` constructor that reports failure by returning an
/// empty handle (and calling the error handler) instead of a status.
fn constructed(op: &'static str, arr: mlx_array) -> Result<Array, MlxError> {
    if arr.ctx.is_null() {
        let message =
            take_last_error().unwrap_or_else(|| "MLX returned no array and no message".to_owned());
        return Err(MlxError { op, message });
    }
    // SAFETY: a non-empty handle whose ownership we take.
    Ok(unsafe { Array::from_ptr(arr) })
}

/// A new array holding a copy of `data` (little-endian elements of `dtype`,
/// row-major, `shape`): what `mx.load` does with a safetensors byte range.
///
/// `data` may be unaligned (safetensors data offsets need not be): it is then
/// copied to an aligned buffer first. `Dtype::Bool` is built as `uint8` and
/// bit-cast, so any byte value is carried over as MLX's loader carries it.
///
/// # Errors
/// [`MlxError`] when `data.len()` is not `prod(shape) * size(dtype)` or MLX
/// rejects the array.
pub fn array_from_bytes(data: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array, MlxError> {
    const OP: &str = "mlx_array_new_data";
    check_len(OP, data.len(), shape, dtype)?;
    let build_dtype = if dtype == Dtype::Bool {
        Dtype::Uint8
    } else {
        dtype
    };
    let aligned: Vec<u64>;
    let ptr = if (data.as_ptr() as usize).is_multiple_of(dtype_size(build_dtype))
        && !data.is_empty()
    {
        data.as_ptr()
    } else {
        let mut buf = vec![0u64; data.len().div_ceil(8).max(1)];
        // SAFETY: `buf` has at least `data.len()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr().cast::<u8>(), data.len())
        };
        aligned = buf;
        aligned.as_ptr().cast::<u8>()
    };
    install_error_handler();
    clear_last_error();
    let ndim = c_int::try_from(shape.len()).map_err(|_| MlxError {
        op: OP,
        message: format!("{} dimensions are too many", shape.len()),
    })?;
    // SAFETY: `ptr` holds `data.len()` readable bytes, checked above to be
    // exactly the array's size; MLX copies them before returning.
    let arr = unsafe {
        mlx_sys::mlx_array_new_data(
            ptr.cast::<c_void>(),
            shape.as_ptr(),
            ndim,
            build_dtype.into(),
        )
    };
    let array = constructed(OP, arr)?;
    if dtype == Dtype::Bool {
        Ok(array.view_dtype(Dtype::Bool)?)
    } else {
        Ok(array)
    }
}

unsafe extern "C" fn drop_owner<O>(payload: *mut c_void) {
    // SAFETY: `payload` is the `Box<O>` leaked by `array_from_owner`, and
    // MLX calls the deleter exactly once.
    drop(unsafe { Box::from_raw(payload.cast::<O>()) });
}

/// An array over the bytes `owner` holds, without a copy where the MLX
/// allocator can wrap foreign memory (Metal, for page-aligned memory), and
/// copied otherwise (the CPU allocator of MLX 0.32.2 copies, then releases
/// `owner`). The bits are the same either way. `owner` (e.g. a memory map)
/// is dropped when MLX no longer needs the memory, possibly on another
/// thread.
///
/// # Errors
/// [`MlxError`] when the length does not match `shape` and `dtype`, the
/// bytes are not aligned for `dtype`, or MLX rejects the array (then `owner`
/// may be leaked: MLX gives no way to know whether it kept the deleter).
pub fn array_from_owner<O>(owner: O, shape: &[i32], dtype: Dtype) -> Result<Array, MlxError>
where
    O: std::ops::DerefMut<Target = [u8]> + Send + 'static,
{
    const OP: &str = "mlx_array_new_data_managed_payload";
    check_len(OP, owner.len(), shape, dtype)?;
    if dtype == Dtype::Bool {
        return Err(MlxError {
            op: OP,
            message: "bool arrays are not mapped; use array_from_bytes".to_owned(),
        });
    }
    let ndim = c_int::try_from(shape.len()).map_err(|_| MlxError {
        op: OP,
        message: format!("{} dimensions are too many", shape.len()),
    })?;
    let mut owner = Box::new(owner);
    let data = owner.as_mut_ptr();
    if !(data as usize).is_multiple_of(dtype_size(dtype)) || owner.is_empty() {
        return Err(MlxError {
            op: OP,
            message: "the bytes are empty or not aligned for the dtype".to_owned(),
        });
    }
    install_error_handler();
    clear_last_error();
    let payload = Box::into_raw(owner);
    // SAFETY: `data` points into `*payload`, which stays alive (boxed, so its
    // heap/mapped buffer does not move) until MLX calls `drop_owner`.
    let arr = unsafe {
        mlx_sys::mlx_array_new_data_managed_payload(
            data.cast::<c_void>(),
            shape.as_ptr(),
            ndim,
            dtype.into(),
            payload.cast::<c_void>(),
            Some(drop_owner::<O>),
        )
    };
    constructed(OP, arr)
}
