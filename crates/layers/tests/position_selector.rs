//! The interleaved frequency→axis selector against a direct re-statement of
//! the reference rule (mlx-vlm 0.7.6 `_interleaved_position_selector`):
//! frequency `i` belongs to axis 1 if `i ≡ 1 (mod 3)` and `i <
//! 3·section[1]`, to axis 2 if `i ≡ 2 (mod 3)` and `i < 3·section[2]`, and
//! to axis 0 otherwise.

use layers::position::interleaved_position_selector;
use proptest::prelude::*;

fn restated(section: &[usize], freq_dim: usize) -> Vec<i32> {
    (0..freq_dim)
        .map(|i| match i % 3 {
            1 if i < 3 * section[1] => 1,
            2 if i < 3 * section[2] => 2,
            _ => 0,
        })
        .collect()
}

proptest! {
    #[test]
    fn selector_matches_the_reference_rule(
        section in prop::collection::vec(0usize..80, 3..6),
        freq_dim in 0usize..200,
    ) {
        let got = interleaved_position_selector(&section, freq_dim).unwrap();
        prop_assert_eq!(got, restated(&section, freq_dim));
    }
}

#[test]
fn qwen3_5_selector() {
    // Values printed by the reference for [11, 11, 10] and 32 frequencies.
    let mut expected: Vec<i32> = [0, 1, 2].repeat(10);
    expected.extend([0, 1]);
    assert_eq!(
        interleaved_position_selector(&[11, 11, 10], 32).unwrap(),
        expected
    );
}

#[test]
fn section_zero_and_extra_entries_are_ignored() {
    let base = interleaved_position_selector(&[11, 11, 10], 32).unwrap();
    assert_eq!(
        interleaved_position_selector(&[0, 11, 10], 32).unwrap(),
        base
    );
    assert_eq!(
        interleaved_position_selector(&[11, 11, 10, 5], 32).unwrap(),
        base
    );
}

#[test]
fn oversized_sections_are_clipped_like_the_reference() {
    // [24, 20, 20] with 32 frequencies: the reference prints the same
    // selector as for [11, 11, 10].
    assert_eq!(
        interleaved_position_selector(&[24, 20, 20], 32).unwrap(),
        interleaved_position_selector(&[11, 11, 10], 32).unwrap()
    );
}

#[test]
fn class_default_section_leaves_the_rest_to_axis_zero() {
    let mut expected: Vec<i32> = [0, 1, 0].repeat(10);
    expected.extend([0, 1]);
    assert_eq!(
        interleaved_position_selector(&[11, 11, 0], 32).unwrap(),
        expected
    );
}
