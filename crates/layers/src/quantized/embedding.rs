//! A quantized embedding table: token lookup, and the tied `lm_head`.

use mlx_rs::Array;

use crate::checkpoint::{Checkpoint, CheckpointError, LayerKind};
use crate::ffi;

use super::{LayerError, QuantSpec, QuantizedPayload};

/// `mlx.nn.QuantizedEmbedding` (mlx 0.32.2): a `[num_embeddings, dims]`
/// table stored quantized (`weight` `uint32 [num_embeddings, dims * bits /
/// 32]`, `scales`/`biases` `[num_embeddings, dims / group_size]`).
///
/// ```python
/// def __call__(self, x):
///     biases = self.get("biases")
///     return mx.dequantize(self["weight"][x], scales=self["scales"][x],
///         biases=biases[x] if biases is not None else None,
///         group_size=self.group_size, bits=self.bits, mode=self.mode)
///
/// def as_linear(self, x):
///     return mx.quantized_matmul(x, self["weight"], scales=self["scales"],
///         biases=self.get("biases"), transpose=True,
///         group_size=self.group_size, bits=self.bits, mode=self.mode)
/// ```
#[derive(Debug, Clone)]
pub struct QuantizedEmbedding {
    payload: QuantizedPayload,
}

impl QuantizedEmbedding {
    /// Wraps a 2-D payload.
    ///
    /// # Errors
    /// [`super::PayloadError::Rank`] unless the weight is 2-D;
    /// [`LayerError::GlobalScaleRefused`] for a payload with a global scale
    /// (the reference layer has none).
    pub fn new(payload: QuantizedPayload) -> Result<Self, LayerError> {
        payload.require_rank(2)?;
        if payload.global_scale().is_some() {
            return Err(LayerError::GlobalScaleRefused {
                layer: "QuantizedEmbedding",
                op: "mlx.nn.QuantizedEmbedding",
            });
        }
        Ok(QuantizedEmbedding { payload })
    }

    /// Quantizes a float table `[num_embeddings, dims]`, as
    /// `QuantizedEmbedding.from_embedding` does (`mx.quantize` of the
    /// embedding's weight).
    ///
    /// # Errors
    /// As [`QuantizedPayload::quantize`].
    pub fn from_float(table: &Array, spec: QuantSpec) -> Result<Self, LayerError> {
        Self::new(QuantizedPayload::quantize(table, spec)?)
    }

    /// The embedding at `path` of a checkpoint (`<path>.weight`,
    /// `.scales`, `.biases`), with the spec `mlx_lm.utils.load_model`
    /// resolves for it (an `nn.Embedding` quantizes like a linear layer:
    /// `to_quantized(group_size=None, bits=None, mode=…)`); `dims` is the
    /// embedding width (the reference's model class knows it).
    ///
    /// # Errors
    /// As [`Checkpoint::quantized_tensors`].
    pub fn from_checkpoint(
        checkpoint: &Checkpoint,
        path: &str,
        dims: i32,
    ) -> Result<Self, LayerError> {
        let tensors = checkpoint.quantized_tensors(path, LayerKind::Linear, dims)?;
        if tensors.bias.is_some() {
            return Err(CheckpointError::UnexpectedTensor {
                path: path.to_owned(),
                tensor: format!("{path}.bias"),
            }
            .into());
        }
        Self::new(tensors.payload)
    }

    /// The quantized table.
    pub fn payload(&self) -> &QuantizedPayload {
        &self.payload
    }

    /// Rows of the table (`weight.shape[0]`).
    pub fn num_embeddings(&self) -> i32 {
        self.payload.out_features()
    }

    /// Width of an embedding (`packed * 32 / bits`).
    pub fn dims(&self) -> i32 {
        self.payload.in_features()
    }

    /// The embeddings of token ids `ids` (any shape, integer dtype):
    /// `[..ids.shape, dims]`, dequantized in MLX's default dtype for the
    /// mode (the scales' dtype for affine, bfloat16 for the float modes).
    ///
    /// # Errors
    /// [`LayerError::IndicesDtype`] for non-integer ids,
    /// [`LayerError::TokenIdOutOfRange`] for an id
    /// outside `0..num_embeddings` (MLX would read out of bounds),
    /// [`LayerError::Mlx`] otherwise.
    pub fn lookup(&self, ids: &Array) -> Result<Array, LayerError> {
        check_ids(ids, self.num_embeddings())?;
        let p = &self.payload;
        let spec = p.spec();
        let take = |a: &Array| a.take_axis(ids, 0);
        let biases = p.biases().map(take).transpose()?;
        Ok(ffi::dequantize(
            &take(p.weight())?,
            &take(p.scales())?,
            biases.as_ref(),
            spec.group_size,
            spec.bits,
            spec.mode,
            None,
        )?)
    }

    /// The table as a linear layer (tied `lm_head`): `x` `[.., dims]` →
    /// logits `[.., num_embeddings]` via `mx.quantized_matmul(...,
    /// transpose=True)`.
    ///
    /// # Errors
    /// [`LayerError::InputShape`] when `x` does not end in `dims`;
    /// [`LayerError::Mlx`] otherwise.
    pub fn as_linear(&self, x: &Array) -> Result<Array, LayerError> {
        if x.shape().last() != Some(&self.dims()) {
            return Err(LayerError::InputShape {
                in_features: self.dims(),
                shape: x.shape().to_vec(),
            });
        }
        let p = &self.payload;
        let spec = p.spec();
        Ok(ffi::quantized_matmul(
            x,
            p.weight(),
            p.scales(),
            p.biases(),
            true,
            spec.group_size,
            spec.bits,
            spec.mode,
        )?)
    }
}

/// [`super::switch::check_indices`]'s checks, reported as token ids.
fn check_ids(ids: &Array, rows: i32) -> Result<(), LayerError> {
    match super::switch::check_indices(ids, rows) {
        Err(LayerError::ExpertIndexOutOfRange {
            index, position, ..
        }) => Err(LayerError::TokenIdOutOfRange {
            id: index,
            position,
            num_embeddings: rows,
        }),
        other => other,
    }
}
