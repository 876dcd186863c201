"""The rope-index family (crates/conformance/src/families/position/rope_index.rs):
Qwen3.5's `LanguageModel.get_rope_index` on a prompt, and the decode
positions `LanguageModel.__call__` computes after it (mlx-vlm 0.7.6,
qwen3_5/language.py)."""

import mlx.core as mx

from reference_glue.core import load
from reference_glue.position_common import _position_grids, _position_language_model


def _position_mask(attention_mask):
    """An all-ones mask stands for None (not passed)."""
    return None if bool(mx.all(attention_mask == 1).item()) else attention_mask


def position_rope_index(attention_mask, input_ids, image_grid_thw, video_grid_thw):
    """LanguageModel.get_rope_index(input_ids, image_grid_thw,
    video_grid_thw, attention_mask) on the reference's own LanguageModel
    (`_position_language_model`: built without its transformer body, which
    get_rope_index does not read). An all-ones mask stands for None (not
    passed). Grids are lists of [t, h, w] or None."""
    position_ids, deltas = _position_language_model().get_rope_index(
        input_ids, _position_grids(image_grid_thw), _position_grids(video_grid_thw),
        _position_mask(attention_mask))
    return {"position_ids": position_ids, "rope_deltas": deltas}


class _RecordingBody:
    """Stands in for `LanguageModel.model`, the transformer body (a
    `Qwen3_5Model`), whose layers the positions do not depend on: the
    positions are decided by `LanguageModel.__call__` before it calls the
    body. It has the body's call signature and `fa_idx` (the index of the
    full-attention layer's cache in the cache list: 0, the one KVCache the
    glue passes); a call records the `position_ids` it is given and returns
    a zeros hidden state [B, L, 1]."""

    fa_idx = 0

    def __init__(self):
        self.position_ids = []

    def __call__(self, inputs, inputs_embeds=None, mask=None, cache=None, position_ids=None,
                 capture_layer_ids=None, hidden_sink=None):
        self.position_ids.append(position_ids)
        return mx.zeros((*inputs.shape, 1))


def _position_call(lm, body, inputs, cache, **kwargs):
    """`lm(inputs, cache=cache, skip_logits=True, **kwargs)`: the
    position_ids it handed to the body."""
    before = len(body.position_ids)
    lm(inputs, cache=cache, skip_logits=True, **kwargs)
    if len(body.position_ids) != before + 1:
        raise ValueError("LanguageModel.__call__ did not call self.model once (another "
                         "path, e.g. _batch_invariant_decode, took the call)")
    return body.position_ids[-1]


def _position_same(a, b):
    return (a.shape == b.shape and a.dtype == b.dtype
            and bool(mx.array_equal(a, b).item()))


def position_rope_decode(attention_mask, input_ids, image_grid_thw, video_grid_thw,
                         cache_offset, length):
    """The reference's own `LanguageModel.__call__` (mlx-vlm 0.7.6
    qwen3_5/language.py) decides the decode positions; the glue only
    records them. Stubbed: the transformer body, `_RecordingBody` (its
    layers do not decide positions, and building it needs a full
    TextConfig), and the config's `text_config` (see
    `_position_language_model`). The LanguageModel is called with
    `skip_logits=True` and `cache=[kv]`, a real `mlx_lm.models.cache.KVCache`:

    1. prefill: `input_ids`, the grids and `attention_mask` (an all-ones
       mask stands for None) at cache offset 0: the reference computes
       `get_rope_index` itself and keeps `_position_ids` / `_rope_deltas`
       (zero deltas for text-only prompts, by its own code);
    2. decode: the KVCache's `offset` set to `cache_offset` (the cache's
       state after the prompt and any earlier decode steps, which the
       stand-in body does not append; at offset 0 the reference would take
       the call for a new prompt), then `length` token ids (zeros
       [B, length] int32; positions do not depend on them).

    Returns `position_ids` and `rope_deltas` of `get_rope_index` on the
    prompt (`position_rope_index`), and `decode_position_ids`, what step 2
    handed to the body. The prefill's recorded positions must equal
    `position_ids`; a difference raises (a finding about the reference)."""
    index = position_rope_index(attention_mask, input_ids, image_grid_thw, video_grid_thw)
    kv = load("mlx_lm.models.cache").KVCache()
    body = _RecordingBody()
    lm = _position_language_model(body)
    prefill = _position_call(
        lm, body, input_ids, [kv],
        image_grid_thw=_position_grids(image_grid_thw),
        video_grid_thw=_position_grids(video_grid_thw),
        attention_mask=_position_mask(attention_mask))
    if not _position_same(prefill, index["position_ids"]):
        raise ValueError("LanguageModel.__call__'s prefill positions differ from "
                         "get_rope_index on the same prompt")
    kv.offset = cache_offset
    decode_ids = mx.zeros((input_ids.shape[0], length), dtype=mx.int32)
    index["decode_position_ids"] = _position_call(lm, body, decode_ids, [kv])
    return index
