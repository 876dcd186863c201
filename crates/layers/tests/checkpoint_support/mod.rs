//! Fixture helpers shared by the checkpoint and quantized tests: temporary
//! directories, raw safetensors bytes, and quantized tensors written with the
//! library's own writer.
#![allow(dead_code)] // each test crate uses a subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use layers::checkpoint::{write_model_dir, RawTensor};
use layers::ffi;
use layers::quantized::QuantSpec;
use mlx_rs::{random, Array, Dtype};
use serde_json::Value;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "layers-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes of a safetensors file with this header JSON and data section.
pub fn raw_safetensors(header: &Value, data: &[u8]) -> Vec<u8> {
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Standard normal float32 values.
pub fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap()
}

/// `shape` of `dtype` normal values.
pub fn normal_as(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    normal(shape, seed).as_dtype(dtype).unwrap()
}

/// `path.weight`, `path.scales` (and affine `path.biases`) of a random
/// `[.., out, in]` matrix quantized with `spec`.
pub fn quantized_tensors(path: &str, shape: &[i32], spec: QuantSpec, seed: u64) -> Vec<RawTensor> {
    let w = normal_as(shape, seed, Dtype::Bfloat16);
    let (wq, scales, biases) = ffi::quantize(&w, spec.group_size, spec.bits, spec.mode).unwrap();
    let mut out = vec![
        RawTensor::from_array(format!("{path}.weight"), &wq).unwrap(),
        RawTensor::from_array(format!("{path}.scales"), &scales).unwrap(),
    ];
    if let Some(b) = biases {
        out.push(RawTensor::from_array(format!("{path}.biases"), &b).unwrap());
    }
    out
}

/// A float tensor.
pub fn float_tensor(name: &str, shape: &[i32], seed: u64) -> RawTensor {
    RawTensor::from_array(name, &normal_as(shape, seed, Dtype::Bfloat16)).unwrap()
}

/// A model directory with `config` and one shard.
pub fn model_dir(tag: &str, config: &Value, tensors: Vec<RawTensor>) -> TempDir {
    let dir = TempDir::new(tag);
    write_model_dir(dir.path(), config, &[tensors]).unwrap();
    dir
}

/// Bitwise equality of two arrays (dtype, shape and bytes).
pub fn same_bits(a: &Array, b: &Array) -> bool {
    let (ra, rb) = (
        RawTensor::from_array("a", a).unwrap(),
        RawTensor::from_array("b", b).unwrap(),
    );
    ra.dtype == rb.dtype && ra.shape == rb.shape && ra.data == rb.data
}
