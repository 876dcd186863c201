//! `QuantizedLinear`: quantized projection + additive bias + LoRA residuals.

use std::fmt;

use mlx_rs::{ops, Array};

use crate::checkpoint::{Checkpoint, LayerKind};
use crate::ffi;

use super::rows_regime::{RowsCall, RowsLimit, RowsRegime};
use super::{LayerError, LoraAdapter, PayloadError, QuantSpec, QuantizedPayload};

/// How [`QuantizedLinear::forward`] treats the rows (the M query rows) of its
/// input.
///
/// One layer type with a mode replaces the origin's `QuantizedLinearPlain` /
/// `QuantizedLinearRows` wrappers: both wrapped the same weights, bias and
/// adapters, so in Rust they are one owner of that state and the row policy
/// is a plain value, switchable at run time and visible in `Debug`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Forward {
    /// One `quantized_matmul` over all rows, as the reference runs it. MLX
    /// may pick a different kernel (and summation order) for different M, so
    /// row i's bits may depend on how many rows were sent.
    #[default]
    Batched,
    /// Every row's result is bit-identical to sending that row alone (the
    /// decode case, M = 1), whatever M, in the fewest calls the backend
    /// allows: the input is flattened to `[rows, K]` and sent in chunks of
    /// at most the [`RowsRegime`]'s [`RowsCall::QuantizedMatmul`] limit for
    /// the layer's spec and `x`'s dtype (MLX picks its kernel from the row
    /// count, and kernels round differently); the chunks' outputs are
    /// concatenated and reshaped back. The regime is the backend of MLX's
    /// default device at the call, unless pinned with
    /// [`QuantizedLinear::set_rows_regime`].
    ///
    /// With LoRA adapters attached every row is still its own call: the
    /// residual's float matmuls have a row regime of their own that the
    /// table does not measure. (The origin ran only the quantized matmul
    /// per row and applied the residual to the whole batch, so with
    /// adapters its rows were not independent.)
    RowsIndependent,
}

/// A quantized linear layer: mirrors `mlx.nn.QuantizedLinear.__call__` (mlx
/// 0.32.2) wrapped by `mlx_lm.tuner.lora.LoRALinear.__call__` (mlx-lm
/// 0.32.2) for each attached adapter:
///
/// ```text
/// y = quantized_matmul(x, weight, scales, biases, transpose=True, group_size, bits, mode)
/// y = y + bias                                   # if the layer has `.bias`
/// y = y + (scale_k * ((x @ A_k) @ B_k)).astype(x.dtype)   # k in attachment order
/// ```
///
/// Input `x`: `[.., K]` with `K = in_features`, any number of leading (batch)
/// dimensions; output `[.., out_features]`. Output dtype: affine →
/// `promote(x, scales)`, floating-point modes → `x.dtype`; then promoted with
/// `bias`'s dtype, then with `x.dtype` per adapter.
///
/// Several adapters: mlx-lm nests one `LoRALinear` per adapter, each adding
/// its residual to the output of the inner one; attaching `a` then `b` is
/// `LoRALinear_b(LoRALinear_a(base))`, i.e. residuals are added in
/// attachment order, each to the running sum, each computed from the same
/// `x`.
pub struct QuantizedLinear {
    payload: QuantizedPayload,
    bias: Option<Array>,
    adapters: Vec<(String, LoraAdapter)>,
    forward: Forward,
    /// The rows regime pinned for [`Forward::RowsIndependent`]; `None`: the
    /// default device's backend at each call.
    rows_regime: Option<RowsRegime>,
}

impl fmt::Debug for QuantizedLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantizedLinear")
            .field("payload", &self.payload)
            .field(
                "bias",
                &self.bias.as_ref().map(|b| (b.shape().to_vec(), b.dtype())),
            )
            .field("adapters", &self.adapters)
            .field("forward", &self.forward)
            .field(
                "rows_regime",
                &self.rows_regime.as_ref().map(RowsRegime::backend),
            )
            .finish()
    }
}

impl QuantizedLinear {
    /// A layer from a payload (`weight` `uint32 [out, packed]`) and an
    /// optional additive `bias` `[out]` (the `.bias` of
    /// `nn.QuantizedLinear`, distinct from the zero points `biases`).
    /// [`Forward::Batched`], no adapters.
    ///
    /// What the reference's `quantized_matmul(x, ...) + bias` broadcasts is
    /// accepted as it broadcasts it: a weight with leading batch axes
    /// (`[.., out, packed]`; the output gains them), and a bias that is a
    /// scalar or ends in `out` or 1 (`[1]`, `[1, out]`, `[B, out]`: checked
    /// against each output in [`QuantizedLinear::forward`]). The
    /// rows-independent forward takes neither batched weights nor a bias
    /// that widens the output.
    ///
    /// # Errors
    /// [`PayloadError::Rank`] for a weight of fewer than 2 axes,
    /// [`PayloadError::BiasShape`] for a bias whose last axis is neither
    /// `out` nor 1 (it broadcasts against no output).
    pub fn new(payload: QuantizedPayload, bias: Option<Array>) -> Result<Self, LayerError> {
        if payload.weight().ndim() < 2 {
            payload.require_rank(2)?;
        }
        if let Some(b) = &bias {
            check_bias_last_axis(b, payload.out_features())?;
        }
        Ok(QuantizedLinear {
            payload,
            bias,
            adapters: Vec::new(),
            forward: Forward::Batched,
            rows_regime: None,
        })
    }

    /// [`QuantizedPayload::new`] then [`QuantizedLinear::new`].
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

    /// The layer at module `path` (e.g. `model.layers.0.self_attn.q_proj`) of
    /// a checkpoint, as `mlx_lm.utils.load_model` builds it: the spec resolved
    /// per path ([`Checkpoint::resolve_quant_spec`] with
    /// [`LayerKind::Linear`]), then `path.weight`, `path.scales`,
    /// `path.biases` (affine), and `path.bias` when present.
    ///
    /// `in_features` is the unquantized module's input width (from the model
    /// architecture); the reference needs it too, to infer the spec of paths
    /// the config does not name.
    ///
    /// # Errors
    /// [`LayerError::Checkpoint`]: spec unresolvable or rejected, path not
    /// quantized, missing tensors, or tensors inconsistent with the spec or
    /// with `in_features` (named by path).
    pub fn from_checkpoint(
        checkpoint: &Checkpoint,
        path: &str,
        in_features: i32,
    ) -> Result<Self, LayerError> {
        let tensors = checkpoint.quantized_tensors(path, LayerKind::Linear, in_features)?;
        // `load_weights(strict=True)` checks each tensor against the shape
        // `nn.QuantizedLinear.__init__` gave it: no broadcasting here.
        let strict = tensors.payload.require_rank(2).and_then(|()| {
            check_bias_exact(tensors.bias.as_ref(), vec![tensors.payload.out_features()])
        });
        let layer = strict
            .map_err(LayerError::from)
            .and_then(|()| Self::new(tensors.payload, tensors.bias))
            .map_err(|e| checkpoint_payload_error(path, e))?;
        Ok(layer)
    }

    /// The quantized payload.
    pub fn payload(&self) -> &QuantizedPayload {
        &self.payload
    }

    /// The additive `bias` (`[out]`, or any shape [`QuantizedLinear::new`]
    /// accepts), if the layer has one.
    pub fn bias(&self) -> Option<&Array> {
        self.bias.as_ref()
    }

    /// The spec of the current payload.
    pub fn spec(&self) -> QuantSpec {
        self.payload.spec()
    }

    /// `packed * 32 / bits` of the current payload.
    pub fn in_features(&self) -> i32 {
        self.payload.in_features()
    }

    /// `weight.shape[0]`.
    pub fn out_features(&self) -> i32 {
        self.payload.out_features()
    }

    /// The row policy [`QuantizedLinear::forward`] uses.
    pub fn forward_mode(&self) -> Forward {
        self.forward
    }

    /// Sets the row policy.
    pub fn set_forward_mode(&mut self, forward: Forward) {
        self.forward = forward;
    }

    /// Builder form of [`QuantizedLinear::set_forward_mode`].
    pub fn with_forward_mode(mut self, forward: Forward) -> Self {
        self.forward = forward;
        self
    }

    /// Pins the rows regime [`Forward::RowsIndependent`] chunks by (`None`:
    /// the table of the default device's backend at each call). A regime
    /// of one row per call (a backend the table has not measured) gives the
    /// same bits as any other that is right for the backend.
    pub fn set_rows_regime(&mut self, regime: Option<RowsRegime>) {
        self.rows_regime = regime;
    }

    /// The rows limit the rows-independent forward uses for `dtype` now.
    ///
    /// # Errors
    /// [`LayerError::Mlx`] when the default device's backend cannot be read.
    pub fn rows_limit(&self, dtype: mlx_rs::Dtype) -> Result<RowsLimit, LayerError> {
        if !self.adapters.is_empty() {
            return Ok(RowsLimit::AtMost(1));
        }
        let limit = |r: &RowsRegime| {
            r.limit(
                RowsCall::QuantizedMatmul,
                self.spec(),
                dtype,
                self.in_features(),
            )
        };
        Ok(match &self.rows_regime {
            Some(r) => limit(r),
            None => limit(&RowsRegime::for_backend(
                crate::backend::Backend::of_default_device()?,
            )),
        })
    }

    /// Atomically installs `next` (weight, scales, biases, spec) and returns
    /// the previous payload: the origin's `exchangeQuantizedState`, the one
    /// mutation sensitivity sweeps use.
    ///
    /// `&mut self` means no forward can observe a half-exchanged layer; the
    /// new payload is fully validated (by [`QuantizedPayload::new`]) before
    /// the single move that installs it. The spec may change (e.g. 4 → 8
    /// bits); the shape may not, because `bias` and the adapters depend on it.
    ///
    /// # Errors
    /// [`LayerError::Payload`] for a payload of another rank than the
    /// layer's, [`LayerError::FeaturesChanged`] when in/out features differ;
    /// in both cases the layer is unchanged.
    pub fn exchange_payload(
        &mut self,
        next: QuantizedPayload,
    ) -> Result<QuantizedPayload, LayerError> {
        next.require_rank(self.payload.weight().ndim())?;
        if (next.in_features(), next.out_features()) != (self.in_features(), self.out_features()) {
            return Err(LayerError::FeaturesChanged {
                expected_in: self.in_features(),
                expected_out: self.out_features(),
                in_features: next.in_features(),
                out_features: next.out_features(),
            });
        }
        Ok(std::mem::replace(&mut self.payload, next))
    }

    /// The attached adapters, in attachment (= application) order.
    pub fn adapters(&self) -> impl Iterator<Item = (&str, &LoraAdapter)> {
        self.adapters.iter().map(|(n, a)| (n.as_str(), a))
    }

    /// The adapter named `name`.
    pub fn adapter(&self, name: &str) -> Option<&LoraAdapter> {
        self.adapters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    /// Appends an adapter; its residual is added after those of the adapters
    /// already attached.
    ///
    /// # Errors
    /// [`LayerError::DuplicateAdapter`] if `name` is attached,
    /// [`LayerError::AdapterShape`] unless `lora_a` is `[in, r]` and `lora_b`
    /// `[r, out]` (or `[r, 1]`, broadcast over the outputs as the reference
    /// broadcasts it: [`LoraAdapter::fits`]).
    pub fn attach_adapter(
        &mut self,
        name: impl Into<String>,
        adapter: LoraAdapter,
    ) -> Result<(), LayerError> {
        let name = name.into();
        if self.adapter(&name).is_some() {
            return Err(LayerError::DuplicateAdapter { name });
        }
        self.check_adapter(&name, &adapter)?;
        self.adapters.push((name, adapter));
        Ok(())
    }

    /// Replaces the adapter named `name` in place (its position in the order
    /// is kept) and returns the previous one.
    ///
    /// # Errors
    /// [`LayerError::UnknownAdapter`], or [`LayerError::AdapterShape`]
    /// (nothing replaced).
    pub fn swap_adapter(
        &mut self,
        name: &str,
        adapter: LoraAdapter,
    ) -> Result<LoraAdapter, LayerError> {
        self.check_adapter(name, &adapter)?;
        let slot = self
            .adapters
            .iter_mut()
            .find(|(n, _)| n == name)
            .ok_or_else(|| LayerError::UnknownAdapter {
                name: name.to_owned(),
            })?;
        Ok(std::mem::replace(&mut slot.1, adapter))
    }

    /// Removes and returns the adapter named `name`; the others keep their
    /// order.
    pub fn detach_adapter(&mut self, name: &str) -> Option<LoraAdapter> {
        let i = self.adapters.iter().position(|(n, _)| n == name)?;
        Some(self.adapters.remove(i).1)
    }

    /// Removes every adapter.
    pub fn clear_adapters(&mut self) {
        self.adapters.clear();
    }

    fn check_adapter(&self, name: &str, adapter: &LoraAdapter) -> Result<(), LayerError> {
        if !adapter.fits(self.in_features(), self.out_features()) {
            return Err(LayerError::AdapterShape {
                name: name.to_owned(),
                in_features: self.in_features(),
                out_features: self.out_features(),
                lora_a: adapter.lora_a().shape().to_vec(),
                lora_b: adapter.lora_b().shape().to_vec(),
            });
        }
        Ok(())
    }

    /// The layer's output for `x` `[.., in_features]` under the layer's
    /// [`Forward`] mode; `[.., out_features]`.
    ///
    /// # Errors
    /// [`LayerError::InputShape`] if `x` is a scalar or does not end in
    /// in_features; [`PayloadError::BiasShape`] when the bias does not
    /// broadcast against this output (the reference raises
    /// `[broadcast_shapes]`), or, rows-independent, widens it;
    /// [`PayloadError::Rank`] for a batched weight under
    /// [`Forward::RowsIndependent`]; [`LayerError::Mlx`] with MLX's message
    /// otherwise.
    pub fn forward(&self, x: &Array) -> Result<Array, LayerError> {
        self.forward_as(x, self.forward)
    }

    /// [`QuantizedLinear::forward`] with an explicit row policy.
    ///
    /// # Errors
    /// As [`QuantizedLinear::forward`].
    pub fn forward_as(&self, x: &Array, forward: Forward) -> Result<Array, LayerError> {
        if self.payload.global_scale().is_some() {
            return Err(LayerError::GlobalScaleRefused {
                layer: "QuantizedLinear",
                op: "mlx.core.quantized_matmul",
            });
        }
        let shape = x.shape();
        if shape.last() != Some(&self.in_features()) {
            return Err(LayerError::InputShape {
                in_features: self.in_features(),
                shape: shape.to_vec(),
            });
        }
        if forward == Forward::RowsIndependent {
            self.check_rows_independent(x)?;
        }
        if x.size() == 0 {
            return self.empty_output(x);
        }
        match forward {
            Forward::Batched => self.forward_batched(x, self.bias.as_ref()),
            Forward::RowsIndependent => self.forward_rows(x),
        }
    }

    /// What the rows-independent forward cannot split into rows: a batched
    /// weight, or a bias that widens the output past `x`'s rows.
    fn check_rows_independent(&self, x: &Array) -> Result<(), LayerError> {
        if !self.payload.leading_shape().is_empty() {
            self.payload.require_rank(2)?;
        }
        if let Some(bias) = &self.bias {
            let y_shape = self.row_output_shape(x);
            if crate::shape::broadcast(&y_shape, bias.shape()).as_ref() != Some(&y_shape) {
                return Err(PayloadError::BiasShape {
                    expected: y_shape,
                    actual: bias.shape().to_vec(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// `x.shape[:-1] + [out]`: the output of a 2-D weight before the bias.
    fn row_output_shape(&self, x: &Array) -> Vec<i32> {
        let mut shape = x.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = self.out_features();
        }
        shape
    }

    /// The result for an input with a zero-size dimension: an empty array of
    /// the shape and dtype the graph for `x` gives (built lazily, never
    /// evaluated: MLX computes shapes when ops are created). MLX 0.32.2's
    /// CPU quantized matmul dies with SIGFPE on an empty batch (the
    /// reference does too), so the kernel is not called.
    fn empty_output(&self, x: &Array) -> Result<Array, LayerError> {
        let graph = self.forward_batched(x, self.bias.as_ref())?;
        // From (no) host data: no kernel launch, which on CUDA fails for a
        // zero-size grid.
        Ok(ffi::array_from_bytes(&[], graph.shape(), graph.dtype())?)
    }

    fn forward_batched(&self, x: &Array, bias: Option<&Array>) -> Result<Array, LayerError> {
        let p = &self.payload;
        let spec = p.spec();
        let mut y = ffi::quantized_matmul(
            x,
            p.weight(),
            p.scales(),
            p.biases(),
            true,
            spec.group_size,
            spec.bits,
            spec.mode,
        )?;
        if let Some(bias) = bias {
            if crate::shape::broadcast(y.shape(), bias.shape()).is_none() {
                return Err(PayloadError::BiasShape {
                    expected: y.shape().to_vec(),
                    actual: bias.shape().to_vec(),
                }
                .into());
            }
            y = ops::add(&y, bias)?;
        }
        for (_, adapter) in &self.adapters {
            y = adapter.apply(x, &y)?;
        }
        Ok(y)
    }

    fn forward_rows(&self, x: &Array) -> Result<Array, LayerError> {
        let shape = x.shape();
        let k = self.in_features();
        let rows: i64 = shape[..shape.len() - 1]
            .iter()
            .map(|&d| i64::from(d))
            .product();
        if rows <= 1 {
            // Zero rows or one row: the batched call already is the M=1 call.
            return self.forward_batched(x, self.bias.as_ref());
        }
        let rows_i32 = i32::try_from(rows).map_err(|_| LayerError::InputShape {
            in_features: k,
            shape: shape.to_vec(),
        })?;
        let flat = x.reshape(&[rows_i32, k])?;
        let out_shape = self.row_output_shape(x);
        let chunk = self.rows_limit(x.dtype())?.chunk(rows as usize);
        let offsets: Vec<i32> = (chunk..rows as usize)
            .step_by(chunk)
            .map(|o| o as i32)
            .collect();
        // A bias that differs per row ([B, out]) gives each chunk its own
        // rows of it: the same element-wise sum as the batched `y + bias`.
        let chunk_biases = match &self.bias {
            Some(b)
                if b.shape()[..b.ndim().saturating_sub(1)]
                    .iter()
                    .any(|&d| d != 1) =>
            {
                Some(
                    ops::broadcast_to(b, &out_shape)?
                        .reshape(&[rows_i32, self.out_features()])?
                        .split_at_indices(&offsets, 0)?,
                )
            }
            _ => None,
        };
        let outputs = flat
            .split_at_indices(&offsets, 0)?
            .iter()
            .enumerate()
            .map(|(i, rows)| {
                let bias = chunk_biases
                    .as_ref()
                    .map_or(self.bias.as_ref(), |r| Some(&r[i]));
                self.forward_batched(rows, bias)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let y = ops::concatenate(&outputs, 0)?;
        Ok(y.reshape(&out_shape)?)
    }
}

/// A bias `x + bias` can add to some `[.., out]` output: a scalar, or a
/// last axis of `out` or 1.
pub(crate) fn check_bias_last_axis(bias: &Array, out: i32) -> Result<(), PayloadError> {
    match bias.shape().last() {
        None => Ok(()),
        Some(&last) if last == out || last == 1 => Ok(()),
        Some(_) => Err(PayloadError::BiasShape {
            expected: vec![out],
            actual: bias.shape().to_vec(),
        }),
    }
}

/// A bias of exactly `expected`, as `load_weights(strict=True)` installs
/// one on a module that `__init__` built (`[out]`, `[E, out]`).
pub(crate) fn check_bias_exact(
    bias: Option<&Array>,
    expected: Vec<i32>,
) -> Result<(), PayloadError> {
    match bias {
        Some(b) if b.shape() != expected.as_slice() => Err(PayloadError::BiasShape {
            expected,
            actual: b.shape().to_vec(),
        }),
        _ => Ok(()),
    }
}

/// A layer-level check that failed while building from a checkpoint, named
/// by module path.
pub(crate) fn checkpoint_payload_error(path: &str, e: LayerError) -> LayerError {
    match e {
        LayerError::Payload(source) => crate::checkpoint::CheckpointError::Payload {
            path: path.to_owned(),
            source,
        }
        .into(),
        other => other,
    }
}
