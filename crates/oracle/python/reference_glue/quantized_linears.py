"""The quantized linear, rows and LoRA families
(crates/conformance/src/families/quantized/): `mlx.nn.QuantizedLinear` and
mlx-lm's `LoRALinear` called on the case's input."""

import mlx.core as mx

from reference_glue.quantized import _q_linear, _q_lora_layer


def quantized_linear(x, weight, scales, biases, bias, mode, bits, group_size):
    """`mlx.nn.QuantizedLinear.__call__` on x."""
    return _q_linear(weight, scales, biases, bias, mode, bits, group_size)(x)


def quantized_linear_rows(x, weight, scales, biases, bias, mode, bits, group_size,
                          lora_a=(), lora_b=(), lora_scales=()):
    """The reference layer (with LoRA when given) called once per row
    (M = 1 each), rows concatenated back to x's shape."""
    layer = _q_lora_layer(_q_linear(weight, scales, biases, bias, mode, bits, group_size),
                          lora_a, lora_b, lora_scales)
    k = x.shape[-1]
    flat = x.reshape(-1, k)
    rows = [layer(flat[i:i + 1]) for i in range(flat.shape[0])]
    y = mx.concatenate(rows, axis=0)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def quantized_lora(x, weight, scales, biases, bias, lora_a, lora_b, lora_scales, mode, bits,
                   group_size):
    """`mlx_lm.tuner.lora.LoRALinear.__call__` (nested per adapter) on x."""
    base = _q_linear(weight, scales, biases, bias, mode, bits, group_size)
    return _q_lora_layer(base, lora_a, lora_b, lora_scales)(x)
