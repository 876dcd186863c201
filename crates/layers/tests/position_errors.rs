//! Every typed error of `layers::position`, each from the smallest input
//! that produces it.

use layers::position::{
    apply_multidimensional_rope, apply_rope2d, compute_inv_freq, interleaved_position_selector,
    metal_is_available, mrope_kernel_launch, rope2d_tables, rope_index, Backend, GridThw, Mrope,
    MropeConfig, MropePath, PositionError, PositionLayout, RegimeTable, RopeIndex, RopeIndexInput,
    VisionKind, VisionTokens,
};
use mlx_rs::{Array, Dtype};

const TOKENS: VisionTokens = VisionTokens {
    image_token_id: 9,
    video_token_id: 8,
    vision_start_token_id: 7,
    spatial_merge_size: 2,
};

fn config(rotary_dim: usize, mrope_section: &[usize]) -> MropeConfig {
    MropeConfig {
        rotary_dim,
        rope_theta: 100_000.0,
        mrope_section: mrope_section.to_vec(),
        attention_scaling: 1.0,
    }
}

fn qwen() -> Mrope {
    Mrope::new(config(64, &[11, 11, 10])).unwrap()
}

fn zeros(shape: &[i32]) -> Array {
    mlx_rs::ops::zeros_dtype(shape, Dtype::Bfloat16).unwrap()
}

fn positions(shape: &[i32]) -> Array {
    mlx_rs::ops::zeros_dtype(shape, Dtype::Int32).unwrap()
}

fn images(input_ids: &[i32], grids: &[GridThw]) -> Result<RopeIndex, PositionError> {
    rope_index(
        &RopeIndexInput {
            input_ids,
            image_grid_thw: Some(grids),
            ..Default::default()
        },
        &TOKENS,
    )
}

// --- mRoPE configuration -------------------------------------------------

#[test]
fn odd_rotary_dim_is_refused_on_the_kernel_path_only() {
    // The reference's pure-MLX path rotates ceil(63 / 2) = 32 pairs; its
    // kernel leaves an output channel unwritten.
    let rope = Mrope::new(config(63, &[11, 11, 10])).unwrap();
    assert_eq!(rope.config().rotated_channels(), 64);
    assert_eq!(rope.inv_freq().shape(), &[32]);
    let (q, k) = (zeros(&[1, 2, 3, 64]), zeros(&[1, 1, 3, 64]));
    let err = rope
        .apply_with_path(MropePath::MetalKernel, &q, &k, &positions(&[3, 1, 3]))
        .unwrap_err();
    assert!(
        matches!(err, PositionError::OddRotaryDim { rotary_dim: 63 }),
        "{err}"
    );
    let (q_out, _) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &positions(&[3, 1, 3]))
        .unwrap();
    assert_eq!(q_out.shape(), &[1, 2, 3, 64]);
    // 63 rotated channels round up to 64, past a head of 63.
    let err = rope
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[1, 2, 3, 63]),
            &zeros(&[1, 1, 3, 63]),
            &positions(&[3, 1, 3]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::RotaryDimExceedsHeadDim {
                rotary_dim: 64,
                head_dim: 63
            }
        ),
        "{err}"
    );
}

#[test]
fn an_infinite_base_is_accepted_and_nan_or_zero_refused() {
    for base in [f64::INFINITY, 1e39] {
        let inv_freq = compute_inv_freq(8, base).unwrap();
        let values: Vec<f32> = inv_freq.as_slice().to_vec();
        assert_eq!(values, [1.0, 0.0, 0.0, 0.0], "base {base}");
    }
    for base in [f64::NAN, 0.0, -5.0, 1e-50] {
        let err = compute_inv_freq(8, base).unwrap_err();
        assert!(
            matches!(err, PositionError::RopeBase { .. }),
            "{base}: {err}"
        );
    }
}

#[test]
fn mrope_section_too_short() {
    let err = interleaved_position_selector(&[11, 11], 32).unwrap_err();
    assert!(
        matches!(err, PositionError::MropeSectionTooShort { .. }),
        "{err}"
    );
    let err = Mrope::new(config(64, &[11, 11])).unwrap_err();
    assert!(
        matches!(err, PositionError::MropeSectionTooShort { .. }),
        "{err}"
    );
}

#[test]
fn mrope_section_beyond_the_frequencies_is_clipped_as_the_reference_clips() {
    // Qwen3-VL's section against Qwen3.5's rotary_dim 64 (32 frequencies):
    // the reference's selector clips each axis at the frequency count.
    let m = Mrope::new(config(64, &[24, 20, 20])).unwrap();
    let expected = layers::position::interleaved_position_selector(&[24, 20, 20], 32).unwrap();
    assert_eq!(m.position_selector(), expected.as_slice());
    assert!(m.position_selector().iter().all(|&a| a <= 2));
    // The reference's own class default sums below the count: accepted.
    Mrope::new(config(64, &[11, 11, 0])).unwrap();
}

#[test]
fn rotary_dim_exceeds_head_dim() {
    let err = qwen()
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[1, 2, 3, 32]),
            &zeros(&[1, 1, 3, 32]),
            &positions(&[3, 1, 3]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::RotaryDimExceedsHeadDim {
                rotary_dim: 64,
                head_dim: 32
            }
        ),
        "{err}"
    );
}

// --- mRoPE apply -------------------------------------------------------------

#[test]
fn q_or_k_not_rank_four() {
    let err = qwen()
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[2, 3, 64]),
            &zeros(&[1, 1, 3, 64]),
            &positions(&[3, 1, 3]),
        )
        .unwrap_err();
    assert!(
        matches!(err, PositionError::Rank { tensor: "q", .. }),
        "{err}"
    );
}

#[test]
fn position_ids_of_wrong_rank() {
    let rope = qwen();
    let err = rope.frequencies(&positions(&[3])).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::Rank {
                tensor: "position_ids",
                ..
            }
        ),
        "{err}"
    );
    let err = rope
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[1, 2, 3, 64]),
            &zeros(&[1, 1, 3, 64]),
            &positions(&[3]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::Rank {
                tensor: "position_ids",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn q_and_k_are_each_checked_against_the_positions() {
    // k of another length than the positions: the reference's broadcast fails.
    let err = qwen()
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[1, 2, 3, 64]),
            &zeros(&[1, 1, 4, 64]),
            &positions(&[3, 1, 3]),
        )
        .unwrap_err();
    assert!(
        matches!(err, PositionError::PositionIdsShape { tensor: "k", .. }),
        "{err}"
    );
    // Head dims that differ, both past the rotary: computed, as the reference computes.
    let (q_out, k_out) = qwen()
        .apply_with_path(
            MropePath::PureMlx,
            &zeros(&[1, 2, 3, 64]),
            &zeros(&[1, 2, 3, 128]),
            &positions(&[3, 1, 3]),
        )
        .unwrap();
    assert_eq!(
        (q_out.shape(), k_out.shape()),
        (&[1, 2, 3, 64][..], &[1, 2, 3, 128][..])
    );
}

#[test]
fn inputs_the_reference_broadcasts_are_computed_on_the_pure_mlx_path() {
    let rope = qwen();
    let (q, k) = (zeros(&[2, 2, 3, 64]), zeros(&[2, 1, 3, 64]));
    // One position for every token, one row for every batch row, a fourth
    // stream the selector never reads.
    for shape in [&[3, 2, 1][..], &[3, 1, 1], &[1, 1], &[4, 2, 3]] {
        let (q_out, k_out) = rope
            .apply_with_path(MropePath::PureMlx, &q, &k, &positions(shape))
            .unwrap();
        assert_eq!(q_out.shape(), q.shape(), "{shape:?}");
        assert_eq!(k_out.shape(), k.shape(), "{shape:?}");
    }
    // A leading axis before [B, H, L, D].
    let q5 = zeros(&[1, 2, 2, 3, 64]);
    let (q_out, _) = rope
        .apply_with_path(MropePath::PureMlx, &q5, &k, &positions(&[3, 2, 3]))
        .unwrap();
    assert_eq!(q_out.shape(), q5.shape());
    // The reference takes the pure-MLX path for a 5-D q even with Metal.
    assert_eq!(
        Mrope::path_for(&q5, &k, &positions(&[3, 2, 3])).unwrap(),
        MropePath::PureMlx
    );
}

#[test]
fn position_ids_not_fitting_q() {
    let rope = qwen();
    let (q, k) = (zeros(&[2, 2, 3, 64]), zeros(&[2, 1, 3, 64]));
    for bad in [&[3, 2, 4][..], &[2, 2, 3], &[3, 3, 3], &[2, 4]] {
        let err = rope
            .apply_with_path(MropePath::PureMlx, &q, &k, &positions(bad))
            .unwrap_err();
        assert!(
            matches!(err, PositionError::PositionIdsShape { .. }),
            "{bad:?}: {err}"
        );
    }
    // A batch of 1 broadcasts on the pure-MLX path only.
    rope.apply_with_path(MropePath::PureMlx, &q, &k, &positions(&[3, 1, 3]))
        .unwrap();
    let err = rope
        .apply_with_path(MropePath::MetalKernel, &q, &k, &positions(&[3, 1, 3]))
        .unwrap_err();
    assert!(
        matches!(err, PositionError::PositionIdsShape { .. }),
        "{err}"
    );
}

#[test]
fn metal_path_without_metal() {
    let (q, k) = (zeros(&[1, 2, 3, 64]), zeros(&[1, 1, 3, 64]));
    let result = qwen().apply_with_path(MropePath::MetalKernel, &q, &k, &positions(&[3, 1, 3]));
    if metal_is_available().unwrap() {
        // Capability present (Apple CI): the kernel must run.
        let (q_out, k_out) = result.unwrap();
        mlx_rs::transforms::eval([&q_out, &k_out]).unwrap();
    } else {
        let err = result.unwrap_err();
        assert!(matches!(err, PositionError::MetalUnavailable), "{err}");
    }
}

#[test]
fn kernel_grid_overflow() {
    let err = mrope_kernel_launch(&[65_536, 65_536, 1, 64], Dtype::Float32, 32).unwrap_err();
    assert!(matches!(err, PositionError::GridOverflow { .. }), "{err}");
}

#[test]
fn inv_freq_dim_beyond_int32() {
    let err = compute_inv_freq(1 << 40, 10_000.0).unwrap_err();
    assert!(matches!(err, PositionError::Mlx(_)), "{err}");
}

// --- Gemma 2-D RoPE ------------------------------------------------------

#[test]
fn one_dimensional_form_needs_an_even_head_dim() {
    let err = apply_multidimensional_rope(&zeros(&[1, 3, 2, 15]), &positions(&[1, 3]), 100.0)
        .unwrap_err();
    assert!(
        matches!(err, PositionError::OddHeadDim { head_dim: 15 }),
        "{err}"
    );
}

#[test]
fn head_dim_too_small_for_the_axes() {
    let err = apply_multidimensional_rope(&zeros(&[1, 3, 2, 3]), &positions(&[1, 3, 2]), 100.0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::HeadDimTooSmall {
                head_dim: 3,
                axes: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn positions_without_axes() {
    let err = apply_multidimensional_rope(&zeros(&[1, 3, 2, 64]), &positions(&[1, 3, 0]), 100.0)
        .unwrap_err();
    assert!(matches!(err, PositionError::NoPositionAxes), "{err}");
}

#[test]
fn rope2d_shapes() {
    // Other ranks broadcast as the reference's do.
    let out =
        apply_multidimensional_rope(&zeros(&[3, 2, 64]), &positions(&[1, 3, 2]), 100.0).unwrap();
    assert_eq!(out.shape(), &[1, 3, 2, 64]);
    let out = apply_multidimensional_rope(&zeros(&[2, 1, 3, 2, 64]), &positions(&[1, 3, 2]), 100.0)
        .unwrap();
    assert_eq!(out.shape(), &[2, 1, 3, 2, 64]);
    let err = apply_multidimensional_rope(&zeros(&[]), &positions(&[1, 3, 2]), 100.0).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::Rank {
                tensor: "inputs",
                ..
            }
        ),
        "{err}"
    );
    let err = apply_multidimensional_rope(&zeros(&[1, 3, 2, 64]), &positions(&[1, 4, 2]), 100.0)
        .unwrap_err();
    assert!(
        matches!(err, PositionError::PositionIdsShape { .. }),
        "{err}"
    );
    let err = rope2d_tables(&positions(&[3]), 64, 100.0, Dtype::Float32).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::Rank {
                tensor: "positions",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tables_for_another_head_dim() {
    let tables = rope2d_tables(&positions(&[1, 3, 2]), 64, 100.0, Dtype::Bfloat16).unwrap();
    let err = apply_rope2d(&zeros(&[1, 3, 2, 32]), &tables).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::TablesHeadDim {
                tables: 64,
                inputs: 32
            }
        ),
        "{err}"
    );
}

#[test]
fn tables_of_another_batch() {
    // Tables for batch 2 against inputs of batch 3 cannot broadcast.
    let tables = rope2d_tables(&positions(&[2, 3, 2]), 64, 100.0, Dtype::Bfloat16).unwrap();
    let err = apply_rope2d(&zeros(&[3, 3, 2, 64]), &tables).unwrap_err();
    assert!(
        matches!(err, PositionError::PositionIdsShape { .. }),
        "{err}"
    );
}

// --- rope index ----------------------------------------------------------

#[test]
fn zero_merge_size() {
    let tokens = VisionTokens {
        spatial_merge_size: 0,
        ..TOKENS
    };
    let input = [7, 9, 9, 9, 9];
    let err = rope_index(
        &RopeIndexInput {
            input_ids: &input,
            image_grid_thw: Some(&[GridThw::new(1, 4, 4)]),
            ..Default::default()
        },
        &tokens,
    )
    .unwrap_err();
    assert!(matches!(err, PositionError::ZeroMergeSize), "{err}");
}

/// The port's position streams and delta, for comparing with what the
/// reference's `get_rope_index` returned on the same ids (probed on
/// 2026-12-02 with the pinned mlx-vlm 0.7.6, tokens 7/9/8, merge 2).
fn computed(index: &RopeIndex) -> ([Vec<i32>; 3], i32) {
    (index.position_ids().clone(), index.rope_delta())
}

#[test]
fn non_integral_merge_is_floored_as_the_reference_floors() {
    // 5 // 2 = 2: a 2x2 span.
    let index = images(&[7, 9, 9, 9, 9, 1], &[GridThw::new(1, 5, 4)]).unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 1, 1, 1, 3],
                vec![0, 1, 1, 2, 2, 3],
                vec![0, 1, 2, 1, 2, 3]
            ],
            -2
        )
    );
}

#[test]
fn empty_grid() {
    let err = images(&[7, 9, 1], &[GridThw::new(1, 0, 4)]).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::EmptyGrid {
                kind: VisionKind::Image,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn more_spans_than_grids() {
    let input = [7, 9, 9, 9, 9, 7, 9, 9, 9, 9];
    let err = images(&input, &[GridThw::new(1, 4, 4)]).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::MissingGrid {
                kind: VisionKind::Image,
                span_index: 1,
                grids: 1
            }
        ),
        "{err}"
    );
    // A video span with no video grid at all.
    let err = images(&[7, 8, 8, 8, 8], &[]).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::MissingGrid {
                kind: VisionKind::Video,
                grids: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn grids_no_span_consumes_are_ignored() {
    let index = images(&[1, 7, 9, 9, 9, 9], &[GridThw::new(1, 4, 4); 2]).unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 2, 2, 2, 2],
                vec![0, 1, 2, 2, 3, 3],
                vec![0, 1, 2, 3, 2, 3]
            ],
            -2
        )
    );
    // Video frames count after the (t, h, w) -> t x (1, h, w) expansion.
    let index = rope_index(
        &RopeIndexInput {
            input_ids: &[7, 8, 8, 8, 8],
            video_grid_thw: Some(&[GridThw::new(2, 4, 4)]),
            ..Default::default()
        },
        &TOKENS,
    )
    .unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 1, 1, 1],
                vec![0, 1, 1, 2, 2],
                vec![0, 1, 2, 1, 2]
            ],
            -2
        )
    );
}

#[test]
fn a_span_is_the_tokens_its_grid_claims() {
    // The grid claims 6 tokens, the run has 4: the two text tokens after it
    // are positioned as the span's last two.
    let index = images(&[7, 9, 9, 9, 9, 1, 2], &[GridThw::new(1, 4, 6)]).unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 1, 1, 1, 1, 1],
                vec![0, 1, 1, 1, 2, 2, 2],
                vec![0, 1, 2, 3, 1, 2, 3]
            ],
            -3
        )
    );
    // One vision token more than the grid: it gets a text position.
    let index = images(&[7, 9, 9, 9, 9, 9], &[GridThw::new(1, 4, 4)]).unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 1, 1, 1, 3],
                vec![0, 1, 1, 2, 2, 3],
                vec![0, 1, 2, 1, 2, 3]
            ],
            -2
        )
    );
    // A span running past the prompt: its positions past the end count
    // toward the maximum (delta 2).
    let index = images(&[1, 7, 9, 9], &[GridThw::new(1, 8, 8)]).unwrap();
    assert_eq!(
        computed(&index),
        ([vec![0, 1, 2, 2], vec![0, 1, 2, 2], vec![0, 1, 2, 3]], 2)
    );
    // A lone vision token after the span: a text position.
    let index = images(&[7, 9, 9, 9, 9, 1, 9], &[GridThw::new(1, 4, 4)]).unwrap();
    assert_eq!(
        computed(&index),
        (
            [
                vec![0, 1, 1, 1, 1, 3, 4],
                vec![0, 1, 1, 2, 2, 3, 4],
                vec![0, 1, 2, 1, 2, 3, 4]
            ],
            -2
        )
    );
}

#[test]
fn vision_token_not_found() {
    // With image and video sharing one token id, each span is counted
    // twice; the second search finds nothing (the reference's `list.index`
    // raises ValueError).
    let tokens = VisionTokens {
        video_token_id: 9,
        ..TOKENS
    };
    let err = rope_index(
        &RopeIndexInput {
            input_ids: &[7, 9],
            image_grid_thw: Some(&[GridThw::new(1, 2, 2)]),
            video_grid_thw: Some(&[GridThw::new(1, 2, 2)]),
            ..Default::default()
        },
        &tokens,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::VisionTokenNotFound {
                kind: VisionKind::Image,
                from: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn mask_of_another_length() {
    let err = rope_index(
        &RopeIndexInput {
            input_ids: &[1, 2, 3],
            attention_mask: Some(&[true, true]),
            ..Default::default()
        },
        &TOKENS,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::MaskLength {
                mask: 2,
                input_ids: 3
            }
        ),
        "{err}"
    );
}

#[test]
fn streams_of_different_lengths() {
    let err = RopeIndex::from_parts(
        [vec![0, 1], vec![0, 1], vec![0]],
        0,
        PositionLayout::Multimodal,
    )
    .unwrap_err();
    assert!(
        matches!(err, PositionError::StreamLengths { lengths: [2, 2, 1] }),
        "{err}"
    );
}

#[test]
fn overflowing_positions() {
    let state = RopeIndex::from_parts(
        [vec![0], vec![0], vec![0]],
        i32::MAX,
        PositionLayout::Multimodal,
    )
    .unwrap();
    let err = state.window(0, 3).unwrap_err();
    assert!(
        matches!(err, PositionError::PositionOverflow { index: 1 }),
        "{err}"
    );
    let err = state.window(usize::MAX, 1).unwrap_err();
    assert!(
        matches!(err, PositionError::PositionOverflow { .. }),
        "{err}"
    );
}

#[test]
fn negative_positions_are_kept_as_the_reference_keeps_them() {
    // `arange(L) + offset + rope_deltas` with a caller's delta of -5.
    let state =
        RopeIndex::from_parts([vec![0], vec![0], vec![0]], -5, PositionLayout::Multimodal).unwrap();
    assert_eq!(state.window(1, 2).unwrap()[0], vec![-4, -3]);
}

// --- append chunk sizing -------------------------------------------------

#[test]
fn regime_boundaries_not_increasing() {
    for bad in [vec![8, 8], vec![16, 4], vec![0, 4]] {
        let err = RegimeTable::from_measured(Backend::Cpu, bad.clone()).unwrap_err();
        assert!(
            matches!(err, PositionError::RegimeBoundaries { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn absurd_sizes_are_refused_before_allocating() {
    // Before: a window of usize::MAX tokens aborted on allocation, and a
    // video grid with a huge temporal size aborted while expanding frames.
    let text = rope_index(
        &RopeIndexInput {
            input_ids: &[1, 2, 3],
            ..Default::default()
        },
        &TOKENS,
    )
    .unwrap();
    for len in [usize::MAX, layers::position::MAX_WINDOW + 1] {
        let err = text.window(0, len).unwrap_err();
        assert!(matches!(err, PositionError::WindowTooLong { .. }), "{err}");
        assert!(text.window_position_ids(5, len).is_err());
    }
    assert_eq!(layers::position::MAX_WINDOW, i32::MAX as usize);
    assert_eq!(text.window(0, 4).unwrap()[0], vec![0, 1, 2, 3]);
    // A video grid of 2^40 frames (or usize::MAX) allocates nothing: only
    // frames a span can consume are expanded, and the reference ignores
    // the rest.
    for t in [usize::MAX, 1 << 40] {
        let grids = [GridThw::new(t, 2, 2)];
        let index = rope_index(
            &RopeIndexInput {
                input_ids: &[1, 7, 8, 2],
                video_grid_thw: Some(&grids),
                ..Default::default()
            },
            &TOKENS,
        )
        .unwrap();
        assert_eq!(
            computed(&index),
            ([vec![0, 1, 2, 3], vec![0, 1, 2, 3], vec![0, 1, 2, 3]], 0)
        );
    }
}
