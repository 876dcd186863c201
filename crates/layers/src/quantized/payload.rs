//! The quantized tensors of a layer: `weight`, `scales`, `biases`, spec.

use std::fmt;

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
        })
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

    /// Splits into `(weight, scales, biases, spec)`.
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
