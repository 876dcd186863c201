//! Seeded inputs, generated on the host so both sides receive the same bits.

use oracle::{DType, HostTensor};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// A reproducible generator (ChaCha8: stable across versions and platforms).
pub struct Inputs(ChaCha8Rng);

impl Inputs {
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in [-scale, scale), rounded to `dtype` (a float dtype).
    pub fn uniform(&mut self, dtype: DType, shape: &[usize], scale: f32) -> HostTensor {
        let n: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(n * dtype.size());
        for _ in 0..n {
            let u = (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32;
            let v = (2.0 * u - 1.0) * scale;
            match dtype {
                DType::Float32 => bytes.extend_from_slice(&v.to_le_bytes()),
                DType::Bfloat16 => bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                DType::Float16 => bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                other => panic!("uniform() needs a float dtype, got {other:?}"),
            }
        }
        HostTensor::new(dtype, shape.to_vec(), bytes).expect("sized by construction")
    }

    /// Integers in [low, high) as int32 or uint32.
    pub fn integers(&mut self, dtype: DType, shape: &[usize], low: i64, high: i64) -> HostTensor {
        let n: usize = shape.iter().product();
        let span = (high - low) as u64;
        let mut bytes = Vec::with_capacity(n * 4);
        for _ in 0..n {
            let v = low + (self.0.next_u64() % span) as i64;
            match dtype {
                DType::Int32 => bytes.extend_from_slice(&(v as i32).to_le_bytes()),
                DType::Uint32 => bytes.extend_from_slice(&(v as u32).to_le_bytes()),
                other => panic!("integers() needs int32 or uint32, got {other:?}"),
            }
        }
        HostTensor::new(dtype, shape.to_vec(), bytes).expect("sized by construction")
    }
}
