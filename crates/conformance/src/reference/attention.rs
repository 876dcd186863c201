//! The attention decode step: mlx-lm's own attention module
//! (`mlx_lm.models.glm4.Glm4Attention`: q/k/v/o projections, partial RoPE
//! with the cache offset, `KVCache`, `base.scaled_dot_product_attention`).
//! Activations, every projection tensor and the prefilled K/V are
//! perturbable; the graph's shape is constant.

use oracle::HostTensor;

use super::{fixed, list, one_array, tensor, Param};
use crate::case::{CaseError, Ctx, Expected};

/// One affine quantized projection (no additive bias).
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    pub weight: &'a HostTensor,
    pub scales: &'a HostTensor,
    pub biases: &'a HostTensor,
}

/// The attention graph's constants.
#[derive(Debug, Clone, Copy)]
pub struct Graph {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dims: usize,
    pub rope_base: f64,
    pub group_size: i32,
    pub bits: i32,
}

/// Per decoded token (rows): the attention output before `o_proj`
/// [T, H*D], the layer output [T, hidden], the token's cached keys and
/// values [T, H_kv*D].
#[derive(Debug)]
pub struct DecodeRows {
    pub attn: Expected,
    pub y: Expected,
    pub keys: Expected,
    pub values: Expected,
}

/// Decodes the rows of `x` [T, hidden] one token at a time (M = 1) after a
/// cache prefilled with `k0`, `v0` [1, H_kv, L0, D].
pub fn attention_decode_m1(
    ctx: &Ctx,
    x: &HostTensor,
    projections: [Projection; 4],
    k0: &HostTensor,
    v0: &HostTensor,
    graph: Graph,
) -> Result<DecodeRows, CaseError> {
    const F: &str = "attention_decode_m1";
    let names = [
        ["q_w", "q_s", "q_b"],
        ["k_w", "k_s", "k_b"],
        ["v_w", "v_s", "v_b"],
        ["o_w", "o_s", "o_b"],
    ];
    let mut params: Vec<Param> = vec![tensor("x", x)];
    for (p, [w, s, b]) in projections.iter().zip(names) {
        params.extend([
            tensor(w, p.weight),
            tensor(s, p.scales),
            tensor(b, p.biases),
        ]);
    }
    params.extend([
        tensor("k0", k0),
        tensor("v0", v0),
        fixed("n_heads", graph.n_heads),
        fixed("n_kv_heads", graph.n_kv_heads),
        fixed("head_dim", graph.head_dim),
        fixed("rotary_dims", graph.rotary_dims),
        fixed("rope_base", graph.rope_base),
        fixed("group_size", graph.group_size),
        fixed("bits", graph.bits),
    ]);
    let rows = list(F, ctx.call(F, params)?)?;
    let [attn, y, keys, values]: [oracle::Value; 4] = rows.try_into().map_err(|v: Vec<_>| {
        CaseError::Harness(format!("`{F}` returned {} arrays, not 4", v.len()))
    })?;
    Ok(DecodeRows {
        attn: one_array(F, attn)?,
        y: one_array(F, y)?,
        keys: one_array(F, keys)?,
        values: one_array(F, values)?,
    })
}
