"""The smoke family (crates/conformance/src/families/smoke.rs)."""

import mlx.core as mx


def smoke_quantized_matmul(x, w, scales, biases, group_size, bits):
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
