//! The quantization ops with a `mode`: `quantize`, `dequantize`,
//! `quantized_matmul` and `gather_qmm`.

use mlx_rs::{Array, Dtype, Stream};
use mlx_sys::{mlx_array, mlx_optional_dtype, mlx_optional_int};

use super::error::{check, clear_last_error, install_error_handler, try_array, MlxError};
use super::Mode;

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
    quantize_impl(w, group_size.into(), bits.into(), mode, None)
}

/// [`quantize`] with nvfp4's per-tensor `global_scale` (a float32 scalar):
/// mirrors `mlx.core.quantize(w, group_size, bits, mode=mode,
/// global_scale=global_scale)` (mlx 0.32.2). Returns `(wq, scales)`.
///
/// # Errors
/// [`MlxError`] with MLX's message: a mode other than nvfp4, a global scale
/// that is not a float32 scalar, and everything [`quantize`] rejects.
pub fn quantize_with_global_scale(
    w: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
    global_scale: &Array,
) -> Result<(Array, Array), MlxError> {
    let (wq, scales, _) =
        quantize_impl(w, group_size.into(), bits.into(), mode, Some(global_scale))?;
    Ok((wq, scales))
}

fn quantize_impl(
    w: &Array,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: Mode,
    global_scale: Option<&Array>,
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
            optional_int(group_size),
            optional_int(bits),
            mode.as_cstr().as_ptr(),
            opt_ptr(global_scale),
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
    dequantize_impl(
        w,
        scales,
        biases,
        group_size.into(),
        bits.into(),
        mode,
        None,
        dtype,
    )
}

/// [`dequantize`] with nvfp4's per-tensor `global_scale`: mirrors
/// `mlx.core.dequantize(w, scales, group_size=…, bits=…, mode=mode,
/// global_scale=global_scale, dtype=dtype)` (mlx 0.32.2). Without `dtype`
/// the result is float32 (measured), not the bfloat16 of [`dequantize`].
///
/// # Errors
/// [`MlxError`] with MLX's message.
pub fn dequantize_with_global_scale(
    w: &Array,
    scales: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: Mode,
    global_scale: &Array,
    dtype: Option<Dtype>,
) -> Result<Array, MlxError> {
    dequantize_impl(
        w,
        scales,
        None,
        group_size.into(),
        bits.into(),
        mode,
        Some(global_scale),
        dtype,
    )
}

#[allow(clippy::too_many_arguments)]
fn dequantize_impl(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: Mode,
    global_scale: Option<&Array>,
    dtype: Option<Dtype>,
) -> Result<Array, MlxError> {
    let stream = Stream::thread_local_or_default();
    let dtype = mlx_optional_dtype {
        value: dtype.map_or(0, u32::from),
        has_value: dtype.is_some(),
    };
    let (group_size, bits) = (optional_int(group_size), optional_int(bits));
    try_array("mlx_dequantize", |res| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            opt_ptr(biases),
            group_size,
            bits,
            mode.as_cstr().as_ptr(),
            opt_ptr(global_scale),
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
