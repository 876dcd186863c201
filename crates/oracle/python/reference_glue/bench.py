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
