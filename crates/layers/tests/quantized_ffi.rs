//! The mode-aware FFI wrappers: results, and errors carrying MLX's message.

use layers::ffi::{self, Mode};
use mlx_rs::{random, Array, Dtype};

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap()
}

#[test]
fn quantize_returns_biases_only_for_affine() {
    let w = normal(&[8, 256], 0);
    for (mode, gs, bits) in [
        (Mode::Affine, 64, 4),
        (Mode::Mxfp4, 32, 4),
        (Mode::Mxfp8, 32, 8),
        (Mode::Nvfp4, 16, 4),
    ] {
        let (wq, scales, biases) = ffi::quantize(&w, gs, bits, mode).unwrap();
        assert_eq!(wq.shape(), &[8, 256 * bits / 32], "{mode}");
        assert_eq!(wq.dtype(), Dtype::Uint32);
        assert_eq!(scales.shape(), &[8, 256 / gs], "{mode}");
        assert_eq!(biases.is_some(), mode == Mode::Affine, "{mode}");
        let expected_scales = if mode == Mode::Affine {
            Dtype::Float32
        } else {
            Dtype::Uint8
        };
        assert_eq!(scales.dtype(), expected_scales, "{mode}");
    }
}

#[test]
fn quantize_none_takes_the_mode_defaults() {
    let w = normal(&[4, 128], 1);
    for mode in Mode::ALL {
        let (gs, bits) = mode.defaults();
        let (wq, scales, _) = ffi::quantize(&w, None, None, mode).unwrap();
        assert_eq!(wq.shape(), &[4, 128 * bits / 32], "{mode}");
        assert_eq!(scales.shape(), &[4, 128 / gs], "{mode}");
    }
}

#[test]
fn quantize_error_carries_mlx_message() {
    let w = normal(&[4, 128], 2);
    let err = ffi::quantize(&w, 16, 4, Mode::Affine).unwrap_err();
    assert!(
        err.message.starts_with(
            "[quantize] The requested group size 16 is not supported. The supported group sizes are 32, 64, and 128."
        ),
        "{err}"
    );
    let err = ffi::quantize(&w, 32, 2, Mode::Mxfp4).unwrap_err();
    assert!(
        err.message
            .starts_with("[quantize] mxfp4 quantization requires bits to be 4 but got 2."),
        "{err}"
    );
    // A later mlx-rs op still reports its own errors.
    let e = mlx_rs::ops::matmul(normal(&[2, 3], 3), normal(&[4, 5], 4)).unwrap_err();
    assert!(e.what().contains("matmul"), "{e}");
}

#[test]
fn quantized_matmul_matches_dequantized_matmul_for_every_mode() {
    let w = normal(&[16, 128], 5);
    let x = normal(&[3, 128], 6);
    for mode in Mode::ALL {
        let (gs, bits) = mode.defaults();
        let (wq, scales, biases) = ffi::quantize(&w, gs, bits, mode).unwrap();
        let y =
            ffi::quantized_matmul(&x, &wq, &scales, biases.as_ref(), true, gs, bits, mode).unwrap();
        assert_eq!(y.shape(), &[3, 16]);
        let wd = ffi::dequantize(
            &wq,
            &scales,
            biases.as_ref(),
            gs,
            bits,
            mode,
            Some(Dtype::Float32),
        )
        .unwrap();
        let reference = mlx_rs::ops::matmul(&x, wd.t()).unwrap();
        let close = mlx_rs::ops::all_close(&y, &reference, 1e-4, 1e-4, None).unwrap();
        assert!(close, "{mode}");
    }
}

#[test]
fn quantized_matmul_errors_carry_mlx_messages() {
    let w = normal(&[8, 128], 7);
    let x = normal(&[2, 128], 8);
    let (wq, scales, biases) = ffi::quantize(&w, 64, 4, Mode::Affine).unwrap();
    let err = ffi::quantized_matmul(&x, &wq, &scales, None, true, 64, 4, Mode::Affine).unwrap_err();
    assert!(
        err.message
            .contains("Biases must be provided for affine quantization"),
        "{err}"
    );
    let (wq4, s4, _) = ffi::quantize(&w, 32, 4, Mode::Mxfp4).unwrap();
    let err = ffi::quantized_matmul(&x, &wq4, &s4, biases.as_ref(), true, 32, 4, Mode::Mxfp4)
        .unwrap_err();
    assert!(err.message.contains("Biases must be null"), "{err}");
    let bad_x = normal(&[2, 64], 9);
    let err = ffi::quantized_matmul(
        &bad_x,
        &wq,
        &scales,
        biases.as_ref(),
        true,
        64,
        4,
        Mode::Affine,
    )
    .unwrap_err();
    assert!(err.message.contains("[quantized_matmul]"), "{err}");
}

#[test]
fn gather_qmm_picks_the_expert_per_row() {
    let w = normal(&[3, 8, 64], 10);
    let x = normal(&[4, 1, 64], 11);
    let (wq, scales, biases) = ffi::quantize(&w, 64, 4, Mode::Affine).unwrap();
    let idx = Array::from_slice(&[2u32, 0, 1, 2], &[4]);
    let y = ffi::gather_qmm(
        &x,
        &wq,
        &scales,
        biases.as_ref(),
        None,
        Some(&idx),
        true,
        64,
        4,
        Mode::Affine,
        false,
    )
    .unwrap();
    assert_eq!(y.shape(), &[4, 1, 8]);
    let err = ffi::gather_qmm(
        &x,
        &wq,
        &scales,
        None,
        None,
        Some(&idx),
        true,
        64,
        4,
        Mode::Affine,
        false,
    )
    .unwrap_err();
    assert!(err.message.contains("[gather_qmm]"), "{err}");
}

#[test]
fn mode_strings_round_trip() {
    for mode in Mode::ALL {
        assert_eq!(mode.as_str().parse::<Mode>().unwrap(), mode);
    }
    let err = "int4".parse::<Mode>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid quantization mode 'int4'. Valid modes are: affine, mxfp4, nvfp4, mxfp8."
    );
}

#[test]
fn array_from_bytes_handles_unaligned_data() {
    let values = [1.5f32, -2.0, 3.25];
    let mut bytes = vec![0u8];
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    let a = ffi::array_from_bytes(&bytes[1..], &[3], Dtype::Float32).unwrap();
    assert_eq!(a.as_slice::<f32>(), &values);
    let err = ffi::array_from_bytes(&bytes[1..], &[4], Dtype::Float32).unwrap_err();
    assert!(err.message.contains("cannot hold"), "{err}");
}
