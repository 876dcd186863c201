"""Importing a reference package's submodules without its package __init__,
for a candidate that calls the reference's own code (docs/src/guide/candidate.md,
"Calling a reference package").

The reference environment installs mlx-lm, mlx-vlm and mlx-optiq with
--no-deps, so a plain `import mlx_vlm` runs mlx_vlm/__init__.py and fails
(`ModuleNotFoundError: No module named 'requests'`; `import mlx_lm`:
`No module named 'huggingface_hub'`). The oracle's glue
(crates/oracle/python/reference_glue/core.py) imports the submodules it calls
the same way as here: every package above the submodule is an empty module
whose __path__ is the installed directory, so relative imports resolve while
no __init__.py runs.

    from reference_import import load, stub_package
    rope_utils = load("mlx_vlm.models.rope_utils")      # MRoPERotaryEmbedding, ...
    stub_package("mlx_vlm.models.qwen3_vl")             # siblings whose __init__
    stub_package("mlx_vlm.speculative")                 # needs transformers
    language = load("mlx_vlm.models.qwen3_5.language")  # Qwen3_5RotaryEmbedding, ...
"""

import os
import sys
import types

import mlx.core as mx

# The site-packages holding mlx and the reference packages.
SITE = os.path.dirname(os.path.dirname(mx.__file__))


def stub_package(name):
    """An empty package `name` whose __path__ is the installed directory:
    its submodules import, its __init__.py never runs."""
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(SITE, *name.split("."))]
        sys.modules[name] = module
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(stub_package(parent), child, module)
    return sys.modules[name]


def load(name):
    """Submodule `name` (one .py file), every package above it stubbed."""
    if name not in sys.modules:
        import importlib.util

        parent, child = name.rsplit(".", 1)
        package = stub_package(parent)
        path = os.path.join(package.__path__[0], child + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(package, child, module)
    return sys.modules[name]


if __name__ == "__main__":
    # A check: python candidates/python/reference_import.py
    rope_utils = load("mlx_vlm.models.rope_utils")
    stub_package("mlx_vlm.models.qwen3_vl")
    stub_package("mlx_vlm.speculative")
    language = load("mlx_vlm.models.qwen3_5.language")
    vision = load("optiq.vlm.gemma4.vision")
    print(rope_utils.MRoPERotaryEmbedding, language.Qwen3_5RotaryEmbedding,
          vision.apply_multidimensional_rope)
