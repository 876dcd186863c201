"""The quantized switch family (crates/conformance/src/families/quantized/):
mlx-lm's `QuantizedSwitchLinear` driven as `SwitchGLU.__call__` drives one
projection."""

import mlx.core as mx

from reference_glue.quantized import _Q_LOCK, _q_switch, _q_switch_apply, _QNoGlobalScale


def quantized_switch(x, indices, weight, scales, biases, bias, mode, bits, group_size, sort,
                     expert0_views=False):
    """`QuantizedSwitchLinear.__call__` with `global_scale=None` dropped."""
    layer = _q_switch(weight, scales, biases, bias, mode, bits, group_size, expert0_views)
    with _QNoGlobalScale():
        y = _q_switch_apply(layer, x, indices, sort)
    mx.eval(y)
    return y


def quantized_switch_as_pinned(x, indices, weight, scales, biases, bias, mode, bits, group_size):
    """`QuantizedSwitchLinear.__call__` exactly as pinned: what it raises."""
    layer = _q_switch(weight, scales, biases, bias, mode, bits, group_size)
    with _Q_LOCK:
        try:
            y = _q_switch_apply(layer, x, indices, False)
            mx.eval(y)
        except Exception as e:  # the finding is the exception itself
            lines = str(e).splitlines()
            return {"raised": True, "type": type(e).__name__, "message": lines[0] if lines else ""}
    return {"raised": False, "y": y}
