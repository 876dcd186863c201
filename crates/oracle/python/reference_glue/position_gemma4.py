"""The 2D RoPE family (crates/conformance/src/families/position/rope2d.rs):
mlx-optiq 0.7.7's Gemma 4 vision `apply_multidimensional_rope`."""

from reference_glue.position_common import _position_load


def position_rope2d(inputs, positions, base_frequency):
    """optiq.vlm.gemma4.vision.apply_multidimensional_rope."""
    vision = _position_load("optiq.vlm.gemma4.vision")
    return vision.apply_multidimensional_rope(inputs, positions, base_frequency)
