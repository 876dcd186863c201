"""The attention decode family (crates/conformance/src/families/attention/):
mlx-lm 0.32.2's own attention module, `mlx_lm.models.glm4.Glm4Attention`,
stepped one token at a time with a real KVCache, as `Glm4Model` drives it."""

import mlx.core as mx
import mlx.nn as nn

from reference_glue.core import load
from reference_glue.quantized import _q_linear


def _attention_qlinear(weight, scales, biases, group_size, bits):
    """An affine nn.QuantizedLinear (no additive bias) holding these tensors."""
    return _q_linear(weight, scales, biases, None, "affine", bits, group_size)


class _RecordOutput(nn.Module):
    """Instrumentation, not logic: wraps the real q_proj, records what it
    returns (the queries before RoPE, which the module does not return)
    and returns it unchanged."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.outputs = []

    def __call__(self, x):
        y = self.layer(x)
        self.outputs.append(y)
        return y


class _RecordInput(nn.Module):
    """Instrumentation, not logic: wraps the real o_proj, records the input
    it is called with (the attention output before o_proj, which the module
    does not return) and returns the real projection of it."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.inputs = []

    def __call__(self, x):
        self.inputs.append(x)
        return self.layer(x)


def attention_decode_m1(
    x, q_w, q_s, q_b, k_w, k_s, k_b, v_w, v_s, v_b, o_w, o_s, o_b, k0, v0,
    n_heads, n_kv_heads, head_dim, rotary_dims, rope_base, group_size, bits,
):
    """Decodes the rows of x [T, hidden] one token at a time (M = 1) through
    the reference's own `mlx_lm.models.glm4.Glm4Attention`: q/k/v/o without
    bias, `nn.RoPE(head_dim * partial_rotary_factor, base=rope_theta,
    traditional=False)` at the cache offset, `cache.update_and_fetch`, and
    `mlx_lm.models.base.scaled_dot_product_attention(scale=head_dim**-0.5)`.
    It is built by its own constructor from glm4's `ModelArgs`
    (partial_rotary_factor = rotary_dims / head_dim, rope_theta = rope_base,
    attention_bias False, rope_traditional False; the MLP, norm, layer-count
    and vocabulary fields are not read by the attention), then holds the
    case's tensors in four affine nn.QuantizedLinear projections (as
    `load_weights` would install a quantized checkpoint's). Each token `h`
    [1, 1, hidden] is called as `Glm4Model` calls its layers:
    `attn(h, mask=base.create_attention_mask(h, cache), cache=cache)` on an
    mlx_lm `KVCache` prefilled with k0/v0 [1, n_kv, L0, D] in one update.
    o_proj is wrapped by `_RecordInput` and q_proj by `_RecordOutput`
    (instrumentation, not logic) to capture the attention output before
    o_proj and the queries before RoPE. Returns (attn [T, H*D] before
    o_proj, y [T, hidden], keys [T, n_kv*D], values [T, n_kv*D], queries
    [T, H*D]) per token; the queries are a record for the exact oracle,
    not compared (a candidate may return the first four only)."""
    base, cache_mod, glm4 = (load("mlx_lm.models.base"), load("mlx_lm.models.cache"),
                             load("mlx_lm.models.glm4"))
    hidden = x.shape[-1]
    args = glm4.ModelArgs(
        model_type="glm4", hidden_size=hidden, num_hidden_layers=1,
        intermediate_size=hidden, num_attention_heads=n_heads, attention_bias=False,
        head_dim=head_dim, rms_norm_eps=1e-5, vocab_size=1, num_key_value_heads=n_kv_heads,
        partial_rotary_factor=rotary_dims / head_dim, rope_theta=rope_base,
        rope_traditional=False)
    attn = glm4.Glm4Attention(args)
    if attn.rope.dims != rotary_dims or attn.head_dim != head_dim:
        raise ValueError(f"Glm4Attention built rope dims {attn.rope.dims} / head_dim "
                         f"{attn.head_dim}, the case has {rotary_dims} / {head_dim}")
    q_proj = _RecordOutput(_attention_qlinear(q_w, q_s, q_b, group_size, bits))
    attn.q_proj = q_proj
    attn.k_proj = _attention_qlinear(k_w, k_s, k_b, group_size, bits)
    attn.v_proj = _attention_qlinear(v_w, v_s, v_b, group_size, bits)
    o_proj = _RecordInput(_attention_qlinear(o_w, o_s, o_b, group_size, bits))
    attn.o_proj = o_proj
    cache = cache_mod.KVCache()
    if k0.shape[2] > 0:
        cache.update_and_fetch(k0, v0)
    start = cache.offset
    attn_rows, y_rows = [], []
    for t in range(x.shape[0]):
        h = x[t : t + 1][None]
        y = attn(h, mask=base.create_attention_mask(h, cache), cache=cache)
        out = o_proj.inputs[-1]
        mx.eval(out, y, q_proj.outputs[-1], cache.keys, cache.values)
        attn_rows.append(out[0])
        y_rows.append(y[0])
    T = x.shape[0]
    k_rows = cache.keys[:, :, start : start + T, :].transpose(2, 0, 1, 3).reshape(T, -1)
    v_rows = cache.values[:, :, start : start + T, :].transpose(2, 0, 1, 3).reshape(T, -1)
    q_rows = mx.concatenate([q.reshape(1, -1) for q in q_proj.outputs], 0)
    return mx.concatenate(attn_rows, 0), mx.concatenate(y_rows, 0), k_rows, v_rows, q_rows


def sdpa_kv_cache(queries, keys, values, scale):
    """The attention core of an mlx-lm model at one step, as its attention
    modules run it (the explorer's `attention/sdpa` family): a fresh
    `mlx_lm.models.cache.KVCache` holds the first L - M of the request's
    keys and values [B, n_kv, L, D] (one `update_and_fetch`, as a prefill
    leaves it), the mask is `mlx_lm.models.base.create_attention_mask` for
    the M query rows on that cache (None for M = 1, "causal" above), the
    last M keys and values enter through `update_and_fetch` (so SDPA sees
    the prefix slice of the cache's step-256 buffer), and
    `mlx_lm.models.base.scaled_dot_product_attention(queries [B, H, M, D],
    keys, values, cache=cache, scale=scale, mask=mask)` runs. Returns
    [B, H, M, D]."""
    base, cache_mod = load("mlx_lm.models.base"), load("mlx_lm.models.cache")
    m, length = queries.shape[2], keys.shape[2]
    cache = cache_mod.KVCache()
    if length > m:
        cache.update_and_fetch(keys[:, :, : length - m], values[:, :, : length - m])
    # The models pass their hidden states h [B, M, hidden]: only h.shape[1] is read.
    mask = base.create_attention_mask(queries.swapaxes(1, 2), cache)
    k, v = cache.update_and_fetch(keys[:, :, length - m :], values[:, :, length - m :])
    out = base.scaled_dot_product_attention(queries, k, v, cache=cache, scale=scale, mask=mask)
    mx.eval(out)
    return out
