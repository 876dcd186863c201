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


def quantized_switch_rows(x, indices, weight, scales, biases, bias, mode, bits, group_size):
    """The reference projection called once per token (x[t:t+1],
    indices[t:t+1], unsorted, as SwitchGLU drives it), tokens concatenated
    back to `indices.shape + (out,)`: how a rows-independent engine calls
    the layer."""
    layer = _q_switch(weight, scales, biases, bias, mode, bits, group_size)
    flat_x = x.reshape(-1, x.shape[-1])
    flat_i = indices.reshape(-1, indices.shape[-1])
    with _QNoGlobalScale():
        rows = [_q_switch_apply(layer, flat_x[t:t + 1], flat_i[t:t + 1], False)
                for t in range(flat_x.shape[0])]
    y = mx.concatenate(rows, axis=0)
    y = y.reshape(*indices.shape, y.shape[-1])
    mx.eval(y)
    return y
