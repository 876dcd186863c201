//! The decoder's modules, each mirroring its mlx-vlm 0.7.6 class
//! (`models/qwen3_5/language.py`, `models/qwen3_5_moe/language.py`,
//! `models/switch_layers.py`).

use mlx_rs::error::Exception;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::{
    argpartition_axis, argsort_axis, conv1d, expand_dims, floor_divide, softmax_axis,
    split_at_indices, squeeze_axes, sum_axis, transpose_axes,
};
use mlx_rs::{Array, Dtype};

use crate::position::Mrope;
use crate::quantized::{ExpertIndices, QuantizedSwitchLinear, RowsRegime};

use super::cache::{KvCache, LinearCache};
use super::gated_delta::gated_delta_update;
use super::linear::Linear;
use super::ops::{run_compiled, silu, silu_ops, slice_axis, weak_scalar};
use super::trace::Trace;
use super::{Faults, ModelError};

/// `nn.RMSNorm`: `fast.rms_norm(x, weight, eps)`.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// `swiglu(gate, x)` (mlx-vlm `activations.swiglu`, `@partial(mx.compile,
/// shapeless=True)`): `silu(gate) * x`, compiled as the reference's is.
fn swiglu(gate: &Array, x: &Array) -> Result<Array, ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        Ok(vec![silu_ops(&inputs[0])?.multiply(&inputs[1])?])
    }
    let mut out = run_compiled(
        "activations.swiglu",
        true,
        graph,
        &[gate.clone(), x.clone()],
    )?;
    Ok(out.pop().expect("the graph returns one array"))
}

/// `_precise_swiglu(h, gate, x)` (`@partial(mx.compile, shapeless=True)`):
/// `(silu(gate.astype(f32)) * x.astype(f32)).astype(h.dtype)`.
fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array, ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        let (h, gate, x) = (&inputs[0], &inputs[1], &inputs[2]);
        let gate = silu_ops(&gate.as_dtype(Dtype::Float32)?)?;
        let x = x.as_dtype(Dtype::Float32)?;
        Ok(vec![gate.multiply(&x)?.as_dtype(h.dtype())?])
    }
    let inputs = [h.clone(), gate.clone(), x.clone()];
    let mut out = run_compiled("_precise_swiglu", true, graph, &inputs)?;
    Ok(out.pop().expect("the graph returns one array"))
}

/// `_qwen3_5_decode_depthwise_conv(conv_input, weight)` (`@partial(mx.compile,
/// shapeless=True)`): `sum(conv_input.astype(f32) * weight[None], axis=1)`,
/// cast back, `[:, None, :]`.
fn decode_depthwise_conv(conv_input: &Array, weight: &Array) -> Result<Array, ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        let (conv_input, weight) = (&inputs[0], &inputs[1]);
        let prod = conv_input
            .as_dtype(Dtype::Float32)?
            .multiply(&expand_dims(weight, 0)?)?;
        let out = sum_axis(&prod, 1, None)?.as_dtype(conv_input.dtype())?;
        Ok(vec![expand_dims(&out, 1)?])
    }
    let inputs = [conv_input.clone(), weight.clone()];
    let mut out = run_compiled("_qwen3_5_decode_depthwise_conv", true, graph, &inputs)?;
    Ok(out.pop().expect("the graph returns one array"))
}

/// `Qwen3_5MLP`: `down_proj(swiglu(gate_proj(x), up_proj(x)))`.
#[derive(Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        let g = self.gate_proj.forward(x)?;
        let u = self.up_proj.forward(x)?;
        self.down_proj.forward(&swiglu(&g, &u)?)
    }

    /// [`Mlp::forward`] with rows-independent projections (`swiglu` is
    /// elementwise).
    pub fn forward_rows(&self, x: &Array) -> Result<Array, ModelError> {
        let g = self.gate_proj.forward_rows(x)?;
        let u = self.up_proj.forward_rows(x)?;
        self.down_proj.forward_rows(&swiglu(&g, &u)?)
    }
}

/// `switch_layers.SwitchGLU` with quantized experts.
#[derive(Debug)]
pub struct SwitchGlu {
    pub gate_proj: QuantizedSwitchLinear,
    pub up_proj: QuantizedSwitchLinear,
    pub down_proj: QuantizedSwitchLinear,
}

/// `linear.DECODE_BLOCK_SIZE`: SwitchGLU's block of 2..=8 tokens takes the
/// reference's "exact" verifier paths, which this port does not mirror.
pub const DECODE_BLOCK_SIZE: i32 = 8;

impl SwitchGlu {
    /// `SwitchGLU.__call__(x, indices)` (no weights, no shared): `x`
    /// `[B, L, D]`, indices `[B, L, K]` → `[B, L, K, D]`. Sorts the routed
    /// rows when `indices.size >= 64` (`_gather_sort` / `_scatter_unsort`).
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array, ModelError> {
        if x.ndim() == 3 && 1 < x.shape()[1] && x.shape()[1] <= DECODE_BLOCK_SIZE {
            return Err(ModelError::Unsupported {
                what: format!("a sparse MoE block of {} tokens", x.shape()[1]),
                why: "mlx-vlm 0.7.6's SwitchGLU runs blocks of 2..=8 tokens through its exact verifier kernels (fast_ops / quantized_verifier), which this port does not mirror; send 1 token or more than 8".into(),
            });
        }
        let x = expand_dims(&expand_dims(x, -2)?, -3)?;
        let do_sort = indices.size() >= 64;
        let (x, idx, inv_order) = if do_sort {
            let m = indices.shape()[indices.ndim() - 1];
            let flat = indices.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inv_order = argsort_axis(&order, 0)?;
            let rows = x.flatten(0, x.ndim() as i32 - 3)?;
            let picked = rows.take_axis(
                floor_divide(&order, Array::from_int(m).as_dtype(order.dtype())?)?,
                0,
            )?;
            (picked, flat.take_axis(&order, 0)?, Some(inv_order))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, do_sort)?;
        let gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let mut y = self
            .down_proj
            .forward(&swiglu(&gate, &up)?, &idx, do_sort)?;
        if let Some(inv) = inv_order {
            y = y.take_axis(&inv, 0)?;
            let mut shape = indices.shape().to_vec();
            shape.extend_from_slice(&y.shape()[1..]);
            y = y.reshape(&shape)?;
        }
        Ok(squeeze_axes(&y, &[-2])?)
    }

    /// [`SwitchGlu::forward`] of `x` `[1, T, D]` with each token giving the
    /// bits of its own one-token call (unsorted, as a decode step of
    /// `top_k < 64` ids is): the experts in chunks of whole tokens the
    /// backend's [`RowsRegime`] allows.
    pub fn forward_rows(&self, x: &Array, indices: &Array) -> Result<Array, ModelError> {
        let regime = RowsRegime::for_backend(crate::backend::Backend::of_default_device()?);
        let x = expand_dims(&expand_dims(x, -2)?, -3)?;
        let idx = ExpertIndices::checked(indices.clone(), self.gate_proj.num_experts())?;
        let up = self.up_proj.forward_rows_independent(&x, &idx, &regime)?;
        let gate = self.gate_proj.forward_rows_independent(&x, &idx, &regime)?;
        let y = self
            .down_proj
            .forward_rows_independent(&swiglu(&gate, &up)?, &idx, &regime)?;
        Ok(squeeze_axes(&y, &[-2])?)
    }
}

/// `Qwen3_5MoeSparseMoeBlock`.
#[derive(Debug)]
pub struct SparseMoe {
    pub gate: Linear,
    pub switch_mlp: SwitchGlu,
    pub shared_expert: Mlp,
    pub shared_expert_gate: Linear,
    pub top_k: i32,
}

impl SparseMoe {
    pub fn forward(&self, x: &Array, trace: &mut Trace, at: &str) -> Result<Array, ModelError> {
        let gates = self.gate.forward(x)?;
        trace.record(at, "router", &gates);
        let (inds, scores) = self.route(&gates)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = sum_axis(&y.multiply(&expand_dims(&scores, -1)?)?, -2, None)?;
        trace.record(at, "experts", &y);
        let shared = self.shared_expert.forward(x)?;
        let shared =
            mlx_rs::ops::sigmoid(&self.shared_expert_gate.forward(x)?)?.multiply(&shared)?;
        trace.record(at, "shared_expert", &shared);
        Ok(y.add(&shared)?)
    }

    /// [`SparseMoe::forward`] with rows-independent linears and experts
    /// (the routing is per row: softmax, top-k and their sums run along
    /// the last axes).
    pub fn forward_rows(&self, x: &Array) -> Result<Array, ModelError> {
        let (inds, scores) = self.route(&self.gate.forward_rows(x)?)?;
        let y = self.switch_mlp.forward_rows(x, &inds)?;
        let y = sum_axis(&y.multiply(&expand_dims(&scores, -1)?)?, -2, None)?;
        let shared = self.shared_expert.forward_rows(x)?;
        let shared =
            mlx_rs::ops::sigmoid(&self.shared_expert_gate.forward_rows(x)?)?.multiply(&shared)?;
        Ok(y.add(&shared)?)
    }

    /// The router's top-k experts and their renormalised scores.
    fn route(&self, gates: &Array) -> Result<(Array, Array), ModelError> {
        let gates = softmax_axis(gates, -1, true)?;
        let k = self.top_k;
        let e = gates.shape()[gates.ndim() - 1];
        let inds = slice_axis(
            &argpartition_axis(&gates, -k, -1)?,
            gates.ndim() - 1,
            e - k,
            e,
        )?;
        let scores = mlx_rs::ops::indexing::take_along_axis(&gates, &inds, -1)?;
        let scores = scores.divide(&sum_axis(&scores, -1, true)?)?;
        Ok((inds, scores))
    }
}

/// The feed-forward of a decoder layer.
#[derive(Debug)]
// One per layer, built once at load: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(SparseMoe),
}

impl FeedForward {
    pub fn forward(&self, x: &Array, trace: &mut Trace, at: &str) -> Result<Array, ModelError> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x, trace, at),
        }
    }

    /// [`FeedForward::forward`] with each row giving its one-row bits.
    pub fn forward_rows(&self, x: &Array) -> Result<Array, ModelError> {
        match self {
            FeedForward::Dense(m) => m.forward_rows(x),
            FeedForward::Moe(m) => m.forward_rows(x),
        }
    }
}

/// `Qwen3_5Attention`: gated full attention.
#[derive(Debug)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: RmsNorm,
    pub k_norm: RmsNorm,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
}

impl Attention {
    /// `__call__(x, mask, cache, position_ids)` for one request (B = 1 or
    /// equal-length rows, no padding): mask `"causal"` for L > 1, none for
    /// L = 1 (`create_attention_mask` with a `KVCache`).
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut KvCache,
        rope: &Mrope,
        position_ids: &Array,
        trace: &mut Trace,
        at: &str,
    ) -> Result<Array, ModelError> {
        let projected = [
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
        ];
        let gated = self.attend(&projected, cache, rope, position_ids, trace, at)?;
        self.o_proj.forward(&gated)
    }

    /// The rows-independent verify of T tokens `x` `[1, T, D]` at
    /// `positions` `[1, T]`: the projections in rows-independent chunks,
    /// then each token attends as its own decode step (cache append, SDPA
    /// of one query over the cache's view), the output projection again in
    /// chunks.
    pub fn verify(
        &self,
        x: &Array,
        cache: &mut KvCache,
        rope: &Mrope,
        position_ids: &Array,
    ) -> Result<Array, ModelError> {
        let projected = [
            self.q_proj.forward_rows(x)?,
            self.k_proj.forward_rows(x)?,
            self.v_proj.forward_rows(x)?,
        ];
        let [q, k, v] = &projected;
        let gated = per_token([q, k, v, position_ids], |[q, k, v, positions]| {
            self.attend(&[q, k, v], cache, rope, &positions, &mut Trace::off(), "")
        })?;
        self.o_proj.forward_rows(&gated)
    }

    /// From the q, k, v projections `[B, L, ..]` to the gated attention
    /// output before `o_proj`.
    fn attend(
        &self,
        projected: &[Array; 3],
        cache: &mut KvCache,
        rope: &Mrope,
        position_ids: &Array,
        trace: &mut Trace,
        at: &str,
    ) -> Result<Array, ModelError> {
        let [q_out, keys, values] = projected;
        let (b, l) = (q_out.shape()[0], q_out.shape()[1]);
        trace.record(at, "q_proj", q_out);
        trace.record(at, "k_proj", keys);
        trace.record(at, "v_proj", values);
        let halves = q_out
            .reshape(&[b, l, self.n_heads, -1])?
            .split_equal(2, -1)?;
        let gate = halves[1].reshape(&[b, l, -1])?;
        let queries = transpose_axes(&self.q_norm.forward(&halves[0])?, &[0, 2, 1, 3])?;
        let keys = transpose_axes(
            &self
                .k_norm
                .forward(&keys.reshape(&[b, l, self.n_kv_heads, -1])?)?,
            &[0, 2, 1, 3],
        )?;
        let values = transpose_axes(
            &values.reshape(&[b, l, self.n_kv_heads, -1])?,
            &[0, 2, 1, 3],
        )?;
        let (queries, keys) = rope.apply(&queries, &keys, position_ids)?;
        trace.record(at, "rope_q", &queries);
        trace.record(at, "rope_k", &keys);
        let (keys, values) = cache.update_and_fetch(&keys, &values)?;
        trace.record_layout(at, cache.offset(), cache.capacity());
        let scale = (self.head_dim as f32).powf(-0.5);
        let mask = (l > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let out = fast::scaled_dot_product_attention(&queries, &keys, &values, scale, mask, None)?;
        trace.record(at, "attention", &out);
        let out = transpose_axes(&out, &[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        Ok(out.multiply(mlx_rs::ops::sigmoid(&gate)?)?)
    }
}

/// `Qwen3_5GatedDeltaNet`.
#[derive(Debug)]
pub struct GatedDeltaNet {
    pub in_proj_qkv: Linear,
    pub in_proj_z: Linear,
    pub in_proj_b: Linear,
    pub in_proj_a: Linear,
    /// `conv1d.weight` `[conv_dim, K, 1]`.
    pub conv_weight: Array,
    /// `conv1d.weight[:, :, 0].T.astype(float32)` `[K, conv_dim]`, the
    /// decode conv's (`_causal_conv1d_decode`) cached weight.
    pub conv_weight_decode: Array,
    pub dt_bias: Array,
    pub a_log: Array,
    /// `norm` (`Qwen3_5RMSNormGated`).
    pub norm: RmsNorm,
    pub out_proj: Linear,
    pub num_k_heads: i32,
    pub num_v_heads: i32,
    pub head_k_dim: i32,
    pub head_v_dim: i32,
    pub conv_kernel: i32,
}

impl GatedDeltaNet {
    pub fn key_dim(&self) -> i32 {
        self.head_k_dim * self.num_k_heads
    }
    pub fn conv_dim(&self) -> i32 {
        self.key_dim() * 2 + self.head_v_dim * self.num_v_heads
    }

    /// `__call__(inputs, mask=None, cache)`.
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut LinearCache,
        faults: &Faults,
        trace: &mut Trace,
        at: &str,
    ) -> Result<Array, ModelError> {
        let projected = [
            self.in_proj_qkv.forward(x)?,
            self.in_proj_z.forward(x)?,
            self.in_proj_b.forward(x)?,
            self.in_proj_a.forward(x)?,
        ];
        let out = self.mix(&projected, cache, faults, trace, at)?;
        self.out_proj.forward(&out)
    }

    /// The rows-independent verify of T tokens `x` `[1, T, D]`: the
    /// projections in rows-independent chunks, then each token through the
    /// conv and the recurrence as its own decode step, `out_proj` again in
    /// chunks.
    pub fn verify(
        &self,
        x: &Array,
        cache: &mut LinearCache,
        faults: &Faults,
    ) -> Result<Array, ModelError> {
        let projected = [
            self.in_proj_qkv.forward_rows(x)?,
            self.in_proj_z.forward_rows(x)?,
            self.in_proj_b.forward_rows(x)?,
            self.in_proj_a.forward_rows(x)?,
        ];
        let [qkv, z, beta, alpha] = &projected;
        let out = per_token([qkv, z, beta, alpha], |one| {
            self.mix(&one, cache, faults, &mut Trace::off(), "")
        })?;
        self.out_proj.forward_rows(&out)
    }

    /// From the four input projections `[B, S, ..]` (qkv, z, b, a) to the
    /// gated-norm output before `out_proj`, advancing the cache by S.
    fn mix(
        &self,
        projected: &[Array; 4],
        cache: &mut LinearCache,
        faults: &Faults,
        trace: &mut Trace,
        at: &str,
    ) -> Result<Array, ModelError> {
        let [mixed_qkv, z, beta_in, a_in] = projected;
        let (b, s) = (mixed_qkv.shape()[0], mixed_qkv.shape()[1]);
        let dtype = mixed_qkv.dtype();
        trace.record(at, "in_proj_qkv", mixed_qkv);
        trace.record(at, "in_proj_z", z);
        trace.record(at, "in_proj_b", beta_in);
        trace.record(at, "in_proj_a", a_in);
        let z = z.reshape(&[b, s, -1, self.head_v_dim])?;

        let width = self.conv_kernel - 1;
        let conv_state = match &cache.conv_state {
            Some(c) if c.shape()[0] == b => c.clone(),
            _ => mlx_rs::ops::zeros_dtype(&[b, width, self.conv_dim()], dtype)?,
        };
        let conv_input = mlx_rs::ops::concatenate(&[&conv_state, mixed_qkv], 1)?;
        // `cache.update_window(0, conv_input, K - 1)`: the trailing window.
        let length = conv_input.shape()[1] - width;
        let start = if faults.conv_state_shift {
            length - 1
        } else {
            length
        };
        cache.conv_state = Some(slice_axis(&conv_input, 1, start, start + width)?.contiguous()?);

        let decode_conv = s == 1
            && conv_input.shape()[1] == self.conv_kernel
            && matches!(self.conv_weight.dtype(), Dtype::Bfloat16 | Dtype::Float16);
        let conv = if decode_conv {
            decode_depthwise_conv(&conv_input, &self.conv_weight_decode)?
        } else {
            conv1d(&conv_input, &self.conv_weight, 1, 0, 1, self.conv_dim())?
        };
        trace.record(at, "conv", &conv);
        let conv_out = silu(&conv)?;

        let kd = self.key_dim();
        let parts = split_at_indices(&conv_out, &[kd, 2 * kd], -1)?;
        let q = parts[0].reshape(&[b, s, self.num_k_heads, self.head_k_dim])?;
        let k = parts[1].reshape(&[b, s, self.num_k_heads, self.head_k_dim])?;
        let v = parts[2].reshape(&[b, s, self.num_v_heads, self.head_v_dim])?;

        // `_normalize_qk`.
        let inv_scale = (self.head_k_dim as f64).powf(-0.5);
        let q = weak_scalar(inv_scale * inv_scale, q.dtype())?
            .multiply(fast::rms_norm(&q, None, 1e-6)?)?;
        let k = weak_scalar(inv_scale, k.dtype())?.multiply(fast::rms_norm(&k, None, 1e-6)?)?;
        trace.record(at, "q_norm", &q);
        trace.record(at, "k_norm", &k);

        let (y, state, which) = gated_delta_update(
            &q,
            &k,
            &v,
            a_in,
            beta_in,
            &self.a_log,
            &self.dt_bias,
            cache.recurrent_state.as_ref(),
        )?;
        trace.note_recurrence(at, which);
        trace.record(at, "recurrence", &y);
        cache.recurrent_state = Some(if faults.recurrent_state_bf16 {
            state.as_dtype(Dtype::Bfloat16)?
        } else {
            state
        });

        // `norm(out, z)`: `Qwen3_5RMSNormGated` with `_precise_swiglu`.
        let eps = self.norm.eps * faults.gated_norm_eps_scale.unwrap_or(1.0);
        let normed = fast::rms_norm(&y, Some(&self.norm.weight), eps)?;
        let out = precise_swiglu(&y, &z, &normed)?;
        trace.record(at, "gated_norm", &out);
        Ok(out.reshape(&[b, s, -1])?)
    }
}

/// The token mixer of a decoder layer.
#[derive(Debug)]
pub enum Mixer {
    Linear(GatedDeltaNet),
    Attention(Attention),
}

impl Mixer {
    pub fn kind(&self) -> &'static str {
        match self {
            Mixer::Linear(_) => "linear_attention",
            Mixer::Attention(_) => "full_attention",
        }
    }
}

/// `Qwen3_5DecoderLayer` / `Qwen3_5MoeDecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    pub mixer: Mixer,
    pub input_layernorm: RmsNorm,
    pub post_attention_layernorm: RmsNorm,
    pub ff: FeedForward,
}

/// `f` for each token in order, given row `t` of each of `arrays` (`[B, T,
/// ..]`, sliced on axis 1), outputs concatenated on axis 1.
fn per_token<const N: usize>(
    arrays: [&Array; N],
    mut f: impl FnMut([Array; N]) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let tokens = arrays.first().map_or(0, |a| a.shape()[1]);
    let mut outs = Vec::with_capacity(tokens as usize);
    for t in 0..tokens {
        let mut rows = Vec::with_capacity(N);
        for a in arrays {
            rows.push(slice_axis(a, 1, t, t + 1)?);
        }
        let rows: [Array; N] = rows
            .try_into()
            .map_err(|_| ModelError::Input("per-token rows".into()))?;
        outs.push(f(rows)?);
    }
    Ok(mlx_rs::ops::concatenate(&outs, 1)?)
}
