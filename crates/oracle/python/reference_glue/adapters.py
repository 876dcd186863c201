"""LoRA adapter directories (crates/conformance/src/families/quantized/adapters.rs),
written and loaded by each library's own code:

- mlx-lm 0.32.2: `tuner.utils.linear_to_lora_layers` then the trainer's
  save (`mx.save_safetensors` of `model.trainable_parameters()`,
  tuner/trainer.py) and `utils.save_config` (lora.py); loaded by
  `tuner.utils.load_adapters`; fused by `tuner.lora.LoRALinear.fuse`.
- mlx-vlm 0.7.6: `trainer.utils.get_peft_model` (current, or legacy=True)
  then `trainer.utils.save_adapter`; loaded by
  `trainer.utils.apply_lora_layers`; fused by
  `trainer.lora_layers.LoRALinear.fuse`, or for the legacy `LoRaLayer` by
  `trainer.lora.replace_lora_with_linear`. From mlx-vlm 0.7.10 the same
  functions live in `trainer.peft.utils` and `trainer.peft.lora`; the glue
  takes them from wherever the installed version keeps them.

The models are tiny stand-ins with the module tree each library walks:
mlx-lm's `model.layers[i].<key>`, mlx-vlm's
`model.language_model.model.layers[i].<key>` with `model.config`. Loading
calls `model.eval()`, as both libraries' `load` do after the adapters."""

import contextlib
import io
import types
from pathlib import Path

import mlx.core as mx

from reference_glue.checkpoints import _q_utils
from reference_glue.core import load
from reference_glue.quantized import _Q_LOCK


def _a_vlm_peft(module):
    """mlx-vlm's PEFT module `module` ("utils" or "lora"): under
    `mlx_vlm.trainer.peft` from 0.7.10, directly under `mlx_vlm.trainer`
    before (0.7.10's `trainer.utils` is a different, training-loop module).
    Its training code imports `tqdm` (progress bars, not used here); the
    reference environment is installed without dependencies, so an
    import-time stub stands in when tqdm is absent, as
    `checkpoints._q_load_utils` does for the HF hub."""
    import importlib.util
    import os
    import sys
    from reference_glue import core
    if "tqdm" not in sys.modules and importlib.util.find_spec("tqdm") is None:
        class _Tqdm:  # the two uses: wrapping an iterable, and tqdm.write
            def __new__(cls, iterable=None, *a, **k):
                return iterable

            @staticmethod
            def write(*a, **k):
                pass

        stub = types.ModuleType("tqdm")
        stub.tqdm = _Tqdm
        sys.modules["tqdm"] = stub
    peft = os.path.join(core.SITE_PACKAGES, "mlx_vlm", "trainer", "peft", module + ".py")
    return load(f"mlx_vlm.trainer.peft.{module}" if os.path.exists(peft)
                else f"mlx_vlm.trainer.{module}")


def _a_module(model, path):
    node = model
    for p in path.split("."):
        node = node[int(p)] if p.isdigit() else getattr(node, p)
    return node


def _a_tree(blocks, keys, make):
    """`blocks` blocks holding `make(block, key)` at each dotted key."""
    import mlx.nn as nn
    out = []
    for b in range(blocks):
        block = nn.Module()
        for key in keys:
            node = block
            *parents, leaf = key.split(".")
            for p in parents:
                if p not in node:
                    setattr(node, p, nn.Module())
                node = node[p]
            setattr(node, leaf, make(b, key))
        out.append(block)
    return out


def _a_model(library, blocks, keys, make):
    import mlx.nn as nn
    model = nn.Module()
    layers = _a_tree(blocks, keys, make)
    if library == "mlx-lm":
        model.layers = layers
    else:
        model.language_model = nn.Module()
        model.language_model.model = nn.Module()
        model.language_model.model.layers = layers
        model.config = types.SimpleNamespace()
    return model


def _a_prefix(library):
    return "layers" if library == "mlx-lm" else "language_model.model.layers"


def adapters_write(library, directory, blocks, keys, ins, outs, rank, scale, alpha, num_layers,
                   paths, lora_a, lora_b):
    """Writes an adapter directory the way `library` ("mlx-lm", "mlx-vlm",
    "mlx-vlm-legacy") does after training: a float model of `blocks`
    blocks with `nn.Linear(ins[i], outs[i])` at `keys[i]`, converted by the
    library, its adapter matrices set to the trained values `lora_a[j]`,
    `lora_b[j]` of `paths[j]` (the converted modules, which must be
    exactly these), then saved. mlx-lm takes `scale` and `num_layers`;
    mlx-vlm takes `alpha` (its scale is alpha / rank)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    dims = dict(zip(keys, zip(ins, outs, strict=True), strict=True))
    model = _a_model(library, blocks, keys, lambda b, k: nn.Linear(*dims[k], bias=False))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _Q_LOCK:
        utils = _q_utils()
        if library == "mlx-lm":
            tuner = load("mlx_lm.tuner.utils")
            params = {"rank": rank, "scale": scale, "dropout": 0.0, "keys": list(keys)}
            model.freeze()
            tuner.linear_to_lora_layers(model, num_layers, params)
        else:
            vlm = _a_vlm_peft("utils")
            with contextlib.redirect_stdout(io.StringIO()):
                vlm.get_peft_model(model, [k.split(".")[-1] for k in keys], rank=rank, alpha=alpha,
                                   dropout=0.0, verbose=False, legacy=library == "mlx-vlm-legacy")
    a_name, b_name = ("A", "B") if library == "mlx-vlm-legacy" else ("lora_a", "lora_b")
    converted = sorted(k.rsplit(".", 1)[0] for k, _ in tree_flatten(model.trainable_parameters())
                       if k.endswith("." + a_name))
    if converted != sorted(paths):
        raise ValueError(f"the library converted {converted}, the case expects {sorted(paths)}")
    for path, a, b in zip(paths, lora_a, lora_b, strict=True):
        setattr(_a_module(model, path), a_name, a)
        setattr(_a_module(model, path), b_name, b)
    weights = dict(tree_flatten(model.trainable_parameters()))
    if library == "mlx-lm":
        mx.save_safetensors(str(directory / "adapters.safetensors"), weights)
        utils.save_config({"fine_tune_type": "lora", "num_layers": num_layers,
                           "lora_parameters": params}, directory / "adapter_config.json")
    else:
        vlm.save_adapter(model, directory / "adapters.safetensors")


def adapters_apply(library, directory, blocks, keys, weights, scales, biases, group_size, bits,
                   mode, paths, x):
    """Loads the directory into a model whose module at `keys[i]` of every
    block is an `nn.QuantizedLinear` holding `weights[i]`, `scales[i]`,
    `biases[i]` (the same in every block), with the library's loader, then
    `model.eval()`. For each of `paths`: `y` = the adapted module on
    `x[..., :in]`; `y_fused` = the module the library's fuse builds, on the
    same input (None where the fuse raised; `fuse_refused` has the first
    message, "" when every fuse ran)."""
    import mlx.nn as nn

    def make(b, key):
        i = keys.index(key)
        out_dims, packed = weights[i].shape
        layer = nn.QuantizedLinear(packed * 32 // bits, out_dims, bias=False,
                                   group_size=group_size, bits=bits, mode=mode)
        layer.weight, layer.scales = weights[i], scales[i]
        if biases[i] is not None:
            layer.biases = biases[i]
        return layer

    model = _a_model(library, blocks, keys, make)
    with _Q_LOCK:
        if library == "mlx-lm":
            _q_utils()
            load("mlx_lm.tuner.utils").load_adapters(model, str(directory))
        else:
            vlm = _a_vlm_peft("utils")
            with contextlib.redirect_stdout(io.StringIO()):
                vlm.apply_lora_layers(model, str(directory))
    model.eval()
    ys, fused, refused = [], [], ""
    for path in paths:
        m = _a_module(model, path)
        base = m.original_layer if library == "mlx-vlm-legacy" else m.linear
        xi = x[..., : base.weight.shape[-1] * 32 // base.bits]
        ys.append(m(xi))
        try:
            if library == "mlx-vlm-legacy":
                holder = nn.Module()
                holder.layers = [m]
                _a_vlm_peft("lora").replace_lora_with_linear(holder)
                f = holder.layers[0]
            else:
                f = m.fuse()
            fused.append(f(xi))
        except Exception as e:  # the library's own failure, recorded by the case
            refused = refused or f"{type(e).__name__}: {str(e).splitlines()[0]}"
            fused.append(None)
    return {"y": ys, "y_fused": fused, "fuse_refused": refused}
