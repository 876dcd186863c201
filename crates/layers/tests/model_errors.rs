//! Bad input to the decoder's entry points is a typed `ModelError` naming
//! what is wrong, never a panic: tokens of another shape, a cache of
//! another model, a directory that is no checkpoint.

use std::path::PathBuf;

use layers::model::{Model, ModelError};
use mlx_rs::Array;

fn tiny() -> Model {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/checkpoints/qwen3_5-tiny");
    Model::load(&dir).expect("the committed tiny checkpoint loads")
}

fn input_error(r: Result<Array, ModelError>, says: &str) {
    match r {
        Err(ModelError::Input(m)) => assert!(m.contains(says), "`{m}` does not say `{says}`"),
        Err(other) => panic!("expected ModelError::Input, got {other}"),
        Ok(a) => panic!("expected an error, got an array of shape {:?}", a.shape()),
    }
}

#[test]
fn verify_refuses_tokens_of_another_shape_and_a_cache_of_another_model() {
    let model = tiny();
    let mut cache = model.make_cache();
    // Two requests: verify takes one.
    let two = Array::from_slice(&[1i32, 2, 3, 4], &[2, 2]);
    input_error(model.verify(&two, &mut cache), "[1, k]");
    // No drafts.
    let none = Array::from_slice::<i32>(&[], &[1, 0]);
    input_error(model.verify(&none, &mut cache), "k >= 1");
    // A cache with a layer missing.
    let mut short = model.make_cache();
    short.pop();
    let drafts = Array::from_slice(&[1i32, 2], &[1, 2]);
    input_error(model.verify(&drafts, &mut short), "a cache of");
    input_error(
        model.forward(&drafts, &mut short, &mut layers::model::Trace::off()),
        "a cache of",
    );
    // Tokens that are not [B, L].
    let flat = Array::from_slice(&[1i32, 2], &[2]);
    input_error(
        model.forward(&flat, &mut cache, &mut layers::model::Trace::off()),
        "[B, L]",
    );
}

#[test]
fn a_directory_that_is_no_checkpoint_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("no-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    match Model::load(&dir) {
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(_) => panic!("an empty directory loaded as a model"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
