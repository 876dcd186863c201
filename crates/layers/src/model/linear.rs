//! The reference's linear and embedding modules after `nn.quantize`: a
//! quantized layer where the checkpoint quantized it, else the float one.

use mlx_rs::ops::{addmm, concatenate, transpose_axes};
use mlx_rs::Array;

use crate::checkpoint::{LayerKind, SpecResolution};
use crate::quantized::{Forward, QuantizedEmbedding, QuantizedLinear, RowsCall, RowsRegime};

use super::load::Weights;
use super::ModelError;

/// `nn.Linear` or `nn.QuantizedLinear`.
#[derive(Debug)]
pub enum Linear {
    Quantized(QuantizedLinear),
    Float { weight: Array, bias: Option<Array> },
}

impl Linear {
    /// Loads module `path` (sanitized name) with `in_features` inputs and
    /// `out_features` outputs.
    pub(super) fn load(
        w: &Weights,
        path: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self, ModelError> {
        let stored = w.module_name(path, "weight")?;
        let spec =
            w.checkpoint()
                .resolve_quant_spec(&stored, LayerKind::Linear, in_features as i32)?;
        let layer = match spec {
            SpecResolution::Quantized { .. } => Linear::Quantized(
                QuantizedLinear::from_checkpoint(w.checkpoint(), &stored, in_features as i32)?,
            ),
            SpecResolution::NotQuantized(_) => {
                let weight =
                    w.tensor(path, "weight", &[out_features as i32, in_features as i32])?;
                let bias = w.optional(path, "bias", &[out_features as i32])?;
                Linear::Float { weight, bias }
            }
        };
        if let Linear::Quantized(q) = &layer {
            if q.out_features() as usize != out_features {
                return Err(ModelError::TensorShape {
                    name: format!("{stored}.weight"),
                    expected: vec![out_features as i32, in_features as i32],
                    actual: vec![q.out_features(), q.in_features()],
                });
            }
        }
        Ok(layer)
    }

    /// `__call__`: `quantized_matmul(x, w, ..., transpose=True)` (+ bias), or
    /// `x @ weight.T` / `addmm(bias, x, weight.T)`.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(match self {
            Linear::Quantized(q) => q.forward(x)?,
            Linear::Float { weight, bias } => {
                let wt = transpose_axes(weight, &[1, 0])?;
                match bias {
                    Some(b) => addmm(b, x, &wt, None, None)?,
                    None => x.matmul(&wt)?,
                }
            }
        })
    }

    /// [`Linear::forward`] of `x` `[B, T, in]` with each of the T rows
    /// giving the bits its own call of one row gives: the quantized layer
    /// in chunks its backend's [`RowsRegime`] allows
    /// ([`Forward::RowsIndependent`]), the float one row by row.
    pub fn forward_rows(&self, x: &Array) -> Result<Array, ModelError> {
        match self {
            Linear::Quantized(q) => Ok(q.forward_as(x, Forward::RowsIndependent)?),
            Linear::Float { .. } => in_chunks(x, 1, |rows| self.forward(rows)),
        }
    }

    /// Whether the layer was loaded quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Linear::Quantized(_))
    }
}

/// `nn.Embedding` or `nn.QuantizedEmbedding`.
#[derive(Debug)]
pub enum Embedding {
    Quantized(QuantizedEmbedding),
    Float(Array),
}

impl Embedding {
    pub(super) fn load(
        w: &Weights,
        path: &str,
        vocab: usize,
        dims: usize,
    ) -> Result<Self, ModelError> {
        let stored = w.module_name(path, "weight")?;
        let spec = w
            .checkpoint()
            .resolve_quant_spec(&stored, LayerKind::Linear, dims as i32)?;
        Ok(match spec {
            SpecResolution::Quantized { .. } => Embedding::Quantized(
                QuantizedEmbedding::from_checkpoint(w.checkpoint(), &stored, dims as i32)?,
            ),
            SpecResolution::NotQuantized(_) => {
                Embedding::Float(w.tensor(path, "weight", &[vocab as i32, dims as i32])?)
            }
        })
    }

    /// `embed_tokens(ids)`: `weight[ids]`, or the quantized lookup.
    pub fn lookup(&self, ids: &Array) -> Result<Array, ModelError> {
        Ok(match self {
            Embedding::Quantized(q) => q.lookup(ids)?,
            Embedding::Float(w) => w.take_axis(ids, 0)?,
        })
    }

    /// [`Embedding::as_linear`] with each row of `x` `[B, T, dims]` giving
    /// the bits of its own one-row call (as [`Linear::forward_rows`]).
    pub fn as_linear_rows(&self, x: &Array) -> Result<Array, ModelError> {
        let rows = x.shape().get(1).copied().unwrap_or(1).max(1) as usize;
        let chunk = match self {
            Embedding::Quantized(q) => {
                RowsRegime::for_backend(crate::backend::Backend::of_default_device()?)
                    .limit(
                        RowsCall::QuantizedMatmul,
                        q.payload().spec(),
                        x.dtype(),
                        q.dims(),
                    )
                    .chunk(rows)
            }
            Embedding::Float(_) => 1,
        };
        in_chunks(x, chunk, |rows| self.as_linear(rows))
    }

    /// `embed_tokens.as_linear(x)`: the tied lm_head.
    pub fn as_linear(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(match self {
            Embedding::Quantized(q) => q.as_linear(x)?,
            Embedding::Float(w) => x.matmul(&transpose_axes(w, &[1, 0])?)?,
        })
    }
}

/// `f` over chunks of at most `chunk` rows of `x`'s axis 1, concatenated
/// back on that axis (a copy: the bits of each chunk's call).
pub(super) fn in_chunks(
    x: &Array,
    chunk: usize,
    f: impl Fn(&Array) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let rows = if x.ndim() >= 2 { x.shape()[1] } else { 1 };
    let chunk = chunk.max(1) as i32;
    if rows <= chunk {
        return f(x);
    }
    let mut parts = Vec::new();
    let mut start = 0;
    while start < rows {
        let stop = (start + chunk).min(rows);
        parts.push(f(&super::ops::slice_axis(x, 1, start, stop)?)?);
        start = stop;
    }
    Ok(concatenate(&parts, 1)?)
}
