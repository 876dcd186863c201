//! Typed errors of the adapter directories, the quantized embedding and
//! the nvfp4 global scale: bad input never panics and names what is wrong.

use std::path::Path;

use layers::checkpoint::write_arrays;
use layers::quantized::{
    lora_scale_from_alpha, AdapterError, AdapterFormat, AdapterSet, LayerError, Mode, PayloadError,
    QuantSpec, QuantizedEmbedding, QuantizedLinear, QuantizedPayload, QuantizedSwitchLinear,
};
use mlx_rs::{random, Array, Dtype};
use serde_json::json;

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn write_dir(dir: &Path, config: serde_json::Value, tensors: &[(&str, &Array)]) {
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    write_arrays(dir.join("adapters.safetensors"), tensors).unwrap();
}

fn lm_config(rank: i64) -> serde_json::Value {
    json!({"fine_tune_type": "lora", "num_layers": 1,
           "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0}})
}

#[test]
fn adapter_directories_load_in_each_format() {
    let (a, b) = (normal(&[64, 4], 1), normal(&[4, 32], 2));
    let dir = tempdir();
    write_dir(
        dir.path(),
        lm_config(4),
        &[
            ("layers.0.q_proj.lora_a", &a),
            ("layers.0.q_proj.lora_b", &b),
        ],
    );
    let set = AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap();
    assert_eq!((set.rank(), set.scale()), (4, 2.0));
    assert_eq!(set.get("layers.0.q_proj").unwrap().rank(), 4);

    let legacy = tempdir();
    write_dir(
        legacy.path(),
        json!({"rank": 4, "alpha": 0.3}),
        &[("m.A", &a), ("m.B", &b)],
    );
    let config: serde_json::Map<_, _> = serde_json::from_str(
        &std::fs::read_to_string(legacy.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        AdapterFormat::detect_mlx_vlm(&config, legacy.path()).unwrap(),
        AdapterFormat::MlxVlmLegacy
    );
    let set = AdapterSet::open(legacy.path(), AdapterFormat::MlxVlmLegacy).unwrap();
    assert_eq!(set.scale(), lora_scale_from_alpha(0.3, 4));
    assert_eq!(set.scale_f64(), 0.3 / 4.0);
}

#[test]
fn the_scale_is_divided_in_f64_then_rounded() {
    // 0.3 / 5 differs in the last bit when divided in f32.
    assert_ne!(
        lora_scale_from_alpha(0.3, 5).to_bits(),
        (0.3_f32 / 5.0_f32).to_bits()
    );
    assert_eq!(lora_scale_from_alpha(0.3, 5), (0.3_f64 / 5.0) as f32);
}

#[test]
fn bad_adapter_directories_are_typed_errors() {
    let (a, b) = (normal(&[64, 4], 1), normal(&[4, 32], 2));
    // No directory.
    let e = AdapterSet::open("/nonexistent/adapters", AdapterFormat::MlxLm).unwrap_err();
    assert!(matches!(e, AdapterError::NoDirectory { .. }), "{e}");
    // mlx-lm config with alpha instead of scale: the reference's hint.
    let dir = tempdir();
    write_dir(
        dir.path(),
        json!({"lora_parameters": {"rank": 4, "alpha": 16}}),
        &[],
    );
    let e = AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err();
    assert!(
        matches!(&e, AdapterError::MissingKey { key, .. } if key == "lora_parameters.scale"),
        "{e}"
    );
    assert!(e.to_string().contains("not 'alpha'"), "{e}");
    // DoRA is refused.
    let dir = tempdir();
    write_dir(
        dir.path(),
        json!({"fine_tune_type": "dora", "lora_parameters": {"rank": 4, "scale": 1.0}}),
        &[],
    );
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::FineTuneType { .. }
    ));
    // Invalid rank and scale values.
    let dir = tempdir();
    write_dir(
        dir.path(),
        json!({"lora_parameters": {"rank": 0, "scale": 1.0}}),
        &[],
    );
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::InvalidValue { .. }
    ));
    // Half an adapter: without A (random in the reference) refused; without
    // B loaded with B's zeros, as the reference loads it.
    let dir = tempdir();
    write_dir(dir.path(), lm_config(4), &[("m.lora_b", &b)]);
    let e = AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err();
    assert!(
        matches!(&e, AdapterError::HalfAdapter { missing, .. } if missing == "m.lora_a"),
        "{e}"
    );
    let dir = tempdir();
    write_dir(dir.path(), lm_config(4), &[("m.lora_a", &a)]);
    let set = AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap();
    let zero_b = set.get("m").unwrap().lora_b();
    assert_eq!(
        (zero_b.shape(), zero_b.dtype()),
        (&[4, 1][..], mlx_rs::Dtype::Float32)
    );
    // mlx-vlm keeps a tensor that is no adapter matrix aside (strict=False).
    let dir = tempdir();
    write_dir(
        dir.path(),
        lm_config(4),
        &[("m.lora_a", &a), ("m.lora_b", &b), ("optimizer.step", &b)],
    );
    let set = AdapterSet::open(dir.path(), AdapterFormat::MlxVlm).unwrap();
    assert_eq!(set.extra_tensors(), ["optimizer.step"]);
    assert_eq!(set.adapters().len(), 1);
    // A rank other than the config's.
    let dir = tempdir();
    write_dir(
        dir.path(),
        lm_config(8),
        &[("m.lora_a", &a), ("m.lora_b", &b)],
    );
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::Rank { rank: 8, .. }
    ));
    // A tensor of the other format.
    let dir = tempdir();
    write_dir(dir.path(), lm_config(4), &[("m.A", &a), ("m.B", &b)]);
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::UnexpectedTensor { .. }
    ));
    // Not JSON; no weights file.
    let dir = tempdir();
    std::fs::write(dir.path().join("adapter_config.json"), "{").unwrap();
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::Config { .. }
    ));
    let dir = tempdir();
    std::fs::write(
        dir.path().join("adapter_config.json"),
        lm_config(4).to_string(),
    )
    .unwrap();
    assert!(matches!(
        AdapterSet::open(dir.path(), AdapterFormat::MlxLm).unwrap_err(),
        AdapterError::Weights(_)
    ));
    // mlx-vlm with neither lora_parameters nor rank.
    let config = serde_json::Map::new();
    assert!(matches!(
        AdapterFormat::detect_mlx_vlm(&config, dir.path()).unwrap_err(),
        AdapterError::NoLoraParameters { .. }
    ));
}

#[test]
fn fuse_refuses_an_adapter_of_the_wrong_shape() {
    let spec = QuantSpec::new(Mode::Affine, 4, 64).unwrap();
    let layer = QuantizedLinear::new(
        QuantizedPayload::quantize(&normal(&[32, 128], 3), spec).unwrap(),
        None,
    )
    .unwrap();
    let adapter =
        layers::quantized::LoraAdapter::new(normal(&[64, 4], 1), normal(&[4, 32], 2), 1.0).unwrap();
    assert!(matches!(
        layers::quantized::lora::fuse(&layer, &adapter).unwrap_err(),
        LayerError::AdapterShape { .. }
    ));
}

#[test]
fn embedding_errors() {
    let spec = QuantSpec::new(Mode::Affine, 4, 64).unwrap();
    let emb = QuantizedEmbedding::from_float(&normal(&[10, 128], 4), spec).unwrap();
    assert_eq!((emb.num_embeddings(), emb.dims()), (10, 128));
    let e = emb
        .lookup(&Array::from_slice(&[1_i32, 10], &[2]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::TokenIdOutOfRange {
                id: 10,
                position: 1,
                num_embeddings: 10
            }
        ),
        "{e}"
    );
    assert!(matches!(
        emb.lookup(&Array::from_slice(&[-1_i32], &[1])).unwrap_err(),
        LayerError::TokenIdOutOfRange { .. }
    ));
    assert!(matches!(
        emb.lookup(&Array::from_slice(&[1.0_f32], &[1]))
            .unwrap_err(),
        LayerError::IndicesDtype { .. }
    ));
    assert!(matches!(
        emb.as_linear(&normal(&[2, 64], 5)).unwrap_err(),
        LayerError::InputShape { .. }
    ));
    assert_eq!(
        emb.lookup(&Array::from_slice(&[3_i32, 4, 5, 6], &[2, 2]))
            .unwrap()
            .shape(),
        &[2, 2, 128]
    );
    // A switch-shaped payload is not a table.
    let three = QuantizedPayload::quantize(&normal(&[2, 10, 128], 6), spec).unwrap();
    assert!(matches!(
        QuantizedEmbedding::new(three).unwrap_err(),
        LayerError::Payload(PayloadError::Rank { .. })
    ));
}

#[test]
fn global_scale_errors_and_refused_forwards() {
    let nvfp4 = QuantSpec::defaults(Mode::Nvfp4);
    let w = normal(&[32, 64], 7);
    let gs = Array::from_f32(3.5);
    // Only nvfp4, only float32, only a scalar (linear) or [E] (switch).
    let affine =
        QuantizedPayload::quantize(&w, QuantSpec::new(Mode::Affine, 4, 64).unwrap()).unwrap();
    assert!(matches!(
        affine.with_global_scale(gs.clone()).unwrap_err(),
        PayloadError::GlobalScaleMode { .. }
    ));
    let p = QuantizedPayload::quantize(&w, nvfp4).unwrap();
    assert!(matches!(
        p.clone()
            .with_global_scale(gs.as_dtype(Dtype::Float16).unwrap())
            .unwrap_err(),
        PayloadError::GlobalScaleDtype { .. }
    ));
    assert!(matches!(
        p.with_global_scale(Array::from_slice(&[1.0_f32, 2.0], &[2]))
            .unwrap_err(),
        PayloadError::GlobalScaleShape { .. }
    ));
    assert!(matches!(
        QuantizedPayload::quantize_with_global_scale(&w, QuantSpec::defaults(Mode::Mxfp4), &gs)
            .unwrap_err(),
        LayerError::Payload(PayloadError::GlobalScaleMode { .. })
    ));
    assert!(matches!(
        QuantizedPayload::quantize_experts_with_global_scale(&w, nvfp4).unwrap_err(),
        LayerError::Payload(PayloadError::Rank { expected: 3, .. })
    ));
    // The pinned MLX has no global scale in quantized_matmul / gather_qmm.
    let p = QuantizedPayload::quantize_with_global_scale(&w, nvfp4, &gs).unwrap();
    assert_eq!(p.dequantize(None).unwrap().shape(), &[32, 64]);
    let layer = QuantizedLinear::new(p, None).unwrap();
    assert!(matches!(
        layer.forward(&normal(&[2, 64], 8)).unwrap_err(),
        LayerError::GlobalScaleRefused { .. }
    ));
    let experts =
        QuantizedPayload::quantize_experts_with_global_scale(&normal(&[3, 32, 64], 9), nvfp4)
            .unwrap();
    assert_eq!(experts.global_scale().unwrap().shape(), &[3]);
    assert_eq!(experts.dequantize(None).unwrap().shape(), &[3, 32, 64]);
    let switch = QuantizedSwitchLinear::new(experts, None).unwrap();
    assert!(
        switch.payload().global_scale().is_some(),
        "the layer keeps the global scale"
    );
    let idx = Array::from_slice(&[0_i32, 2], &[1, 2]);
    assert!(matches!(
        switch
            .forward(&normal(&[1, 1, 1, 64], 10), &idx, false)
            .unwrap_err(),
        LayerError::GlobalScaleRefused { .. }
    ));
}
