//! The reference's linear and embedding modules after `nn.quantize`: a
//! quantized layer where the checkpoint quantized it, else the float one.

use mlx_rs::ops::{addmm, transpose_axes};
use mlx_rs::Array;

use crate::checkpoint::{LayerKind, SpecResolution};
use crate::quantized::{QuantizedEmbedding, QuantizedLinear};

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

    /// `embed_tokens.as_linear(x)`: the tied lm_head.
    pub fn as_linear(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(match self {
            Embedding::Quantized(q) => q.as_linear(x)?,
            Embedding::Float(w) => x.matmul(&transpose_axes(w, &[1, 0])?)?,
        })
    }
}
