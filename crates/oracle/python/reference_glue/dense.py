"""Float layers a quantized checkpoint leaves unquantized
(crates/conformance/src/families/quantized/float*): `mlx.nn.Linear` and
mlx-lm's `SwitchLinear` holding the case's tensors."""

from reference_glue.quantized import _q_switch_apply, _q_switch_layers


def float_linear(x, weight, bias):
    """`mlx.nn.Linear` (mlx 0.32.2) holding these tensors, on x."""
    import mlx.nn as nn
    out_dims, in_dims = weight.shape
    layer = nn.Linear(in_dims, out_dims, bias=bias is not None)
    layer.weight = weight
    if bias is not None:
        layer.bias = bias
    return layer(x)


def float_switch(x, indices, weight, bias, sort):
    """mlx-lm's `SwitchLinear` (0.32.2) holding these tensors, driven as
    `SwitchGLU.__call__` drives a projection (see `_q_switch_apply`)."""
    sw = _q_switch_layers()
    experts, out_dims, in_dims = weight.shape
    layer = sw.SwitchLinear(in_dims, out_dims, experts, bias=bias is not None)
    layer.weight = weight
    if bias is not None:
        layer.bias = bias
    return _q_switch_apply(layer, x, indices, sort)
