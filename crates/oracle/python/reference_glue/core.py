"""Imports of reference submodules and tensors across the boundary.

The glue is a package of small modules (one per concern); the oracle
(crates/oracle/src/interpreter.rs) executes each as
`reference_glue.<module>` and exposes every public function on the
`reference_glue` namespace that Rust calls by name.

Only two things live in the glue: importing reference submodules without
running their packages' ``__init__`` (whose dependency closures conflict and
pull in transformers, opencv, ...), and calls into reference functions. Case
generation, comparison and reporting are Rust.
"""

import importlib.util
import os
import sys
import threading
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
_IMPORT_LOCK = threading.RLock()


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
    """Raw little-endian bytes from Rust as an mx.array of that dtype and
    shape (the bits unchanged)."""
    dtype = mx.bool_ if dtype_name == "bool" else getattr(mx, dtype_name)
    size = dtype.size
    raw = np.frombuffer(data, dtype=_NP_RAW[size]).reshape(shape)
    array = mx.array(raw, dtype=_RAW_VIEW[size])
    return array if dtype == _RAW_VIEW[size] else array.view(dtype)


def from_mx(array):
    """An mx.array back to Rust: its dtype name, shape and raw bytes."""
    mx.eval(array)
    name = str(array.dtype).removeprefix("mlx.core.")
    raw = array.view(_RAW_VIEW[array.dtype.size])
    return name, tuple(array.shape), np.array(raw, copy=False).tobytes()


def is_array(value):
    """Whether a result value is an mx.array (the transfer's dispatch)."""
    return isinstance(value, mx.array)


# --- devices and provenance ----------------------------------------------

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
    if backend == "metal":
        out.update(_macos_versions())
    return out


def _macos_versions():
    """What can change Metal bits between macOS versions: the macOS
    release and the mlx-metal wheel the lock installed for it (one wheel
    per minimum macOS: 14, 15, 26), by its WHEEL tags."""
    import platform
    from importlib import metadata
    out = {"macos": platform.mac_ver()[0] or "unknown"}
    try:
        wheel = metadata.distribution("mlx-metal").read_text("WHEEL") or ""
        tags = [l.split(":", 1)[1].strip() for l in wheel.splitlines() if l.startswith("Tag:")]
        out["mlx_metal_wheel"] = " ".join(tags) or "unknown"
    except metadata.PackageNotFoundError:
        out["mlx_metal_wheel"] = "not installed"
    return out


def environment():
    """The reference's versions and paths (mlx, its libmlx, packages)."""
    return {
        "mlx_version": mx.__version__,
        "gpu_backend": _gpu_backend(),
        "default_device": str(mx.default_device()),
    }
