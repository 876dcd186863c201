"""Shared by the quantized families (crates/conformance/src/families/quantized*):
the reference layers (mlx 0.32.2 `nn.QuantizedLinear`, mlx-lm 0.32.2
`QuantizedSwitchLinear` and `LoRALinear`) built by their own constructors
and holding a case's tensors, the `SwitchGLU.__call__` drive of one switch
projection, and the `gather_qmm` shim."""

import threading

import mlx.core as mx

from reference_glue.core import load

# Held while a reference global is patched (the gather_qmm shim), so that an
# unpatched call on another thread never sees the patch, and while a reference
# module is first executed.
_Q_LOCK = threading.RLock()


def _q_switch_layers():
    with _Q_LOCK:  # two threads must not both execute the module
        return load("mlx_lm.models.switch_layers")


def _q_lora():
    with _Q_LOCK:
        return load("mlx_lm.tuner.lora")


def _q_install(layer, weight, scales, biases, bias):
    """Installs quantized tensors on a reference layer as `load_weights` would."""
    layer.weight = weight
    layer.scales = scales
    if biases is not None:
        layer.biases = biases
    if bias is not None:
        layer.bias = bias
    return layer


def _q_linear(weight, scales, biases, bias, mode, bits, group_size):
    """`mlx.nn.QuantizedLinear` (mlx 0.32.2), built by its own __init__, then
    holding exactly these tensors (as `load_weights` would install them;
    a weight with leading batch axes is installed as given)."""
    import mlx.nn as nn
    *_, out_dims, packed = weight.shape
    layer = nn.QuantizedLinear(packed * 32 // bits, out_dims, bias=bias is not None,
                               group_size=group_size, bits=bits, mode=mode)
    return _q_install(layer, weight, scales, biases, bias)


def _q_lora_layer(base, lora_a, lora_b, lora_scales):
    """`mlx_lm.tuner.lora.LoRALinear` around `base`, one per adapter, nested
    in order: adapter 0 wraps the base (`LoRALinear.from_base`), adapter i
    wraps adapter i-1 (`from_base` reads `linear.weight`, which a LoRALinear
    has not, so the outer ones are built by the constructor with the same
    dims). Dropout 0 and eval mode: the dropout is the identity."""
    if not lora_a:
        return base
    lora = _q_lora()
    out_dims = base.weight.shape[0]
    in_dims = base.weight.shape[1] * 32 // base.bits
    layer = base
    for i, (a, b, s) in enumerate(zip(lora_a, lora_b, lora_scales)):
        if i == 0:
            wrapped = lora.LoRALinear.from_base(layer, r=a.shape[1], dropout=0.0, scale=s)
        else:
            wrapped = lora.LoRALinear(in_dims, out_dims, r=a.shape[1], dropout=0.0, scale=s)
            wrapped.linear = layer
        wrapped.lora_a = a
        wrapped.lora_b = b
        layer = wrapped
    layer.eval()
    return layer


def _q_switch(weight, scales, biases, bias, mode, bits, group_size, expert0_views=False):
    """`QuantizedSwitchLinear` (mlx-lm 0.32.2) holding these tensors. With
    `expert0_views`, the layer gets stride-0 views `broadcast_to(t[:1],
    t.shape)` of expert 0 that share each tensor's buffer."""
    sw = _q_switch_layers()
    if expert0_views:
        def view(t):
            return None if t is None else mx.broadcast_to(t[:1], t.shape)
        weight, scales, biases, bias = view(weight), view(scales), view(biases), view(bias)
    experts, out_dims, _ = weight.shape
    in_dims = scales.shape[2] * group_size
    layer = sw.QuantizedSwitchLinear(in_dims, out_dims, experts, bias=bias is not None,
                                     group_size=group_size, bits=bits, mode=mode)
    return _q_install(layer, weight, scales, biases, bias)


def _q_switch_apply(layer, x, indices, sort):
    """As `SwitchGLU.__call__` drives one projection: x (.., D) expanded to
    (.., 1, 1, D); when `sort`, `_gather_sort` / `sorted_indices=True` /
    `_scatter_unsort`; then `squeeze(-2)`: (.., K, out)."""
    sw = _q_switch_layers()
    x = mx.expand_dims(x, (-2, -3))
    if sort:
        xs, idx, inv_order = sw._gather_sort(x, indices)
        y = layer(xs, idx, sorted_indices=True)
        y = sw._scatter_unsort(y, inv_order, indices.shape)
    else:
        y = layer(x, indices)
    return y.squeeze(-2)


class _QNoGlobalScale:
    """Within `with`: `mx.gather_qmm` drops a `global_scale=None` keyword
    (mlx 0.32.2's gather_qmm has none); restored on exit."""

    def __enter__(self):
        _Q_LOCK.acquire()
        self.saved = mx.gather_qmm
        saved = self.saved

        def gather_qmm(*args, global_scale=None, **kwargs):
            if global_scale is not None:
                raise TypeError("the shim only drops global_scale=None")
            return saved(*args, **kwargs)

        mx.gather_qmm = gather_qmm
        return self

    def __exit__(self, *exc):
        mx.gather_qmm = self.saved
        _Q_LOCK.release()
        return False
