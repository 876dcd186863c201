//! Chunk sizing for appending tokens to a KV cache so that every committed
//! span stays inside one SDPA arithmetic regime.
//!
//! SDPA picks its kernel (one-pass vector, two-pass with a block count, …)
//! from the KV length; each choice rounds differently. A prompt appended in
//! chunks matches token-by-token decoding (M = 1) only if no chunk straddles
//! a length where the choice changes. Ported from the origin's
//! `layers/qwen-append.ts`, which reads the boundaries off MLX 0.32.2
//! `mlx/backend/metal/scaled_dot_product_attention.cpp`.

use super::error::PositionError;

/// The largest chunk ever returned (the origin's `Math.min(4, …)`).
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
    /// The largest chunk this backend's arithmetic allows at all
    /// ([`MAX_APPEND_CHUNK`], or 1 where only M = 1 reproduces decoding).
    max_chunk: usize,
}

impl RegimeTable {
    /// Metal's table, from the origin: `[1023, 1024, 8192, 32768, 65536]`.
    ///
    /// Qualified for the Qwen GQA-6 / head_dim 256 attention graph on
    /// `applegpu_g16s` (MLX 0.32.2): after these inclusive KV lengths the
    /// one-pass/vector selection and the two-pass block counts change.
    /// Other head dims, GQA factors or GPUs need their own measurement.
    pub fn metal() -> Self {
        RegimeTable {
            backend: Backend::Metal,
            boundaries: vec![1023, 1024, 8192, 32768, 65536],
            max_chunk: MAX_APPEND_CHUNK,
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
            max_chunk: MAX_APPEND_CHUNK,
        }
    }

    /// The CUDA table: **append one token at a time**, by measurement. On
    /// MLX 0.32.2's CUDA backend (`mlx-cuda-13`), a chunk of
    /// [`MAX_APPEND_CHUNK`] tokens does not reproduce token-by-token
    /// (M = 1) decoding at most KV lengths: M = 1 runs the fused
    /// sdpa-vector kernel, a chunk (M > 1) the other SDPA path, and they
    /// round differently. No set of boundaries can describe that, so every
    /// chunk is 1 ([`RegimeTable::append_chunk_size`] returns 1).
    ///
    /// Measured 2026-12-01 on an NVIDIA H200 (sm_90, driver 580.159.04,
    /// CUDA 13.0) by the conformance boundary finder (case
    /// `attention/boundary-finder/qwen35-gqa6-d256-h512/affine-4b-gs64/bf16/chunk4`,
    /// same graph as [`RegimeTable::cpu`], 64 dense candidates from 4 to
    /// 65536): 57 of the 64 straddling chunks of 4 failed; failing runs at
    /// cache lengths 135–254, 509–510, 1018–1024 and from 1026 on (open,
    /// through 65538); the finder classified it "differs at most lengths".
    /// Every crossing window (cache 1019–1029, 8186–8198, 32762–32770,
    /// 65530–65540) differed too, while M = 1 decoding matched the
    /// reference bit for bit in all four windows. The run's evidence is
    /// kept under `fixtures/gpu-runs/` in the conformance repository.
    pub fn cuda() -> Self {
        RegimeTable {
            backend: Backend::Cuda,
            boundaries: Vec::new(),
            max_chunk: 1,
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
            max_chunk: MAX_APPEND_CHUNK,
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
    /// Mirrors the origin's `qwenAppendChunkSize`: the first boundary `end >
    /// cache_len` gives `min(4, end − cache_len)`; past every boundary, 4.
    pub fn append_chunk_size(&self, cache_len: usize) -> usize {
        self.boundaries
            .iter()
            .find(|&&end| cache_len < end)
            .map_or(self.max_chunk, |&end| self.max_chunk.min(end - cache_len))
    }

    /// The largest chunk the table ever returns.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }
}
