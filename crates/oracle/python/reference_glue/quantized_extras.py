"""Quantized embeddings and nvfp4 global scales
(crates/conformance/src/families/quantized/embedding.rs, global_scale.rs):
`mlx.nn.QuantizedEmbedding` (mlx 0.32.2), `mx.quantize`/`mx.dequantize`
with `global_scale`, and mlx-lm's `SwitchLinear.to_quantized(...,
global_scale=True)` (0.32.2). Where the pinned MLX refuses a global scale
(`quantized_matmul`, `gather_qmm`: TypeError on mlx 0.32.2; MLX 0.32.4's
CPU `gather_qmm` raises ValueError, GPU only), the refusal's first line is
returned for the case to record."""

import mlx.core as mx

from reference_glue.quantized import _q_switch_layers


def _first_line(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def quantized_embedding(ids, x, weight, scales, biases, group_size, bits, mode):
    """An `nn.QuantizedEmbedding` holding these tensors: `lookup` =
    `__call__(ids)`, `logits` = `as_linear(x)`."""
    import mlx.nn as nn
    dims = weight.shape[-1] * 32 // bits
    emb = nn.QuantizedEmbedding(weight.shape[0], dims, group_size, bits, mode)
    emb.weight, emb.scales = weight, scales
    if biases is not None:
        emb.biases = biases
    return {"lookup": emb(ids), "logits": emb.as_linear(x)}


def quantized_global_scale(w, x, group_size):
    """nvfp4 with a per-tensor global scale, `max(|w|)` in float32 as
    mlx-lm's `_quantize_experts` takes it: `mx.quantize(w, group_size, 4,
    mode="nvfp4", global_scale=gs)`, `mx.dequantize` of the result with it,
    and `mx.quantized_matmul(x, …, global_scale=gs)`, which the pinned MLX
    refuses (`matmul_refused`: the message, "" if it ran)."""
    gs = mx.max(mx.abs(w)).astype(mx.float32)
    wq, scales = mx.quantize(w, group_size, 4, mode="nvfp4", global_scale=gs)
    deq = mx.dequantize(wq, scales, None, group_size, 4, mode="nvfp4", global_scale=gs)
    try:
        mx.eval(mx.quantized_matmul(x, wq, scales, None, True, group_size, 4, mode="nvfp4",
                                    global_scale=gs))
        refused = ""
    except (TypeError, ValueError) as e:  # the pinned MLX's refusal, recorded
        refused = _first_line(e)
    return {"global_scale": gs, "weight": wq, "scales": scales, "dequantized": deq,
            "matmul_refused": refused}


def quantized_switch_global_scale(w, x, indices, group_size):
    """`SwitchLinear(in, out, E, bias=False)` holding `w`, then
    `.to_quantized(group_size, 4, mode="nvfp4", global_scale=True)`: its
    weight, scales and per-expert global_scale; then its `__call__(x,
    indices)`, which passes `global_scale=` to `mx.gather_qmm`
    (`call_refused`: the message, "" if it ran)."""
    sw = _q_switch_layers()
    experts, out_dims, in_dims = w.shape
    layer = sw.SwitchLinear(in_dims, out_dims, experts, bias=False)
    layer.weight = w
    q = layer.to_quantized(group_size=group_size, bits=4, mode="nvfp4", global_scale=True)
    try:
        mx.eval(q(x, indices))
        refused = ""
    except (TypeError, ValueError) as e:  # the pinned MLX's refusal, recorded
        refused = _first_line(e)
    return {"weight": q.weight, "scales": q.scales, "global_scale": q.global_scale,
            "call_refused": refused}
