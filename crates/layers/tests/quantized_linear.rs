//! QuantizedLinear: forward shapes and row policies, additive bias, LoRA
//! adapters, payload exchange, and one test per typed error.

mod checkpoint_support;

use checkpoint_support::{model_dir, normal, normal_as, quantized_tensors, same_bits};
use layers::checkpoint::Checkpoint;
use layers::ffi;
use layers::quantized::{
    Forward, LayerError, LoraAdapter, Mode, PayloadError, QuantSpec, QuantizedLinear,
    QuantizedPayload,
};
use mlx_rs::{ops, Array, Dtype};
use serde_json::json;

const ALL_SPECS: [(Mode, i32, i32); 6] = [
    (Mode::Affine, 4, 64),
    (Mode::Affine, 3, 32),
    (Mode::Affine, 6, 128),
    (Mode::Mxfp4, 4, 32),
    (Mode::Mxfp8, 8, 32),
    (Mode::Nvfp4, 4, 16),
];

fn spec(mode: Mode, bits: i32, group_size: i32) -> QuantSpec {
    QuantSpec::new(mode, bits, group_size).unwrap()
}

/// A layer `in -> out` quantized from bf16 normal weights.
fn layer(out: i32, inp: i32, spec: QuantSpec, seed: u64) -> QuantizedLinear {
    let w = normal_as(&[out, inp], seed, Dtype::Bfloat16);
    QuantizedLinear::new(QuantizedPayload::quantize(&w, spec).unwrap(), None).unwrap()
}

fn rows(a: &Array, i: i32) -> Array {
    a.reshape(&[-1, a.shape()[a.ndim() - 1]])
        .unwrap()
        .split_equal(a.shape()[..a.ndim() - 1].iter().product(), 0)
        .unwrap()[i as usize]
        .clone()
}

#[test]
fn forward_shapes_with_batch_dims_in_both_modes() {
    for (mode, bits, gs) in ALL_SPECS {
        let l = layer(16, 128, spec(mode, bits, gs), 1);
        assert_eq!((l.in_features(), l.out_features()), (128, 16));
        for shape in [&[128][..], &[5, 128], &[2, 3, 128], &[2, 1, 4, 128]] {
            let x = normal_as(shape, 2, Dtype::Bfloat16);
            for forward in [Forward::Batched, Forward::RowsIndependent] {
                let y = l.forward_as(&x, forward).unwrap();
                let mut expected = shape.to_vec();
                *expected.last_mut().unwrap() = 16;
                assert_eq!(
                    y.shape(),
                    expected.as_slice(),
                    "{mode} {shape:?} {forward:?}"
                );
                // uint8 scales: x.dtype; affine: promote(x, scales) = bf16 here.
                assert_eq!(y.dtype(), Dtype::Bfloat16);
            }
        }
    }
}

#[test]
fn batched_forward_is_quantized_matmul_then_bias() {
    let s = spec(Mode::Affine, 4, 64);
    let w = normal_as(&[32, 256], 3, Dtype::Bfloat16);
    let payload = QuantizedPayload::quantize(&w, s).unwrap();
    let bias = normal(&[32], 4);
    let l = QuantizedLinear::new(payload.clone(), Some(bias.clone())).unwrap();
    let x = normal_as(&[2, 7, 256], 5, Dtype::Bfloat16);
    let y = l.forward(&x).unwrap();
    let qmm = ffi::quantized_matmul(
        &x,
        payload.weight(),
        payload.scales(),
        payload.biases(),
        true,
        64,
        4,
        Mode::Affine,
    )
    .unwrap();
    let expected = ops::add(&qmm, &bias).unwrap();
    assert!(same_bits(&y, &expected));
    // bf16 + f32 bias promotes to f32, as `x + self["bias"]` does.
    assert_eq!(y.dtype(), Dtype::Float32);
}

#[test]
fn rows_independent_rows_do_not_depend_on_m() {
    for (mode, bits, gs) in ALL_SPECS {
        let mut l = layer(64, 256, spec(mode, bits, gs), 6);
        let a = LoraAdapter::new(normal(&[256, 4], 7), normal(&[4, 64], 8), 2.0).unwrap();
        l.attach_adapter("a", a).unwrap();
        l.set_forward_mode(Forward::RowsIndependent);
        let x = normal_as(&[2, 9, 256], 9, Dtype::Bfloat16);
        let y = l.forward(&x).unwrap();
        for i in 0..18 {
            let row = rows(&x, i).reshape(&[1, 1, 256]).unwrap();
            let alone = l.forward_as(&row, Forward::Batched).unwrap();
            assert!(
                same_bits(&rows(&y, i).reshape(&[1, 1, 64]).unwrap(), &alone),
                "{mode} row {i}"
            );
        }
        // A prefix of the rows gives the same rows.
        let x3 = x
            .reshape(&[18, 256])
            .unwrap()
            .split_at_indices(&[3], 0)
            .unwrap()[0]
            .clone();
        let y3 = l.forward(&x3).unwrap();
        let y18 = y
            .reshape(&[18, 64])
            .unwrap()
            .split_at_indices(&[3], 0)
            .unwrap()[0]
            .clone();
        assert!(same_bits(&y3, &y18), "{mode}");
    }
}

#[test]
fn lora_residual_op_order_and_dtypes() {
    let mut l = layer(32, 128, spec(Mode::Affine, 4, 64), 10);
    let (lora_a, lora_b) = (normal(&[128, 8], 11), normal(&[8, 32], 12));
    l.attach_adapter(
        "sft",
        LoraAdapter::new(lora_a.clone(), lora_b.clone(), 20.0).unwrap(),
    )
    .unwrap();
    let x = normal_as(&[3, 128], 13, Dtype::Bfloat16);
    let y = l.forward(&x).unwrap();
    // y = linear(x); z = (x @ A) @ B; y + (scale * z).astype(x.dtype)
    let base = {
        let p = l.payload();
        ffi::quantized_matmul(
            &x,
            p.weight(),
            p.scales(),
            p.biases(),
            true,
            64,
            4,
            Mode::Affine,
        )
        .unwrap()
    };
    let z = ops::matmul(ops::matmul(&x, &lora_a).unwrap(), &lora_b).unwrap();
    assert_eq!(z.dtype(), Dtype::Float32);
    let scaled = ops::multiply(Array::from_f32(20.0), &z)
        .unwrap()
        .as_dtype(Dtype::Bfloat16)
        .unwrap();
    let expected = ops::add(&base, &scaled).unwrap();
    assert!(same_bits(&y, &expected));
    assert_eq!(y.dtype(), Dtype::Bfloat16);
}

#[test]
fn several_adapters_apply_in_attachment_order() {
    let mut l = layer(32, 128, spec(Mode::Mxfp4, 4, 32), 14);
    let a = LoraAdapter::new(normal(&[128, 4], 15), normal(&[4, 32], 16), 1.5).unwrap();
    let b = LoraAdapter::new(normal(&[128, 2], 17), normal(&[2, 32], 18), 0.25).unwrap();
    let x = normal_as(&[4, 128], 19, Dtype::Float16);
    let base = l.forward(&x).unwrap();
    l.attach_adapter("a", a.clone()).unwrap();
    l.attach_adapter("b", b.clone()).unwrap();
    let y = l.forward(&x).unwrap();
    let expected = b.apply(&x, &a.apply(&x, &base).unwrap()).unwrap();
    assert!(same_bits(&y, &expected));
    assert_eq!(l.adapters().map(|(n, _)| n).collect::<Vec<_>>(), ["a", "b"]);

    // Swap keeps the position; detach removes; the base output returns.
    let a2 = LoraAdapter::new(normal(&[128, 4], 20), normal(&[4, 32], 21), 1.0).unwrap();
    let old = l.swap_adapter("a", a2.clone()).unwrap();
    assert!(same_bits(old.lora_a(), a.lora_a()));
    let y2 = l.forward(&x).unwrap();
    assert!(same_bits(
        &y2,
        &b.apply(&x, &a2.apply(&x, &base).unwrap()).unwrap()
    ));
    assert!(l.detach_adapter("a").is_some());
    assert!(l.detach_adapter("a").is_none());
    l.clear_adapters();
    assert!(same_bits(&l.forward(&x).unwrap(), &base));
}

#[test]
fn exchange_payload_swaps_and_returns_the_previous() {
    let w = normal_as(&[16, 128], 22, Dtype::Bfloat16);
    let p4 = QuantizedPayload::quantize(&w, spec(Mode::Affine, 4, 64)).unwrap();
    let p8 = QuantizedPayload::quantize(&w, spec(Mode::Affine, 8, 32)).unwrap();
    let mut l = QuantizedLinear::new(p4, None).unwrap();
    let x = normal_as(&[2, 128], 23, Dtype::Bfloat16);
    let y4 = l.forward(&x).unwrap();
    let previous = l.exchange_payload(p8.clone()).unwrap();
    assert_eq!(previous.spec(), spec(Mode::Affine, 4, 64));
    assert_eq!(l.spec(), spec(Mode::Affine, 8, 32));
    let y8 = l.forward(&x).unwrap();
    assert!(!same_bits(&y4, &y8));
    l.exchange_payload(previous).unwrap();
    assert!(same_bits(&l.forward(&x).unwrap(), &y4));
}

#[test]
fn exchange_payload_of_another_shape_is_refused() {
    let mut l = layer(16, 128, spec(Mode::Affine, 4, 64), 24);
    let other =
        QuantizedPayload::quantize(&normal(&[16, 256], 25), spec(Mode::Affine, 4, 64)).unwrap();
    let err = l.exchange_payload(other).unwrap_err();
    assert!(
        matches!(
            err,
            LayerError::FeaturesChanged {
                in_features: 256,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(l.in_features(), 128);
}

#[test]
fn input_shape_error() {
    let l = layer(16, 128, spec(Mode::Affine, 4, 64), 26);
    for shape in [&[2, 64][..], &[]] {
        let x = if shape.is_empty() {
            Array::from_f32(1.0)
        } else {
            normal(shape, 27)
        };
        let err = l.forward(&x).unwrap_err();
        assert!(
            matches!(
                err,
                LayerError::InputShape {
                    in_features: 128,
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn adapter_shape_errors() {
    let mut l = layer(16, 128, spec(Mode::Affine, 4, 64), 28);
    let err = LoraAdapter::new(normal(&[128, 4], 1), normal(&[3, 16], 2), 1.0).unwrap_err();
    assert!(matches!(err, LayerError::AdapterMatrices { .. }), "{err}");
    // Before: "LoRA adapter ``: ... do not fit a -1->-1 layer".
    let text = err.to_string();
    assert!(!text.contains("``") && !text.contains("-1"), "{text}");
    assert!(
        text.contains("[128, 4]") && text.contains("[3, 16]"),
        "{text}"
    );
    let wrong_out = LoraAdapter::new(normal(&[128, 4], 1), normal(&[4, 8], 2), 1.0).unwrap();
    let err = l.attach_adapter("x", wrong_out).unwrap_err();
    assert!(
        matches!(err, LayerError::AdapterShape { ref name, .. } if name == "x"),
        "{err}"
    );
}

#[test]
fn duplicate_and_unknown_adapters() {
    let mut l = layer(16, 128, spec(Mode::Affine, 4, 64), 29);
    let a = LoraAdapter::new(normal(&[128, 4], 1), normal(&[4, 16], 2), 1.0).unwrap();
    l.attach_adapter("a", a.clone()).unwrap();
    let err = l.attach_adapter("a", a.clone()).unwrap_err();
    assert!(matches!(err, LayerError::DuplicateAdapter { .. }), "{err}");
    let err = l.swap_adapter("b", a).unwrap_err();
    assert!(matches!(err, LayerError::UnknownAdapter { .. }), "{err}");
}

#[test]
fn payload_errors_from_arrays() {
    let s = spec(Mode::Affine, 4, 64);
    let w = normal(&[8, 128], 30);
    let (wq, scales, biases) = ffi::quantize(&w, 64, 4, Mode::Affine).unwrap();
    let payload = |w: &Array, sc: &Array, b: Option<&Array>, s| {
        QuantizedPayload::new(w.clone(), sc.clone(), b.cloned(), s).unwrap_err()
    };
    assert!(matches!(
        payload(&w, &scales, biases.as_ref(), s),
        PayloadError::WeightDtype { .. }
    ));
    let flat = wq.reshape(&[-1]).unwrap();
    assert!(matches!(
        payload(&flat, &scales, biases.as_ref(), s),
        PayloadError::Rank { .. }
    ));
    assert!(matches!(
        payload(&wq, &scales, None, s),
        PayloadError::MissingBiases { .. }
    ));
    let (fq, fs, _) = ffi::quantize(&w, 32, 4, Mode::Mxfp4).unwrap();
    assert!(matches!(
        payload(&fq, &fs, Some(&fs), spec(Mode::Mxfp4, 4, 32)),
        PayloadError::UnexpectedBiases { .. }
    ));
    // 16 packed uint32 at 4 bits = 128 inputs, not a multiple of 128 * 3? 512 bits / 3: no.
    assert!(matches!(
        payload(&wq, &scales, biases.as_ref(), spec(Mode::Affine, 3, 64)),
        PayloadError::BitsDoNotDivide {
            packed: 16,
            bits: 3
        }
    ));
    // 128 inputs at 2 bits = 8 packed; claimed 8 bits → 64 inputs, group 128 does not divide.
    assert!(matches!(
        payload(&wq, &scales, biases.as_ref(), spec(Mode::Affine, 8, 128)),
        PayloadError::GroupSizeDoesNotDivide {
            in_features: 64,
            group_size: 128
        }
    ));
    assert!(matches!(
        payload(&wq, &scales, biases.as_ref(), spec(Mode::Affine, 4, 32)),
        PayloadError::ScalesShape { .. }
    ));
    let bad_biases = biases.as_ref().unwrap().reshape(&[2, 8]).unwrap();
    assert!(matches!(
        payload(&wq, &scales, Some(&bad_biases), s),
        PayloadError::BiasesShape { .. }
    ));
    let invalid = QuantSpec {
        mode: Mode::Nvfp4,
        bits: 4,
        group_size: 32,
    };
    assert!(matches!(
        payload(&wq, &scales, None, invalid),
        PayloadError::Spec(_)
    ));
    let err =
        QuantizedLinear::from_arrays(wq, scales, biases, s, Some(normal(&[9], 1))).unwrap_err();
    assert!(
        matches!(err, LayerError::Payload(PayloadError::BiasShape { .. })),
        "{err}"
    );
}

#[test]
fn in_features_for_odd_bit_widths() {
    // 384 inputs at 3, 5 and 6 bits: optiq's `packed * (32 // bits)` would say 360.
    for bits in [3, 5, 6] {
        let l = layer(8, 384, spec(Mode::Affine, bits, 128), 31);
        assert_eq!(l.in_features(), 384, "bits {bits}");
        let x = normal_as(&[2, 384], 32, Dtype::Bfloat16);
        assert_eq!(l.forward(&x).unwrap().shape(), &[2, 8]);
    }
}

#[test]
fn from_checkpoint_equals_from_arrays() {
    let path = "model.layers.0.self_attn.q_proj";
    for (mode, bits, gs) in ALL_SPECS {
        let s = spec(mode, bits, gs);
        let mut tensors = quantized_tensors(path, &[16, 256], s, 33);
        tensors.push(checkpoint_support::float_tensor(
            &format!("{path}.bias"),
            &[16],
            34,
        ));
        let dir = model_dir(
            "linear",
            &json!({"quantization": {"group_size": 64, "bits": 4}}),
            tensors,
        );
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let l = QuantizedLinear::from_checkpoint(&ckpt, path, 256).unwrap();
        assert_eq!(l.spec(), s);
        let get = |n: &str| ckpt.array(&format!("{path}.{n}")).unwrap();
        let biases = (mode == Mode::Affine).then(|| get("biases"));
        let direct = QuantizedLinear::from_arrays(
            get("weight"),
            get("scales"),
            biases,
            s,
            Some(get("bias")),
        )
        .unwrap();
        let x = normal_as(&[3, 256], 35, Dtype::Bfloat16);
        assert!(
            same_bits(&l.forward(&x).unwrap(), &direct.forward(&x).unwrap()),
            "{s}"
        );
        // A path error names the path (in=100: inferred group size 100 // G is invalid).
        let err = QuantizedLinear::from_checkpoint(&ckpt, path, 100).unwrap_err();
        assert!(err.to_string().starts_with(path), "{err}");
    }
}

#[test]
fn an_empty_batch_gives_the_empty_result_without_touching_the_kernel() {
    // Before: MLX's CPU quantized matmul crashed the process (SIGFPE) on a
    // zero-size dimension (the reference crashes the same way).
    for (mode, bits, gs) in [(Mode::Affine, 4, 64), (Mode::Mxfp4, 4, 32)] {
        let mut l = layer(16, 128, spec(mode, bits, gs), 28);
        let adapter = LoraAdapter::new(normal(&[128, 4], 1), normal(&[4, 16], 2), 2.0).unwrap();
        l.attach_adapter("a", adapter).unwrap();
        for shape in [vec![0, 128], vec![2, 0, 128], vec![0, 3, 128]] {
            for forward in [Forward::Batched, Forward::RowsIndependent] {
                let x = normal_as(&shape, 3, Dtype::Bfloat16);
                let y = l.forward_as(&x, forward).unwrap();
                let mut expected = shape.clone();
                *expected.last_mut().unwrap() = 16;
                assert_eq!(y.shape(), expected.as_slice(), "{mode} {shape:?}");
                // The dtype the non-empty graph gives (bf16 + f32 LoRA).
                let one = l
                    .forward_as(&normal_as(&[1, 128], 3, Dtype::Bfloat16), forward)
                    .unwrap();
                assert_eq!(y.dtype(), one.dtype(), "{mode} {shape:?}");
                y.eval().unwrap();
            }
        }
    }
}

#[test]
fn biases_the_reference_broadcasts_in_both_modes() {
    let s = spec(Mode::Affine, 4, 64);
    let payload =
        QuantizedPayload::quantize(&normal_as(&[32, 128], 3, Dtype::Bfloat16), s).unwrap();
    let x = normal_as(&[2, 128], 5, Dtype::Bfloat16);
    let qmm = ffi::quantized_matmul(
        &x,
        payload.weight(),
        payload.scales(),
        payload.biases(),
        true,
        64,
        4,
        Mode::Affine,
    )
    .unwrap();
    for shape in [&[][..], &[1], &[1, 32], &[2, 32]] {
        let bias = normal(shape, 4);
        let l = QuantizedLinear::new(payload.clone(), Some(bias.clone())).unwrap();
        let expected = ops::add(&qmm, &bias).unwrap();
        // A bias per row: each row gets its own row in the rows-independent forward.
        for forward in [Forward::Batched, Forward::RowsIndependent] {
            let y = l.forward_as(&x, forward).unwrap();
            assert!(same_bits(&y, &expected), "{shape:?} {forward:?}");
        }
    }
    // A bias that widens the output: the batched forward widens it, as
    // `x + bias` does; the rows-independent forward refuses it.
    let l = QuantizedLinear::new(payload.clone(), Some(normal(&[2, 1, 32], 4))).unwrap();
    assert_eq!(l.forward(&x).unwrap().shape(), &[2, 2, 32]);
    let err = l.forward_as(&x, Forward::RowsIndependent).unwrap_err();
    assert!(
        matches!(err, LayerError::Payload(PayloadError::BiasShape { .. })),
        "{err}"
    );
    // One that broadcasts against no output of 2 rows.
    let l = QuantizedLinear::new(payload.clone(), Some(normal(&[3, 32], 4))).unwrap();
    let err = l.forward(&x).unwrap_err();
    assert!(
        matches!(err, LayerError::Payload(PayloadError::BiasShape { .. })),
        "{err}"
    );
    // Nor against any output at all: refused at construction.
    let err = QuantizedLinear::new(payload, Some(normal(&[33], 4))).unwrap_err();
    assert!(
        matches!(err, LayerError::Payload(PayloadError::BiasShape { .. })),
        "{err}"
    );
}
