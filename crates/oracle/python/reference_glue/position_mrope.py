"""The mRoPE family (crates/conformance/src/families/position/mrope.rs):
Qwen3.5's `MRoPERotaryEmbedding` (mlx-vlm 0.7.6 rope_utils, as the
qwen3_5 attention builds it) on prompts and decode steps, and the
rope_utils helpers it is built from."""

import mlx.core as mx

from reference_glue.position_common import (
    _position_apply_on,
    _position_path,
    _position_rope_utils,
    _position_rotary,
)
from reference_glue.position_index import position_rope_decode, position_rope_index


def position_mrope_apply(q, k, position_ids, head_dim, partial_rotary_factor, rope_theta,
                         mrope_section, path):
    """MRoPERotaryEmbedding.apply_rotary(q, k, position_ids) on the path the
    reference takes; `path` is the one the case expects. "pure-mlx" on a
    Metal build (a CPU-device run) disables `fused_apply`, which is the
    reference's own choice on a build without Metal."""
    rotary, q_out, k_out = _position_apply_on(path, q, k, position_ids, head_dim,
                                              partial_rotary_factor, rope_theta, mrope_section)
    return {
        "q": q_out,
        "k": k_out,
        "path": _position_path(rotary),
        "inv_freq": rotary.inv_freq,
        "position_selector": rotary.position_selector,
    }


def position_inv_freq(dims, base):
    """compute_inv_freq(dim, base) for every dim of the list `dims`,
    concatenated."""
    ru = _position_rope_utils()
    return mx.concatenate([ru.compute_inv_freq(d, base) for d in dims])


def position_selectors(freq_dims, sections):
    """_interleaved_position_selector(section, freq_dim) for each pair of
    `freq_dims` and `sections`, concatenated."""
    ru = _position_rope_utils()
    return mx.concatenate([ru._interleaved_position_selector(list(s), f)
                           for f, s in zip(freq_dims, sections, strict=True)])


def position_mrope_decode(q, k, input_ids, image_grid_thw, video_grid_thw, cache_offset,
                          head_dim, partial_rotary_factor, rope_theta, mrope_section, path):
    """Decode step after a prompt: rope index of the prompt, the decode
    positions at `cache_offset` as `LanguageModel.__call__` decides them
    (`position_rope_decode`), then the rotary apply."""
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
