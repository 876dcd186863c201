//! `attention/sdpa`: the attention core of one serving step as data (the
//! explorer's attention family, and the kept cases it writes).
//!
//! A step of `batch` requests, each with `kv_len` (L) keys and values
//! `[B, H_kv, L, D]` and `m` (M) query rows `[B, H, M, D]` (M = 1 a decode
//! step, M > 1 a chunk: a speculative verify or a chunked prefill, causal
//! within it), GQA ratio `n_heads / n_kv_heads`, scale `head_dim ** -0.5`.
//!
//! - The port: the attention step's own cache and mask policy
//!   ([`super::step`]: the first L − M keys prefilled, the last M appended
//!   by [`KvCache`] (the step-256 buffer of `layers::model::KvCache`, since
//!   the model family), no mask for M = 1, `"causal"` above),
//!   then `fast::scaled_dot_product_attention`. With
//!   [`KvView::CacheBuffer`] the port instead hands SDPA the prefix slice
//!   of a buffer grown in steps of 256, as `mlx_lm.models.cache.KVCache`
//!   holds it: same bits, other strides. MLX's CUDA backend picks its
//!   kernel from those strides (cuDNN for a decode step only when K/V are
//!   slices of a step-256 buffer).
//! - The reference: mlx-lm's `KVCache`, `create_attention_mask` and
//!   `base.scaled_dot_product_attention` (glue `sdpa_kv_cache`), with the
//!   exact oracle's SDPA attached.
//! - Invariances of the port (findings): each request of the batch alone
//!   gives its row of the batch; each query row of a chunk alone (M = 1
//!   over its causal prefix) gives its row of the chunk; the cache-buffer
//!   view gives the contiguous view's bits.

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;
use oracle::{DType, HostTensor};
use serde::{Deserialize, Serialize};

use super::step::KvCache;
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::support::{dtype_tag, host};
use crate::inputs::Inputs;
use crate::reference;

const FAMILY: &str = "attention/sdpa";
const REFERENCE: &str =
    "mlx_lm.models.base.scaled_dot_product_attention on an mlx_lm.models.cache.KVCache, \
     mask from mlx_lm.models.base.create_attention_mask (mlx-lm 0.32.2, mlx 0.32.2)";
/// `mlx_lm.models.cache.KVCache.step`.
pub const CACHE_STEP: usize = 256;

/// The most attention scores (B x H x M x L) a step may hold: 2^27 (the
/// explorer draws at most 8 x 32 x 16 x 8193, about 2^25).
pub const MAX_SCORES: usize = 1 << 27;

/// How the port's keys and values reach SDPA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvView {
    /// One contiguous `[B, H_kv, L, D]` array (the port's own cache).
    Contiguous,
    /// The first L rows of a `[B, H_kv, ceil(L / 256) * 256, D]` buffer.
    CacheBuffer,
}

/// One attention step's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SdpaShape {
    pub dtype: DType,
    /// Requests batched in the step.
    pub batch: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Keys per request, the M new ones included.
    pub kv_len: usize,
    /// Query rows per request.
    pub m: usize,
    pub kv_view: KvView,
}

/// A step's seeded inputs (one generator: queries, keys, values).
pub struct SdpaInputs {
    pub queries: HostTensor,
    pub keys: HostTensor,
    pub values: HostTensor,
}

impl SdpaShape {
    /// Why the shape cannot run, if so.
    pub fn check(&self) -> Result<(), String> {
        if self.batch == 0
            || self.n_heads == 0
            || self.n_kv_heads == 0
            || self.head_dim == 0
            || self.m == 0
        {
            return Err("batch, n_heads, n_kv_heads, head_dim and m must be positive".into());
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.m > self.kv_len {
            return Err(format!("m {} exceeds kv_len {}", self.m, self.kv_len));
        }
        if !matches!(
            self.dtype,
            DType::Bfloat16 | DType::Float16 | DType::Float32
        ) {
            return Err(format!(
                "dtype {} is not a float dtype SDPA takes",
                self.dtype.name()
            ));
        }
        // i32 shapes, and a bound on what a kept file can ask for.
        let elements = [
            self.n_kv_heads.max(self.n_heads),
            self.kv_len
                .checked_next_multiple_of(CACHE_STEP)
                .unwrap_or(usize::MAX),
            self.head_dim,
        ]
        .into_iter()
        .try_fold(self.batch, |a, d| a.checked_mul(d));
        if elements.is_none_or(|e| e > 1 << 30) {
            return Err("the step holds more than 2^30 elements".into());
        }
        // The attention scores (and the causal mask) are B x H x M x L:
        // the largest tensor a step allocates, in the reference, the port
        // and the float64 exact oracle. M = L = 65536 passed the bound
        // above and crashed its worker (SIGFPE).
        let scores = [self.n_heads, self.m, self.kv_len]
            .into_iter()
            .try_fold(self.batch, |a, d| a.checked_mul(d));
        if scores.is_none_or(|e| e > MAX_SCORES) {
            return Err(format!(
                "the step's attention scores (B x H x M x L) hold more than 2^{} elements",
                MAX_SCORES.trailing_zeros()
            ));
        }
        Ok(())
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// `attention/sdpa/<dtype>/B<b>-H<h>-KV<hkv>-D<d>/L<l>-M<m>[/cache-buffer]`.
    pub fn name(&self) -> String {
        format!(
            "{FAMILY}/{}/B{}-H{}-KV{}-D{}/L{}-M{}{}",
            dtype_tag(self.dtype),
            self.batch,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.kv_len,
            self.m,
            if self.kv_view == KvView::CacheBuffer {
                "/cache-buffer"
            } else {
                ""
            }
        )
    }

    pub fn inputs(&self, seed: u64) -> SdpaInputs {
        let mut inputs = Inputs::new(seed);
        let (b, h, hkv, d) = (self.batch, self.n_heads, self.n_kv_heads, self.head_dim);
        let queries = inputs.uniform(self.dtype, &[b, h, self.m, d], 1.0);
        let keys = inputs.uniform(self.dtype, &[b, hkv, self.kv_len, d], 1.0);
        let values = inputs.uniform(self.dtype, &[b, hkv, self.kv_len, d], 1.0);
        SdpaInputs {
            queries,
            keys,
            values,
        }
    }

    /// The must-equal case of this shape under `name`.
    pub fn case_named(self, name: String) -> Case {
        <Self as crate::families::describe::Params>::build(self, name)
    }
}

impl crate::families::describe::Params for SdpaShape {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| run(ctx, &self)).glue_composed(&[
            "mlx_lm.models.cache.KVCache, prefilled with the first L - M keys in one update",
            "mlx_lm.models.base.create_attention_mask for the M query rows",
            "the last M keys through KVCache.update_and_fetch",
            "mlx_lm.models.base.scaled_dot_product_attention",
        ])
    }
}

impl SdpaShape {
    /// The port's step: `[B, H, M, D]`, evaluated.
    pub fn port(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        view: KvView,
    ) -> Result<Array, CaseError> {
        let mlx = |e: mlx_rs::error::Exception| {
            CaseError::Port(format!("the port's attention step: {e}"))
        };
        let (m, l) = (queries.shape()[2], keys.shape()[2]);
        let rows = |a: &Array, from: i32, to: i32| a.try_index((.., .., from..to, ..)).map_err(mlx);
        let (all_keys, all_values) = match view {
            KvView::Contiguous => {
                let prefill = if l > m {
                    Some((rows(keys, 0, l - m)?, rows(values, 0, l - m)?))
                } else {
                    None
                };
                let mut cache = KvCache::prefilled(prefill);
                cache.append(&rows(keys, l - m, l)?, &rows(values, l - m, l)?)?
            }
            KvView::CacheBuffer => {
                // The prefix slice (a view) of a buffer grown in steps of 256.
                let buffered = |a: &Array| -> Result<Array, CaseError> {
                    let pad = (l as usize).next_multiple_of(CACHE_STEP) as i32 - l;
                    if pad == 0 {
                        return Ok(a.clone());
                    }
                    let mut shape = a.shape().to_vec();
                    shape[2] = pad;
                    let zeros = zeros_dtype(&shape, a.dtype()).map_err(mlx)?;
                    rows(&concatenate(&[a, &zeros], 2).map_err(mlx)?, 0, l)
                };
                (buffered(keys)?, buffered(values)?)
            }
        };
        // Evaluated first, as a cache's arrays are: CUDA picks its kernel
        // from the strides of evaluated keys and values.
        mlx_rs::transforms::eval([&all_keys, &all_values]).map_err(mlx)?;
        let mask = (m > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let out = fast::scaled_dot_product_attention(
            queries,
            &all_keys,
            &all_values,
            self.scale(),
            mask,
            None,
        )
        .map_err(mlx)?;
        out.eval().map_err(mlx)?;
        Ok(out)
    }

    /// Invariances of the port (findings, never verdicts), by name.
    pub fn invariances(&self, seed: u64) -> Result<Vec<(String, bool)>, CaseError> {
        self.check().map_err(|e| CaseError::harness("shape", e))?;
        let inp = self.inputs(seed);
        let (q, k, v) = (
            inp.queries.to_array(),
            inp.keys.to_array(),
            inp.values.to_array(),
        );
        let chunked = self.port(&q, &k, &v, self.kv_view)?;
        let batched = host(&chunked)?;
        let mut out = Vec::new();
        if self.batch > 1 {
            let mut same = true;
            for b in 0..self.batch {
                let row = |t: &HostTensor| slice_rows(t, b, b + 1);
                let alone = self.port(
                    &row(&inp.queries).to_array(),
                    &row(&inp.keys).to_array(),
                    &row(&inp.values).to_array(),
                    self.kv_view,
                )?;
                if host(&alone)?.bytes != slice_rows(&batched, b, b + 1).bytes {
                    same = false;
                    break;
                }
            }
            out.push(("batch = each request alone".to_owned(), same));
        }
        if self.m > 1 {
            let mut same = true;
            'rows: for i in 0..self.m {
                let n = self.kv_len - self.m + i + 1;
                let (i, n) = (i as i32, n as i32);
                let qi = q.try_index((.., .., i..i + 1, ..))?;
                let (ki, vi) = (
                    k.try_index((.., .., ..n, ..))?,
                    v.try_index((.., .., ..n, ..))?,
                );
                let alone = host(&self.port(&qi, &ki, &vi, self.kv_view)?)?;
                let chunk = host(&chunked.try_index((.., .., i..i + 1, ..))?)?;
                if alone.bytes != chunk.bytes {
                    same = false;
                    break 'rows;
                }
            }
            out.push(("chunk = rows alone (M=1)".to_owned(), same));
        }
        let other = match self.kv_view {
            KvView::Contiguous => KvView::CacheBuffer,
            KvView::CacheBuffer => KvView::Contiguous,
        };
        let viewed = host(&self.port(&q, &k, &v, other)?)?;
        out.push((
            "cache buffer = contiguous".to_owned(),
            viewed.bytes == batched.bytes,
        ));
        Ok(out)
    }
}

/// Rows `from..to` of the first dimension.
fn slice_rows(t: &HostTensor, from: usize, to: usize) -> HostTensor {
    super::step::rows(t, from, to)
}

fn run(ctx: &Ctx, s: &SdpaShape) -> Result<CaseOutput, CaseError> {
    s.check().map_err(|e| CaseError::harness("shape", e))?;
    let inp = s.inputs(ctx.seed());
    let reference =
        reference::attention::sdpa_kv_cache(ctx, &inp.queries, &inp.keys, &inp.values, s.scale())?;
    let y = s.port(
        &inp.queries.to_array(),
        &inp.keys.to_array(),
        &inp.values.to_array(),
        s.kv_view,
    )?;
    let mut y = host(&y)?;
    ctx.port_output(FAMILY, s.batch, s.kv_len, &mut y);
    let mut out = CaseOutput::new("mlx.core.fast.scaled_dot_product_attention");
    out.compare("attn", &y, &reference);
    Ok(out)
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// Issue 40 (open from round 3): a kept entry with M = L = 65536
    /// passed the size check (which bounded the step's tensors, not the
    /// M x L scores) and crashed its worker.
    #[test]
    fn the_scores_are_bounded_too() {
        let shape = |batch, n_heads, m, kv_len| SdpaShape {
            dtype: DType::Bfloat16,
            batch,
            n_heads,
            n_kv_heads: 1,
            head_dim: 64,
            kv_len,
            m,
            kv_view: KvView::Contiguous,
        };
        let e = shape(1, 1, 65536, 65536).check().unwrap_err();
        assert!(e.contains("scores"), "{e}");
        // The explorer's largest draw still runs.
        shape(8, 32, 16, 8193).check().unwrap();
        // And every fixed case's description still builds.
        for d in crate::families::fixed_descriptions() {
            if let Err(e) = crate::families::build(&d) {
                panic!("{}: {e}", d.name);
            }
        }
    }
}
