//! Small MLX helpers with the reference's exact semantics.

use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
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

/// `mlx.nn.silu` (`@partial(mx.compile, shapeless=True)`): `x * sigmoid(x)`,
/// compiled as the reference's is.
pub fn silu(x: &Array) -> Result<Array, ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        Ok(vec![silu_ops(&inputs[0])?])
    }
    let mut out = run_compiled("nn.silu", true, graph, std::slice::from_ref(x))?;
    Ok(out.pop().expect("the graph returns one array"))
}

/// `x * sigmoid(x)` as plain ops, for use inside a compiled graph (where the
/// reference's nested `mx.compile` of `nn.silu` is traced inline).
pub fn silu_ops(x: &Array) -> Result<Array, Exception> {
    x.multiply(mlx_rs::ops::sigmoid(x)?)
}

/// An op graph the reference runs under `mx.compile`: inputs in, outputs out.
pub type Graph = fn(&[Array]) -> Result<Vec<Array>, Exception>;

type CompiledGraph = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception>>;

/// Runs `graph` compiled, as the reference's `@mx.compile` /
/// `@partial(mx.compile, shapeless=True)` function `name` runs. Why: on
/// CUDA, MLX fuses a compiled function's elementwise ops into one
/// NVRTC-built kernel (NVRTC contracts `a * b + c` into an FMA by default),
/// which rounds differently from the same ops run one kernel each; on the
/// CPU both agree. So the port compiles the same graph the same way. One
/// compiled function per name and thread, traced once per input shapes and
/// dtypes (every call when not shapeless) as a module-level `mx.compile`
/// is (mlx-rs compiled functions are not `Send`).
pub fn run_compiled(
    name: &'static str,
    shapeless: bool,
    graph: Graph,
    inputs: &[Array],
) -> Result<Vec<Array>, ModelError> {
    thread_local! {
        static COMPILED: RefCell<HashMap<&'static str, CompiledGraph>> =
            RefCell::new(HashMap::new());
    }
    Ok(COMPILED.with(|slots| {
        let mut slots = slots.borrow_mut();
        let apply = slots
            .entry(name)
            .or_insert_with(|| Box::new(compile(graph, shapeless)));
        apply(inputs)
    })?)
}
