//! Arrays from raw little-endian bytes: copied ([`array_from_bytes`]) or
//! over memory an owner keeps alive ([`array_from_owner`]).

use std::ffi::{c_int, c_void};

use mlx_rs::{Array, Dtype};
use mlx_sys::mlx_array;

use super::error::{clear_last_error, install_error_handler, take_last_error, MlxError};

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
