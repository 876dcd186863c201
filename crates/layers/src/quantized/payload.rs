//! The quantized tensors of a layer: `weight`, `scales`, `biases`, spec.

use std::fmt;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use crate::ffi::{self, Mode};

use super::{LayerError, PayloadError, QuantSpec};

/// The quantized payload of a layer: the packed `weight`, its `scales`, the
/// affine zero points `biases`, and the [`QuantSpec`] they were packed with.
///
/// Shapes (checked by [`QuantizedPayload::new`]), with `in = packed * 32 /
/// bits`:
/// * `weight`: `uint32 [.., out, packed]`
/// * `scales`: `[.., out, in / group_size]` (the weight's float dtype for
///   affine, `uint8` for mxfp4/mxfp8/nvfp4)
/// * `biases`: affine only, same shape and dtype as `scales`
///
/// Leading dimensions `..` are the experts of a switch layer (none for a
/// linear layer).
///
/// in/out features come from the tensors exactly as the reference layers
/// derive them: `in = packed * 32 // bits` (`QuantizedLinear._extra_repr`,
/// `LoRALinear.from_base`), which after validation equals `scales.shape[-1] *
/// group_size` (`QuantizedSwitchLinear.input_dims`).
///
/// **Finding:** `optiq.adapters.mount._infer_linear_shape` (mlx-optiq 0.7.7)
/// computes `packed * (32 // bits)`, dividing before multiplying: for bits 3,
/// 5 and 6 that is wrong (a true in=384 at 3 bits gives 360), so optiq's
/// `add_adapter` rejects correctly shaped LoRA matrices there. The origin's
/// `inFeatures` (`scales.shape[1] * groupSize`) cites that function but
/// computes the correct value; this port follows the reference layers.
#[derive(Clone)]
pub struct QuantizedPayload {
    weight: Array,
    scales: Array,
    biases: Option<Array>,
    spec: QuantSpec,
    in_features: i32,
    global_scale: Option<Array>,
}

impl fmt::Debug for QuantizedPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only shapes and dtypes: `Array`'s Debug would evaluate the data.
        f.debug_struct("QuantizedPayload")
            .field("spec", &self.spec)
            .field("weight", &(self.weight.shape(), self.weight.dtype()))
            .field("scales", &(self.scales.shape(), self.scales.dtype()))
            .field(
                "biases",
                &self
                    .biases
                    .as_ref()
                    .map(|b| (b.shape().to_vec(), b.dtype())),
            )
            .field(
                "global_scale",
                &self
                    .global_scale
                    .as_ref()
                    .map(|g| (g.shape().to_vec(), g.dtype())),
            )
            .finish()
    }
}

impl QuantizedPayload {
    /// Checks and wraps the tensors of a quantized layer (shapes above).
    ///
    /// # Errors
    /// [`PayloadError`]: invalid spec, weight not `uint32`, rank below 2,
    /// `packed * 32` not a multiple of `bits`, `group_size` not dividing
    /// in_features, scales or biases of the wrong shape, affine without
    /// biases, or biases for a mode that has none.
    pub fn new(
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        spec: QuantSpec,
    ) -> Result<Self, PayloadError> {
        let in_features = validate(&weight, &scales, biases.as_ref(), spec)?;
        Ok(QuantizedPayload {
            weight,
            scales,
            biases,
            spec,
            in_features,
            global_scale: None,
        })
    }

    /// Adds nvfp4's two-level scaling: a float32 per-tensor `global_scale`
    /// next to the per-group `scales`. Shape: a scalar for a linear payload
    /// (`mx.quantize`'s `global_scale`), `[E]` for a switch payload (one per
    /// expert, as `mlx_lm.models.switch_layers._quantize_experts` stores
    /// it; mlx-lm 0.32.2 saves it as `<path>.global_scale`).
    ///
    /// # Errors
    /// [`PayloadError::GlobalScaleMode`] unless the mode is nvfp4 (MLX:
    /// "Global scale is only supported for 'nvfp4'"),
    /// [`PayloadError::GlobalScaleDtype`] unless float32,
    /// [`PayloadError::GlobalScaleShape`] for any other shape.
    pub fn with_global_scale(mut self, global_scale: Array) -> Result<Self, PayloadError> {
        if self.spec.mode != Mode::Nvfp4 {
            return Err(PayloadError::GlobalScaleMode {
                mode: self.spec.mode,
            });
        }
        if global_scale.dtype() != Dtype::Float32 {
            return Err(PayloadError::GlobalScaleDtype {
                dtype: global_scale.dtype(),
            });
        }
        let leading = self.leading_shape().to_vec();
        let fits = match leading.as_slice() {
            [] => global_scale.size() == 1 && global_scale.ndim() <= 1,
            lead => global_scale.shape() == lead,
        };
        if !fits {
            return Err(PayloadError::GlobalScaleShape {
                expected: leading,
                actual: global_scale.shape().to_vec(),
            });
        }
        self.global_scale = Some(global_scale);
        Ok(self)
    }

    /// nvfp4 with a global scale: `mx.quantize(w, group_size, bits,
    /// mode="nvfp4", global_scale=global_scale)` (mlx 0.32.2) of a 2-D `w`
    /// `[out, in]`; `global_scale` a float32 scalar.
    ///
    /// # Errors
    /// [`LayerError::Payload`] for an invalid spec, a rank other than 2, or
    /// a global scale [`QuantizedPayload::with_global_scale`] refuses;
    /// [`LayerError::Mlx`] for anything `mx.quantize` rejects.
    pub fn quantize_with_global_scale(
        w: &Array,
        spec: QuantSpec,
        global_scale: &Array,
    ) -> Result<Self, LayerError> {
        spec.validate().map_err(PayloadError::from)?;
        if w.ndim() != 2 {
            return Err(PayloadError::Rank {
                tensor: "weight",
                expected: 2,
                shape: w.shape().to_vec(),
            }
            .into());
        }
        if spec.mode != Mode::Nvfp4 {
            return Err(PayloadError::GlobalScaleMode { mode: spec.mode }.into());
        }
        let (weight, scales) = ffi::quantize_with_global_scale(
            w,
            spec.group_size,
            spec.bits,
            spec.mode,
            global_scale,
        )?;
        Ok(Self::new(weight, scales, None, spec)?.with_global_scale(global_scale.clone())?)
    }

    /// Each expert of `w` `[E, out, in]` quantized with its own nvfp4
    /// global scale, as `mlx_lm.models.switch_layers._quantize_experts`
    /// (mlx-lm 0.32.2) does for `SwitchLinear.to_quantized(...,
    /// global_scale=True)`:
    ///
    /// ```python
    /// gs = mx.max(mx.abs(w), axis=(-2, -1)).astype(mx.float32)
    /// qs = [mx.quantize(w[e], group_size, bits, mode=mode, global_scale=gs[e])
    ///       for e in range(w.shape[0])]
    /// return mx.stack([q for q, _ in qs]), mx.stack([s for _, s in qs]), gs
    /// ```
    ///
    /// # Errors
    /// As [`QuantizedPayload::quantize_with_global_scale`], for a rank
    /// other than 3.
    pub fn quantize_experts_with_global_scale(
        w: &Array,
        spec: QuantSpec,
    ) -> Result<Self, LayerError> {
        spec.validate().map_err(PayloadError::from)?;
        if w.ndim() != 3 {
            return Err(PayloadError::Rank {
                tensor: "weight",
                expected: 3,
                shape: w.shape().to_vec(),
            }
            .into());
        }
        if spec.mode != Mode::Nvfp4 {
            return Err(PayloadError::GlobalScaleMode { mode: spec.mode }.into());
        }
        let gs = mlx_rs::ops::max_axes(&mlx_rs::ops::abs(w)?, &[-2, -1], false)?
            .as_dtype(Dtype::Float32)?;
        let (mut packed, mut scales) = (Vec::new(), Vec::new());
        for e in 0..w.shape()[0] {
            let (q, s) = ffi::quantize_with_global_scale(
                &w.index(e),
                spec.group_size,
                spec.bits,
                spec.mode,
                &gs.index(e),
            )?;
            packed.push(q);
            scales.push(s);
        }
        let weight = mlx_rs::ops::stack(&packed, 0)?;
        let scales = mlx_rs::ops::stack(&scales, 0)?;
        Ok(Self::new(weight, scales, None, spec)?.with_global_scale(gs)?)
    }

    /// The nvfp4 global scale, if any: a float32 scalar (linear) or `[E]`
    /// (switch).
    pub fn global_scale(&self) -> Option<&Array> {
        self.global_scale.as_ref()
    }

    /// Quantizes a floating matrix `w` (`[.., out, in]`) with `mx.quantize`,
    /// as `mlx.nn.QuantizedLinear.from_linear` does.
    ///
    /// # Errors
    /// [`LayerError::Payload`] for an invalid spec, [`LayerError::Mlx`] for
    /// anything `mx.quantize` rejects.
    pub fn quantize(w: &Array, spec: QuantSpec) -> Result<Self, LayerError> {
        spec.validate().map_err(PayloadError::from)?;
        let (weight, scales, biases) = ffi::quantize(w, spec.group_size, spec.bits, spec.mode)?;
        Ok(Self::new(weight, scales, biases, spec)?)
    }

    /// `mx.dequantize` of this payload (`[.., out, in]`), as
    /// `mlx_lm.tuner.lora.LoRALinear.fuse` computes it; `dtype` `None` lets
    /// MLX choose.
    ///
    /// # Errors
    /// [`LayerError::Mlx`] with MLX's message.
    pub fn dequantize(&self, dtype: Option<Dtype>) -> Result<Array, LayerError> {
        if let Some(gs) = &self.global_scale {
            let spec = self.spec;
            let one = |w: &Array, s: &Array, g: &Array| {
                ffi::dequantize_with_global_scale(
                    w,
                    s,
                    spec.group_size,
                    spec.bits,
                    spec.mode,
                    g,
                    dtype,
                )
            };
            if self.weight.ndim() == 2 {
                return Ok(one(&self.weight, &self.scales, gs)?);
            }
            // One expert at a time: MLX takes a scalar global scale only.
            let experts = (0..self.weight.shape()[0])
                .map(|e| one(&self.weight.index(e), &self.scales.index(e), &gs.index(e)))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(mlx_rs::ops::stack(&experts, 0)?);
        }
        Ok(ffi::dequantize(
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.spec.group_size,
            self.spec.bits,
            self.spec.mode,
            dtype,
        )?)
    }

    /// The packed weight, `uint32 [.., out, packed]`.
    pub fn weight(&self) -> &Array {
        &self.weight
    }

    /// The scales, `[.., out, in / group_size]`.
    pub fn scales(&self) -> &Array {
        &self.scales
    }

    /// The affine zero points, shaped like `scales`; `None` for the
    /// floating-point modes.
    pub fn biases(&self) -> Option<&Array> {
        self.biases.as_ref()
    }

    /// The spec the tensors were packed with.
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    /// The mode of the spec.
    pub fn mode(&self) -> Mode {
        self.spec.mode
    }

    /// `packed * 32 / bits`.
    pub fn in_features(&self) -> i32 {
        self.in_features
    }

    /// `weight.shape[-2]`.
    pub fn out_features(&self) -> i32 {
        let shape = self.weight.shape();
        shape[shape.len() - 2]
    }

    /// The leading (expert) dimensions, empty for a linear layer.
    pub fn leading_shape(&self) -> &[i32] {
        let shape = self.weight.shape();
        &shape[..shape.len() - 2]
    }

    /// Splits into `(weight, scales, biases, spec)`; the global scale, if
    /// any, is not part of it (take [`QuantizedPayload::global_scale`]
    /// first).
    pub fn into_parts(self) -> (Array, Array, Option<Array>, QuantSpec) {
        (self.weight, self.scales, self.biases, self.spec)
    }

    /// Checks the number of dimensions of `weight` (2 for a linear layer, 3
    /// for a switch layer).
    pub(crate) fn require_rank(&self, rank: usize) -> Result<(), PayloadError> {
        if self.weight.ndim() != rank {
            return Err(PayloadError::Rank {
                tensor: "weight",
                expected: rank,
                shape: self.weight.shape().to_vec(),
            });
        }
        Ok(())
    }
}

/// Returns in_features.
fn validate(
    weight: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<i32, PayloadError> {
    spec.validate()?;
    if weight.dtype() != Dtype::Uint32 {
        return Err(PayloadError::WeightDtype {
            dtype: weight.dtype(),
        });
    }
    let shape = weight.shape();
    if shape.len() < 2 {
        return Err(PayloadError::Rank {
            tensor: "weight",
            expected: 2,
            shape: shape.to_vec(),
        });
    }
    let packed = shape[shape.len() - 1];
    let packed_bits = i64::from(packed) * 32;
    if packed_bits % i64::from(spec.bits) != 0 {
        return Err(PayloadError::BitsDoNotDivide {
            packed,
            bits: spec.bits,
        });
    }
    let in_features = i32::try_from(packed_bits / i64::from(spec.bits)).map_err(|_| {
        PayloadError::BitsDoNotDivide {
            packed,
            bits: spec.bits,
        }
    })?;
    if in_features % spec.group_size != 0 {
        return Err(PayloadError::GroupSizeDoesNotDivide {
            in_features,
            group_size: spec.group_size,
        });
    }
    let mut expected = shape.to_vec();
    if let Some(last) = expected.last_mut() {
        *last = in_features / spec.group_size;
    }
    if scales.shape() != expected.as_slice() {
        return Err(PayloadError::ScalesShape {
            weight: shape.to_vec(),
            expected,
            actual: scales.shape().to_vec(),
        });
    }
    match (spec.mode.has_biases(), biases) {
        (true, None) => return Err(PayloadError::MissingBiases { mode: spec.mode }),
        (false, Some(_)) => return Err(PayloadError::UnexpectedBiases { mode: spec.mode }),
        (true, Some(b)) if b.shape() != scales.shape() => {
            return Err(PayloadError::BiasesShape {
                expected: scales.shape().to_vec(),
                actual: b.shape().to_vec(),
            })
        }
        _ => {}
    }
    Ok(in_features)
}
