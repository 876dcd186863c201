"""The whole Qwen3.5 text decoder (crates/conformance/src/families/model/):
mlx-vlm 0.7.6's own `qwen3_5` / `qwen3_5_moe` model (`Model`, its
`sanitize`, `LanguageModel.__call__`, `make_cache`) on a checkpoint
directory.

`mlx_vlm.utils` imports transformers and requests, which the reference
environment does not carry, so `load_model`'s steps are composed here
(glue-composed, the cases say so): `mx.load` of each safetensors file,
`Model(ModelConfig)` from the config as `_config_model` reads it,
`Model.sanitize`, the vision tower dropped when the checkpoint has no
weights for it (`_drop_modules_without_weights`), `nn.quantize` with
load_model's class predicate (a per-path dict of `config["quantization"]`,
else quantized iff `<path>.scales` is in the checkpoint and the weight size
is a multiple of 64), `load_weights(strict=True)`.

Intermediates are captured from the reference's own modules by wrappers
that call the wrapped module or function and keep its output (nothing
computed differently).
"""

import glob
import json
import os
import threading

import mlx.core as mx

from reference_glue.configs import _config_model, _config_qwen3_vl_package
from reference_glue.core import _stub_package, load

_MODEL_LOCK = threading.RLock()


def _model_packages(model_type):
    with _MODEL_LOCK:
        _stub_package("mlx_vlm.models.qwen3_vl")
        _stub_package("mlx_vlm.speculative")
        _stub_package("mlx_vlm.models.qwen3_5")
        _stub_package(f"mlx_vlm.models.{model_type}")
        _config_qwen3_vl_package()
        dense = _stub_package("mlx_vlm.models.qwen3_5")
        if not hasattr(dense, "Model"):
            # What the package's __init__ exports, which qwen3_5_moe imports.
            dense.Model = load("mlx_vlm.models.qwen3_5.qwen3_5").Model
        return load(f"mlx_vlm.models.{model_type}.{model_type}")


def _model_build(directory):
    """`load_model(directory)`'s steps (see the module docstring)."""
    with open(os.path.join(directory, "config.json")) as f:
        config_text = f.read()
    config = json.loads(config_text)
    module = _model_packages(config["model_type"])
    model = module.Model(_config_model(config_text))
    return _model_weights(model, directory, config)


def _model_build_lm(directory):
    """mlx-lm 0.32.2's `load_model(directory)` steps for the same
    checkpoint: `mlx_lm.models.<model_type>`'s `ModelArgs.from_dict` and
    `Model`, then the same weight steps (its own `sanitize`)."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    module = load(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    return _model_weights(model, directory, config)


def _model_weights(model, directory, config):
    """`load_model`'s weight steps, as mlx-vlm and mlx-lm both take them:
    `mx.load` of every shard, `model.sanitize`, `nn.quantize` with the
    class predicate of the config's `quantization`, `load_weights(strict)`."""
    import mlx.nn as nn
    weights = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        weights.update(mx.load(path))
    weights = model.sanitize(weights)
    if hasattr(model, "vision_tower") and not any(k.startswith("vision_tower.") for k in weights):
        model.vision_tower = None
    quantization = config.get("quantization")
    if quantization is not None:
        def predicate(p, m):
            entry = quantization.get(p)
            if isinstance(entry, dict):
                return entry
            if not hasattr(m, "to_quantized"):
                return False
            if hasattr(m, "weight") and m.weight.size % 64 != 0:
                return False
            return f"{p}.scales" in weights
        nn.quantize(model, group_size=quantization["group_size"], bits=quantization["bits"],
                    mode=quantization.get("mode", "affine"), class_predicate=predicate)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model


class _Capture:
    """Wraps module attributes and module-level functions of the reference
    so that each call's output is kept under a point name."""

    def __init__(self):
        self.points = []
        self._undo = []

    def keep(self, name, value):
        self.points.append((name, value))

    def wrap_module(self, owner, attr, name):
        """Swaps the instance's class for a subclass whose `__call__` calls
        the class's own and keeps the output (attributes unchanged)."""
        module = getattr(owner, attr)
        cls = module.__class__
        capture = self

        def __call__(inner_self, *args, **kwargs):
            out = cls.__call__(inner_self, *args, **kwargs)
            capture.keep(name, out)
            return out

        module.__class__ = type("Kept" + cls.__name__, (cls,), {"__call__": __call__})
        self._undo.append(lambda: setattr(module, "__class__", cls))

    def wrap_method(self, owner, attr, name):
        inner = getattr(owner, attr)

        def kept(*args, **kwargs):
            out = inner(*args, **kwargs)
            self.keep(name, out)
            return out

        setattr(owner, attr, kept)
        self._undo.append(lambda: delattr(owner, attr))

    def undo(self):
        for f in reversed(self._undo):
            f()
        self._undo = []


def _instrument(model, capture):
    """Capture points named as the port's trace names them
    (`layers.{i}.{op}`)."""
    language = load("mlx_vlm.models.qwen3_5.language")
    lm = model.language_model
    capture.wrap_module(lm.model, "embed_tokens", "embed")
    for i, layer in enumerate(lm.model.layers):
        at = f"layers.{i}"
        capture.wrap_module(layer, "input_layernorm", f"{at}.input_norm")
        if layer.is_linear:
            m = layer.linear_attn
            for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
                capture.wrap_module(m, p, f"{at}.{p}")
            capture.wrap_module(m, "conv1d", f"{at}.conv")
            capture.wrap_method(m, "_causal_conv1d_decode", f"{at}.conv")
            capture.wrap_module(m, "norm", f"{at}.gated_norm")
            capture.wrap_module(layer, "linear_attn", f"{at}.mixer")
        else:
            m = layer.self_attn
            for p in ("q_proj", "k_proj", "v_proj"):
                capture.wrap_module(m, p, f"{at}.{p}")
            capture.wrap_module(layer, "self_attn", f"{at}.mixer")
        capture.wrap_module(layer, "mlp", f"{at}.mlp")
    capture.wrap_module(lm.model, "norm", "final_norm")
    # The recurrence and SDPA are module-level functions of language.py.
    layer_of = {}
    gdu, sdpa = language.gated_delta_update, language.scaled_dot_product_attention

    def gated_delta_update(*args, **kwargs):
        out = gdu(*args, **kwargs)
        n = layer_of.setdefault("linear", 0)
        capture.keep(("recurrence", n), out[0])
        layer_of["linear"] = n + 1
        return out

    def scaled_dot_product_attention(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        cache = kwargs.get("cache")
        capture.keep(("attention", None), out)
        if cache is not None and getattr(cache, "keys", None) is not None:
            capture.keep(("kv_layout", None),
                         mx.array([cache.offset, cache.keys.shape[2]], dtype=mx.int32))
        return out

    language.gated_delta_update = gated_delta_update
    language.scaled_dot_product_attention = scaled_dot_product_attention
    capture._undo.append(lambda: setattr(language, "gated_delta_update", gdu))
    capture._undo.append(lambda: setattr(language, "scaled_dot_product_attention", sdpa))
    return layer_of


def _named(points, model, layer_of):
    """Function-level captures get the layer whose module call they fell in."""
    layers = model.language_model.model.layers
    linear_ids = [i for i, l in enumerate(layers) if l.is_linear]
    full_ids = [i for i, l in enumerate(layers) if not l.is_linear]
    out, full_n, kv_n = {}, 0, 0
    for name, value in points:
        if isinstance(name, tuple):
            kind, n = name
            if kind == "recurrence":
                name = f"layers.{linear_ids[n % len(linear_ids)]}.recurrence"
            elif kind == "attention":
                name = f"layers.{full_ids[full_n % len(full_ids)]}.attention"
                full_n += 1
            else:
                name = f"layers.{full_ids[kv_n % len(full_ids)]}.kv_layout"
                kv_n += 1
        out.setdefault(name, value)
    return out


def model_generate(directory, prompt, steps, chunk, trace_step):
    """Greedy generation with the reference's own model and caches:
    `prompt` int32 [1, P] prefilled in chunks of `chunk` tokens (the whole
    prompt at once when `chunk` is 0 or >= P), then `steps` single-token
    decode steps, each feeding the argmax of the previous logits.
    Returns `prefill` (logits of every prompt position, [P, vocab], the
    chunks' logits concatenated), `decode` ([steps, vocab]), `tokens`
    (int32 [steps + 1]: the first greedy token and every decode step's),
    `kv_layout` (int32 [full-attention layers, 2]: each KVCache's offset
    and allocated rows at the end), and `trace`: the intermediates of call `trace_step` (0 = the first
    prefill chunk, then one per later call) as {point: array}, or None
    when `trace_step` is negative."""
    with _MODEL_LOCK:
        model = _model_build(directory)
        lm = model.language_model
        cache = lm.make_cache()
        P = prompt.shape[1]
        chunk = P if chunk <= 0 else min(chunk, P)
        calls = [prompt[:, s:s + chunk] for s in range(0, P, chunk)]
        prefill, decode, tokens, trace = [], [], [], None
        call = 0

        def run(inputs):
            nonlocal call, trace
            capture = None
            if call == trace_step:
                capture = _Capture()
                layer_of = _instrument(model, capture)
            try:
                logits = lm(inputs, cache=cache).logits
                mx.eval(logits, [c.state for c in cache])
            finally:
                if capture is not None:
                    capture.undo()
            if capture is not None:
                trace = _named(capture.points, model, layer_of)
                trace["logits"] = logits
            call += 1
            return logits

        for inputs in calls:
            prefill.append(run(inputs)[0])
        token = mx.argmax(prefill[-1][-1], axis=-1).astype(mx.int32)
        tokens.append(token)
        for _ in range(steps):
            logits = run(token.reshape(1, 1))
            decode.append(logits[0, -1])
            token = mx.argmax(logits[0, -1], axis=-1).astype(mx.int32)
            tokens.append(token)
        layout = [[c.offset, c.keys.shape[2]] for c in cache if hasattr(c, "keys")]
        return {
            "kv_layout": mx.array(layout, dtype=mx.int32),
            "prefill": mx.concatenate(prefill, axis=0),
            "decode": mx.stack(decode) if decode else mx.zeros((0, 1)),
            "tokens": mx.stack(tokens),
            "trace": trace,
        }


def model_bench(directory, prompt, ks, iterations):
    """Seconds of the reference's own model, built as `model_generate`
    builds it, one mx.eval per call, each the best of `iterations` runs
    after one warm-up: `prefill`, the prompt (int32 [1, P]) in one call on
    a fresh cache; `decode`, one single-token step after the prompt; and
    for each k of `ks`, after the prompt: `block_k`, one call of k tokens
    (the model's own path for a block of drafts), `steps_k`, k single-token
    steps. The fed tokens are the prompt's first ones (timing does not
    depend on the ids)."""
    import time

    with _MODEL_LOCK:
        model = _model_build(directory)
        lm = model.language_model

        def call(inputs, cache):
            logits = lm(inputs, cache=cache).logits
            mx.eval(logits, [c.state for c in cache])

        def prefilled():
            cache = lm.make_cache()
            call(prompt, cache)
            return cache

        def best(setup, timed):
            out = float("inf")
            for i in range(iterations + 1):
                state = setup()
                start = time.perf_counter()
                timed(state)
                if i > 0:
                    out = min(out, time.perf_counter() - start)
            return out

        result = {
            "prefill": best(lm.make_cache, lambda cache: call(prompt, cache)),
            "decode": best(prefilled, lambda cache: call(prompt[:, :1], cache)),
        }
        for k in ks:
            drafts = prompt[:, :k]
            result[f"block_{k}"] = best(prefilled, lambda cache: call(drafts, cache))
            result[f"steps_{k}"] = best(
                prefilled, lambda cache: [call(drafts[:, j:j + 1], cache) for j in range(k)])
        return result


def model_generate_lm(directory, prompt, steps, chunk):
    """`model_generate` with mlx-lm 0.32.2's own model of the checkpoint's
    `model_type` (`mlx_lm.models.qwen3_5` / `qwen3_5_moe`, its
    `make_cache()`): the same greedy loop; returns `prefill`, `decode` and
    `tokens` as `model_generate` does. mlx-lm's `QuantizedSwitchLinear`
    passes `global_scale=None` to an mx.gather_qmm that has no such
    argument (the `quantized/switch/.../as-pinned` finding), so the MoE runs
    with that keyword dropped, as the switch cases run it."""
    from reference_glue.quantized import _QNoGlobalScale

    with _MODEL_LOCK, _QNoGlobalScale():
        model = _model_build_lm(directory)
        cache = model.make_cache()
        P = prompt.shape[1]
        chunk = P if chunk <= 0 else min(chunk, P)
        prefill, decode, tokens = [], [], []

        def run(inputs):
            logits = model(inputs, cache=cache)
            mx.eval(logits, [c.state for c in cache])
            return logits

        for s in range(0, P, chunk):
            prefill.append(run(prompt[:, s:s + chunk])[0])
        token = mx.argmax(prefill[-1][-1], axis=-1).astype(mx.int32)
        tokens.append(token)
        for _ in range(steps):
            logits = run(token.reshape(1, 1))
            decode.append(logits[0, -1])
            token = mx.argmax(logits[0, -1], axis=-1).astype(mx.int32)
            tokens.append(token)
        return {
            "prefill": mx.concatenate(prefill, axis=0),
            "decode": mx.stack(decode) if decode else mx.zeros((0, 1)),
            "tokens": mx.stack(tokens),
        }


def model_generate_batch(directory, prompt, steps):
    """Greedy generation of B requests of equal length at once with
    mlx-vlm's own model and caches: `prompt` int32 [B, P] in one prefill
    call, then `steps` single-token steps of all B rows (each row fed its
    own argmax). Returns `prefill` [B, P, vocab], `decode` [B, steps,
    vocab] and `tokens` int32 [B, steps + 1]."""
    with _MODEL_LOCK:
        model = _model_build(directory)
        lm = model.language_model
        cache = lm.make_cache()

        def run(inputs):
            logits = lm(inputs, cache=cache).logits
            mx.eval(logits, [c.state for c in cache])
            return logits

        prefill = run(prompt)
        token = mx.argmax(prefill[:, -1], axis=-1).astype(mx.int32)
        tokens, decode = [token], []
        for _ in range(steps):
            logits = run(token.reshape(-1, 1))
            decode.append(logits[:, -1])
            token = mx.argmax(logits[:, -1], axis=-1).astype(mx.int32)
            tokens.append(token)
        return {
            "prefill": prefill,
            "decode": mx.stack(decode, axis=1) if decode else mx.zeros((prompt.shape[0], 0, 1)),
            "tokens": mx.stack(tokens, axis=1),
        }
