//! Config reading: every shipped real config parses, and bad configs get a
//! typed error naming the key.

use std::path::PathBuf;

use layers::config::{ConfigError, Gemma4VisionConfig, Qwen3_5Config, RopeTheta};
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/configs")
}

fn configs(family: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(fixtures().join(family))
        .unwrap()
        .map(|e| e.unwrap().path().join("config.json"))
        .collect();
    v.sort();
    v
}

fn qwen(v: Value) -> Result<Qwen3_5Config, ConfigError> {
    Qwen3_5Config::from_json(v.as_object().unwrap())
}

fn gemma(v: Value) -> Result<Gemma4VisionConfig, ConfigError> {
    Gemma4VisionConfig::from_json(v.as_object().unwrap())
}

/// A minimal valid Qwen3.5 config.
fn qwen_base() -> Value {
    json!({
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": 1024, "intermediate_size": 3584,
            "linear_num_value_heads": 16, "linear_num_key_heads": 16,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "num_hidden_layers": 24,
            "num_attention_heads": 8, "rms_norm_eps": 1e-6, "vocab_size": 248320,
            "num_key_value_heads": 2, "max_position_embeddings": 262144, "head_dim": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                "mrope_interleaved": true}
        },
        "vision_config": {"spatial_merge_size": 2}
    })
}

#[test]
fn every_shipped_qwen3_5_config_parses() {
    let paths = configs("qwen3_5");
    assert!(paths.len() >= 6, "{paths:?}");
    for path in paths {
        let c =
            Qwen3_5Config::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(c.mrope().unwrap().rotary_dim, 64, "{}", path.display());
        assert_eq!(c.rope.rope_theta.as_f64(), 1e7);
        c.vision_tokens().unwrap();
    }
}

#[test]
fn shipped_quantized_conversions_parse_as_the_reference_reads_them() {
    let dir = fixtures().join("quantized");
    // Released spelling: theta as written.
    let c = Qwen3_5Config::from_file(dir.join("Qwen3.5-9B-MLX-8bit/config.json")).unwrap();
    assert_eq!(c.rope.rope_theta, RopeTheta::Int(10_000_000));
    assert!(c
        .defaults_used
        .iter()
        .all(|k| k != "text_config.rope_parameters"));
    // The AutoRound export writes its rope flat in text_config (rope_theta
    // 10000000, no rope_parameters): the reference's default stands in.
    let c =
        Qwen3_5Config::from_file(dir.join("Qwen3.6-27B-int4-mlx-AutoRound/config.json")).unwrap();
    assert_eq!(c.rope.rope_theta, RopeTheta::Int(100_000));
    assert!(c
        .defaults_used
        .contains(&"text_config.rope_parameters".to_string()));
    assert_eq!(c.mrope().unwrap().rotary_dim, 64);
    assert_eq!(c.vision_tokens().unwrap().vision_start_token_id, 248053);
}

#[test]
fn every_shipped_gemma4_config_parses() {
    for path in configs("gemma4") {
        let c = Gemma4VisionConfig::from_file(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(c.rope_theta, 100.0);
        assert!(c.head_dim > 0);
    }
}

#[test]
fn qwen_missing_required_text_key_is_named() {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "max_position_embeddings",
        "linear_conv_kernel_dim",
    ] {
        let mut v = qwen_base();
        v["text_config"].as_object_mut().unwrap().remove(key);
        let e = qwen(v).unwrap_err();
        assert!(matches!(e, ConfigError::MissingKey { .. }), "{e}");
        assert_eq!(e.key(), Some(format!("text_config.{key}").as_str()), "{e}");
    }
}

#[test]
fn qwen_missing_head_dim_is_an_error_not_a_default() {
    let mut v = qwen_base();
    v["text_config"].as_object_mut().unwrap().remove("head_dim");
    let e = qwen(v).unwrap_err();
    assert_eq!(e.key(), Some("text_config.head_dim"), "{e}");
    assert!(e.to_string().contains("TypeError"), "{e}");
}

#[test]
fn qwen_missing_model_type_and_text_config() {
    let mut v = qwen_base();
    v.as_object_mut().unwrap().remove("model_type");
    assert_eq!(qwen(v).unwrap_err().key(), Some("model_type"));
    let mut v = qwen_base();
    v.as_object_mut().unwrap().remove("text_config");
    assert_eq!(qwen(v).unwrap_err().key(), Some("text_config.model_type"));
    let mut v = qwen_base();
    v["model_type"] = json!("llama");
    assert!(matches!(
        qwen(v).unwrap_err(),
        ConfigError::ModelType { .. }
    ));
}

#[test]
fn qwen_rope_parameters_follow_the_reference() {
    // Absent: the dataclass default (theta 100000, an integer).
    let mut v = qwen_base();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("rope_parameters");
    let c = qwen(v).unwrap();
    assert_eq!(c.rope.rope_theta, RopeTheta::Int(100_000));
    assert_eq!(c.rope.mrope_section, vec![11, 11, 10]);
    assert!(c
        .defaults_used
        .contains(&"text_config.rope_parameters".to_string()));
    // Incomplete: the reference's ValueError, naming what is missing.
    let mut v = qwen_base();
    v["text_config"]["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("partial_rotary_factor");
    let e = qwen(v).unwrap_err();
    assert!(
        matches!(&e, ConfigError::RopeParametersIncomplete { missing, .. } if missing == &vec!["partial_rotary_factor"]),
        "{e}"
    );
    // Empty and null.
    for bad in [json!({}), Value::Null] {
        let mut v = qwen_base();
        v["text_config"]["rope_parameters"] = bad;
        assert_eq!(
            qwen(v).unwrap_err().key(),
            Some("text_config.rope_parameters")
        );
    }
    // Float theta is kept as written.
    let mut v = qwen_base();
    v["text_config"]["rope_parameters"]["rope_theta"] = json!(10000000.0);
    assert_eq!(qwen(v).unwrap().rope.rope_theta, RopeTheta::Float(1e7));
    // Wrong types.
    let mut v = qwen_base();
    v["text_config"]["rope_parameters"]["mrope_section"] = json!("11,11,10");
    assert_eq!(
        qwen(v).unwrap_err().key(),
        Some("text_config.rope_parameters.mrope_section")
    );
    let mut v = qwen_base();
    v["text_config"]["head_dim"] = json!(-1);
    assert!(matches!(
        qwen(v).unwrap_err(),
        ConfigError::WrongType { .. }
    ));
    // Sections over the frequencies: accepted, as mlx-vlm reads them (its
    // rotary clips each axis at the frequency count).
    let mut v = qwen_base();
    v["text_config"]["rope_parameters"]["mrope_section"] = json!([20, 20, 20]);
    let c = qwen(v).unwrap();
    assert_eq!(c.rope.mrope_section, vec![20, 20, 20]);
}

#[test]
fn qwen_vision_config_null_and_deepstack() {
    let mut v = qwen_base();
    v["vision_config"] = Value::Null;
    let c = qwen(v).unwrap();
    assert_eq!(c.vision_tokens().unwrap_err().key(), Some("vision_config"));
    let mut v = qwen_base();
    v["vision_config"]["deepstack_visual_indexes"] = json!([8, 16]);
    assert_eq!(
        qwen(v).unwrap_err().key(),
        Some("vision_config.deepstack_visual_indexes")
    );
    let mut v = qwen_base();
    v.as_object_mut().unwrap().remove("vision_config");
    assert_eq!(
        qwen(v).unwrap().vision_tokens().unwrap().spatial_merge_size,
        2
    );
    // Zero: read as the reference reads it, refused where it would divide.
    let mut v = qwen_base();
    v["vision_config"]["spatial_merge_size"] = json!(0);
    assert_eq!(
        qwen(v).unwrap().vision_tokens().unwrap_err().key(),
        Some("vision_config.spatial_merge_size")
    );
}

#[test]
fn gemma_defaults_and_errors() {
    let c = gemma(json!({"model_type": "gemma4"})).unwrap();
    assert_eq!((c.head_dim, c.rope_theta), (64, 100.0));
    assert!(c
        .defaults_used
        .contains(&"vision_config.rope_parameters".to_string()));
    let e =
        gemma(json!({"vision_config": {"rope_parameters": {"rope_type": "default"}}})).unwrap_err();
    assert_eq!(
        e.key(),
        Some("vision_config.rope_parameters.rope_theta"),
        "{e}"
    );
    let e = gemma(json!({"vision_config": null})).unwrap_err();
    assert_eq!(e.key(), Some("vision_config"));
    let e = gemma(json!({"vision_config": {"head_dim": "64"}})).unwrap_err();
    assert!(matches!(e, ConfigError::WrongType { .. }), "{e}");
    let e = gemma(json!({"model_type": "gemma3"})).unwrap_err();
    assert!(matches!(e, ConfigError::ModelType { .. }));
}

#[test]
fn file_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("layers-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("config.json");
    std::fs::write(&bad, b"{\"model_type\": ").unwrap();
    let e = Qwen3_5Config::from_file(&bad).unwrap_err();
    assert!(matches!(e, ConfigError::Json { line: 1, .. }), "{e}");
    std::fs::write(&bad, b"[]").unwrap();
    assert!(matches!(
        Qwen3_5Config::from_file(&bad).unwrap_err(),
        ConfigError::NotAnObject { .. }
    ));
    std::fs::write(
        &bad,
        serde_json::to_vec(&json!({"model_type": "qwen3_5"})).unwrap(),
    )
    .unwrap();
    let e = Qwen3_5Config::from_file(&bad).unwrap_err();
    assert!(e.to_string().starts_with(&bad.display().to_string()), "{e}");
    assert!(matches!(
        Qwen3_5Config::from_file(dir.join("nope.json")).unwrap_err(),
        ConfigError::Read { .. }
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
