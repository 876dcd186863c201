"""Real model configurations (crates/conformance/src/families/configs/):
a model directory's config.json read by mlx-vlm's own config classes, the
way `mlx_vlm.utils.load_model` reads it (mlx-vlm 0.7.6), then the layers
built from the result: Qwen3.5's rope index and rotary, Gemma 4's vision
2-D RoPE.

`mlx_vlm.utils` itself imports transformers, which the reference
environment does not carry; its three config lines (the `setdefault`s) and
`update_module_configs` (four lines) are repeated in `_config_model`, and
the cases say so (glue-composed).

The same config as mlx-lm 0.32.2 reads it (`mlx_lm.models.qwen3_5`
`ModelArgs` and `TextModelArgs`, what `mlx_lm.utils.load_model` builds the
text model from) is returned too, for the cases that compare the two
libraries."""

import json
import sys
import types

import mlx.core as mx

from reference_glue.core import _stub_package, load
from reference_glue.position_common import (
    _POSITION_LOCK,
    _position_apply_on,
    _position_grids,
    _position_language_model,
    _position_path,
)


def _config_qwen3_vl_package():
    """mlx-vlm's `qwen3_vl` package with the names its `__init__` exports
    (`LanguageModel`, `Model`, `VisionModel`), its `__init__` not run:
    Qwen3.5's `ModelConfig.__post_init__` renames a quantization block's
    keys with `qwen3_5.qwen3_5.sanitize_key`, and that module imports
    `..qwen3_vl.Model`. Stub: `qwen3_vl.processing_qwen3_vl`, which imports
    transformers (absent from the reference environment) to register a HF
    processor, and is nothing a config reads; an empty module stands in."""
    package = _stub_package("mlx_vlm.models.qwen3_vl")
    if not hasattr(package, "Model"):
        name = "mlx_vlm.models.qwen3_vl.processing_qwen3_vl"
        processing = sys.modules.setdefault(name, types.ModuleType(name))
        package.processing_qwen3_vl = processing
        model = load("mlx_vlm.models.qwen3_vl.qwen3_vl")
        package.LanguageModel, package.Model, package.VisionModel = (
            model.LanguageModel, model.Model, model.VisionModel)


def _config_model(config_text):
    """`load_model`'s config steps: the package's `ModelConfig.from_dict`,
    then each `<name>_config` rebuilt by its own class
    (`update_module_configs`, modules text/vision/audio)."""
    config = json.loads(config_text)
    config.setdefault("text_config", config.pop("llm_config", {}))
    config.setdefault("vision_config", {})
    config.setdefault("audio_config", {})
    with _POSITION_LOCK:
        _stub_package("mlx_vlm.models.qwen3_vl")
        if config.get("model_type") in ("qwen3_5", "qwen3_5_moe"):
            # qwen3_5_moe/config.py imports `..qwen3_5.config` by relative
            # import: the `qwen3_5` package must be the stub, or its
            # `__init__` runs and imports the HF processor (transformers).
            # Without this a MoE config read first in a worker raised
            # ImportError, and passed only after a dense one.
            _stub_package("mlx_vlm.models.qwen3_5")
            _config_qwen3_vl_package()
        module = load(f"mlx_vlm.models.{config['model_type']}.config")
    model_config = module.ModelConfig.from_dict(config)
    for name in ("text", "vision", "audio"):
        attr = f"{name}_config"
        if hasattr(model_config, attr) and config.get(attr) is not None:
            setattr(model_config, attr, getattr(module, f"{name.title()}Config").from_dict(config[attr]))
    return model_config


def config_qwen3_5(config_text):
    """What the text attention and the rope index read from the config:
    `fields` int64 [head_dim, int(head_dim * partial_rotary_factor) (the
    rotary's dims, as Qwen3_5Attention computes them), image_token_id,
    video_token_id, vision_start_token_id, vision spatial_merge_size,
    num_attention_heads, num_key_value_heads, hidden_size,
    num_hidden_layers]; `mrope_section` int64; `floats` [rope_theta,
    partial_rotary_factor] as Python floats; `theta_is_int` int64 [1]."""
    mc = _config_model(config_text)
    tc, rope = mc.text_config, mc.text_config.rope_parameters
    fields = [tc.head_dim, int(tc.head_dim * rope["partial_rotary_factor"]), mc.image_token_id,
              mc.video_token_id, mc.vision_start_token_id, mc.vision_config.spatial_merge_size,
              tc.num_attention_heads, tc.num_key_value_heads, tc.hidden_size, tc.num_hidden_layers]
    return {
        "fields": mx.array(fields, dtype=mx.int64),
        "mrope_section": mx.array(list(rope["mrope_section"]), dtype=mx.int64),
        "floats": [float(rope["rope_theta"]), float(rope["partial_rotary_factor"])],
        "theta_is_int": mx.array([int(isinstance(rope["rope_theta"], int))], dtype=mx.int64),
    }


def config_qwen3_5_mlx_lm(config_text):
    """The same config as mlx-lm reads it: `mlx_lm.models.<model_type>`
    `ModelArgs.from_dict`, then `qwen3_5.TextModelArgs.from_dict(
    args.text_config)` as `Model.__init__` does; what its attention
    (`qwen3_next.Qwen3NextAttention`) builds the rotary from: `fields`
    int64 [head_dim, int(head_dim * partial_rotary_factor)]; `floats`
    [rope_theta, partial_rotary_factor] as Python floats; `rope_type`
    (`rope_scaling`'s type, which `initialize_rope` reads)."""
    config = json.loads(config_text)
    text = load("mlx_lm.models.qwen3_5")
    args = load(f"mlx_lm.models.{config['model_type']}").ModelArgs.from_dict(config)
    tc = text.TextModelArgs.from_dict(args.text_config)
    scaling = tc.rope_scaling or {}
    return {
        "fields": mx.array([tc.head_dim, int(tc.head_dim * tc.partial_rotary_factor)],
                           dtype=mx.int64),
        "floats": [float(tc.rope_theta), float(tc.partial_rotary_factor)],
        "rope_type": str(scaling.get("type") or scaling.get("rope_type", "default")),
    }


def config_quantization_keys(config_text):
    """A quantization block's keys as each library's loader reads them:
    `written` (mlx-lm's `load_model` looks module paths up in
    `config["quantization"]` as the file writes it) and `mlx_vlm` (mlx-vlm's
    `load_model` replaces it with `ModelConfig.quantization`, which Qwen3.5's
    `__post_init__` passes through `sanitize_quantization_config`), in the
    file's order."""
    written = json.loads(config_text).get("quantization") or {}
    return {"written": list(written), "mlx_vlm": list(_config_model(config_text).quantization or {})}


def config_qwen3_5_mrope(config_text, q, k, input_ids, image_grid_thw, video_grid_thw, path):
    """The prompt's positions from `LanguageModel.get_rope_index` with this
    config as the model's `config` (token ids, spatial_merge_size), then
    the text attention's rotary built from this config's text_config, as
    `Qwen3_5Attention.__init__` builds it, applied to q and k."""
    mc = _config_model(config_text)
    tc, rope = mc.text_config, mc.text_config.rope_parameters
    lm = _position_language_model()
    lm.config = mc
    position_ids, deltas = lm.get_rope_index(
        input_ids, _position_grids(image_grid_thw), _position_grids(video_grid_thw), None)
    rotary, q_out, k_out = _position_apply_on(path, q, k, position_ids, tc.head_dim,
                                              rope["partial_rotary_factor"], rope["rope_theta"],
                                              rope["mrope_section"])
    return {"q": q_out, "k": k_out, "position_ids": position_ids, "rope_deltas": deltas,
            "path": _position_path(rotary)}


def config_gemma4_vision(config_text):
    """What the vision attention reads: `fields` int64 [head_dim,
    num_attention_heads, num_key_value_heads, hidden_size, patch_size];
    `floats` [rope_parameters["rope_theta"]] as Python floats."""
    vc = _config_model(config_text).vision_config
    fields = [vc.head_dim, vc.num_attention_heads, vc.num_key_value_heads, vc.hidden_size,
              vc.patch_size]
    return {
        "fields": mx.array(fields, dtype=mx.int64),
        "floats": [float(vc.rope_parameters["rope_theta"])],
    }


def config_gemma4_rope2d(config_text, inputs, positions):
    """`mlx_vlm.models.gemma4.vision.apply_multidimensional_rope(inputs,
    positions, rope_theta)` with the theta `VisionAttention` reads from
    this config."""
    vc = _config_model(config_text).vision_config
    with _POSITION_LOCK:
        vision = load("mlx_vlm.models.gemma4.vision")
    return vision.apply_multidimensional_rope(inputs, positions, vc.rope_parameters["rope_theta"])
