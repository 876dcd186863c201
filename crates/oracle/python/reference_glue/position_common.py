"""Shared by the position families (crates/conformance/src/families/position/).

References: mlx_vlm.models.rope_utils, mlx_vlm.models.qwen3_5.language
(mlx-vlm 0.7.6), optiq.vlm.gemma4.vision (mlx-optiq 0.7.7)."""

import threading
import types

import mlx.core as mx

from reference_glue.core import _stub_package, load

_POSITION_LOCK = threading.RLock()


def _position_load(name):
    return load(name)


def _position_rope_utils():
    return _position_load("mlx_vlm.models.rope_utils")


def _position_qwen3_5():
    with _POSITION_LOCK:
        _stub_package("mlx_vlm.models.qwen3_vl")
        _stub_package("mlx_vlm.speculative")
        return load("mlx_vlm.models.qwen3_5.language")


def _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section):
    """The Qwen3.5 attention's rotary, built as the attention builds it."""
    language = _position_qwen3_5()
    return language.Qwen3_5RotaryEmbedding(
        int(head_dim * partial_rotary_factor),
        base=rope_theta,
        mrope_section=list(mrope_section),
    )


def _position_apply_on(path, q, k, position_ids, head_dim, partial_rotary_factor, rope_theta,
                       mrope_section):
    """The Qwen3.5 rotary (`_position_rotary`) on the path the case expects,
    applied: `(rotary, q_out, k_out)`. "pure-mlx" on a Metal build (a
    CPU-device run) disables `fused_apply`, which is the reference's own
    choice on a build without Metal."""
    rotary = _position_rotary(head_dim, partial_rotary_factor, rope_theta, mrope_section)
    if path == "pure-mlx" and rotary.fused_apply:
        rotary.fused_apply = False
        rotary._compiled_apply = None
    if _position_path(rotary) != path:
        raise ValueError(f"the reference takes {_position_path(rotary)}, the case expects {path}")
    with _POSITION_LOCK:
        q_out, k_out = rotary.apply_rotary(q, k, position_ids, unsqueeze_dim=1)
    return rotary, q_out, k_out


def _position_path(rotary):
    return "metal-kernel" if rotary.fused_apply else "pure-mlx"


def _position_grids(grids):
    if grids is None:
        return None
    return mx.array(grids, dtype=mx.int32).reshape(-1, 3)


def _position_language_model(body=None):
    """The reference's own `qwen3_5.language.LanguageModel`, created without
    its constructor, which would build the whole transformer (a
    `Qwen3_5Model` from a full `TextConfig`): `nn.Module.__init__`, then
    exactly the attributes `get_rope_index` and `__call__` (with
    `skip_logits=True`) read, set as the constructor sets them:

    - `config`: the real `ModelConfig` with its own defaults (the image,
      video and vision-start token ids) and the real Qwen3.5 `VisionConfig`
      (`spatial_merge_size`); its `text_config` is a stand-in holding only
      the `eos_token_id=None` that `ModelConfig.__post_init__` reads;
    - `model`: `body`, a stand-in for the transformer body (see
      `_RecordingBody`), or None when only `get_rope_index` is called;
    - `_position_ids = None`, `_rope_deltas = None`.

    `args` (the TextConfig) is not set: only the logits head reads it,
    which `skip_logits=True` skips."""
    import mlx.nn as nn
    language = _position_qwen3_5()
    qwen_config = _position_load("mlx_vlm.models.qwen3_5.config")
    config = qwen_config.ModelConfig(
        text_config=types.SimpleNamespace(eos_token_id=None),
        vision_config=qwen_config.VisionConfig(),
        model_type="qwen3_5",
    )
    lm = language.LanguageModel.__new__(language.LanguageModel)
    nn.Module.__init__(lm)
    lm.config = config
    lm.model = body
    lm._position_ids = None
    lm._rope_deltas = None
    return lm
