//! Small MLX helpers with the reference's exact semantics.

use mlx_rs::{Array, Dtype, Stream};

use crate::ffi::try_array;

use super::ModelError;

/// `a[..., start:stop, ...]` on `axis` (a view, as Python slicing makes).
pub fn slice_axis(a: &Array, axis: usize, start: i32, stop: i32) -> Result<Array, ModelError> {
    let shape = a.shape();
    let mut starts = vec![0i32; shape.len()];
    let mut stops = shape.to_vec();
    let strides = vec![1i32; shape.len()];
    starts[axis] = start;
    stops[axis] = stop;
    let stream = Stream::thread_local_or_default();
    Ok(try_array("mlx_slice", |res| unsafe {
        mlx_sys::mlx_slice(
            res,
            a.as_ptr(),
            starts.as_ptr(),
            starts.len(),
            stops.as_ptr(),
            stops.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        )
    })?)
}

/// `src[..., start:stop, ...] = update` on `axis` (Python `__setitem__`
/// with slices: `slice_update`).
pub fn slice_update_axis(
    src: &Array,
    update: &Array,
    axis: usize,
    start: i32,
    stop: i32,
) -> Result<Array, ModelError> {
    let shape = src.shape();
    let mut starts = vec![0i32; shape.len()];
    let mut stops = shape.to_vec();
    let strides = vec![1i32; shape.len()];
    starts[axis] = start;
    stops[axis] = stop;
    let stream = Stream::thread_local_or_default();
    Ok(try_array("mlx_slice_update", |res| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            starts.as_ptr(),
            starts.len(),
            stops.as_ptr(),
            stops.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        )
    })?)
}

/// A Python float scalar as MLX makes it meet an array of `dtype` (a weak
/// scalar: `array(float(value)).astype(dtype)`).
pub fn weak_scalar(value: f64, dtype: Dtype) -> Result<Array, ModelError> {
    Ok(Array::from_f32(value as f32).as_dtype(dtype)?)
}

/// `mlx.nn.silu`: `x * sigmoid(x)`.
pub fn silu(x: &Array) -> Result<Array, ModelError> {
    Ok(x.multiply(mlx_rs::ops::sigmoid(x)?)?)
}
