//! Caches mirroring the reference's own types (mlx-vlm 0.7.6
//! `models/cache.py`): [`KvCache`] for the full-attention layers (`KVCache`:
//! a buffer grown in steps of 256, SDPA handed a prefix view of it) and
//! [`LinearCache`] for the Gated DeltaNet layers (`ArraysCache(size=2)`: the
//! conv window and the float32 recurrent state).

use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::ops::{slice_axis, slice_update_axis};
use super::ModelError;

/// `KVCache.step`.
pub const KV_STEP: usize = 256;

/// How the keys and values are stored. The reference's is [`KvLayout::Step256`];
/// [`KvLayout::Contiguous`] (one concatenated array, what this port's
/// attention step used to do) is kept as a planted fault: same bits on the
/// CPU, other strides, so CUDA's SDPA may pick another kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLayout {
    #[default]
    Step256,
    Contiguous,
}

/// `mlx_vlm.models.cache.KVCache` (mlx-vlm 0.7.6; the same as mlx-lm
/// 0.32.2's `KVCache`).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    layout: KvLayout,
}

impl KvCache {
    /// An empty cache of the reference's layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache of the given layout.
    pub fn with_layout(layout: KvLayout) -> Self {
        KvCache {
            layout,
            ..Self::default()
        }
    }

    /// Tokens held (`offset`).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Rows allocated (`keys.shape[2]`; 0 when empty).
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.shape()[2] as usize)
    }

    /// The layout.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// `update_and_fetch(keys, values)`: appends `[B, H_kv, n, D]` keys
    /// and values and returns the views SDPA is handed,
    /// `keys[..., :offset, :]` and `values[..., :offset, :]`.
    ///
    /// ```text
    /// prev = self.offset
    /// if self.keys is None or prev + n > self.keys.shape[2]:
    ///     n_steps = (256 + n - 1) // 256
    ///     new_k = zeros((B, H_kv, n_steps * 256, D), keys.dtype)   # and new_v
    ///     if self.keys is not None:
    ///         if prev % 256 != 0: self.keys = self.keys[..., :prev, :]   # and values
    ///         self.keys = concatenate([self.keys, new_k], axis=2)
    ///     else: self.keys = new_k
    /// self.offset += n
    /// self.keys[..., prev:self.offset, :] = keys                    # and values
    /// return self.keys[..., :self.offset, :], self.values[..., :self.offset, :]
    /// ```
    ///
    /// # Errors
    /// [`ModelError::Input`] for keys/values not 4-D or not matching the
    /// cache; MLX errors.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), ModelError> {
        if keys.ndim() != 4 || values.ndim() != 4 || keys.shape()[..3] != values.shape()[..3] {
            return Err(ModelError::Input(format!(
                "KV cache: keys {:?} and values {:?} are not [B, H_kv, n, D] of one B, H_kv, n",
                keys.shape(),
                values.shape()
            )));
        }
        let n = keys.shape()[2] as usize;
        if self.layout == KvLayout::Contiguous {
            let join = |old: &Option<Array>, new: &Array| -> Result<Array, ModelError> {
                Ok(match old {
                    Some(old) => concatenate(&[old, new], 2)?,
                    None => new.clone(),
                })
            };
            let (k, v) = (join(&self.keys, keys)?, join(&self.values, values)?);
            self.offset += n;
            self.keys = Some(k.clone());
            self.values = Some(v.clone());
            return Ok((k, v));
        }
        let prev = self.offset;
        if self.keys.is_none() || prev + n > self.capacity() {
            let n_steps = n.div_ceil(KV_STEP);
            let fresh = |a: &Array| -> Result<Array, ModelError> {
                let mut shape = a.shape().to_vec();
                shape[2] = (n_steps * KV_STEP) as i32;
                Ok(zeros_dtype(&shape, a.dtype())?)
            };
            let (new_k, new_v) = (fresh(keys)?, fresh(values)?);
            match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    if !prev.is_multiple_of(KV_STEP) {
                        k = slice_axis(&k, 2, 0, prev as i32)?;
                        v = slice_axis(&v, 2, 0, prev as i32)?;
                    }
                    self.keys = Some(concatenate(&[&k, &new_k], 2)?);
                    self.values = Some(concatenate(&[&v, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.offset += n;
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        let k = slice_update_axis(k, keys, 2, prev as i32, self.offset as i32)?;
        let v = slice_update_axis(v, values, 2, prev as i32, self.offset as i32)?;
        let fetched = (
            slice_axis(&k, 2, 0, self.offset as i32)?,
            slice_axis(&v, 2, 0, self.offset as i32)?,
        );
        self.keys = Some(k);
        self.values = Some(v);
        Ok(fetched)
    }

    /// The arrays held (for evaluation between steps).
    pub fn arrays(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
}

/// `ArraysCache(size=2)` of a Gated DeltaNet layer: `cache[0]` the conv
/// window `[B, K - 1, conv_dim]` (the activation dtype), `cache[1]` the
/// recurrent state `[B, Hv, Dv, Dk]` (float32).
#[derive(Debug, Clone, Default)]
pub struct LinearCache {
    pub conv_state: Option<Array>,
    pub recurrent_state: Option<Array>,
}

impl LinearCache {
    pub fn arrays(&self) -> Vec<&Array> {
        self.conv_state
            .iter()
            .chain(self.recurrent_state.iter())
            .collect()
    }
}

/// One layer's cache (`LanguageModel.make_cache`: `ArraysCache(size=2)` for
/// a linear layer, `KVCache()` for a full-attention layer).
#[derive(Debug, Clone)]
pub enum LayerCache {
    Linear(LinearCache),
    Attention(KvCache),
}

impl LayerCache {
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            LayerCache::Linear(c) => c.arrays(),
            LayerCache::Attention(c) => c.arrays(),
        }
    }
}
