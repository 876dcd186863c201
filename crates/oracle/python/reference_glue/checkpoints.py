"""Checkpoint files and directories: `mx.load` of safetensors files
(crates/conformance/src/families/safetensors.rs) and mlx-lm's `load_model`
of the quantized checkpoint fixtures (families/quantized/: checkpoint, float).
The fixture writer (fixtures/checkpoints/write_fixture.py) builds its tiny
model with the same `_q_tiny_classes`."""

import sys
import types

import mlx.core as mx

from reference_glue.core import _stub_package, load
from reference_glue.quantized import _Q_LOCK, _q_switch_apply, _q_switch_layers, _QNoGlobalScale

_Q_MODE_IDS = {"affine": 0, "mxfp4": 1, "mxfp8": 2, "nvfp4": 3}


def safetensors_load(path):
    """`mx.load(path, return_metadata=True)` (mlx 0.32.2) of a safetensors
    file: {"arrays": {name: array}, "metadata": {key: value}}."""
    arrays, metadata = mx.load(path, return_metadata=True)
    return {"arrays": dict(arrays), "metadata": dict(metadata)}


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
        if d["kind"] == "embedding":
            return nn.Embedding(d["out"], d["in"])
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
    module on `x[:, :in]` (QuantizedLinear; QuantizedEmbedding.as_linear) or
    on `x[:, :in]` with `indices` through the SwitchGLU-style unsorted call
    (QuantizedSwitchLinear; gather_qmm shim), its loaded `global_scale` for
    a switch layer that has one (the pinned MLX cannot call it), None for
    float layers."""
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
        elif isinstance(m, nn.QuantizedEmbedding):
            specs.append([m.bits, m.group_size, _Q_MODE_IDS[m.mode]])
            outputs.append(m.as_linear(x[:, :m.dims]))
        elif isinstance(m, sw.QuantizedSwitchLinear) and m.global_scale is not None:
            # The pinned MLX cannot run it (gather_qmm has no global_scale):
            # the loaded per-expert global scale is the output.
            specs.append([m.bits, m.group_size, _Q_MODE_IDS[m.mode]])
            outputs.append(m.global_scale)
        elif isinstance(m, sw.QuantizedSwitchLinear):
            specs.append([m.bits, m.group_size, _Q_MODE_IDS[m.mode]])
            with _QNoGlobalScale():
                y = _q_switch_apply(m, x[None, :, :m.input_dims], indices[None], False)
            outputs.append(y)
        else:
            specs.append([0, 0, -1])
            outputs.append(None)
    return {"specs": mx.array(specs, dtype=mx.int32), "outputs": outputs}


def float_checkpoint(x, directory, path):
    """The module `load_model` built at `path` (its class name) and its
    output on `x[:, :in]`."""
    model, _ = quantized_checkpoint_load(directory)
    m = _q_module(model, path)
    return {"module": type(m).__name__, "y": m(x[:, :m.weight.shape[-1]])}
