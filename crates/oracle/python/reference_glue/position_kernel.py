"""The mRoPE Metal kernel (crates/conformance/src/families/position/mrope.rs):
what mlx-vlm's rope_utils hands to `mx.fast.metal_kernel` and how
`_fast_mrope_apply` launches it, captured by recorders (on any platform)."""

import types

import mlx.core as mx
import numpy as np

from reference_glue.position_common import _POSITION_LOCK, _position_rope_utils


def _position_bytes(text):
    return mx.array(np.frombuffer(text.encode("utf-8"), dtype=np.uint8))


def position_mrope_kernel_source(rotary_dim, position_ndim, pairing):
    """What _mrope_apply_kernel(rotary_dim, position_ndim, pairing) hands to
    mx.fast.metal_kernel, captured by a recorder (on any platform: the
    builder runs with _HAS_METAL forced on and its lru_cache bypassed)."""
    ru = _position_rope_utils()
    calls = []

    def recorder(**kwargs):
        calls.append(kwargs)
        return "recorded kernel"

    # The builder behind the lru_cache, with _HAS_METAL forced on in a copy
    # of its module globals (the module's own flag is left alone).
    builder = ru._mrope_apply_kernel.__wrapped__
    builder = types.FunctionType(
        builder.__code__, {**ru.__dict__, "_HAS_METAL": True}, builder.__name__,
        builder.__defaults__, builder.__closure__)
    with _POSITION_LOCK:
        saved = mx.fast.metal_kernel
        mx.fast.metal_kernel = recorder
        try:
            builder(rotary_dim, position_ndim, pairing)
        finally:
            mx.fast.metal_kernel = saved
    if len(calls) != 1:
        raise ValueError(f"expected one metal_kernel call, got {len(calls)}")
    (call,) = calls
    # Arguments not passed take mx.fast.metal_kernel's own defaults, read
    # from its signature ("", True, False, None in MLX 0.32.2).
    optional = ("header", "ensure_row_contiguous", "atomic_outputs", "compile_options")
    signature = getattr(saved, "__nb_signature__", None)
    defaults = dict(zip(optional, signature[0][2])) if signature else \
        dict(zip(optional, ("", True, False, None)))
    known = {"name", "input_names", "output_names", "source", *optional}
    if set(call) - known:
        raise ValueError(f"unexpected metal_kernel arguments {sorted(set(call) - known)}")
    call = {**defaults, **call}
    return {
        "name": _position_bytes(call["name"]),
        "input_names": _position_bytes("\0".join(call["input_names"])),
        "output_names": _position_bytes("\0".join(call["output_names"])),
        "source": _position_bytes(call["source"]),
        "header": _position_bytes(call["header"]),
        # ensure_row_contiguous, atomic_outputs, compile_options given.
        "flags": mx.array([int(call["ensure_row_contiguous"]), int(call["atomic_outputs"]),
                           int(call["compile_options"] is not None)], dtype=mx.int32),
    }


def position_mrope_kernel_launch(batch, q_heads, kv_heads, length, head_dim, dtype_name,
                                 position_ndim, rotary_dim):
    """The launch _fast_mrope_apply makes for q [B, Hq, L, D] and k
    [B, Hk, L, D]: the kernel is a recorder returning zeros."""
    ru = _position_rope_utils()
    b, hq, hk, d = batch, q_heads, kv_heads, head_dim
    dtype = getattr(mx, dtype_name)
    launches = []

    def kernel(**kwargs):
        launches.append(kwargs)
        return (mx.zeros(kwargs["output_shapes"][0], dtype=kwargs["output_dtypes"][0]),)

    q = mx.zeros((b, hq, length, d), dtype=dtype)
    k = mx.zeros((b, hk, length, d), dtype=dtype)
    shape = (3, b, length) if position_ndim == 3 else (b, length)
    position_ids = mx.zeros(shape, dtype=mx.int32)
    inv_freq = ru.compute_inv_freq(rotary_dim, 10000.0)
    selector = ru._interleaved_position_selector([11, 11, 10], rotary_dim // 2)
    outs = ru._fast_mrope_apply(kernel, q, k, position_ids, inv_freq, selector, ru._HALF_SPLIT)
    mx.eval(outs)
    rows = []
    for launch in launches:
        known = {"inputs", "template", "grid", "threadgroup", "output_shapes", "output_dtypes"}
        if set(launch) - known:
            raise ValueError(f"unexpected kernel arguments {sorted(set(launch) - known)}")
        (name, t_dtype), = launch["template"]
        rows.append({
            "grid": mx.array(list(launch["grid"]), dtype=mx.int32),
            "threadgroup": mx.array(list(launch["threadgroup"]), dtype=mx.int32),
            "template": f"{name}={str(t_dtype).removeprefix('mlx.core.')}",
            "output_shapes": mx.array([list(s) for s in launch["output_shapes"]], dtype=mx.int32),
            "output_dtypes": [str(t).removeprefix("mlx.core.") for t in launch["output_dtypes"]],
            "inputs": len(launch["inputs"]),
        })
    return rows
