//! LoRA adapters on a quantized linear layer.

use std::fmt;

use mlx_rs::{ops, Array};

use super::LayerError;

/// One low-rank adapter: `lora_a` `[in, r]`, `lora_b` `[r, out]` and `scale`.
///
/// The residual mirrors `mlx_lm.tuner.lora.LoRALinear.__call__` (mlx-lm
/// 0.32.2) at inference, where `self.dropout` is the identity (dropout
/// `p == 0`, or the module in eval mode; mlx-lm's `load` calls `model.eval()`
/// after loading adapters):
///
/// ```python
/// y = self.linear(x)
/// z = (self.dropout(x) @ self.lora_a) @ self.lora_b
/// return y + (self.scale * z).astype(x.dtype)
/// ```
///
/// Dtypes: `z` has `promote(x, lora_a, lora_b)` (float32 for the default
/// float32 LoRA parameters); `self.scale` is a Python float, which mlx's
/// scalar conversion turns into a scalar *of `z`'s dtype* (the float passes
/// through `float` = f32 on the way, hence `scale: f32` here), so `scale * z`
/// stays in `z`'s dtype; the product is cast to `x.dtype` and added to `y`
/// with ordinary promotion. Training-time dropout is not ported.
#[derive(Clone)]
pub struct LoraAdapter {
    lora_a: Array,
    lora_b: Array,
    scale: f32,
}

impl fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("lora_a", &(self.lora_a.shape(), self.lora_a.dtype()))
            .field("lora_b", &(self.lora_b.shape(), self.lora_b.dtype()))
            .field("scale", &self.scale)
            .finish()
    }
}

impl LoraAdapter {
    /// An adapter from `lora_a` `[in, r]` and `lora_b` `[r, out]` (any float
    /// dtype; mlx-lm keeps them float32) and `scale` (mlx-lm's default is
    /// 20.0).
    ///
    /// # Errors
    /// [`LayerError::AdapterMatrices`] unless both are 2-D with matching `r`.
    pub fn new(lora_a: Array, lora_b: Array, scale: f32) -> Result<Self, LayerError> {
        let (a, b) = (lora_a.shape(), lora_b.shape());
        if a.len() != 2 || b.len() != 2 || a[1] != b[0] {
            return Err(LayerError::AdapterMatrices {
                lora_a: a.to_vec(),
                lora_b: b.to_vec(),
            });
        }
        Ok(LoraAdapter {
            lora_a,
            lora_b,
            scale,
        })
    }

    /// `[in, r]`.
    pub fn lora_a(&self) -> &Array {
        &self.lora_a
    }

    /// `[r, out]`.
    pub fn lora_b(&self) -> &Array {
        &self.lora_b
    }

    /// The scale multiplying the low-rank product.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The rank `r`.
    pub fn rank(&self) -> i32 {
        self.lora_a.shape()[1]
    }

    /// `lora_a.shape[0]`.
    pub fn in_features(&self) -> i32 {
        self.lora_a.shape()[0]
    }

    /// `lora_b.shape[1]`.
    pub fn out_features(&self) -> i32 {
        self.lora_b.shape()[1]
    }

    /// Whether the adapter fits a layer `in -> out`: `lora_a` `[in, r]` and
    /// `lora_b` `[r, out]`, or `[r, 1]`, whose one output column the
    /// reference's `y + residual` (and `weight + delta` in `fuse`)
    /// broadcasts over every output.
    pub fn fits(&self, in_features: i32, out_features: i32) -> bool {
        self.in_features() == in_features
            && (self.out_features() == out_features || self.out_features() == 1)
    }

    /// `(scale * ((x @ lora_a) @ lora_b)).astype(x.dtype)` for `x` `[.., in]`;
    /// result `[.., out]` in `x`'s dtype.
    ///
    /// # Errors
    /// [`LayerError::Mlx`] with MLX's message (e.g. `x` not ending in `in`).
    pub fn residual(&self, x: &Array) -> Result<Array, LayerError> {
        let z = ops::matmul(ops::matmul(x, &self.lora_a)?, &self.lora_b)?;
        let scale = Array::from_f32(self.scale).as_dtype(z.dtype())?;
        Ok(ops::multiply(&scale, &z)?.as_dtype(x.dtype())?)
    }

    /// `y + residual(x)`: the last line of `LoRALinear.__call__`.
    ///
    /// # Errors
    /// As [`LoraAdapter::residual`].
    pub fn apply(&self, x: &Array, y: &Array) -> Result<Array, LayerError> {
        Ok(ops::add(y, &self.residual(x)?)?)
    }
}

/// The fused float weight `[out, in]`: the layer's dequantized weight plus
/// the adapter's low-rank delta, as `mlx_lm.tuner.lora.LoRALinear.fuse`
/// (mlx-lm 0.32.2) computes it:
///
/// ```python
/// weight = mx.dequantize(weight, linear.scales, linear.biases,
///     group_size=linear.group_size, bits=linear.bits, mode=linear.mode)
/// delta = ((self.scale * self.lora_b.T) @ self.lora_a.T).astype(weight.dtype)
/// fused_linear.weight = weight + delta
/// ```
///
/// # Errors
/// [`LayerError::AdapterShape`] when the adapter does not fit the layer;
/// [`LayerError::Mlx`] otherwise.
pub fn fused_weight(
    linear: &super::QuantizedLinear,
    adapter: &LoraAdapter,
) -> Result<Array, LayerError> {
    if !adapter.fits(linear.in_features(), linear.out_features()) {
        return Err(LayerError::AdapterShape {
            name: "fuse".to_owned(),
            in_features: linear.in_features(),
            out_features: linear.out_features(),
            lora_a: adapter.lora_a().shape().to_vec(),
            lora_b: adapter.lora_b().shape().to_vec(),
        });
    }
    let weight = linear.payload().dequantize(None)?;
    let b_t = adapter.lora_b().t();
    let scale = Array::from_f32(adapter.scale()).as_dtype(b_t.dtype())?;
    let delta = ops::matmul(&ops::multiply(&scale, &b_t)?, adapter.lora_a().t())?
        .as_dtype(weight.dtype())?;
    Ok(ops::add(&weight, &delta)?)
}

/// `LoRALinear.fuse(dequantize=False)`: [`fused_weight`] requantized with
/// the layer's spec (`nn.QuantizedLinear.from_linear(fused, group_size,
/// bits, mode=mode)`), the additive bias kept. The result has no adapters.
///
/// # Errors
/// As [`fused_weight`], and [`LayerError::Mlx`] from `mx.quantize`.
pub fn fuse(
    linear: &super::QuantizedLinear,
    adapter: &LoraAdapter,
) -> Result<super::QuantizedLinear, LayerError> {
    let weight = fused_weight(linear, adapter)?;
    let payload = super::QuantizedPayload::quantize(&weight, linear.spec())?;
    super::QuantizedLinear::new(payload, linear.bias().cloned())
}
