"""The smoke family (crates/conformance/src/families/smoke.rs)."""

import mlx.core as mx


def smoke_quantized_matmul(x, w, scales, biases, group_size, bits):
    """mx.quantized_matmul(x, w, scales, biases, transpose=True) (mlx 0.32.2)."""
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
