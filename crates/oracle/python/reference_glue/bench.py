"""Reference timings for the benches (crates/conformance/benches): seconds
per forward of the reference layer, `time.perf_counter` over `iterations`
calls each followed by `mx.eval`, after one warm-up."""

import time

import mlx.core as mx

from reference_glue.position_common import _position_load, _position_rotary
from reference_glue.quantized import (
    _q_linear,
    _q_lora_layer,
    _q_switch,
    _q_switch_apply,
    _QNoGlobalScale,
)


def quantized_bench(kind, x, weight, scales, biases, mode, bits, group_size, iterations,
                    lora_a=(), lora_b=(), lora_scales=(), indices=None):
    """Seconds per forward of the reference layer (time.perf_counter over
    `iterations` calls, each followed by mx.eval), after one warm-up."""
    if kind == "linear":
        layer = _q_lora_layer(_q_linear(weight, scales, biases, None, mode, bits, group_size),
                              lora_a, lora_b, lora_scales)

        def step():
            return layer(x)
    else:
        layer = _q_switch(weight, scales, biases, None, mode, bits, group_size)
        shim = _QNoGlobalScale().__enter__()

        def step():
            return _q_switch_apply(layer, x, indices, False)
    try:
        mx.eval(layer.parameters())
        mx.eval(step())
        start = time.perf_counter()
        for _ in range(iterations):
            mx.eval(step())
        return (time.perf_counter() - start) / iterations
    finally:
        if kind != "linear":
            shim.__exit__(None, None, None)


def position_bench_mrope(q, k, position_ids, head_dim, partial_rotary_factor, rope_theta,
                         mrope_section, iterations):
    """Seconds per MRoPERotaryEmbedding.apply_rotary + mx.eval, over
    `iterations` after one warm-up."""
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    mx.eval(rotary.apply_rotary(q, k, position_ids))
    start = time.perf_counter()
    for _ in range(iterations):
        mx.eval(rotary.apply_rotary(q, k, position_ids))
    return (time.perf_counter() - start) / iterations


def position_bench_rope2d(inputs, positions, base_frequency, iterations):
    """Seconds per apply_multidimensional_rope + mx.eval."""
    vision = _position_load("optiq.vlm.gemma4.vision")
    mx.eval(vision.apply_multidimensional_rope(inputs, positions, base_frequency))
    start = time.perf_counter()
    for _ in range(iterations):
        mx.eval(vision.apply_multidimensional_rope(inputs, positions, base_frequency))
    return (time.perf_counter() - start) / iterations


def _bench_uniform(shape, scale, seed, dtype):
    """Seeded uniform floats in [-scale, scale), as the Rust bench makes them
    (`mlx_rs::random::uniform` with `key(seed)`, then the dtype)."""
    a = mx.random.uniform(-scale, scale, shape, key=mx.random.key(seed))
    return a.astype(getattr(mx, dtype))


def _bench_quantized(shape, seed, mode, bits, group_size, dtype, switch=False):
    """A reference quantized layer of float weight `shape` ([out, in] or
    [E, out, in]), quantized by `mx.quantize`."""
    w = _bench_uniform(shape, shape[-1] ** -0.5, seed, dtype)
    parts = mx.quantize(w, group_size, bits, mode=mode)
    biases = parts[2] if len(parts) > 2 else None
    build = _q_switch if switch else _q_linear
    return build(parts[0], parts[1], biases, None, mode, bits, group_size)


def decode_bench(kind, layers, hidden, heads, kv_heads, head_dim, intermediate, experts,
                 top_k, moe_intermediate, partial_rotary_factor, rope_theta, mrope_section,
                 position, mode, bits, group_size, dtype, seed, iterations):
    """Seconds per decode step of a stack of `layers` reference layers, one
    mx.eval per token (after one warm-up): per layer the attention
    projections (nn.QuantizedLinear) with the Qwen3.5 rotary applied to q
    and k (its own compiled apply_rotary), SDPA stood in for by q itself,
    then a dense MLP (gate/up/down) or, `kind == "moe"`, mlx-lm's routing
    (softmax, argpartition top-k) and three QuantizedSwitchLinear
    projections driven as SwitchGLU drives them (unsorted below 64 ids),
    weighted by the router scores. The elementwise glue (silu, residuals)
    is the same plain mlx.core ops the Rust bench issues. Seeds follow the
    Rust bench: layer l, projection j uses seed + 16 * l + j."""
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    stack = []
    for l in range(layers):
        s = seed + 16 * l
        q = lambda shape, j, sw=False: _bench_quantized(shape, s + j, mode, bits, group_size, dtype, sw)
        p = {"q": q((q_out, hidden), 0), "k": q((kv_out, hidden), 1), "v": q((kv_out, hidden), 2),
             "o": q((hidden, q_out), 3)}
        if kind == "dense":
            p.update(gate=q((intermediate, hidden), 4), up=q((intermediate, hidden), 5),
                     down=q((hidden, intermediate), 6))
        else:
            p.update(router=q((experts, hidden), 4),
                     sw_gate=q((experts, moe_intermediate, hidden), 5, True),
                     sw_up=q((experts, moe_intermediate, hidden), 6, True),
                     sw_down=q((experts, hidden, moe_intermediate), 7, True))
        stack.append(p)
    x0 = _bench_uniform((1, 1, hidden), 1.0, seed + 1000, dtype)
    positions = mx.full((3, 1, 1), position, dtype=mx.int32)

    def step(x):
        outs = []
        for p in stack:
            q = p["q"](x).reshape(1, 1, heads, head_dim).transpose(0, 2, 1, 3)
            k = p["k"](x).reshape(1, 1, kv_heads, head_dim).transpose(0, 2, 1, 3)
            v = p["v"](x)
            q, k = rotary.apply_rotary(q, k, positions)
            x = x + p["o"](q.transpose(0, 2, 1, 3).reshape(1, 1, q_out))
            if kind == "dense":
                g = p["gate"](x)
                m = p["down"](g * mx.sigmoid(g) * p["up"](x))
            else:
                gates = mx.softmax(p["router"](x), axis=-1, precise=True)
                inds = mx.argpartition(gates, kth=-top_k, axis=-1)[..., -top_k:]
                scores = mx.take_along_axis(gates, inds, axis=-1)
                xe = mx.expand_dims(x, (-2, -3))
                g = p["sw_gate"](xe, inds)
                h = p["sw_down"](g * mx.sigmoid(g) * p["sw_up"](xe, inds), inds).squeeze(-2)
                m = (h * mx.expand_dims(scores, -1)).sum(axis=-2).astype(x.dtype)
            x = x + m
            outs += [k, v]
        return [x] + outs

    with _QNoGlobalScale():
        mx.eval([p_.parameters() for p in stack for p_ in p.values()])
        mx.eval(step(x0))
        start = time.perf_counter()
        for _ in range(iterations):
            mx.eval(step(x0))
        return (time.perf_counter() - start) / iterations
