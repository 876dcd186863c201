//! Per-path quantization spec resolution, as `mlx_lm.utils.load_model`
//! resolves it, and one test per typed error of the quantized loader.

mod checkpoint_support;

use checkpoint_support::{model_dir, quantized_tensors, TempDir};
use layers::checkpoint::{
    Checkpoint, CheckpointError, LayerKind, NotQuantizedReason, RawTensor, SpecResolution,
    SpecSource, TensorDtype, Unresolvable,
};
use layers::quantized::{Mode, PayloadError, QuantSpec, SpecError};
use serde_json::{json, Value};

const P: &str = "model.layers.0.mlp.down_proj";

fn spec(mode: Mode, bits: i32, group_size: i32) -> QuantSpec {
    QuantSpec::new(mode, bits, group_size).unwrap()
}

/// A checkpoint with `P` quantized with `saved` (out 8, in 256) and `config`.
fn checkpoint(config: Value, saved: QuantSpec) -> (TempDir, Checkpoint) {
    let dir = model_dir("spec", &config, quantized_tensors(P, &[8, 256], saved, 1));
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, ckpt)
}

fn resolve(
    config: Value,
    saved: QuantSpec,
    kind: LayerKind,
) -> Result<SpecResolution, CheckpointError> {
    let (_dir, ckpt) = checkpoint(config, saved);
    ckpt.resolve_quant_spec(P, kind, 256)
}

fn quantized(spec: QuantSpec, source: SpecSource) -> SpecResolution {
    SpecResolution::Quantized { spec, source }
}

fn top(extra: Value) -> Value {
    let mut q = json!({"group_size": 64, "bits": 4});
    q.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({ "quantization": q })
}

#[test]
fn per_path_dict_entry() {
    let saved = spec(Mode::Affine, 8, 32);
    let r = resolve(
        top(json!({P: {"group_size": 32, "bits": 8}})),
        saved,
        LayerKind::Linear,
    );
    assert_eq!(r.unwrap(), quantized(saved, SpecSource::PerPath));
}

#[test]
fn per_path_true_takes_the_top_level_values() {
    let saved = spec(Mode::Affine, 4, 64);
    let r = resolve(top(json!({P: true})), saved, LayerKind::Linear);
    assert_eq!(r.unwrap(), quantized(saved, SpecSource::TopLevel));
    // With a top-level mode.
    let saved = spec(Mode::Mxfp4, 4, 32);
    let config = json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4", P: true}});
    assert_eq!(
        resolve(config, saved, LayerKind::Linear).unwrap(),
        quantized(saved, SpecSource::TopLevel)
    );
}

#[test]
fn falsy_per_path_entries_disable_quantization() {
    for entry in [json!(false), json!({}), json!(0), json!(null), json!("")] {
        let r = resolve(
            top(json!({P: entry})),
            spec(Mode::Affine, 4, 64),
            LayerKind::Linear,
        );
        assert_eq!(
            r.unwrap(),
            SpecResolution::NotQuantized(NotQuantizedReason::DisabledForPath),
            "{entry}"
        );
    }
}

#[test]
fn unnamed_paths_are_inferred_from_the_saved_tensors() {
    for saved in [
        spec(Mode::Affine, 3, 32),
        spec(Mode::Affine, 6, 128),
        spec(Mode::Affine, 8, 64),
        spec(Mode::Mxfp4, 4, 32),
        spec(Mode::Mxfp8, 8, 32),
        spec(Mode::Nvfp4, 4, 16),
    ] {
        // The top-level default (64, 4, affine) is not what was saved.
        for kind in [LayerKind::Linear, LayerKind::Switch] {
            let r = resolve(top(json!({})), saved, kind);
            assert_eq!(
                r.unwrap(),
                quantized(saved, SpecSource::Inferred),
                "{saved}"
            );
        }
    }
}

#[test]
fn paths_without_scales_are_not_quantized_despite_the_top_level_default() {
    let (_dir, ckpt) = checkpoint(top(json!({})), spec(Mode::Affine, 4, 64));
    let r = ckpt.resolve_quant_spec("model.embed_tokens", LayerKind::Linear, 256);
    assert_eq!(
        r.unwrap(),
        SpecResolution::NotQuantized(NotQuantizedReason::NoScales)
    );
}

#[test]
fn no_quantization_config() {
    let r = resolve(
        json!({"model_type": "x"}),
        spec(Mode::Affine, 4, 64),
        LayerKind::Linear,
    );
    assert_eq!(
        r.unwrap(),
        SpecResolution::NotQuantized(NotQuantizedReason::NoQuantizationConfig)
    );
    let r = resolve(
        json!({"quantization": null}),
        spec(Mode::Affine, 4, 64),
        LayerKind::Linear,
    );
    assert_eq!(
        r.unwrap(),
        SpecResolution::NotQuantized(NotQuantizedReason::NoQuantizationConfig)
    );
}

#[test]
fn legacy_quantization_config() {
    let mx = spec(Mode::Mxfp4, 4, 32);
    let r = resolve(
        json!({"quantization_config": {"quant_method": "mxfp4"}}),
        mx,
        LayerKind::Linear,
    );
    assert_eq!(r.unwrap(), quantized(mx, SpecSource::Inferred));
    // From text_config.
    let config = json!({"text_config": {"quantization_config": {"quant_method": "mxfp4"}}});
    assert_eq!(
        resolve(config, mx, LayerKind::Linear).unwrap(),
        quantized(mx, SpecSource::Inferred)
    );
    // From hf_quant_config.json (ModelOpt NVFP4).
    let nv = spec(Mode::Nvfp4, 4, 16);
    let (dir, _) = checkpoint(json!({}), nv);
    std::fs::write(
        dir.join("hf_quant_config.json"),
        json!({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        json!({"quantization_config": null}).to_string(),
    )
    .unwrap();
    // `quantization_config: null` is present, so hf_quant_config.json is not read.
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ckpt.resolve_quant_spec(P, LayerKind::Linear, 256).unwrap(),
        SpecResolution::NotQuantized(NotQuantizedReason::NoQuantizationConfig)
    );
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ckpt.resolve_quant_spec(P, LayerKind::Linear, 256).unwrap(),
        quantized(nv, SpecSource::Inferred)
    );
    // A method the reference ignores.
    let r = resolve(
        json!({"quantization_config": {"quant_method": "bitsandbytes"}}),
        mx,
        LayerKind::Linear,
    );
    assert!(matches!(
        r.unwrap(),
        SpecResolution::NotQuantized(NotQuantizedReason::IgnoredQuantMethod(_))
    ));
}

#[test]
fn switch_and_linear_defaults_differ() {
    let saved = spec(Mode::Mxfp4, 4, 32);
    let config = top(json!({P: {"mode": "mxfp4"}}));
    // Linear.to_quantized(group_size=None, bits=None): the mode's defaults.
    assert_eq!(
        resolve(config.clone(), saved, LayerKind::Linear).unwrap(),
        quantized(saved, SpecSource::PerPath)
    );
    // SwitchLinear.to_quantized(group_size=64, bits=4): mx.quantize rejects it.
    let err = resolve(config, saved, LayerKind::Switch).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::InvalidSpec {
                source: SpecError::UnsupportedGroupSize {
                    mode: Mode::Mxfp4,
                    group_size: 64
                },
                ..
            }
        ),
        "{err}"
    );
    // An explicit null is None for both.
    let config = top(json!({P: {"mode": "mxfp4", "group_size": null, "bits": null}}));
    assert_eq!(
        resolve(config, saved, LayerKind::Switch).unwrap(),
        quantized(saved, SpecSource::PerPath)
    );
}

fn unresolvable(config: Value, saved: QuantSpec) -> Unresolvable {
    match resolve(config, saved, LayerKind::Linear) {
        Err(CheckpointError::QuantSpecUnresolvable { path, reason }) => {
            assert_eq!(path, P);
            reason
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unresolvable_cannot_infer_uint8_scales() {
    // uint8 scales whose (bits, group_size) is (4, 64): no float mode has it.
    let tensors = vec![
        RawTensor {
            name: format!("{P}.weight"),
            dtype: TensorDtype::U32,
            shape: vec![8, 32],
            data: vec![0; 8 * 32 * 4],
        },
        RawTensor {
            name: format!("{P}.scales"),
            dtype: TensorDtype::U8,
            shape: vec![8, 4],
            data: vec![0; 32],
        },
    ];
    let dir = model_dir("infer", &top(json!({})), tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt
        .resolve_quant_spec(P, LayerKind::Linear, 256)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::QuantSpecUnresolvable {
                reason: Unresolvable::CannotInfer {
                    bits: 4,
                    group_size: 64
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unresolvable_config_shapes() {
    let s = spec(Mode::Affine, 4, 64);
    assert_eq!(
        unresolvable(top(json!({P: 5})), s),
        Unresolvable::InvalidEntry("5".into())
    );
    assert_eq!(
        unresolvable(top(json!({P: {"bits": 4, "foo": 1}})), s),
        Unresolvable::UnexpectedKey("foo".into())
    );
    assert_eq!(
        unresolvable(json!({"quantization": {"group_size": 64}}), s),
        Unresolvable::MissingTopLevelKey("bits")
    );
    assert_eq!(
        unresolvable(json!({"quantization": 3}), s),
        Unresolvable::QuantizationNotObject
    );
    assert!(matches!(
        unresolvable(top(json!({P: {"bits": 4.0}})), s),
        Unresolvable::InvalidValue { .. }
    ));
    assert_eq!(
        unresolvable(
            top(json!({P: {"mode": "nvfp4", "quantize_input": true}})),
            s
        ),
        Unresolvable::QuantizeInputUnsupported
    );
    assert!(matches!(
        unresolvable(json!({"quantization_config": {"quant_method": "awq"}}), s),
        Unresolvable::UnsupportedQuantMethod(_)
    ));
    assert_eq!(
        unresolvable(json!({"quantization_config": {"bits": 4}}), s),
        Unresolvable::MalformedQuantizationConfig
    );
    // A falsy quantize_input is dropped, as nn.quantize pops it.
    let r = resolve(
        top(json!({P: {"quantize_input": false}})),
        s,
        LayerKind::Linear,
    );
    assert_eq!(r.unwrap(), quantized(s, SpecSource::PerPath));
}

#[test]
fn unresolvable_global_scale_for_switch_without_nvfp4() {
    let s = spec(Mode::Mxfp4, 4, 32);
    let err = resolve(
        top(json!({P: {"mode": "mxfp4", "group_size": 32, "global_scale": true}})),
        s,
        LayerKind::Switch,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::QuantSpecUnresolvable {
                reason: Unresolvable::GlobalScaleMode { mode: Mode::Mxfp4 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn global_scale_for_switch_resolves_with_nvfp4() {
    let s = spec(Mode::Nvfp4, 4, 16);
    let got = resolve(
        top(json!({P: {"mode": "nvfp4", "group_size": 16, "global_scale": true}})),
        s,
        LayerKind::Switch,
    )
    .unwrap();
    assert!(matches!(got, SpecResolution::Quantized { .. }), "{got:?}");
}

#[test]
fn unknown_mode() {
    let err = resolve(
        top(json!({P: {"mode": "int4"}})),
        spec(Mode::Affine, 4, 64),
        LayerKind::Linear,
    )
    .unwrap_err();
    match err {
        CheckpointError::InvalidSpec {
            source: SpecError::UnknownMode(m),
            ..
        } => assert_eq!(m.0, "int4"),
        other => panic!("{other}"),
    }
}

#[test]
fn rejected_mode_bits_group_size_combinations() {
    let s = spec(Mode::Affine, 4, 64);
    for (entry, expected) in [
        (
            json!({"mode": "mxfp4", "bits": 8}),
            SpecError::UnsupportedBits {
                mode: Mode::Mxfp4,
                bits: 8,
            },
        ),
        (
            json!({"group_size": 16}),
            SpecError::UnsupportedGroupSize {
                mode: Mode::Affine,
                group_size: 16,
            },
        ),
        (
            json!({"bits": 7}),
            SpecError::UnsupportedBits {
                mode: Mode::Affine,
                bits: 7,
            },
        ),
        (
            json!({"mode": "nvfp4", "group_size": 32}),
            SpecError::UnsupportedGroupSize {
                mode: Mode::Nvfp4,
                group_size: 32,
            },
        ),
        (
            json!({"mode": "mxfp8", "bits": 4}),
            SpecError::UnsupportedBits {
                mode: Mode::Mxfp8,
                bits: 4,
            },
        ),
    ] {
        match resolve(top(json!({P: entry})), s, LayerKind::Linear) {
            Err(CheckpointError::InvalidSpec { source, .. }) => {
                assert_eq!(source, expected, "{entry}")
            }
            other => panic!("{entry}: {other:?}"),
        }
    }
    // Group size checked before bits, with MLX's messages.
    let e = QuantSpec::new(Mode::Mxfp4, 8, 64).unwrap_err();
    assert_eq!(
        e.to_string(),
        "[quantize] mxfp4 quantization requires group size 32 but got 64."
    );
    let e = QuantSpec::new(Mode::Affine, 7, 64).unwrap_err();
    assert_eq!(
        e.to_string(),
        "[quantize] The requested number of bits 7 is not supported. The supported bits are 2, 3, 4, 5, 6 and 8."
    );
}

#[test]
fn group_size_not_dividing_in_features() {
    let (_dir, ckpt) = checkpoint(top(json!({P: true})), spec(Mode::Affine, 4, 64));
    let err = ckpt
        .resolve_quant_spec(P, LayerKind::Linear, 96)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Payload {
                source: PayloadError::GroupSizeDoesNotDivide {
                    in_features: 96,
                    group_size: 64
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn invalid_in_features() {
    let (_dir, ckpt) = checkpoint(top(json!({})), spec(Mode::Affine, 4, 64));
    let err = ckpt
        .resolve_quant_spec(P, LayerKind::Linear, 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::InvalidInFeatures { in_features: 0, .. }
        ),
        "{err}"
    );
}

fn without(tensors: Vec<RawTensor>, suffix: &str) -> Vec<RawTensor> {
    tensors
        .into_iter()
        .filter(|t| !t.name.ends_with(suffix))
        .collect()
}

fn missing(config: Value, suffix: &str) -> CheckpointError {
    let saved = spec(Mode::Affine, 4, 64);
    let dir = model_dir(
        "missing",
        &config,
        without(quantized_tensors(P, &[8, 256], saved, 1), suffix),
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    ckpt.quantized_tensors(P, LayerKind::Linear, 256)
        .unwrap_err()
}

#[test]
fn missing_weight() {
    let err = missing(top(json!({})), ".weight");
    assert!(
        matches!(err, CheckpointError::MissingTensor { ref tensor, .. } if tensor.ends_with(".weight")),
        "{err}"
    );
}

#[test]
fn missing_scales() {
    let err = missing(top(json!({P: true})), ".scales");
    assert!(
        matches!(err, CheckpointError::MissingTensor { ref tensor, .. } if tensor.ends_with(".scales")),
        "{err}"
    );
}

#[test]
fn missing_biases_for_affine() {
    let err = missing(top(json!({})), ".biases");
    assert!(
        matches!(err, CheckpointError::MissingTensor { ref tensor, .. } if tensor.ends_with(".biases")),
        "{err}"
    );
}

#[test]
fn unexpected_biases_for_a_float_mode() {
    let mut tensors = quantized_tensors(P, &[8, 256], spec(Mode::Mxfp4, 4, 32), 1);
    tensors.push(RawTensor {
        name: format!("{P}.biases"),
        dtype: TensorDtype::U8,
        shape: vec![8, 8],
        data: vec![0; 64],
    });
    let dir = model_dir("unexpected", &top(json!({})), tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 256)
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnexpectedTensor { .. }),
        "{err}"
    );
}

#[test]
fn scales_shape_inconsistent_with_weight() {
    // Saved with group size 64, config claims 32: scales should be [8, 8].
    let (_dir, ckpt) = checkpoint(
        top(json!({P: {"group_size": 32, "bits": 4}})),
        spec(Mode::Affine, 4, 64),
    );
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 256)
        .unwrap_err();
    match err {
        CheckpointError::Payload {
            path,
            source: PayloadError::ScalesShape {
                expected, actual, ..
            },
        } => {
            assert_eq!(
                (path.as_str(), expected, actual),
                (P, vec![8, 8], vec![8, 4])
            )
        }
        other => panic!("{other}"),
    }
}

#[test]
fn biases_shape_inconsistent_with_scales() {
    let mut tensors = without(
        quantized_tensors(P, &[8, 256], spec(Mode::Affine, 4, 64), 1),
        ".biases",
    );
    tensors.push(RawTensor {
        name: format!("{P}.biases"),
        dtype: TensorDtype::BF16,
        shape: vec![8, 3],
        data: vec![0; 48],
    });
    let dir = model_dir("biases", &top(json!({})), tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 256)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Payload {
                source: PayloadError::BiasesShape { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bits_that_do_not_divide_the_packed_width() {
    // 3 packed uint32 = 96 bits, not a multiple of 5.
    let tensors = vec![
        RawTensor {
            name: format!("{P}.weight"),
            dtype: TensorDtype::U32,
            shape: vec![2, 3],
            data: vec![0; 24],
        },
        RawTensor {
            name: format!("{P}.scales"),
            dtype: TensorDtype::BF16,
            shape: vec![2, 1],
            data: vec![0; 4],
        },
        RawTensor {
            name: format!("{P}.biases"),
            dtype: TensorDtype::BF16,
            shape: vec![2, 1],
            data: vec![0; 4],
        },
    ];
    let dir = model_dir(
        "bits",
        &top(json!({P: {"bits": 5, "group_size": 32}})),
        tensors,
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 32)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Payload {
                source: PayloadError::BitsDoNotDivide { packed: 3, bits: 5 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tensors_of_another_in_features() {
    let (_dir, ckpt) = checkpoint(top(json!({P: true})), spec(Mode::Affine, 4, 64));
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 512)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Payload {
                source: PayloadError::InFeatures {
                    expected: 512,
                    actual: 256
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn not_quantized_path_cannot_build_a_quantized_layer() {
    let (_dir, ckpt) = checkpoint(top(json!({P: false})), spec(Mode::Affine, 4, 64));
    let err = ckpt
        .quantized_tensors(P, LayerKind::Linear, 256)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::NotQuantized {
                reason: NotQuantizedReason::DisabledForPath,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn quantized_tensors_with_additive_bias() {
    let saved = spec(Mode::Affine, 4, 64);
    let mut tensors = quantized_tensors(P, &[8, 256], saved, 1);
    tensors.push(checkpoint_support::float_tensor(
        &format!("{P}.bias"),
        &[8],
        2,
    ));
    let dir = model_dir("bias", &top(json!({})), tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let t = ckpt.quantized_tensors(P, LayerKind::Linear, 256).unwrap();
    assert_eq!(t.payload.spec(), saved);
    assert_eq!(
        (t.payload.in_features(), t.payload.out_features()),
        (256, 8)
    );
    assert_eq!(t.bias.unwrap().shape(), &[8]);
    assert_eq!(t.source, SpecSource::Inferred);
}

#[test]
fn inferred_spec_follows_the_callers_in_features() {
    // As in infer_quant_config, in_features decides the inferred spec: 4-bit
    // gs-64 tensors of a 256-wide layer read as 2-bit gs-128 for a 512-wide
    // one, and every shape still matches (the reference loads it silently).
    let (_dir, ckpt) = checkpoint(top(json!({})), spec(Mode::Affine, 4, 64));
    assert_eq!(
        ckpt.resolve_quant_spec(P, LayerKind::Linear, 512).unwrap(),
        quantized(spec(Mode::Affine, 2, 128), SpecSource::Inferred)
    );
}

#[test]
fn quantize_activations_is_refused_for_linear_layers_not_built_silently() {
    // Before: `quantize_activations: true` was ignored and a weight-only
    // layer was built where mlx-lm builds nn.QQLinear (or raises).
    let with = |mode: &str, saved: QuantSpec, kind: LayerKind| {
        let mut config =
            top(json!({P: {"mode": mode, "group_size": saved.group_size, "bits": saved.bits}}));
        config["quantize_activations"] = json!(true);
        resolve(config, saved, kind)
    };
    for (mode, saved) in [
        ("nvfp4", spec(Mode::Nvfp4, 4, 16)),
        ("mxfp8", spec(Mode::Mxfp8, 8, 32)),
        ("affine", spec(Mode::Affine, 4, 64)),
    ] {
        let err = with(mode, saved, LayerKind::Linear).unwrap_err();
        let CheckpointError::QuantSpecUnresolvable { reason, .. } = &err else {
            panic!("{mode}: {err}");
        };
        assert_eq!(
            *reason,
            Unresolvable::QuantizeActivations {
                mode: saved.mode,
                bias: false
            },
            "{mode}"
        );
        let text = err.to_string();
        if mode == "affine" {
            assert!(text.contains("raises ValueError"), "{text}");
        } else {
            assert!(text.contains("QQLinear"), "{text}");
        }
        // Switch layers are not QuantizedLinear: unaffected, as in mlx-lm.
        let switch = with(mode, saved, LayerKind::Switch);
        assert!(
            switch.is_ok() || mode == "nvfp4" || mode == "mxfp8",
            "{mode}: {switch:?}"
        );
    }
    // Falsy values change nothing.
    let saved = spec(Mode::Affine, 4, 64);
    for falsy in [json!(false), json!(0), json!(null)] {
        let mut config = top(json!({P: true}));
        config["quantize_activations"] = falsy;
        assert!(resolve(config, saved, LayerKind::Linear).is_ok());
    }
}
