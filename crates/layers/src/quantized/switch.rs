//! `QuantizedSwitchLinear`: per-row expert projections over stacked experts.

use std::fmt;

use mlx_rs::{ops, Array, Dtype};

use crate::checkpoint::{Checkpoint, ExpertOffload, LayerKind};
use crate::ffi;

use super::linear::checkpoint_payload_error;
use super::rows_regime::{RowsCall, RowsRegime};
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

    /// Projects each row of `x` with the expert `indices` selects, after
    /// checking the indices on the host: [`ExpertIndices::checked`] (one
    /// synchronisation) then [`QuantizedSwitchLinear::forward_routed`].
    ///
    /// * `x`: `[.., M, in]` (from `SwitchGLU`: `[B, L, 1, 1, in]`, or the
    ///   sorted `[N*K, 1, in]`), broadcast against `indices` by `gather_qmm`.
    /// * `indices`: integer expert ids in `0..E` (e.g. `[B, L, K]`).
    /// * `sorted_indices`: the caller promises `indices` is sorted (SwitchGLU
    ///   sorts when `indices.size >= 64`).
    ///
    /// Output `indices.shape + [M, out]` (after broadcasting), then `+
    /// expand_dims(bias[indices], -2)` if the layer has a bias.
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
        self.check_input(x)?;
        if x.size() == 0 || indices.size() == 0 {
            let (k, n) = (self.in_features(), self.out_features());
            let e = self.num_experts();
            return empty_switch_output(x, indices, e, k, n, |x, i| self.forward(x, i, false));
        }
        let indices = ExpertIndices::checked(indices.clone(), self.num_experts())?;
        self.forward_routed(x, &indices, sorted_indices)
    }

    /// [`QuantizedSwitchLinear::forward`] for indices that are in range by
    /// construction ([`ExpertIndices`]): no host synchronisation, so a
    /// decode step evaluates the router, the gather and everything after in
    /// the caller's one `eval`.
    ///
    /// # Errors
    /// [`LayerError::ExpertCount`] when the indices were made for another
    /// number of experts, [`LayerError::InputShape`] when `x` does not end in
    /// in_features, [`LayerError::Mlx`] with MLX's message otherwise.
    pub fn forward_routed(
        &self,
        x: &Array,
        indices: &ExpertIndices,
        sorted_indices: bool,
    ) -> Result<Array, LayerError> {
        self.check_input(x)?;
        indices.require_experts(self.num_experts())?;
        let indices = indices.array();
        if x.size() == 0 || indices.size() == 0 {
            return self.forward(x, indices, sorted_indices);
        }
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

    /// The switch layer over T tokens with every token's rows bit-identical
    /// to a call for that token alone (the decode case), in the fewest calls
    /// the backend's measured [`RowsRegime`] allows: chunks of whole tokens
    /// of at most its [`RowsCall::GatherQmm`] limit of routed rows (a token
    /// carries `top_k × M` of them).
    ///
    /// * `x`: `[T.., 1 | top_k, M, in]` (SwitchGLU's unsorted
    ///   `expand_dims(x, (-2, -3))` is `[B, L, 1, 1, in]`);
    /// * `indices`: `[T.., top_k]`, the same leading (token) axes.
    ///
    /// Output as [`QuantizedSwitchLinear::forward_routed`] gives it,
    /// `[T.., top_k, M, out]`. Indices are unsorted per token (as SwitchGLU
    /// passes them below 64 ids).
    ///
    /// # Errors
    /// [`LayerError::RowsLayout`] for other layouts, and as
    /// [`QuantizedSwitchLinear::forward_routed`].
    pub fn forward_rows_independent(
        &self,
        x: &Array,
        indices: &ExpertIndices,
        regime: &RowsRegime,
    ) -> Result<Array, LayerError> {
        self.check_input(x)?;
        let (xs, is) = (x.shape(), indices.array().shape());
        let layout = || LayerError::RowsLayout {
            x: xs.to_vec(),
            indices: is.to_vec(),
        };
        if xs.len() < 3 || is.is_empty() || xs.len() != is.len() + 2 {
            return Err(layout());
        }
        let top_k = is[is.len() - 1];
        let (a, m) = (xs[xs.len() - 3], xs[xs.len() - 2]);
        let lead = &is[..is.len() - 1];
        if &xs[..xs.len() - 3] != lead || (a != 1 && a != top_k) {
            return Err(layout());
        }
        let tokens: usize = lead.iter().map(|&d| d as usize).product();
        if tokens <= 1 || x.size() == 0 || indices.array().size() == 0 {
            return self.forward_routed(x, indices, false);
        }
        let limit = regime.limit(
            RowsCall::GatherQmm,
            self.spec(),
            x.dtype(),
            self.in_features(),
        );
        let per_call = limit.units(top_k as usize * m as usize, tokens);
        let t = i32::try_from(tokens).map_err(|_| layout())?;
        let flat_x = x.reshape(&[t, a, m, self.in_features()])?;
        let flat_i = indices.array().reshape(&[t, top_k])?;
        let offsets: Vec<i32> = (per_call..tokens)
            .step_by(per_call)
            .map(|o| o as i32)
            .collect();
        let outputs = flat_x
            .split_at_indices(&offsets, 0)?
            .iter()
            .zip(flat_i.split_at_indices(&offsets, 0)?)
            .map(|(xc, ic)| {
                let ic = ExpertIndices {
                    indices: ic,
                    num_experts: indices.num_experts,
                };
                self.forward_routed(xc, &ic, false)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let y = ops::concatenate(&outputs, 0)?;
        let mut shape = lead.to_vec();
        shape.extend([top_k, m, self.out_features()]);
        Ok(y.reshape(&shape)?)
    }

    fn check_input(&self, x: &Array) -> Result<(), LayerError> {
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
        Ok(())
    }
}

/// Expert ids a switch layer gathers with no further check: every id is in
/// `0..num_experts`, and that is guaranteed by how the value was made, not
/// by a check at each forward.
///
/// * [`ExpertIndices::checked`]: ids from anywhere, checked once on the
///   host (one synchronisation, where they are made, not on the hot path);
/// * [`ExpertIndices::top_k`]: the router's top-k selection, in range by
///   construction (argpartition returns positions along the experts axis),
///   built lazily with no synchronisation.
///
/// The fields are private, so no other value can reach
/// [`QuantizedSwitchLinear::forward_routed`]: out-of-range ids are a typed
/// error, never a silent wrong answer (MLX's gather does not bound-check on
/// every backend).
#[derive(Clone)]
pub struct ExpertIndices {
    indices: Array,
    num_experts: i32,
}

impl fmt::Debug for ExpertIndices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpertIndices")
            .field("shape", &self.indices.shape())
            .field("dtype", &self.indices.dtype())
            .field("num_experts", &self.num_experts)
            .finish()
    }
}

impl ExpertIndices {
    /// `indices` (any integer dtype, any shape) for a layer of
    /// `num_experts` experts, after evaluating them and checking every id
    /// on the host.
    ///
    /// # Errors
    /// [`LayerError::IndicesDtype`] for non-integer indices,
    /// [`LayerError::ExpertIndexOutOfRange`] (the first offending id and its
    /// flat position).
    pub fn checked(indices: Array, num_experts: i32) -> Result<Self, LayerError> {
        check_indices(&indices, num_experts)?;
        Ok(ExpertIndices {
            indices,
            num_experts,
        })
    }

    /// The `k` experts with the largest router `scores` (`[.., E]`) per
    /// row, as mlx-lm's MoE blocks route: `mx.argpartition(scores, kth=-k,
    /// axis=-1)[..., -k:]` (`mlx_lm.models.qwen3_moe.Qwen3MoeSparseMoeBlock`
    /// and `qwen3_next.Qwen3NextSparseMoeBlock.__call__`, mlx-lm 0.32.2);
    /// `uint32 [.., k]`, unsorted. Lazy: nothing is evaluated.
    ///
    /// # Errors
    /// [`LayerError::TopK`] unless `scores` has a last axis and `1 <= k <=
    /// E`; [`LayerError::Mlx`] with MLX's message otherwise.
    pub fn top_k(scores: &Array, k: i32) -> Result<Self, LayerError> {
        let experts = scores.shape().last().copied().unwrap_or(0);
        if scores.ndim() == 0 || k < 1 || k > experts {
            return Err(LayerError::TopK {
                k,
                scores: scores.shape().to_vec(),
            });
        }
        let order = ops::argpartition_axis(scores, -k, -1)?;
        let top = order.split_at_indices(&[experts - k], -1)?.remove(1);
        Ok(ExpertIndices {
            indices: top,
            num_experts: experts,
        })
    }

    /// The ids.
    pub fn array(&self) -> &Array {
        &self.indices
    }

    /// The number of experts they index.
    pub fn num_experts(&self) -> i32 {
        self.num_experts
    }

    fn require_experts(&self, num_experts: i32) -> Result<(), LayerError> {
        if self.num_experts != num_experts {
            return Err(LayerError::ExpertCount {
                indices_for: self.num_experts,
                num_experts,
            });
        }
        Ok(())
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
