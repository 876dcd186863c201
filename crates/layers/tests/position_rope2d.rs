//! Gemma vision RoPE (`apply_multidimensional_rope`, mlx-optiq 0.7.7)
//! behaviour that holds whatever the float bits: output width (including
//! the reference's dropped trailing channels), dtype, identity at position
//! zero, axis independence, and the agreement of the 1-D form with a single
//! axis.

use layers::position::{apply_multidimensional_rope, apply_rope2d, rope2d_tables};
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::{random, Array, Dtype};

fn normal(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

fn bits(x: &Array) -> Vec<u32> {
    let x = x.as_dtype(Dtype::Float32).unwrap().contiguous().unwrap();
    x.eval().unwrap();
    x.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

/// `[1, L, 2]` int32 grid positions (x, y).
fn grid(xy: &[(i32, i32)]) -> Array {
    let flat: Vec<i32> = xy.iter().flat_map(|&(x, y)| [x, y]).collect();
    Array::from_slice(&flat, &[1, xy.len() as i32, 2])
}

const XY: [(i32, i32); 4] = [(0, 0), (1, 0), (0, 1), (-1, -1)];

#[test]
fn output_shape_and_dtype() {
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        let x = normal(&[1, 4, 3, 64], dtype, 1);
        let y = apply_multidimensional_rope(&x, &grid(&XY), 100.0).unwrap();
        assert_eq!(y.shape(), &[1, 4, 3, 64]);
        assert_eq!(y.dtype(), dtype);
    }
}

#[test]
fn trailing_channels_are_dropped_like_the_reference() {
    // head_dim 70 with two axes: 2 * (70 / 4) = 34 channels per axis.
    let x = normal(&[1, 4, 2, 70], Dtype::Bfloat16, 2);
    let y = apply_multidimensional_rope(&x, &grid(&XY), 100.0).unwrap();
    assert_eq!(y.shape(), &[1, 4, 2, 68]);
    let tables = rope2d_tables(&grid(&XY), 70, 100.0, Dtype::Bfloat16).unwrap();
    assert_eq!(tables.channels_per_axis(), 34);
    assert_eq!(tables.output_dim(), 68);
    assert_eq!(tables.head_dim(), 70);
}

#[test]
fn zero_positions_are_the_identity() {
    let x = normal(&[2, 3, 2, 72], Dtype::Bfloat16, 3);
    let zeros = mlx_rs::ops::zeros_dtype(&[2, 3, 2], Dtype::Int32).unwrap();
    let y = apply_multidimensional_rope(&x, &zeros, 100.0).unwrap();
    assert_eq!(bits(&y), bits(&x));
}

#[test]
fn each_axis_rotates_only_its_own_partition() {
    let x = normal(&[1, 4, 2, 64], Dtype::Float32, 4);
    let a = apply_multidimensional_rope(&x, &grid(&XY), 100.0).unwrap();
    // Change only the y coordinates: the x partition (channels 0..32) stays.
    let moved: Vec<(i32, i32)> = XY.iter().map(|&(x, y)| (x, y + 5)).collect();
    let b = apply_multidimensional_rope(&x, &grid(&moved), 100.0).unwrap();
    let part = |y: &Array, r: std::ops::Range<i32>| bits(&y.try_index((Ellipsis, r)).unwrap());
    assert_eq!(part(&a, 0..32), part(&b, 0..32));
    assert_ne!(part(&a, 32..64), part(&b, 32..64));
}

#[test]
fn one_dimensional_form_equals_a_single_axis() {
    let x = normal(&[1, 5, 2, 64], Dtype::Bfloat16, 5);
    let p: Vec<i32> = vec![0, 3, 1, 8, 2];
    let flat = Array::from_slice(&p, &[1, 5]);
    let single = Array::from_slice(&p, &[1, 5, 1]);
    let a = apply_multidimensional_rope(&x, &flat, 100.0).unwrap();
    let b = apply_multidimensional_rope(&x, &single, 100.0).unwrap();
    assert_eq!(a.shape(), &[1, 5, 2, 64]);
    assert_eq!(bits(&a), bits(&b));
    let tables = rope2d_tables(&flat, 64, 100.0, Dtype::Bfloat16).unwrap();
    assert!(tables.is_one_dimensional());
    assert_eq!(tables.axes().len(), 1);
}

#[test]
fn prebuilt_tables_give_the_same_result() {
    let x = normal(&[2, 4, 3, 72], Dtype::Bfloat16, 6);
    let positions = mlx_rs::ops::broadcast_to(grid(&XY), &[2, 4, 2]).unwrap();
    let direct = apply_multidimensional_rope(&x, &positions, 100.0).unwrap();
    let tables = rope2d_tables(&positions, 72, 100.0, Dtype::Bfloat16).unwrap();
    assert_eq!(tables.axes()[0].cos.shape(), &[2, 4, 1, 36]);
    let via_tables = apply_rope2d(&x, &tables).unwrap();
    assert_eq!(bits(&direct), bits(&via_tables));
}

#[test]
fn positions_of_batch_one_broadcast() {
    let x = normal(&[2, 4, 3, 64], Dtype::Float32, 7);
    let one = grid(&XY);
    let two = mlx_rs::ops::broadcast_to(&one, &[2, 4, 2]).unwrap();
    let a = apply_multidimensional_rope(&x, &one, 100.0).unwrap();
    let b = apply_multidimensional_rope(&x, &two, 100.0).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn a_base_frequency_that_is_not_positive_and_finite_is_refused() {
    // Before: accepted, and the tables came out NaN.
    let x = normal(&[1, 4, 2, 8], Dtype::Float32, 3);
    let positions = grid(&[(0, 0), (0, 1), (1, 0), (1, 1)]);
    for base in [f64::NAN, -100.0, 0.0, f64::NEG_INFINITY] {
        let err = apply_multidimensional_rope(&x, &positions, base).unwrap_err();
        assert!(
            matches!(
                err,
                layers::position::PositionError::RopeBase {
                    what: "base_frequency",
                    ..
                }
            ),
            "{base}: {err}"
        );
    }
}
