//! mRoPE behaviour that holds whatever the float bits: shapes and dtypes,
//! bit-exact pass-through channels, the 2-D/3-D equivalence for text,
//! broadcasting, the selector wiring of the angles, `inv_freq`'s op
//! sequence, and the path choice. Bit comparison with the reference is the
//! oracle's job.

use layers::position::{
    apply_mrope, compute_inv_freq, inv_freq_host_f32, inv_freq_host_f64, metal_is_available, Mrope,
    MropeConfig, MropePath, PositionError,
};
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::{random, Array, Dtype};

fn qwen_config() -> MropeConfig {
    MropeConfig::qwen3_5(256, 0.25, 100_000.0, vec![11, 11, 10])
}

fn normal(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

/// Values widened to f32 (exact for bf16/f16), in row-major order.
fn values(x: &Array) -> Vec<f32> {
    let x = x.as_dtype(Dtype::Float32).unwrap().contiguous().unwrap();
    x.eval().unwrap();
    x.as_slice::<f32>().to_vec()
}

fn bits(x: &Array) -> Vec<u32> {
    values(x).iter().map(|v| v.to_bits()).collect()
}

/// `[3, 1, L]` int32 with per-axis positions.
fn positions_3d(t: &[i32], h: &[i32], w: &[i32]) -> Array {
    Array::from_slice(&[t, h, w].concat(), &[3, 1, t.len() as i32])
}

#[test]
fn qwen3_5_config() {
    let config = qwen_config();
    assert_eq!(config.rotary_dim, 64);
    assert_eq!(config.freq_count(), 32);
    assert_eq!(config.attention_scaling, 1.0);
    config.validate().unwrap();
}

#[test]
fn inv_freq_shape_dtype_and_first_entry() {
    let inv = compute_inv_freq(64, 100_000.0).unwrap();
    assert_eq!(inv.shape(), &[32]);
    assert_eq!(inv.dtype(), Dtype::Float32);
    let v = values(&inv);
    assert_eq!(v[0], 1.0);
    assert!(v.windows(2).all(|w| w[1] < w[0]), "inv_freq must decrease");
}

#[test]
fn host_emulations_stay_within_a_few_ulps_of_the_device() {
    for (dim, base) in [(64usize, 100_000.0f64), (128, 10_000.0), (48, 1_000_000.0)] {
        let device = values(&compute_inv_freq(dim, base).unwrap());
        let f32_host = inv_freq_host_f32(dim, base as f32);
        let f64_host = inv_freq_host_f64(dim, base);
        assert_eq!(device.len(), f32_host.len());
        assert_eq!(device.len(), f64_host.len());
        for ((d, a), b) in device.iter().zip(&f32_host).zip(&f64_host) {
            let ulps = |x: &f32| (x.to_bits() as i64 - d.to_bits() as i64).abs();
            assert!(
                ulps(a) <= 4 && ulps(b) <= 4,
                "dim {dim} base {base}: {d} vs {a}, {b}"
            );
        }
    }
}

#[test]
fn path_on_this_build_follows_metal_availability() {
    let path = MropePath::current().unwrap();
    if metal_is_available().unwrap() {
        assert_eq!(path, MropePath::MetalKernel);
    } else {
        assert_eq!(path, MropePath::PureMlx);
    }
    assert_eq!(MropePath::PureMlx.as_str(), "pure-mlx");
    assert_eq!(MropePath::MetalKernel.as_str(), "metal-kernel");
}

#[test]
fn shapes_dtypes_and_pass_through_are_preserved() {
    let rope = Mrope::new(qwen_config()).unwrap();
    for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
        // Grouped-query attention: q has 4 heads, k has 1.
        let q = normal(&[2, 4, 5, 256], dtype, 1);
        let k = normal(&[2, 1, 5, 256], dtype, 2);
        let pos = Array::from_slice(
            &(0..30).map(|i| i * 7 % 11).collect::<Vec<i32>>(),
            &[3, 2, 5],
        );
        let (qe, ke) = rope
            .apply_with_path(MropePath::PureMlx, &q, &k, &pos)
            .unwrap();
        assert_eq!(qe.shape(), q.shape());
        assert_eq!(ke.shape(), k.shape());
        assert_eq!(qe.dtype(), dtype);
        assert_eq!(ke.dtype(), dtype);
        for (out, x) in [(&qe, &q), (&ke, &k)] {
            let tail = |a: &Array| bits(&a.try_index((Ellipsis, 64..)).unwrap());
            assert_eq!(
                tail(out),
                tail(x),
                "{dtype:?}: pass-through channels changed"
            );
            let head = |a: &Array| bits(&a.try_index((Ellipsis, ..64)).unwrap());
            assert_ne!(head(out), head(x), "{dtype:?}: rotary channels untouched");
        }
    }
}

#[test]
fn zero_positions_leave_q_and_k_unchanged() {
    let rope = Mrope::new(qwen_config()).unwrap();
    let q = normal(&[1, 2, 3, 256], Dtype::Bfloat16, 3);
    let k = normal(&[1, 2, 3, 256], Dtype::Bfloat16, 4);
    let pos = positions_3d(&[0; 3], &[0; 3], &[0; 3]);
    let (qe, ke) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &pos)
        .unwrap();
    assert_eq!(bits(&qe), bits(&q));
    assert_eq!(bits(&ke), bits(&k));
}

#[test]
fn text_positions_in_2d_and_3d_agree_bit_for_bit() {
    let rope = Mrope::new(qwen_config()).unwrap();
    let q = normal(&[1, 2, 6, 256], Dtype::Bfloat16, 5);
    let k = normal(&[1, 1, 6, 256], Dtype::Bfloat16, 6);
    let p: Vec<i32> = (100..106).collect();
    let two = Array::from_slice(&p, &[1, 6]);
    let three = positions_3d(&p, &p, &p);
    let (q2, k2) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &two)
        .unwrap();
    let (q3, k3) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &three)
        .unwrap();
    assert_eq!(bits(&q2), bits(&q3));
    assert_eq!(bits(&k2), bits(&k3));
}

#[test]
fn a_batch_of_one_position_row_broadcasts() {
    let rope = Mrope::new(qwen_config()).unwrap();
    let q = normal(&[2, 2, 4, 256], Dtype::Bfloat16, 7);
    let k = normal(&[2, 1, 4, 256], Dtype::Bfloat16, 8);
    let one = positions_3d(&[5, 6, 6, 9], &[5, 6, 7, 9], &[5, 7, 6, 9]);
    let tiled = mlx_rs::ops::broadcast_to(&one, &[3, 2, 4]).unwrap();
    let (qa, ka) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &one)
        .unwrap();
    let (qb, kb) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &tiled)
        .unwrap();
    assert_eq!(bits(&qa), bits(&qb));
    assert_eq!(bits(&ka), bits(&kb));
}

#[test]
fn angles_take_each_frequency_from_its_selected_axis() {
    let rope = Mrope::new(qwen_config()).unwrap();
    let (t, h, w) = ([3, 40], [17, 2], [1000, 7]);
    let freqs = rope.frequencies(&positions_3d(&t, &h, &w)).unwrap();
    assert_eq!(freqs.shape(), &[1, 2, 32]);
    assert_eq!(freqs.dtype(), Dtype::Float32);
    let inv = values(rope.inv_freq());
    let got = values(&freqs);
    for l in 0..2 {
        for (i, &axis) in rope.position_selector().iter().enumerate() {
            let position = [t[l], h[l], w[l]][axis as usize] as f32;
            // One f32 multiply, the same on host and device.
            assert_eq!(got[l * 32 + i].to_bits(), (position * inv[i]).to_bits());
        }
    }
}

#[test]
fn cos_sin_tables_have_the_activation_dtype() {
    let rope = Mrope::new(qwen_config()).unwrap();
    let (cos, sin) = rope
        .cos_sin(Dtype::Bfloat16, &positions_3d(&[1, 2], &[1, 2], &[1, 2]))
        .unwrap();
    assert_eq!(cos.shape(), &[1, 2, 64]);
    assert_eq!(sin.dtype(), Dtype::Bfloat16);
    // Both halves repeat the same angles.
    let c = values(&cos);
    assert_eq!(c[..32], c[32..64]);
}

#[test]
fn one_shot_apply_matches_the_reusable_rotary() {
    let config = qwen_config();
    let q = normal(&[1, 2, 3, 256], Dtype::Float32, 9);
    let k = normal(&[1, 2, 3, 256], Dtype::Float32, 10);
    let pos = positions_3d(&[0, 1, 2], &[0, 3, 4], &[0, 5, 6]);
    let path = MropePath::current().unwrap();
    let (qa, ka) = apply_mrope(&q, &k, &pos, &config).unwrap();
    let (qb, kb) = Mrope::new(config)
        .unwrap()
        .apply_with_path(path, &q, &k, &pos)
        .unwrap();
    assert_eq!(bits(&qa), bits(&qb));
    assert_eq!(bits(&ka), bits(&kb));
}

#[test]
fn metal_kernel_agrees_with_pure_mlx_in_f32() {
    if !metal_is_available().unwrap() {
        eprintln!("skipped (capability): {}", PositionError::MetalUnavailable);
        return;
    }
    // The kernel rounds once from f32; in f32 the two paths differ only by
    // the cos/sin implementations, i.e. by a few ulps.
    let rope = Mrope::new(qwen_config()).unwrap();
    let q = normal(&[2, 4, 5, 256], Dtype::Float32, 11);
    let k = normal(&[2, 1, 5, 256], Dtype::Float32, 12);
    let pos = Array::from_slice(
        &(0..30).map(|i| i * 13 % 17).collect::<Vec<i32>>(),
        &[3, 2, 5],
    );
    let (qk, kk) = rope
        .apply_with_path(MropePath::MetalKernel, &q, &k, &pos)
        .unwrap();
    let (qp, kp) = rope
        .apply_with_path(MropePath::PureMlx, &q, &k, &pos)
        .unwrap();
    for (kernel, pure, x) in [(&qk, &qp, &q), (&kk, &kp, &k)] {
        assert_eq!(kernel.shape(), x.shape());
        let tail = |a: &Array| bits(&a.try_index((Ellipsis, 64..)).unwrap());
        assert_eq!(tail(kernel), tail(x), "kernel pass-through changed");
        for (a, b) in values(kernel).iter().zip(values(pure)) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

#[test]
fn a_rope_theta_that_is_nan_or_not_positive_is_refused_and_an_infinite_one_computed() {
    // Before: accepted, and every frequency came out NaN.
    for theta in [f64::NAN, -10000.0, 0.0, 1e-300] {
        let config = MropeConfig {
            rope_theta: theta,
            ..qwen_config()
        };
        let err = Mrope::new(config).unwrap_err();
        assert!(
            matches!(
                err,
                PositionError::RopeBase {
                    what: "rope_theta",
                    ..
                }
            ),
            "{theta}: {err}"
        );
        assert!(compute_inv_freq(64, theta).is_err(), "{theta}");
    }
    // Infinite in f32, as the reference computes it: frequencies 1, 0, 0, ...
    for theta in [0.5, f64::INFINITY, 1e300] {
        assert!(
            Mrope::new(MropeConfig {
                rope_theta: theta,
                ..qwen_config()
            })
            .is_ok(),
            "{theta}"
        );
    }
}
