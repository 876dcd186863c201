//! Chunk sizing for appending tokens to a KV cache so that every committed
//! span stays inside one SDPA arithmetic regime.
//!
//! SDPA picks its kernel (one-pass vector, two-pass with a block count, …)
//! from the KV length; each choice rounds differently. A prompt appended in
//! chunks matches token-by-token decoding (M = 1) only if no chunk straddles
//! a length where the choice changes. Ported from the seed's
//! `layers/qwen-append.ts`, which reads the boundaries off MLX 0.32.2
//! `mlx/backend/metal/scaled_dot_product_attention.cpp`.

use super::error::PositionError;

/// The largest chunk ever returned (the seed's `Math.min(4, …)`).
pub const MAX_APPEND_CHUNK: usize = 4;

pub use crate::backend::Backend;

/// Inclusive KV lengths after which a backend's SDPA arithmetic changes.
///
/// Regime `i` holds the KV lengths `n` with `boundaries[i-1] < n <=
/// boundaries[i]` (regime 0 starts at 1; the last regime is unbounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegimeTable {
    backend: Backend,
    boundaries: Vec<usize>,
}

impl RegimeTable {
    /// Metal's table, from the seed: `[1023, 1024, 8192, 32768, 65536]`.
    ///
    /// Qualified for the Qwen GQA-6 / head_dim 256 attention graph on
    /// `applegpu_g16s` (MLX 0.32.2): after these inclusive KV lengths the
    /// one-pass/vector selection and the two-pass block counts change.
    /// Other head dims, GQA factors or GPUs need their own measurement.
    pub fn metal() -> Self {
        RegimeTable {
            backend: Backend::Metal,
            boundaries: vec![1023, 1024, 8192, 32768, 65536],
        }
    }

    /// The CPU table: **empty, by measurement**. On MLX 0.32.2's CPU
    /// backend (SDPA there is the unfused fallback: no fused CPU kernel),
    /// appending a chunk of up to [`MAX_APPEND_CHUNK`] tokens reproduced
    /// token-by-token (M = 1) decoding bit for bit at every KV length
    /// probed, so there is no regime boundary to respect. An empty table is
    /// one unbounded regime: every chunk is [`MAX_APPEND_CHUNK`].
    ///
    /// Measured 2026-11-29 on x86-64 Linux (the `mlx-cpu` 0.32.2 wheel) by
    /// the conformance boundary finder (`conformance` crate,
    /// `families::attention::finder`; case
    /// `attention/boundary-finder/qwen35-gqa6-d256-h512/affine-4b-gs64/bf16/chunk4`)
    /// on a Qwen3.5-like decode step: 6 query heads / 1 KV head (GQA 6),
    /// head_dim 256, partial RoPE 64 of 256 (base 1e7), bf16, hidden 512,
    /// rows-independent affine 4-bit group-64 q/k/v/o projections. Chunks of
    /// 4 straddling every power of two 4 ..= 65536 and every Metal boundary
    /// (KV lengths `b-1 ..= b+2`), and whole windows of cache lengths
    /// 1019–1029, 8186–8198, 32762–32770 and 65530–65540 appended in chunks
    /// of 4, all matched M = 1 in every output (attention, `o_proj`, keys,
    /// values). Another shape, MLX version or CPU needs its own measurement;
    /// the finder's snapshot flags a change.
    pub fn cpu() -> Self {
        RegimeTable {
            backend: Backend::Cpu,
            boundaries: Vec::new(),
        }
    }

    /// A table from measured boundaries.
    ///
    /// # Errors
    /// [`PositionError::RegimeBoundaries`] unless the boundaries are
    /// positive and strictly increasing.
    pub fn from_measured(backend: Backend, boundaries: Vec<usize>) -> Result<Self, PositionError> {
        let increasing = boundaries.windows(2).all(|w| w[0] < w[1]);
        if !increasing || boundaries.first() == Some(&0) {
            return Err(PositionError::RegimeBoundaries { boundaries });
        }
        Ok(RegimeTable {
            backend,
            boundaries,
        })
    }

    /// The backend described.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The boundaries, strictly increasing.
    pub fn boundaries(&self) -> &[usize] {
        &self.boundaries
    }

    /// The regime of KV length `kv_len`: how many boundaries lie below it.
    pub fn regime(&self, kv_len: usize) -> usize {
        self.boundaries.partition_point(|&b| b < kv_len)
    }

    /// How many tokens to append to a cache holding `cache_len` tokens: the
    /// largest chunk of at most [`MAX_APPEND_CHUNK`] whose KV lengths
    /// `cache_len + 1 ..= cache_len + chunk` share one regime. Always at
    /// least 1.
    ///
    /// Mirrors the seed's `qwenAppendChunkSize`: the first boundary `end >
    /// cache_len` gives `min(4, end − cache_len)`; past every boundary, 4.
    pub fn append_chunk_size(&self, cache_len: usize) -> usize {
        self.boundaries
            .iter()
            .find(|&&end| cache_len < end)
            .map_or(MAX_APPEND_CHUNK, |&end| {
                MAX_APPEND_CHUNK.min(end - cache_len)
            })
    }
}
