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


def load(name):
    """Imports reference submodule `name` (e.g. 'mlx_vlm.models.rope_utils')."""
    if name in sys.modules and not isinstance(sys.modules[name], types.ModuleType.__class__):
        existing = sys.modules[name]
        if getattr(existing, "__file__", None):
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


def set_device(kind):
    mx.set_default_device(mx.gpu if kind == "gpu" else mx.cpu)


def environment():
    metal = bool(mx.metal.is_available())
    return {
        "mlx_version": mx.__version__,
        "metal_available": metal,
        "default_device": str(mx.default_device()),
        "gpu_architecture": str(mx.metal.device_info().get("architecture", "unknown")) if metal else None,
    }


# --- reference calls (one small function per case family) ---------------

def smoke_quantized_matmul(x, w, scales, biases, group_size, bits):
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)


# --- quantized families (crates/conformance/src/families/quantized*) -----


# --- position families (crates/conformance/src/families/position*) -------


# --- attention families (crates/conformance/src/families/attention*) -----


# --- oracle self-tests ----------------------------------------------------

def echo(value):
    """Returns its argument unchanged (round-trip test of the transfer)."""
    return value


def raise_value_error(message):
    raise ValueError(message)
