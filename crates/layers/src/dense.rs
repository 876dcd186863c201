//! Unquantized layers, for the modules a quantized checkpoint leaves in
//! float (a per-path `false`, an `lm_head` without scales, a layer whose
//! width the group size does not divide):
//!
//! | here | reference (pinned) |
//! | --- | --- |
//! | [`Linear::forward`] | `mlx.nn.Linear.__call__` (mlx 0.32.2): `mx.addmm(bias, x, weight.T)`, or `x @ weight.T` without a bias |
//! | [`SwitchLinear::forward`] | `mlx_lm.models.switch_layers.SwitchLinear.__call__` (mlx-lm 0.32.2): `mx.gather_mm(x, weight.swapaxes(-1, -2), rhs_indices=indices, sorted_indices=…)`, then `+ expand_dims(bias[indices], -2)` |
//! | `from_checkpoint` | `mlx_lm.utils.load_model` leaving the module unquantized, then `load_weights` |
//!
//! Errors are [`LayerError`]s (shared with the quantized layers); no input
//! panics or crashes: an empty batch gives the empty result without a
//! kernel launch, expert indices are range-checked on the host.

use mlx_rs::{ops, Array, Dtype};

use crate::checkpoint::Checkpoint;
use crate::ffi;
use crate::quantized::switch::{
    add_expert_bias, check_expert_bias, check_indices, empty_switch_output,
};
use crate::quantized::{check_bias_exact, check_bias_last_axis, LayerError, PayloadError};

const QUANTIZED_HINT: &str =
    " (a uint32 weight is packed: load the path with QuantizedLinear / QuantizedSwitchLinear)";

/// A weight of `rank` axes. Any dtype: the reference's matmul promotes an
/// integer or bool weight with `x` (to `x`'s float dtype), and so does the
/// port's.
fn check_weight(layer: &'static str, weight: &Array, rank: usize) -> Result<(), LayerError> {
    if weight.ndim() != rank {
        return Err(LayerError::FloatWeight {
            layer,
            rank,
            shape: weight.shape().to_vec(),
            dtype: weight.dtype(),
            hint: if weight.dtype() == Dtype::Uint32 {
                QUANTIZED_HINT
            } else {
                ""
            },
        });
    }
    Ok(())
}

/// A float weight whose dtype holds packed integers: a checkpoint's
/// quantized path read as float. `load_weights` would install it only on a
/// module of the packed shape, so from a checkpoint it is refused.
fn check_checkpoint_weight(
    layer: &'static str,
    weight: &Array,
    rank: usize,
) -> Result<(), LayerError> {
    if weight.dtype() == Dtype::Uint32 {
        return Err(LayerError::FloatWeight {
            layer,
            rank,
            shape: weight.shape().to_vec(),
            dtype: weight.dtype(),
            hint: QUANTIZED_HINT,
        });
    }
    Ok(())
}

/// `weight` and optional `bias` of module `path` in a checkpoint.
fn checkpoint_tensors(
    checkpoint: &Checkpoint,
    path: &str,
) -> Result<(Array, Option<Array>), LayerError> {
    let weight = checkpoint.array(&format!("{path}.weight"))?;
    let bias_name = format!("{path}.bias");
    let bias = match checkpoint.tensor_info(&bias_name) {
        Ok(_) => Some(checkpoint.array(&bias_name)?),
        Err(_) => None,
    };
    Ok((weight, bias))
}

/// `mlx.nn.Linear`: `weight` `[out, in]`, optional `bias` `[out]`, any
/// dtype (the output dtype is MLX's promotion of `x`, `weight` and `bias`;
/// an integer or bool weight takes `x`'s float dtype, as in the reference).
/// A bias that `addmm` broadcasts to the output (a scalar, `[1]`, `[1,
/// out]`, `[M, out]`) is accepted as the reference accepts it.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Array,
    bias: Option<Array>,
}

impl Linear {
    /// # Errors
    /// [`LayerError::FloatWeight`] unless `weight` is 2-D;
    /// [`PayloadError::BiasShape`] for a bias whose last axis is neither
    /// `out` nor 1.
    pub fn new(weight: Array, bias: Option<Array>) -> Result<Self, LayerError> {
        check_weight("Linear", &weight, 2)?;
        if let Some(b) = &bias {
            check_bias_last_axis(b, weight.shape()[0])?;
        }
        Ok(Linear { weight, bias })
    }

    /// The float layer at module `path` of a checkpoint: `path.weight` and,
    /// if saved, `path.bias` (what `load_weights` installs on an
    /// `nn.Linear` the loader left unquantized).
    ///
    /// # Errors
    /// [`crate::checkpoint::CheckpointError`] when the tensors cannot be
    /// read; [`LayerError::FloatWeight`] for a uint32 (packed) weight, which
    /// says to use `QuantizedLinear`; [`PayloadError::BiasShape`] for a bias
    /// other than `[out]` (`load_weights(strict=True)`); those of
    /// [`Linear::new`].
    pub fn from_checkpoint(checkpoint: &Checkpoint, path: &str) -> Result<Self, LayerError> {
        let (weight, bias) = checkpoint_tensors(checkpoint, path)?;
        check_checkpoint_weight("Linear", &weight, 2)?;
        check_weight("Linear", &weight, 2)?;
        check_bias_exact(bias.as_ref(), vec![weight.shape()[0]])?;
        Self::new(weight, bias)
    }

    /// `weight.shape[1]`.
    pub fn in_features(&self) -> i32 {
        self.weight.shape()[1]
    }

    /// `weight.shape[0]`.
    pub fn out_features(&self) -> i32 {
        self.weight.shape()[0]
    }

    /// The weight `[out, in]`.
    pub fn weight(&self) -> &Array {
        &self.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Array> {
        self.bias.as_ref()
    }

    /// `x` `[.., in]` → `[.., out]`, as `nn.Linear.__call__`.
    ///
    /// # Errors
    /// [`LayerError::InputShape`] when `x` does not end in in_features;
    /// [`PayloadError::BiasShape`] when the bias does not broadcast to this
    /// output (the reference's `addmm` raises); [`LayerError::Mlx`] with
    /// MLX's message otherwise.
    pub fn forward(&self, x: &Array) -> Result<Array, LayerError> {
        if x.shape().last() != Some(&self.in_features()) {
            return Err(LayerError::InputShape {
                in_features: self.in_features(),
                shape: x.shape().to_vec(),
            });
        }
        if let Some(bias) = &self.bias {
            let mut y_shape = x.shape().to_vec();
            if let Some(last) = y_shape.last_mut() {
                *last = self.out_features();
            }
            // `addmm` broadcasts its `c` to the output, never the output to `c`.
            if crate::shape::broadcast(&y_shape, bias.shape()).as_ref() != Some(&y_shape) {
                return Err(PayloadError::BiasShape {
                    expected: y_shape,
                    actual: bias.shape().to_vec(),
                }
                .into());
            }
        }
        if x.size() == 0 {
            // The shape and dtype of the graph for `x`, built lazily, never
            // run; the result from (no) host data: no zero-size kernel launch.
            let graph = self.graph(x)?;
            return Ok(ffi::array_from_bytes(&[], graph.shape(), graph.dtype())?);
        }
        self.graph(x)
    }

    fn graph(&self, x: &Array) -> Result<Array, LayerError> {
        // `self["weight"].T`: every axis reversed.
        let wt = ops::transpose(&self.weight)?;
        Ok(match &self.bias {
            Some(bias) => ops::addmm(bias, x, &wt, None, None)?,
            None => ops::matmul(x, &wt)?,
        })
    }
}

/// mlx-lm's `SwitchLinear`: stacked float experts, `weight` `[E, out, in]`,
/// optional `bias` `[E, out]`.
#[derive(Debug, Clone)]
pub struct SwitchLinear {
    weight: Array,
    bias: Option<Array>,
}

impl SwitchLinear {
    /// # Errors
    /// [`LayerError::FloatWeight`] unless `weight` is 3-D (any dtype, as
    /// for [`Linear`]); [`PayloadError::BiasShape`] for a bias not shaped
    /// `[E, out]` or `[E, 1]`.
    pub fn new(weight: Array, bias: Option<Array>) -> Result<Self, LayerError> {
        check_weight("SwitchLinear", &weight, 3)?;
        if let Some(b) = &bias {
            check_expert_bias(b, weight.shape()[0], weight.shape()[1])?;
        }
        Ok(SwitchLinear { weight, bias })
    }

    /// The float switch layer at module `path` of a checkpoint.
    ///
    /// # Errors
    /// As [`Linear::from_checkpoint`] (the bias exactly `[E, out]`), with
    /// [`SwitchLinear::new`]'s.
    pub fn from_checkpoint(checkpoint: &Checkpoint, path: &str) -> Result<Self, LayerError> {
        let (weight, bias) = checkpoint_tensors(checkpoint, path)?;
        check_checkpoint_weight("SwitchLinear", &weight, 3)?;
        check_weight("SwitchLinear", &weight, 3)?;
        check_bias_exact(bias.as_ref(), vec![weight.shape()[0], weight.shape()[1]])?;
        Self::new(weight, bias)
    }

    /// `E = weight.shape[0]`.
    pub fn num_experts(&self) -> i32 {
        self.weight.shape()[0]
    }

    /// `weight.shape[2]`.
    pub fn in_features(&self) -> i32 {
        self.weight.shape()[2]
    }

    /// `weight.shape[1]`.
    pub fn out_features(&self) -> i32 {
        self.weight.shape()[1]
    }

    /// Projects each row of `x` (`[.., M, in]`) with the expert `indices`
    /// selects, as `SwitchLinear.__call__`: output `broadcast(x.shape[:-2],
    /// indices.shape) + [M, out]`.
    ///
    /// # Errors
    /// [`LayerError::IndicesDtype`], [`LayerError::ExpertIndexOutOfRange`]
    /// (checked on the host, one synchronisation), [`LayerError::InputShape`],
    /// [`LayerError::Mlx`].
    pub fn forward(
        &self,
        x: &Array,
        indices: &Array,
        sorted_indices: bool,
    ) -> Result<Array, LayerError> {
        let shape = x.shape();
        if shape.len() < 2 || shape.last() != Some(&self.in_features()) {
            return Err(LayerError::InputShape {
                in_features: self.in_features(),
                shape: shape.to_vec(),
            });
        }
        if x.size() == 0 || indices.size() == 0 {
            let (k, n) = (self.in_features(), self.out_features());
            let e = self.num_experts();
            return empty_switch_output(x, indices, e, k, n, |x, i| self.forward(x, i, false));
        }
        check_indices(indices, self.num_experts())?;
        let wt = self.weight.swap_axes(-1, -2)?;
        let y = ops::gather_mm(x, &wt, None, indices, sorted_indices)?;
        add_expert_bias(y, self.bias.as_ref(), indices)
    }
}
