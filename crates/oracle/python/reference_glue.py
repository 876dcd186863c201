"""Thin glue between the Rust oracle and the pinned Python reference.

Only two things live here: importing reference submodules without running
their packages' ``__init__`` (whose dependency closures conflict and pull in
transformers, opencv, ...), and calls into reference functions. Case
generation, comparison and reporting are Rust.
"""

import importlib.util
import os
import sys
import types

import mlx.core as mx
import numpy as np

SITE_PACKAGES = None  # set by the oracle before the first import


# --- importing reference submodules -------------------------------------

def _stub_package(name):
    """A package module whose __path__ is the real directory, so relative
    imports resolve while the real __init__.py is never executed."""
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(SITE_PACKAGES, *name.split("."))]
    sys.modules[name] = module
    if "." in name:
        parent, child = name.rsplit(".", 1)
        setattr(_stub_package(parent), child, module)
    return module


# `load` publishes a module in sys.modules before executing it; cases run on
# several threads, so a first import must finish before anyone sees it.
_IMPORT_LOCK = __import__("threading").RLock()


def load(name):
    """Imports reference submodule `name` (e.g. 'mlx_vlm.models.rope_utils')."""
    with _IMPORT_LOCK:
        return _load_unlocked(name)


def _load_unlocked(name):
    existing = sys.modules.get(name)
    if existing is not None and getattr(existing, "__file__", None):
        return existing
    parts = name.split(".")
    for i in range(1, len(parts)):
        _stub_package(".".join(parts[:i]))
    path = os.path.join(SITE_PACKAGES, *parts) + ".py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
    return module


# --- tensors across the boundary (raw bits, no conversion) --------------

_RAW_VIEW = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}
_NP_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def to_mx(dtype_name, shape, data):
    dtype = mx.bool_ if dtype_name == "bool" else getattr(mx, dtype_name)
    size = dtype.size
    raw = np.frombuffer(data, dtype=_NP_RAW[size]).reshape(shape)
    array = mx.array(raw, dtype=_RAW_VIEW[size])
    return array if dtype == _RAW_VIEW[size] else array.view(dtype)


def from_mx(array):
    mx.eval(array)
    name = str(array.dtype).removeprefix("mlx.core.")
    raw = array.view(_RAW_VIEW[array.dtype.size])
    return name, tuple(array.shape), np.array(raw, copy=False).tobytes()


def is_array(value):
    return isinstance(value, mx.array)


def _gpu_backend():
    """The GPU backend of this MLX ("metal", "cuda") or None: the one
    backend vocabulary of the suite (layers::Backend)."""
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return None


def set_device(backend):
    """Routes mx's default device to `backend` ("cpu", "metal", "cuda")."""
    if backend == "cpu":
        mx.set_default_device(mx.cpu)
        return
    if backend != _gpu_backend():
        raise ValueError(
            f"backend {backend!r} is not available to this MLX (its GPU backend: {_gpu_backend()})")
    mx.set_default_device(mx.gpu)


def _nvidia_versions():
    """Driver and CUDA versions of the host (provenance only): the driver's
    own /proc file and libcudart's cudaDriverGetVersion/cudaRuntimeGetVersion."""
    out = {}
    try:
        with open("/proc/driver/nvidia/version") as f:
            out["driver"] = f.readline().strip()
    except OSError:
        pass
    import ctypes
    for soname in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            rt = ctypes.CDLL(soname)
        except OSError:
            continue
        for key, fn in (("cuda_driver_api", "cudaDriverGetVersion"),
                        ("cuda_runtime", "cudaRuntimeGetVersion")):
            v = ctypes.c_int(0)
            if getattr(rt, fn)(ctypes.byref(v)) == 0:
                out[key] = f"{v.value // 1000}.{(v.value % 1000) // 10}"
        break
    return out


def device_info(backend):
    """The device's own name and architecture, as MLX reports them, plus
    host versions for CUDA. Strings only."""
    if backend == "cpu":
        import platform
        name = platform.processor()
        try:
            with open("/proc/cpuinfo") as f:
                name = next((l.split(":", 1)[1].strip() for l in f
                             if l.startswith("model name")), name)
        except OSError:
            pass
        return {"name": name or platform.machine(), "architecture": platform.machine()}
    info = mx.device_info(mx.gpu)
    out = {"name": str(info.get("device_name", "unknown")),
           "architecture": str(info.get("architecture", "unknown"))}
    if backend == "cuda":
        out.update(_nvidia_versions())
    return out


def environment():
    return {
        "mlx_version": mx.__version__,
        "gpu_backend": _gpu_backend(),
        "default_device": str(mx.default_device()),
    }


# --- reference calls (one small function per case family) ---------------

def smoke_quantized_matmul(x, w, scales, biases, group_size, bits):
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)


# --- quantized families (crates/conformance/src/families/quantized*) -----

import threading as _q_threading

_Q_MODE_IDS = {"affine": 0, "mxfp4": 1, "mxfp8": 2, "nvfp4": 3}


# Held while a reference global is patched (the gather_qmm shim), so that an
# unpatched call on another thread never sees the patch, and while a reference
# module is first executed.
_Q_LOCK = _q_threading.RLock()


def _q_switch_layers():
    with _Q_LOCK:  # two threads must not both execute the module
        return load("mlx_lm.models.switch_layers")


def _q_lora():
    with _Q_LOCK:
        return load("mlx_lm.tuner.lora")


def _q_utils():
    """mlx_lm.utils (0.32.2) without the HF hub or tokenizers: both are only
    used by download/tokenizer paths, so import-time stubs stand in. Its
    import-time `resource.setrlimit(RLIMIT_NOFILE, (2048, 4096))` would
    lower this whole process's hard limit for good; it is skipped."""
    with _Q_LOCK:
        return _q_load_utils()


def _q_load_utils():
    if "mlx_lm.utils" in sys.modules:
        return sys.modules["mlx_lm.utils"]
    import importlib.util as _util
    import resource
    if "huggingface_hub" not in sys.modules and _util.find_spec("huggingface_hub") is None:
        hub = types.ModuleType("huggingface_hub")
        hub.snapshot_download = lambda *a, **k: None
        sys.modules["huggingface_hub"] = hub
    _stub_package("mlx_lm")
    if "mlx_lm.tokenizer_utils" not in sys.modules:
        tok = types.ModuleType("mlx_lm.tokenizer_utils")
        tok.TokenizerWrapper = object
        tok.load = lambda *a, **k: None
        sys.modules["mlx_lm.tokenizer_utils"] = tok
    saved = resource.setrlimit
    resource.setrlimit = lambda *a, **k: None
    try:
        return load("mlx_lm.utils")
    finally:
        resource.setrlimit = saved


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
    holding exactly these tensors (as `load_weights` would install them)."""
    import mlx.nn as nn
    out_dims, packed = weight.shape
    layer = nn.QuantizedLinear(packed * 32 // bits, out_dims, bias=bias is not None,
                               group_size=group_size, bits=bits, mode=mode)
    return _q_install(layer, weight, scales, biases, bias)


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


def safetensors_load(path):
    """`mx.load(path, return_metadata=True)` (mlx 0.32.2) of a safetensors
    file: {"arrays": {name: array}, "metadata": {key: value}}."""
    arrays, metadata = mx.load(path, return_metadata=True)
    return {"arrays": dict(arrays), "metadata": dict(metadata)}


def quantized_lora(x, weight, scales, biases, bias, lora_a, lora_b, lora_scales, mode, bits,
                   group_size):
    """`mlx_lm.tuner.lora.LoRALinear.__call__` (nested per adapter) on x."""
    base = _q_linear(weight, scales, biases, bias, mode, bits, group_size)
    return _q_lora_layer(base, lora_a, lora_b, lora_scales)(x)


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


# A tiny model for mlx_lm.utils.load_model: its modules are described by the
# config key `conformance_layers` {path: {kind, in, out, bias[, experts]}},
# so the fixture writer and the loader build the same tree.

def _q_tiny_classes():
    import mlx.nn as nn
    sw = _q_switch_layers()

    class TinyArgs:
        def __init__(self, layers):
            self.layers = layers

        @classmethod
        def from_dict(cls, config):
            return cls(config["conformance_layers"])

    def make(d):
        if d["kind"] == "linear":
            return nn.Linear(d["in"], d["out"], bias=d["bias"])
        if d["kind"] == "switch":
            return sw.SwitchLinear(d["in"], d["out"], d["experts"], bias=d["bias"])
        raise ValueError(f"unknown layer kind {d['kind']!r}")

    def tree(paths):
        root = {}
        for path, d in paths.items():
            node = root
            parts = path.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = make(d)
        return root

    def modules(node):
        if isinstance(node, nn.Module):
            return node
        keys = list(node)
        if keys and all(k.isdigit() for k in keys) and sorted(map(int, keys)) == list(range(len(keys))):
            return [modules(node[str(i)]) for i in range(len(keys))]
        m = nn.Module()
        for k in keys:
            setattr(m, k, modules(node[k]))
        return m

    class TinyModel(nn.Module):
        def __init__(self, args):
            super().__init__()
            for k, v in tree(args.layers).items():
                setattr(self, k, modules(v))

    return TinyModel, TinyArgs


def _q_module(model, path):
    node = model
    for p in path.split("."):
        node = node[int(p)] if isinstance(node, list) else node[p]
    return node


def quantized_checkpoint_load(directory):
    """`mlx_lm.utils.load_model` of the directory with the tiny model class."""
    from pathlib import Path
    utils = _q_utils()
    model_class, args_class = _q_tiny_classes()
    model, config = utils.load_model(Path(directory),
                                     get_model_classes=lambda config: (model_class, args_class))
    return model, config


def quantized_checkpoint(x, indices, directory, paths):
    """Loads `directory` with the reference's load_model and returns, per
    path: the spec it decided as int32 [bits, group_size, mode_id] ([0, 0, -1]
    when the module stayed a float layer) and the output of the loaded
    module on `x[:, :in]` (QuantizedLinear) or on `x[:, :in]` with `indices`
    through the SwitchGLU-style unsorted call (QuantizedSwitchLinear;
    gather_qmm shim), None for float layers."""
    import mlx.nn as nn
    sw = _q_switch_layers()
    model, _ = quantized_checkpoint_load(directory)
    specs, outputs = [], []
    for path in paths:
        m = _q_module(model, path)
        if isinstance(m, nn.QuantizedLinear):
            in_dims = m.weight.shape[-1] * 32 // m.bits
            specs.append([m.bits, m.group_size, _Q_MODE_IDS[m.mode]])
            outputs.append(m(x[:, :in_dims]))
        elif isinstance(m, sw.QuantizedSwitchLinear):
            specs.append([m.bits, m.group_size, _Q_MODE_IDS[m.mode]])
            with _QNoGlobalScale():
                y = _q_switch_apply(m, x[None, :, :m.input_dims], indices[None], False)
            outputs.append(y)
        else:
            specs.append([0, 0, -1])
            outputs.append(None)
    return {"specs": mx.array(specs, dtype=mx.int32), "outputs": outputs}


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


def float_checkpoint(x, directory, path):
    """The module `load_model` built at `path` (its class name) and its
    output on `x[:, :in]`."""
    model, _ = quantized_checkpoint_load(directory)
    m = _q_module(model, path)
    return {"module": type(m).__name__, "y": m(x[:, :m.weight.shape[-1]])}


def quantized_bench(kind, x, weight, scales, biases, mode, bits, group_size, iterations,
                    lora_a=(), lora_b=(), lora_scales=(), indices=None):
    """Seconds per forward of the reference layer (time.perf_counter over
    `iterations` calls, each followed by mx.eval), after one warm-up."""
    import time
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


# --- position families (crates/conformance/src/families/position*) -------
#
# References: mlx_vlm.models.rope_utils, mlx_vlm.models.qwen3_5.language
# (mlx-vlm 0.7.6), optiq.vlm.gemma4.vision (mlx-optiq 0.7.7).


_POSITION_LOCK = __import__("threading").RLock()


def _position_load(name):
    return load(name)


def _position_rope_utils():
    return _position_load("mlx_vlm.models.rope_utils")


def _position_qwen3_5():
    with _POSITION_LOCK:
        _stub_package("mlx_vlm.models.qwen3_vl")
        _stub_package("mlx_vlm.speculative")
        return load("mlx_vlm.models.qwen3_5.language")


def _position_int_list(params):
    return [int(v) for v in params.tolist()]


def _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section):
    """The Qwen3.5 attention's rotary, built as the attention builds it."""
    language = _position_qwen3_5()
    return language.Qwen3_5RotaryEmbedding(
        int(head_dim * partial_rotary_factor),
        base=rope_theta,
        mrope_section=list(mrope_section),
    )


def _position_path(rotary):
    return "metal-kernel" if rotary.fused_apply else "pure-mlx"


def position_mrope_apply(q, k, position_ids, head_dim, partial_rotary_factor, rope_theta,
                         mrope_section, path):
    """MRoPERotaryEmbedding.apply_rotary(q, k, position_ids) on the path the
    reference takes; `path` is the one the case expects. "pure-mlx" on a
    Metal build (a CPU-device run) disables `fused_apply`, which is the
    reference's own choice on a build without Metal."""
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    if path == "pure-mlx" and rotary.fused_apply:
        rotary.fused_apply = False
        rotary._compiled_apply = None
    if _position_path(rotary) != path:
        raise ValueError(f"the reference takes {_position_path(rotary)}, the case expects {path}")
    with _POSITION_LOCK:
        q_out, k_out = rotary.apply_rotary(q, k, position_ids, unsqueeze_dim=1)
    return {
        "q": q_out,
        "k": k_out,
        "path": _position_path(rotary),
        "inv_freq": rotary.inv_freq,
        "position_selector": rotary.position_selector,
    }


def position_inv_freq(dims, base):
    """compute_inv_freq(dim, base) for every dim of the int tensor `dims`,
    concatenated."""
    ru = _position_rope_utils()
    return mx.concatenate([ru.compute_inv_freq(d, base) for d in _position_int_list(dims)])


def position_selectors(params):
    """_interleaved_position_selector(section, freq_dim) for each row
    [freq_dim, s0, s1, s2] of `params`, concatenated."""
    ru = _position_rope_utils()
    rows = params.reshape(-1, 4).tolist()
    return mx.concatenate([ru._interleaved_position_selector(row[1:], row[0]) for row in rows])


def _position_bytes(text):
    return mx.array(np.frombuffer(text.encode("utf-8"), dtype=np.uint8))


def position_mrope_kernel_source(params, pairing):
    """What _mrope_apply_kernel(rotary_dim, position_ndim, pairing) hands to
    mx.fast.metal_kernel, captured by a recorder (on any platform: the
    builder runs with _HAS_METAL forced on and its lru_cache bypassed).
    `params` = [rotary_dim, position_ndim]."""
    ru = _position_rope_utils()
    rotary_dim, position_ndim = _position_int_list(params)
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


def position_mrope_kernel_launch(params, dtype_name, position_ndim, rotary_dim):
    """The launch _fast_mrope_apply makes for q and k: the kernel is a
    recorder returning zeros. `params` = [B, Hq, Hk, L, D]."""
    ru = _position_rope_utils()
    b, hq, hk, length, d = _position_int_list(params)
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


def _position_qwen3_5_self():
    """A stand-in `self` for LanguageModel.get_rope_index: the real
    ModelConfig defaults (token ids) and Qwen3.5 VisionConfig
    (spatial_merge_size)."""
    _position_qwen3_5()
    qwen_config = _position_load("mlx_vlm.models.qwen3_5.config")
    config = qwen_config.ModelConfig(
        text_config=types.SimpleNamespace(eos_token_id=None),
        vision_config=qwen_config.VisionConfig(),
        model_type="qwen3_5",
    )
    return types.SimpleNamespace(config=config)


def _position_grids(grids):
    if grids is None:
        return None
    return mx.array(grids, dtype=mx.int32).reshape(-1, 3)


def position_rope_index(attention_mask, input_ids, image_grid_thw, video_grid_thw):
    """LanguageModel.get_rope_index(input_ids, image_grid_thw,
    video_grid_thw, attention_mask). An all-ones mask stands for None (not
    passed). Grids are lists of [t, h, w] or None."""
    language = _position_qwen3_5()
    mask = None if bool(mx.all(attention_mask == 1).item()) else attention_mask
    position_ids, deltas = language.LanguageModel.get_rope_index(
        _position_qwen3_5_self(), input_ids,
        _position_grids(image_grid_thw), _position_grids(video_grid_thw), mask)
    return {"position_ids": position_ids, "rope_deltas": deltas}


def _position_decode_ids(position_ids, rope_deltas, has_grids, cache_offset, length):
    """LanguageModel.__call__'s decode positions (mlx-vlm 0.7.6
    qwen3_5/language.py, cache offset > 0, rope_deltas set, no per-row
    offsets): text prompts decode with zero deltas; the positions are
    broadcast to (3, B, L) when the cached prompt positions are 3-D."""
    batch_size = position_ids.shape[-2]
    if not has_grids:
        rope_deltas = mx.zeros((batch_size, 1), dtype=rope_deltas.dtype)
    delta = mx.array(cache_offset + rope_deltas)
    if delta.ndim == 0:
        delta = mx.expand_dims(delta, axis=0)
    if delta.shape[0] < batch_size:
        delta = mx.tile(delta, (batch_size, 1))
    else:
        delta = delta[:batch_size]
    ids = mx.arange(length).reshape(1, -1)
    ids = mx.broadcast_to(ids, (batch_size, length))
    ids = mx.add(ids, delta)
    if position_ids.ndim == 3:
        ids = mx.broadcast_to(ids[None, ...], (3, batch_size, length))
    return ids


def position_rope_decode(attention_mask, input_ids, image_grid_thw, video_grid_thw,
                         cache_offset, length):
    """get_rope_index on the prompt, then the decode positions of the
    `length` tokens at `cache_offset` (LanguageModel.__call__'s rule)."""
    index = position_rope_index(attention_mask, input_ids, image_grid_thw, video_grid_thw)
    has_grids = image_grid_thw is not None or video_grid_thw is not None
    index["decode_position_ids"] = _position_decode_ids(
        index["position_ids"], index["rope_deltas"], has_grids, cache_offset, length)
    return index


def position_mrope_decode(q, k, input_ids, image_grid_thw, video_grid_thw, cache_offset,
                          head_dim, partial_rotary_factor, rope_theta, mrope_section, path):
    """Decode step after a prompt: rope index of the prompt, decode
    positions at `cache_offset`, then the rotary apply."""
    ones = mx.ones(input_ids.shape, dtype=mx.int32)
    index = position_rope_decode(ones, input_ids, image_grid_thw, video_grid_thw,
                                 cache_offset, q.shape[2])
    out = position_mrope_apply(q, k, index["decode_position_ids"], head_dim,
                               partial_rotary_factor, rope_theta, mrope_section, path)
    out.update(index)
    return out


def position_mrope_prompt(q, k, input_ids, image_grid_thw, video_grid_thw, head_dim,
                          partial_rotary_factor, rope_theta, mrope_section, path):
    """Prefill: rope index of the prompt (input_ids [B, L]), then the apply
    with those positions."""
    ones = mx.ones(input_ids.shape, dtype=mx.int32)
    index = position_rope_index(ones, input_ids, image_grid_thw, video_grid_thw)
    out = position_mrope_apply(q, k, index["position_ids"], head_dim,
                               partial_rotary_factor, rope_theta, mrope_section, path)
    out.update(index)
    return out


def position_mrope_vs_rope(q, position_ids, head_dim, partial_rotary_factor, rope_theta,
                           mrope_section, path):
    """Text-only: the reference mRoPE with three equal position streams, and
    mx.fast.rope(traditional=False, dims=rotary_dim, base=rope_theta,
    scale=1.0, offset=0) on the same q."""
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    out = position_mrope_apply(q, q, position_ids, head_dim, partial_rotary_factor,
                               rope_theta, mrope_section, path)
    rope = mx.fast.rope(q, rotary.dim, traditional=False, base=rope_theta, scale=1.0, offset=0)
    return {"mrope": out["q"], "rope": rope, "path": out["path"]}


def position_rope2d(inputs, positions, base_frequency):
    """optiq.vlm.gemma4.vision.apply_multidimensional_rope."""
    vision = _position_load("optiq.vlm.gemma4.vision")
    return vision.apply_multidimensional_rope(inputs, positions, base_frequency)


def position_bench_mrope(q, k, position_ids, head_dim, partial_rotary_factor, rope_theta,
                         mrope_section, iterations):
    """Seconds per MRoPERotaryEmbedding.apply_rotary + mx.eval, over
    `iterations` after one warm-up."""
    import time
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    mx.eval(rotary.apply_rotary(q, k, position_ids))
    start = time.perf_counter()
    for _ in range(iterations):
        mx.eval(rotary.apply_rotary(q, k, position_ids))
    return (time.perf_counter() - start) / iterations


def position_bench_rope2d(inputs, positions, base_frequency, iterations):
    """Seconds per apply_multidimensional_rope + mx.eval."""
    import time
    vision = _position_load("optiq.vlm.gemma4.vision")
    mx.eval(vision.apply_multidimensional_rope(inputs, positions, base_frequency))
    start = time.perf_counter()
    for _ in range(iterations):
        mx.eval(vision.apply_multidimensional_rope(inputs, positions, base_frequency))
    return (time.perf_counter() - start) / iterations


# --- attention families (crates/conformance/src/families/attention*) -----

def _attention_modules():
    return load("mlx_lm.models.base"), load("mlx_lm.models.cache")


def _attention_qlinear(weight, scales, biases, group_size, bits):
    """An affine nn.QuantizedLinear (no additive bias) holding these tensors."""
    return _q_linear(weight, scales, biases, None, "affine", bits, group_size)


def attention_decode_m1(
    x, q_w, q_s, q_b, k_w, k_s, k_b, v_w, v_s, v_b, o_w, o_s, o_b, k0, v0,
    n_heads, n_kv_heads, head_dim, rotary_dims, rope_base, group_size, bits,
):
    """Decodes the rows of x [T, hidden] one token at a time (M = 1) through
    an mlx-lm style attention (q/k/v/o nn.QuantizedLinear, nn.RoPE with the
    cache offset, mlx_lm KVCache prefilled with k0/v0 [1, n_kv, L0, D] in one
    update, mlx_lm base.scaled_dot_product_attention with the mask of
    base.create_attention_mask). Returns (attn [T, H*D] before o_proj,
    y [T, hidden], keys [T, n_kv*D], values [T, n_kv*D]) per token."""
    import mlx.nn as nn

    base, cache_mod = _attention_modules()
    q_proj = _attention_qlinear(q_w, q_s, q_b, group_size, bits)
    k_proj = _attention_qlinear(k_w, k_s, k_b, group_size, bits)
    v_proj = _attention_qlinear(v_w, v_s, v_b, group_size, bits)
    o_proj = _attention_qlinear(o_w, o_s, o_b, group_size, bits)
    rope = nn.RoPE(rotary_dims, traditional=False, base=rope_base)
    scale = head_dim**-0.5
    cache = cache_mod.KVCache()
    if k0.shape[2] > 0:
        cache.update_and_fetch(k0, v0)
    start = cache.offset
    attn_rows, y_rows = [], []
    for t in range(x.shape[0]):
        h = x[t : t + 1][None]
        B, L, _ = h.shape
        mask = base.create_attention_mask(h, cache)
        queries = q_proj(h).reshape(B, L, n_heads, -1).transpose(0, 2, 1, 3)
        keys = k_proj(h).reshape(B, L, n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = v_proj(h).reshape(B, L, n_kv_heads, -1).transpose(0, 2, 1, 3)
        queries = rope(queries, offset=cache.offset)
        keys = rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        out = base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(B, L, -1)
        y = o_proj(out)
        mx.eval(out, y, cache.keys, cache.values)
        attn_rows.append(out[0])
        y_rows.append(y[0])
    T = x.shape[0]
    k_rows = cache.keys[:, :, start : start + T, :].transpose(2, 0, 1, 3).reshape(T, -1)
    v_rows = cache.values[:, :, start : start + T, :].transpose(2, 0, 1, 3).reshape(T, -1)
    return mx.concatenate(attn_rows, 0), mx.concatenate(y_rows, 0), k_rows, v_rows


# --- oracle self-tests ----------------------------------------------------

def echo(value):
    """Returns its argument unchanged (round-trip test of the transfer)."""
    return value


def raise_value_error(message):
    raise ValueError(message)
