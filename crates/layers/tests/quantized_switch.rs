//! QuantizedSwitchLinear: gather_qmm per expert, the per-expert bias, host
//! index checks, and expert weights served from a page-aligned memory map.

mod checkpoint_support;

use checkpoint_support::{model_dir, normal, normal_as, quantized_tensors, same_bits, TempDir};
use layers::checkpoint::{
    map_page_aligned, page_size, Checkpoint, CheckpointError, ExpertOffload, OffloadError,
    TensorDtype,
};
use layers::ffi;
use layers::quantized::{
    LayerError, Mode, PayloadError, QuantSpec, QuantizedPayload, QuantizedSwitchLinear,
};
use mlx_rs::{ops, Array, Dtype};
use serde_json::json;

const SPECS: [(Mode, i32, i32); 4] = [
    (Mode::Affine, 4, 64),
    (Mode::Mxfp4, 4, 32),
    (Mode::Mxfp8, 8, 32),
    (Mode::Nvfp4, 4, 16),
];

fn spec(mode: Mode, bits: i32, group_size: i32) -> QuantSpec {
    QuantSpec::new(mode, bits, group_size).unwrap()
}

fn switch(
    experts: i32,
    out: i32,
    inp: i32,
    s: QuantSpec,
    bias: Option<Array>,
) -> QuantizedSwitchLinear {
    let w = normal_as(&[experts, out, inp], 1, Dtype::Bfloat16);
    QuantizedSwitchLinear::new(QuantizedPayload::quantize(&w, s).unwrap(), bias).unwrap()
}

#[test]
fn switch_glu_shapes() {
    for (mode, bits, gs) in SPECS {
        let l = switch(4, 32, 128, spec(mode, bits, gs), None);
        assert_eq!(
            (l.num_experts(), l.in_features(), l.out_features()),
            (4, 128, 32)
        );
        // SwitchGLU: x (B, L, D) -> (B, L, 1, 1, D); indices (B, L, K).
        let x = normal_as(&[2, 3, 1, 1, 128], 2, Dtype::Bfloat16);
        let idx = Array::from_slice(&[0u32, 3, 1, 2, 2, 0, 3, 3, 1, 0, 2, 1], &[2, 3, 2]);
        let y = l.forward(&x, &idx, false).unwrap();
        assert_eq!(y.shape(), &[2, 3, 2, 1, 32], "{mode}");
        assert_eq!(y.dtype(), Dtype::Bfloat16);
    }
}

#[test]
fn each_row_uses_its_expert() {
    // float32 weights: with bf16 scales MLX's CPU kernel does not compute in
    // f32 (about 1e-2 off a f32 dequantized matmul, in the reference too).
    let w = normal(&[3, 16, 64], 1);
    let payload = QuantizedPayload::quantize(&w, spec(Mode::Affine, 8, 32)).unwrap();
    let l = QuantizedSwitchLinear::new(payload, None).unwrap();
    let x = normal(&[4, 1, 64], 3);
    let idx = Array::from_slice(&[2i32, 0, 1, 2], &[4]);
    let y = l.forward(&x, &idx, false).unwrap();
    let w = l.payload().dequantize(Some(Dtype::Float32)).unwrap();
    // x @ dequant(W)[indices].swapaxes(-1, -2)
    let expected =
        ops::matmul(&x, w.take_axis(&idx, 0).unwrap().swap_axes(-1, -2).unwrap()).unwrap();
    assert!(y.all_close(&expected, 1e-4, 1e-4, None).unwrap());
}

#[test]
fn per_expert_bias_is_added_like_the_reference() {
    let bias = normal(&[3, 16], 4);
    let l = switch(3, 16, 64, spec(Mode::Affine, 4, 64), Some(bias.clone()));
    let x = normal_as(&[5, 1, 64], 5, Dtype::Bfloat16);
    let idx = Array::from_slice(&[1u32, 1, 0, 2, 0], &[5]);
    let y = l.forward(&x, &idx, false).unwrap();
    let p = l.payload();
    let g = ffi::gather_qmm(
        &x,
        p.weight(),
        p.scales(),
        p.biases(),
        None,
        Some(&idx),
        true,
        64,
        4,
        Mode::Affine,
        false,
    )
    .unwrap();
    // x + mx.expand_dims(self["bias"][indices], -2)
    let expected = ops::add(
        &g,
        bias.take_axis(&idx, 0).unwrap().expand_dims(-2).unwrap(),
    )
    .unwrap();
    assert!(same_bits(&y, &expected));
    assert_eq!(y.dtype(), Dtype::Float32);
}

#[test]
fn sorted_indices_give_the_same_result() {
    let l = switch(4, 16, 64, spec(Mode::Mxfp4, 4, 32), None);
    let x = normal_as(&[8, 1, 64], 6, Dtype::Bfloat16);
    let idx = Array::from_slice(&[0u32, 0, 1, 1, 2, 3, 3, 3], &[8]);
    let a = l.forward(&x, &idx, true).unwrap();
    let b = l.forward(&x, &idx, false).unwrap();
    assert!(same_bits(&a, &b));
}

#[test]
fn expert_index_out_of_range() {
    let l = switch(3, 16, 64, spec(Mode::Affine, 4, 64), None);
    let x = normal(&[2, 1, 64], 7);
    for (idx, bad, position) in [
        (Array::from_slice(&[0u32, 3], &[2]), 3, 1),
        (Array::from_slice(&[-1i32, 0], &[2]), -1, 0),
        (Array::from_slice(&[1i64, 1 << 40], &[2]), 1 << 40, 1),
    ] {
        let err = l.forward(&x, &idx, false).unwrap_err();
        match err {
            LayerError::ExpertIndexOutOfRange {
                index,
                position: p,
                num_experts: 3,
            } => {
                assert_eq!((index, p), (bad, position))
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn indices_must_be_integers() {
    let l = switch(3, 16, 64, spec(Mode::Affine, 4, 64), None);
    let err = l
        .forward(&normal(&[2, 1, 64], 8), &normal(&[2], 9), false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            LayerError::IndicesDtype {
                dtype: Dtype::Float32
            }
        ),
        "{err}"
    );
}

#[test]
fn input_of_the_wrong_width() {
    let l = switch(3, 16, 64, spec(Mode::Affine, 4, 64), None);
    let err = l
        .forward(
            &normal(&[2, 1, 32], 8),
            &Array::from_slice(&[0u32, 1], &[2]),
            false,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            LayerError::InputShape {
                in_features: 64,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn switch_payload_errors() {
    let w2 = normal(&[16, 64], 10);
    let p2 = QuantizedPayload::quantize(&w2, spec(Mode::Affine, 4, 64)).unwrap();
    let err = QuantizedSwitchLinear::new(p2, None).unwrap_err();
    assert!(
        matches!(
            err,
            LayerError::Payload(PayloadError::Rank { expected: 3, .. })
        ),
        "{err}"
    );
    let w3 = normal(&[3, 16, 64], 11);
    let p3 = QuantizedPayload::quantize(&w3, spec(Mode::Affine, 4, 64)).unwrap();
    let err = QuantizedSwitchLinear::new(p3, Some(normal(&[16], 12))).unwrap_err();
    assert!(
        matches!(err, LayerError::Payload(PayloadError::BiasShape { .. })),
        "{err}"
    );
}

const P: &str = "model.layers.0.mlp.switch_mlp.up_proj";

fn switch_checkpoint(s: QuantSpec) -> (TempDir, Checkpoint) {
    let mut tensors = quantized_tensors(P, &[4, 32, 128], s, 13);
    tensors.push(checkpoint_support::float_tensor(
        &format!("{P}.bias"),
        &[4, 32],
        14,
    ));
    let dir = model_dir(
        "switch",
        &json!({"quantization": {"group_size": 64, "bits": 4}}),
        tensors,
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, ckpt)
}

#[test]
fn expert_weights_from_a_page_aligned_map_give_identical_bits() {
    for (mode, bits, gs) in SPECS {
        let s = spec(mode, bits, gs);
        let (dir, ckpt) = switch_checkpoint(s);
        let resident = QuantizedSwitchLinear::from_checkpoint(&ckpt, P, 128).unwrap();
        assert_eq!(resident.spec(), s);
        let offload = ExpertOffload::create(
            dir.join("experts.bin"),
            &ckpt,
            &[
                "model.layers.0.mlp.switch_mlp.up_proj.bias",
                &format!("{P}.weight"),
            ],
        )
        .unwrap();
        let entry = &offload.entries()[&format!("{P}.weight")];
        assert_eq!(entry.offset % page_size() as u64, 0);
        assert!(entry.offset > 0);
        let mapped =
            QuantizedSwitchLinear::from_checkpoint_offloaded(&ckpt, P, 128, &offload).unwrap();
        assert!(same_bits(
            mapped.payload().weight(),
            resident.payload().weight()
        ));
        let x = normal_as(&[6, 1, 128], 15, Dtype::Bfloat16);
        let idx = Array::from_slice(&[3u32, 0, 2, 2, 1, 0], &[6]);
        let a = resident.forward(&x, &idx, false).unwrap();
        let b = mapped.forward(&x, &idx, false).unwrap();
        assert!(same_bits(&a, &b), "{s}");
        drop(mapped);
    }
}

#[test]
fn offload_errors() {
    let (dir, ckpt) = switch_checkpoint(spec(Mode::Affine, 4, 64));
    let file = dir.join("experts.bin");
    let offload = ExpertOffload::create(&file, &ckpt, &[&format!("{P}.weight")]).unwrap();
    let offload_err = |e: CheckpointError| match e {
        CheckpointError::Offload { reason, .. } => reason,
        other => panic!("{other}"),
    };
    let e = offload_err(map_page_aligned(&file, 8, TensorDtype::U32, &[4]).unwrap_err());
    assert!(
        matches!(e, OffloadError::NotPageAligned { offset: 8, .. }),
        "{e}"
    );
    let e = offload_err(map_page_aligned(&file, 0, TensorDtype::U32, &[1 << 24]).unwrap_err());
    assert!(matches!(e, OffloadError::PastEnd { .. }), "{e}");
    let e = offload_err(
        offload
            .array(&format!("{P}.weight"), TensorDtype::U32, &[4, 32, 8])
            .unwrap_err(),
    );
    assert!(matches!(e, OffloadError::Mismatch { .. }), "{e}");
    let e = offload_err(offload.array("nope", TensorDtype::U32, &[1]).unwrap_err());
    assert!(matches!(e, OffloadError::UnknownTensor(_)), "{e}");
    // The mapped bytes are the checkpoint's.
    let mapped = map_page_aligned(&file, 0, TensorDtype::U32, &[4, 32, 16]).unwrap();
    assert!(same_bits(
        &mapped,
        &ckpt.array(&format!("{P}.weight")).unwrap()
    ));
}

#[test]
fn an_empty_batch_gives_the_empty_result_of_the_broadcast_shape() {
    // Before: a cryptic MLX error; the reference returns an empty array of
    // the broadcast shape (indices.shape + [M, out]).
    for (mode, bits, gs) in SPECS {
        let l = switch(
            4,
            32,
            128,
            spec(mode, bits, gs),
            Some(normal_as(&[4, 32], 5, Dtype::Bfloat16)),
        );
        for (x_shape, idx_shape, expected) in [
            (vec![0, 3, 1, 1, 128], vec![0, 3, 2], vec![0, 3, 2, 1, 32]),
            (vec![2, 0, 1, 1, 128], vec![2, 0, 2], vec![2, 0, 2, 1, 32]),
            (vec![2, 3, 1, 1, 128], vec![2, 3, 0], vec![2, 3, 0, 1, 32]),
        ] {
            let x = normal_as(&x_shape, 2, Dtype::Bfloat16);
            let n: i32 = idx_shape.iter().product();
            let idx = Array::from_slice(&vec![0u32; n as usize], &idx_shape);
            let y = l.forward(&x, &idx, false).unwrap();
            assert_eq!(
                y.shape(),
                expected.as_slice(),
                "{mode} {x_shape:?} {idx_shape:?}"
            );
            assert_eq!(y.dtype(), Dtype::Bfloat16);
            y.eval().unwrap();
        }
    }
}
