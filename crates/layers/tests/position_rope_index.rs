//! Rope index (`get_rope_index`, mlx-vlm 0.7.6 `qwen3_5/language.py`) on
//! worked examples. Every expected position list below was produced by
//! running the pinned reference on the same token ids and grids (vision
//! start 7, image 9, video 8, spatial merge 2).

use layers::position::{
    rope_index, GridThw, PositionError, PositionLayout, RopeIndex, RopeIndexInput, VisionKind,
    VisionTokens,
};

const TOKENS: VisionTokens = VisionTokens {
    image_token_id: 9,
    video_token_id: 8,
    vision_start_token_id: 7,
    spatial_merge_size: 2,
};

fn ids(parts: &[&[i32]]) -> Vec<i32> {
    parts.concat()
}

fn index(
    input_ids: &[i32],
    images: Option<&[GridThw]>,
    videos: Option<&[GridThw]>,
    mask: Option<&[bool]>,
) -> Result<RopeIndex, PositionError> {
    rope_index(
        &RopeIndexInput {
            input_ids,
            image_grid_thw: images,
            video_grid_thw: videos,
            attention_mask: mask,
        },
        &TOKENS,
    )
}

fn assert_index(got: &RopeIndex, expected: [&[i32]; 3], delta: i32) {
    for (axis, (stream, want)) in got.position_ids().iter().zip(expected).enumerate() {
        assert_eq!(stream, want, "axis {axis}");
    }
    assert_eq!(got.rope_delta(), delta);
}

const G144: GridThw = GridThw::new(1, 4, 4);
const G146: GridThw = GridThw::new(1, 4, 6);

#[test]
fn one_image() {
    let input = ids(&[&[1, 2, 7], &[9; 6], &[3, 4]]);
    let got = index(&input, Some(&[G146]), None, None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
            &[0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
            &[0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
        ],
        -3,
    );
    assert_eq!(got.layout(), PositionLayout::Multimodal);
    assert_eq!(got.decode_delta(), -3);
}

#[test]
fn two_images_with_text_between_and_after() {
    let input = ids(&[&[1, 7], &[9; 4], &[5, 6, 7], &[9; 6], &[3]]);
    let got = index(&input, Some(&[G144, G146]), None, None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 2, 2, 2, 4, 5, 6, 7, 7, 7, 7, 7, 7, 10],
            &[0, 1, 2, 2, 3, 3, 4, 5, 6, 7, 7, 7, 8, 8, 8, 10],
            &[0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 7, 8, 9, 10],
        ],
        -5,
    );
}

#[test]
fn image_then_two_frame_video() {
    // The video grid (2, 4, 4) is split into two frames (1, 4, 4), each with
    // its own vision_start; the temporal index restarts in each frame.
    let input = ids(&[&[1, 7], &[9; 4], &[2, 7], &[8; 4], &[3, 7], &[8; 4], &[4]]);
    let got = index(&input, Some(&[G144]), Some(&[GridThw::new(2, 4, 4)]), None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 2, 2, 2, 4, 5, 6, 6, 6, 6, 8, 9, 10, 10, 10, 10, 12],
            &[0, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 9, 10, 10, 11, 11, 12],
            &[0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10, 11, 10, 11, 12],
        ],
        -6,
    );
}

#[test]
fn video_before_image_is_taken_first() {
    let input = ids(&[&[7], &[8; 6], &[7], &[9; 4], &[5]]);
    let got = index(&input, Some(&[G144]), Some(&[G146]), None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 1, 1, 1, 1, 1, 4, 5, 5, 5, 5, 7],
            &[0, 1, 1, 1, 2, 2, 2, 4, 5, 5, 6, 6, 7],
            &[0, 1, 2, 3, 1, 2, 3, 4, 5, 6, 5, 6, 7],
        ],
        -5,
    );
}

#[test]
fn image_with_two_temporal_patches() {
    let input = ids(&[&[1, 7], &[9; 8], &[3, 4]]);
    let got = index(&input, Some(&[GridThw::new(2, 4, 4)]), None, None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 5],
            &[0, 1, 2, 2, 3, 3, 2, 2, 3, 3, 4, 5],
            &[0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5],
        ],
        -6,
    );
}

#[test]
fn wide_image_resumes_after_its_widest_axis() {
    let input = ids(&[&[5, 7], &[9; 8], &[6]]);
    let got = index(&input, Some(&[GridThw::new(1, 2, 16)]), None, None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 10],
            &[0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 10],
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        ],
        0,
    );
}

#[test]
fn prompt_ending_in_an_image() {
    let input = ids(&[&[1, 7], &[9; 4]]);
    let got = index(&input, Some(&[G144]), None, None).unwrap();
    assert_index(
        &got,
        [
            &[0, 1, 2, 2, 2, 2],
            &[0, 1, 2, 2, 3, 3],
            &[0, 1, 2, 3, 2, 3],
        ],
        -2,
    );
}

#[test]
fn left_padding_gets_position_one_and_no_delta_share() {
    let input = ids(&[&[0, 0, 1, 7], &[9; 4], &[3]]);
    let mask = [false, false, true, true, true, true, true, true, true];
    let got = index(&input, Some(&[G144]), None, Some(&mask)).unwrap();
    assert_index(
        &got,
        [
            &[1, 1, 0, 1, 2, 2, 2, 2, 4],
            &[1, 1, 0, 1, 2, 2, 3, 3, 4],
            &[1, 1, 0, 1, 2, 3, 2, 3, 4],
        ],
        -2,
    );
}

#[test]
fn text_only_prompt() {
    let got = index(&[1, 2, 3, 4], None, None, None).unwrap();
    assert_index(&got, [&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1, 2, 3]], 0);
    assert_eq!(got.layout(), PositionLayout::Text);
}

#[test]
fn masked_text_prompt_decodes_with_zero_delta() {
    // get_rope_index returns [1, 0, 1] with delta -1; LanguageModel.__call__
    // then replaces the delta with zeros because no grid was passed.
    let got = index(&[0, 1, 2], None, None, Some(&[false, true, true])).unwrap();
    assert_index(&got, [&[1, 0, 1], &[1, 0, 1], &[1, 0, 1]], -1);
    assert_eq!(got.decode_delta(), 0);
}

#[test]
fn empty_grid_list_takes_the_multimodal_branch() {
    let got = index(&[1, 2, 3], Some(&[]), None, None).unwrap();
    assert_index(&got, [&[0, 1, 2], &[0, 1, 2], &[0, 1, 2]], 0);
    assert_eq!(got.layout(), PositionLayout::Multimodal);
}

#[test]
fn window_inside_and_beyond_the_prompt() {
    let input = ids(&[&[1, 2, 7], &[9; 6], &[3, 4]]);
    let got = index(&input, Some(&[G146]), None, None).unwrap();
    // Prompt positions for tokens 8..11, then index + delta (-3) on all axes.
    let window = got.window(8, 5).unwrap();
    assert_eq!(window[0], [3, 6, 7, 8, 9]);
    assert_eq!(window[1], [4, 6, 7, 8, 9]);
    assert_eq!(window[2], [5, 6, 7, 8, 9]);

    let array = got.window_position_ids(11, 2).unwrap();
    assert_eq!(array.shape(), &[3, 1, 2]);
    assert_eq!(array.as_slice::<i32>(), &[8, 9, 8, 9, 8, 9]);
}

#[test]
fn text_window_is_two_dimensional() {
    let got = index(&[1, 2, 3], None, None, None).unwrap();
    let array = got.window_position_ids(2, 3).unwrap();
    assert_eq!(array.shape(), &[1, 3]);
    assert_eq!(array.as_slice::<i32>(), &[2, 3, 4]);
    let array = got.window_position_ids_3d(2, 3).unwrap();
    assert_eq!(array.shape(), &[3, 1, 3]);
}

#[test]
fn qwen3_5_defaults() {
    assert_eq!(VisionTokens::QWEN3_5.image_token_id, 248_056);
    assert_eq!(VisionTokens::QWEN3_5.video_token_id, 248_057);
    assert_eq!(VisionTokens::QWEN3_5.vision_start_token_id, 248_045);
    assert_eq!(VisionTokens::QWEN3_5.spatial_merge_size, 2);
}

#[test]
fn vision_kind_names() {
    assert_eq!(VisionKind::Image.to_string(), "image");
    assert_eq!(VisionKind::Video.to_string(), "video");
    assert_eq!(GridThw::new(1, 4, 6).to_string(), "(1, 4, 6)");
}
