//! `QuantizedSwitchLinear`: per-row expert projections over stacked experts.

use std::fmt;

use mlx_rs::{ops, Array, Dtype};

use crate::checkpoint::{Checkpoint, ExpertOffload, LayerKind};
use crate::ffi;

use super::linear::checkpoint_payload_error;
use super::{LayerError, PayloadError, QuantSpec, QuantizedPayload};

/// The MoE expert projection: mirrors
/// `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__` (mlx-lm
/// 0.32.2):
///
/// ```python
/// x = mx.gather_qmm(x, self["weight"], self["scales"], self.get("biases"),
///                   rhs_indices=indices, transpose=True, group_size=self.group_size,
///                   bits=self.bits, mode=self.mode, global_scale=self.global_scale,
///                   sorted_indices=sorted_indices)
/// if "bias" in self:
///     x = x + mx.expand_dims(self["bias"][indices], -2)
/// ```
///
/// Tensors: `weight` `uint32 [E, out, packed]`, `scales` (and affine
/// `biases`) `[E, out, in / group_size]`, optional additive `bias` `[E, out]`.
///
/// **Finding:** on the pinned mlx 0.32.2 that `__call__` cannot run at all:
/// it passes `global_scale=` to `mx.gather_qmm`, which has no such keyword
/// (TypeError even for `global_scale=None`). This port is the call with that
/// keyword dropped, which is what the reference computes once it can run;
/// per-expert nvfp4 global scales are not supported.
#[derive(Clone)]
pub struct QuantizedSwitchLinear {
    payload: QuantizedPayload,
    bias: Option<Array>,
}

impl fmt::Debug for QuantizedSwitchLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantizedSwitchLinear")
            .field("payload", &self.payload)
            .field(
                "bias",
                &self.bias.as_ref().map(|b| (b.shape().to_vec(), b.dtype())),
            )
            .finish()
    }
}

impl QuantizedSwitchLinear {
    /// A layer from a 3-D payload and an optional per-expert `bias` `[E,
    /// out]`, or `[E, 1]` (one value per expert, broadcast over the outputs
    /// as the reference's `x + expand_dims(bias[indices], -2)` broadcasts
    /// it).
    ///
    /// # Errors
    /// [`PayloadError::Rank`] unless the weight is 3-D,
    /// [`PayloadError::BiasShape`] for a bias not shaped `[E, out]` or `[E, 1]`.
    pub fn new(payload: QuantizedPayload, bias: Option<Array>) -> Result<Self, LayerError> {
        payload.require_rank(3)?;
        if let Some(b) = &bias {
            check_expert_bias(b, payload.leading_shape()[0], payload.out_features())?;
        }
        Ok(QuantizedSwitchLinear {
            payload: row_contiguous(payload)?,
            bias,
        })
    }

    /// [`QuantizedPayload::new`] then [`QuantizedSwitchLinear::new`].
    ///
    /// # Errors
    /// Any [`PayloadError`] of either.
    pub fn from_arrays(
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        spec: QuantSpec,
        bias: Option<Array>,
    ) -> Result<Self, LayerError> {
        Self::new(QuantizedPayload::new(weight, scales, biases, spec)?, bias)
    }

    /// The layer at module `path` (e.g. `model.layers.0.mlp.switch_mlp.up_proj`)
    /// of a checkpoint, spec resolved with [`LayerKind::Switch`] (whose
    /// `to_quantized` defaults differ from a linear layer's). `in_features`
    /// is the unquantized `SwitchLinear`'s `weight.shape[-1]`.
    ///
    /// # Errors
    /// As [`crate::quantized::QuantizedLinear::from_checkpoint`].
    pub fn from_checkpoint(
        checkpoint: &Checkpoint,
        path: &str,
        in_features: i32,
    ) -> Result<Self, LayerError> {
        let tensors = checkpoint.quantized_tensors(path, LayerKind::Switch, in_features)?;
        Self::strict(tensors.payload, tensors.bias).map_err(|e| checkpoint_payload_error(path, e))
    }

    /// [`QuantizedSwitchLinear::new`] with the bias shape `load_weights(strict=True)`
    /// requires of the module `__init__` built: exactly `[E, out]`.
    fn strict(payload: QuantizedPayload, bias: Option<Array>) -> Result<Self, LayerError> {
        payload.require_rank(3)?;
        let expected = vec![payload.leading_shape()[0], payload.out_features()];
        super::check_bias_exact(bias.as_ref(), expected)?;
        Self::new(payload, bias)
    }

    /// As [`QuantizedSwitchLinear::from_checkpoint`], but the expert weight
    /// (`path.weight`, the bulk of the bytes) is served from a page-aligned
    /// memory map of `offload`'s file instead of the checkpoint; scales,
    /// biases and bias stay resident. The bytes are the checkpoint's (see
    /// [`ExpertOffload::create`]), so the results are bit-identical: the origin's
    /// `expertOffloadArray(name) ?? weights.tensor(name)`.
    ///
    /// # Errors
    /// As [`QuantizedSwitchLinear::from_checkpoint`], plus
    /// [`crate::checkpoint::CheckpointError`] when the offload file does not
    /// hold `path.weight` with the checkpoint's dtype and shape.
    pub fn from_checkpoint_offloaded(
        checkpoint: &Checkpoint,
        path: &str,
        in_features: i32,
        offload: &ExpertOffload,
    ) -> Result<Self, LayerError> {
        let tensors = checkpoint.quantized_tensors(path, LayerKind::Switch, in_features)?;
        let name = format!("{path}.weight");
        let info = checkpoint.tensor_info(&name)?;
        let weight = offload.array(&name, info.dtype, &info.shape)?;
        let global_scale = tensors.payload.global_scale().cloned();
        let (_, scales, biases, spec) = tensors.payload.into_parts();
        let payload_error = |source| crate::checkpoint::CheckpointError::Payload {
            path: path.to_owned(),
            source,
        };
        let mut payload =
            QuantizedPayload::new(weight, scales, biases, spec).map_err(payload_error)?;
        if let Some(gs) = global_scale {
            payload = payload.with_global_scale(gs).map_err(payload_error)?;
        }
        Self::strict(payload, tensors.bias).map_err(|e| checkpoint_payload_error(path, e))
    }

    /// The quantized payload.
    pub fn payload(&self) -> &QuantizedPayload {
        &self.payload
    }

    /// The per-expert additive bias `[E, out]`, if any.
    pub fn bias(&self) -> Option<&Array> {
        self.bias.as_ref()
    }

    /// The spec.
    pub fn spec(&self) -> QuantSpec {
        self.payload.spec()
    }

    /// `E = weight.shape[0]`.
    pub fn num_experts(&self) -> i32 {
        self.payload.leading_shape()[0]
    }

    /// `scales.shape[2] * group_size` (the reference's `input_dims`).
    pub fn in_features(&self) -> i32 {
        self.payload.in_features()
    }

    /// `weight.shape[1]`.
    pub fn out_features(&self) -> i32 {
        self.payload.out_features()
    }

    /// Projects each row of `x` with the expert `indices` selects.
    ///
    /// * `x`: `[.., M, in]` (from `SwitchGLU`: `[B, L, 1, 1, in]`, or the
    ///   sorted `[N*K, 1, in]`), broadcast against `indices` by `gather_qmm`.
    /// * `indices`: integer expert ids in `0..E` (e.g. `[B, L, K]`).
    /// * `sorted_indices`: the caller promises `indices` is sorted (SwitchGLU
    ///   sorts when `indices.size >= 64`).
    ///
    /// Output `indices.shape + [M, out]` (after broadcasting), then `+
    /// expand_dims(bias[indices], -2)` if the layer has a bias. The indices
    /// are evaluated and checked on the host first (one synchronisation).
    ///
    /// # Errors
    /// [`LayerError::IndicesDtype`] for non-integer indices,
    /// [`LayerError::ExpertIndexOutOfRange`] for an id outside `0..E`,
    /// [`LayerError::InputShape`] when `x` does not end in in_features,
    /// [`LayerError::Mlx`] with MLX's message otherwise.
    pub fn forward(
        &self,
        x: &Array,
        indices: &Array,
        sorted_indices: bool,
    ) -> Result<Array, LayerError> {
        if self.payload.global_scale().is_some() {
            return Err(LayerError::GlobalScaleRefused {
                layer: "QuantizedSwitchLinear",
                op: "mlx.core.gather_qmm",
            });
        }
        if x.shape().last() != Some(&self.in_features()) {
            return Err(LayerError::InputShape {
                in_features: self.in_features(),
                shape: x.shape().to_vec(),
            });
        }
        if x.size() == 0 || indices.size() == 0 {
            let (k, n) = (self.in_features(), self.out_features());
            let e = self.num_experts();
            return empty_switch_output(x, indices, e, k, n, |x, i| self.forward(x, i, false));
        }
        check_indices(indices, self.num_experts())?;
        let p = &self.payload;
        let spec = p.spec();
        let y = ffi::gather_qmm(
            x,
            p.weight(),
            p.scales(),
            p.biases(),
            None,
            Some(indices),
            true,
            spec.group_size,
            spec.bits,
            spec.mode,
            sorted_indices,
        )?;
        add_expert_bias(y, self.bias.as_ref(), indices)
    }
}

/// The payload with every tensor row-contiguous: views that are not (a
/// stride-0 `broadcast_to` of one expert, a transposed or sliced view) are
/// copied, lazily; every other buffer is shared, so loaded checkpoints cost
/// nothing.
///
/// Why: MLX 0.32.2's CUDA `GatherQMM` kernels address expert `e` at
/// `e * out * packed` whatever the weight's strides (its `supports_*` checks
/// look at the last two dimensions only), so a stride-0 expert view reads
/// past its buffer there; the CPU kernel honours the strides. Copying gives
/// the broadcast's defined meaning on every backend, bit-identical to the
/// reference on contiguous tensors. The reference's own stride-0 call is
/// the finding `quantized/switch/<spec>/.../broadcast-reference-vs-contiguous`.
fn row_contiguous(payload: QuantizedPayload) -> Result<QuantizedPayload, LayerError> {
    let global_scale = payload.global_scale().cloned();
    let (weight, scales, biases, spec) = payload.into_parts();
    let biases = biases.map(|b| b.contiguous()).transpose()?;
    let payload = QuantizedPayload::new(weight.contiguous()?, scales.contiguous()?, biases, spec)?;
    Ok(match global_scale {
        Some(gs) => payload.with_global_scale(gs)?,
        None => payload,
    })
}

/// `x + mx.expand_dims(self["bias"][indices], -2)`: the last line of both
/// switch layers (`self["bias"][indices]` with an array index is a take
/// along axis 0).
pub(crate) fn add_expert_bias(
    y: Array,
    bias: Option<&Array>,
    indices: &Array,
) -> Result<Array, LayerError> {
    match bias {
        None => Ok(y),
        Some(bias) => {
            let b = bias.take_axis(indices, 0)?.expand_dims(-2)?;
            Ok(ops::add(&y, &b)?)
        }
    }
}

/// A per-expert bias the reference adds as `expand_dims(bias[indices], -2)`
/// without changing the output's shape: `[E, out]` or `[E, 1]`.
pub(crate) fn check_expert_bias(bias: &Array, experts: i32, out: i32) -> Result<(), PayloadError> {
    match *bias.shape() {
        [e, last] if e == experts && (last == out || last == 1) => Ok(()),
        _ => Err(PayloadError::BiasShape {
            expected: vec![experts, out],
            actual: bias.shape().to_vec(),
        }),
    }
}

/// The result of a switch layer when `x` or `indices` has a zero-size
/// dimension, as the reference gives it: an empty array of shape
/// `broadcast(x.shape[:-2], indices.shape) + [M, out]`, in the dtype of
/// `graph` (the layer's graph for one row, built lazily, never evaluated).
/// Built from (no) host data: no kernel launch, which MLX 0.32.2's CUDA
/// backend fails for a zero-size grid and keeps failing for the process.
pub(crate) fn empty_switch_output(
    x: &Array,
    indices: &Array,
    num_experts: i32,
    in_features: i32,
    out_features: i32,
    graph: impl FnOnce(&Array, &Array) -> Result<Array, LayerError>,
) -> Result<Array, LayerError> {
    check_indices(indices, num_experts)?;
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(LayerError::InputShape {
            in_features,
            shape: shape.to_vec(),
        });
    }
    let batch = &shape[..shape.len() - 2];
    let mut out = crate::shape::broadcast(batch, indices.shape()).ok_or_else(|| {
        LayerError::Mlx(ffi::MlxError {
            op: "gather",
            message: format!(
                "x batch shape {batch:?} and indices shape {:?} do not broadcast",
                indices.shape()
            ),
        })
    })?;
    out.extend([shape[shape.len() - 2], out_features]);
    let probe = graph(
        &ops::zeros_dtype(&[1, in_features], x.dtype())?,
        &Array::from_slice(&[0u32], &[1]),
    )?;
    Ok(ffi::array_from_bytes(&[], &out, probe.dtype())?)
}

/// Every index in `0..num_experts`, checked on the host.
pub(crate) fn check_indices(indices: &Array, num_experts: i32) -> Result<(), LayerError> {
    let dtype = indices.dtype();
    let out_of_range = |position: usize, index: i128| LayerError::ExpertIndexOutOfRange {
        index,
        position,
        num_experts,
    };
    let e = i128::from(num_experts);
    if indices.size() == 0 {
        // Nothing to read (and MLX gives an empty array no data); the dtype
        // is still checked below through the same match.
        return match dtype {
            Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 | Dtype::Uint64 => Ok(()),
            Dtype::Int8 | Dtype::Int16 | Dtype::Int32 | Dtype::Int64 => Ok(()),
            _ => Err(LayerError::IndicesDtype { dtype }),
        };
    }
    match dtype {
        Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 | Dtype::Uint64 => {
            let values = host_values::<u64>(indices)?;
            if let Some((i, &v)) = values.iter().enumerate().find(|(_, &v)| i128::from(v) >= e) {
                return Err(out_of_range(i, i128::from(v)));
            }
        }
        Dtype::Int8 | Dtype::Int16 | Dtype::Int32 | Dtype::Int64 => {
            let values = host_values::<i64>(indices)?;
            if let Some((i, &v)) = values
                .iter()
                .enumerate()
                .find(|(_, &v)| v < 0 || i128::from(v) >= e)
            {
                return Err(out_of_range(i, i128::from(v)));
            }
        }
        _ => return Err(LayerError::IndicesDtype { dtype }),
    }
    Ok(())
}

fn host_values<T: mlx_rs::ArrayElement + Clone>(a: &Array) -> Result<Vec<T>, LayerError> {
    let converted = a.as_dtype(T::DTYPE)?.contiguous()?;
    converted.to_vec_exact::<T>().map_err(|e| {
        LayerError::Mlx(ffi::MlxError {
            op: "read indices",
            message: e.to_string(),
        })
    })
}
