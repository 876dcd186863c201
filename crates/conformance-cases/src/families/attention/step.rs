//! The port's attention decode step, built from the ported layers: rows-
//! independent quantized q/k/v/o projections ([`QuantizedLinear`] with
//! [`Forward::RowsIndependent`]), plain RoPE (`fast::rope` with the cache
//! offset), a growing KV cache and `fast::scaled_dot_product_attention`
//! (no mask for one token, `"causal"` within an appended chunk).
//!
//! It mirrors mlx-lm's `glm4.Glm4Attention` (mlx-lm 0.32.2; the llama /
//! qwen3 block without q/k norms or output gate, which the regime question
//! does not involve, and with partial rotary):
//!
//! ```text
//! q, k, v = q_proj(x), k_proj(x), v_proj(x)          # [1, M, ·]
//! q = q.reshape(1, M, H, D).transpose(0, 2, 1, 3)    # and k, v with H_kv
//! q, k = rope(q, offset), rope(k, offset)            # offset = cache length
//! keys, values = cache.update_and_fetch(k, v)
//! o = sdpa(q, keys, values, scale=D**-0.5, mask=None if M == 1 else "causal")
//! y = o_proj(o.transpose(0, 2, 1, 3).reshape(1, M, H * D))
//! ```
//!
//! The cache is `layers::model::KvCache`, laid out as
//! `mlx_lm.models.cache.KVCache` (a buffer preallocated in steps of 256,
//! SDPA handed a prefix slice of it).

use layers::ffi::{self, Mode};
use layers::quantized::{Forward, QuantSpec, QuantizedLinear};
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::Array;
use oracle::{DType, HostTensor};

use crate::case::CaseError;
use crate::inputs::Inputs;

/// The attention graph's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Rotated channels of each head (partial rotary when `< head_dim`).
    pub rotary_dims: usize,
    pub rope_base: f32,
    pub spec: QuantSpec,
}

impl AttentionShape {
    /// Width of the attention output before `o_proj`.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of one token's keys (or values), all KV heads.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// `head_dim ** -0.5`, as mlx-lm's `self.scale`.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Qwen3.5-like: GQA 6 (6 query heads, 1 KV head), head_dim 256, partial
/// rotary 64 of 256, rope base 1e7, hidden 512 (small, to keep it fast),
/// affine 4-bit group-64 projections, bf16 activations.
pub const QWEN35_LIKE: AttentionShape = AttentionShape {
    hidden: 512,
    n_heads: 6,
    n_kv_heads: 1,
    head_dim: 256,
    rotary_dims: 64,
    rope_base: 1e7,
    spec: QuantSpec {
        mode: Mode::Affine,
        bits: 4,
        group_size: 64,
    },
};

/// One quantized projection as host tensors (`weight` uint32, `scales`,
/// `biases`), the bits both sides load.
#[derive(Debug, Clone)]
pub struct HostProjection {
    pub weight: HostTensor,
    pub scales: HostTensor,
    pub biases: HostTensor,
}

impl HostProjection {
    /// A seeded bf16 `[out, in]` matrix (uniform, scale `1/sqrt(in)`)
    /// quantized with `spec` by MLX.
    pub fn seeded(
        inputs: &mut Inputs,
        out: usize,
        input: usize,
        spec: QuantSpec,
    ) -> Result<Self, CaseError> {
        let w = inputs.uniform(DType::Bfloat16, &[out, input], 1.0 / (input as f32).sqrt());
        let (wq, scales, biases) =
            ffi::quantize(&w.to_array(), spec.group_size, spec.bits, spec.mode)
                .map_err(|e| CaseError::Port(e.to_string()))?;
        let biases = biases
            .ok_or_else(|| CaseError::Harness("affine quantize returned no biases".into()))?;
        Ok(Self {
            weight: HostTensor::from_array(&wq)?,
            scales: HostTensor::from_array(&scales)?,
            biases: HostTensor::from_array(&biases)?,
        })
    }

    pub(crate) fn layer(&self, spec: QuantSpec) -> Result<QuantizedLinear, CaseError> {
        QuantizedLinear::from_arrays(
            self.weight.to_array(),
            self.scales.to_array(),
            Some(self.biases.to_array()),
            spec,
            None,
        )
        .map(|l| l.with_forward_mode(Forward::RowsIndependent))
        .map_err(|e| CaseError::Port(e.to_string()))
    }
}

/// The four projections of one attention block.
#[derive(Debug, Clone)]
pub struct HostWeights {
    pub q: HostProjection,
    pub k: HostProjection,
    pub v: HostProjection,
    pub o: HostProjection,
}

impl HostWeights {
    pub fn seeded(inputs: &mut Inputs, shape: &AttentionShape) -> Result<Self, CaseError> {
        Ok(Self {
            q: HostProjection::seeded(inputs, shape.q_width(), shape.hidden, shape.spec)?,
            k: HostProjection::seeded(inputs, shape.kv_width(), shape.hidden, shape.spec)?,
            v: HostProjection::seeded(inputs, shape.kv_width(), shape.hidden, shape.spec)?,
            o: HostProjection::seeded(inputs, shape.hidden, shape.q_width(), shape.spec)?,
        })
    }
}

/// The port's KV cache: [`layers::model::KvCache`], the reference's own
/// layout (`mlx_lm.models.cache.KVCache`: a buffer grown in steps of 256,
/// SDPA handed the prefix view `keys[..., :offset, :]`). Until the model
/// family it concatenated into one contiguous array: same bits on the CPU,
/// but CUDA picks SDPA's kernel from the view's strides (the kept case
/// `kept/attention/sdpa/bf16/B1-H1-KV1-D64/L257-M1/s0`, up to 123 ulp).
pub struct KvCache {
    inner: layers::model::KvCache,
    /// The prefill's refusal, returned by the next append.
    refused: Option<String>,
}

impl KvCache {
    /// A cache prefilled with `keys`/`values` `[B, H_kv, n, D]` in one
    /// update (one-shot prefill); `None` for an empty cache.
    pub fn prefilled(kv: Option<(Array, Array)>) -> Self {
        let mut inner = layers::model::KvCache::new();
        let refused = kv.and_then(|(keys, values)| {
            inner
                .update_and_fetch(&keys, &values)
                .err()
                .map(|e| e.to_string())
        });
        Self { inner, refused }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.inner.offset()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `[B, H_kv, m, D]` keys and values; returns the views SDPA
    /// is handed (`update_and_fetch`).
    pub(crate) fn append(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), CaseError> {
        if let Some(e) = self.refused.take() {
            return Err(CaseError::port(
                "layers::model::KvCache::update_and_fetch (prefill)",
                e,
            ));
        }
        self.inner
            .update_and_fetch(keys, values)
            .map_err(|e| CaseError::port("layers::model::KvCache::update_and_fetch", e))
    }
}

/// One step's outputs, token-major: `attn [M, H*D]` (before `o_proj`),
/// `y [M, hidden]`, this step's roped `keys`/`values` `[M, H_kv*D]`.
pub struct StepOutput {
    pub attn: Array,
    pub y: Array,
    pub keys: Array,
    pub values: Array,
}

/// The decode step of one attention block.
pub struct DecodeStep {
    shape: AttentionShape,
    q: QuantizedLinear,
    k: QuantizedLinear,
    v: QuantizedLinear,
    o: QuantizedLinear,
}

impl DecodeStep {
    pub fn new(shape: AttentionShape, weights: &HostWeights) -> Result<Self, CaseError> {
        Ok(Self {
            shape,
            q: weights.q.layer(shape.spec)?,
            k: weights.k.layer(shape.spec)?,
            v: weights.v.layer(shape.spec)?,
            o: weights.o.layer(shape.spec)?,
        })
    }

    /// Appends the `M` tokens of `x` `[M, hidden]` to `cache` and attends:
    /// M = 1 is the decode step, M > 1 a chunked append (causal within the
    /// chunk). Evaluates the outputs and the cache before returning.
    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<StepOutput, CaseError> {
        self.forward_ops(x, cache).map_err(|e| match e {
            // The step's own MLX ops are the port's computation.
            StepFail::Mlx(e) => CaseError::Port(format!("the port's attention step: {e}")),
            StepFail::Case(e) => e,
        })
    }

    fn forward_ops(&self, x: &Array, cache: &mut KvCache) -> Result<StepOutput, StepFail> {
        let s = &self.shape;
        let m = x.shape()[0];
        let (h, h_kv, d) = (s.n_heads as i32, s.n_kv_heads as i32, s.head_dim as i32);
        let x = x.reshape(&[1, m, s.hidden as i32])?;
        let project = |layer: &QuantizedLinear, heads: i32| -> Result<Array, StepFail> {
            let y = layer
                .forward(&x)
                .map_err(|e| CaseError::Port(e.to_string()))?;
            Ok(y.reshape(&[1, m, heads, d])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        let queries = project(&self.q, h)?;
        let keys = project(&self.k, h_kv)?;
        let values = project(&self.v, h_kv)?;
        let offset =
            i32::try_from(cache.len()).map_err(|_| CaseError::Harness("cache too long".into()))?;
        let rope = |a: &Array| {
            fast::rope(
                a,
                s.rotary_dims as i32,
                false,
                s.rope_base,
                1.0,
                offset,
                None,
            )
        };
        let queries = rope(&queries)?;
        let keys = rope(&keys)?;
        let (all_keys, all_values) = cache.append(&keys, &values)?;
        let mask = (m > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let attn = fast::scaled_dot_product_attention(
            &queries,
            &all_keys,
            &all_values,
            s.scale(),
            mask,
            None,
        )?;
        let attn = attn
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, m, h * d])?;
        let y = self
            .o
            .forward(&attn)
            .map_err(|e| CaseError::Port(e.to_string()))?;
        let token_major = |a: &Array, width: i32| -> Result<Array, StepFail> {
            Ok(a.transpose_axes(&[0, 2, 1, 3])?.reshape(&[m, width])?)
        };
        let out = StepOutput {
            attn: attn.reshape(&[m, h * d])?,
            y: y.reshape(&[m, s.hidden as i32])?,
            keys: token_major(&keys, h_kv * d)?,
            values: token_major(&values, h_kv * d)?,
        };
        mlx_rs::transforms::eval([
            &out.attn,
            &out.y,
            &out.keys,
            &out.values,
            &all_keys,
            &all_values,
        ])?;
        Ok(out)
    }
}

/// Why the step's ops stopped: an MLX error in the port's own ops, or a
/// case error from the layers or the cache.
enum StepFail {
    Mlx(mlx_rs::error::Exception),
    Case(CaseError),
}

impl From<mlx_rs::error::Exception> for StepFail {
    fn from(e: mlx_rs::error::Exception) -> Self {
        StepFail::Mlx(e)
    }
}

impl From<CaseError> for StepFail {
    fn from(e: CaseError) -> Self {
        StepFail::Case(e)
    }
}

/// Rows `start..end` of a tensor whose first dimension is the token.
pub fn rows(t: &HostTensor, start: usize, end: usize) -> HostTensor {
    let row: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
    let mut shape = t.shape.clone();
    shape[0] = end - start;
    HostTensor::new(t.dtype, shape, t.bytes[start * row..end * row].to_vec())
        .expect("sized by construction")
}

/// Tensors with the same trailing shape, stacked along the first dimension.
pub fn stack_rows(parts: &[HostTensor]) -> HostTensor {
    let first = &parts[0];
    let mut shape = first.shape.clone();
    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
    let bytes = parts.iter().flat_map(|p| p.bytes.iter().copied()).collect();
    HostTensor::new(first.dtype, shape, bytes).expect("sized by construction")
}

/// `[n, H_kv*D]` token-major rows as a cache tensor `[1, H_kv, n, D]`.
pub fn cache_layout(t: &HostTensor, shape: &AttentionShape) -> Result<Array, CaseError> {
    let n = t.shape[0] as i32;
    Ok(t.to_array()
        .reshape(&[1, n, shape.n_kv_heads as i32, shape.head_dim as i32])?
        .transpose_axes(&[0, 2, 1, 3])?)
}
