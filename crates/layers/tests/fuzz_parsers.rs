//! A time-budgeted fuzz run of the parsers that take untrusted input: the
//! safetensors header (random bytes, mutated valid files, random headers),
//! `config.json` (random bytes, mutated valid configs), and `get_rope_index`
//! with its position windows (random prompts, grids, masks, windows,
//! including huge sizes). Every call must return, `Ok` or a typed error: a
//! panic fails the run with the input, an abort or a signal kills it.
//!
//! Ignored by default (it runs for a while); README "Reliability":
//!
//! ```sh
//! FUZZ_SECONDS=600 cargo test --release -p layers --test fuzz_parsers -- --ignored --nocapture
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use layers::checkpoint::{parse_config, SafetensorsHeader};
use layers::position::{rope_index, GridThw, RopeIndexInput, VisionTokens};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRng, TestRunner};
use serde_json::json;

const TOKENS: VisionTokens = VisionTokens {
    image_token_id: 9,
    video_token_id: 8,
    vision_start_token_id: 7,
    spatial_merge_size: 2,
};

fn valid_safetensors() -> Vec<u8> {
    let header = json!({
        "__metadata__": {"format": "mlx"},
        "a.weight": {"dtype": "U32", "shape": [4, 2], "data_offsets": [0, 32]},
        "a.scales": {"dtype": "BF16", "shape": [4, 1], "data_offsets": [32, 40]},
        "b": {"dtype": "F32", "shape": [], "data_offsets": [40, 44]},
    });
    let text = header.to_string().into_bytes();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend((0..44).map(|i| i as u8));
    bytes
}

fn valid_config() -> Vec<u8> {
    json!({
        "model_type": "qwen3_5",
        "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                         "model.layers.0.mlp": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
                         "lm_head": false},
        "text_config": {"rope_theta": 1e7, "partial_rotary_factor": 0.25}
    })
    .to_string()
    .into_bytes()
}

/// Random edits: flips, truncation, insertions, a rewritten length prefix.
fn mutate(bytes: &mut Vec<u8>, edits: &[(u8, usize, u8)]) {
    for &(kind, at, byte) in edits {
        let n = bytes.len();
        match kind % 4 {
            0 if n > 0 => bytes[at % n] ^= byte.max(1),
            1 => bytes.truncate(at % (n + 1)),
            2 => bytes.insert(at % (n + 1), byte),
            3 if n >= 8 => bytes[..8].copy_from_slice(&(at as u64).to_le_bytes()),
            _ => {}
        }
    }
}

fn edits() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    prop::collection::vec(
        (
            any::<u8>(),
            prop_oneof![0usize..200, any::<usize>()],
            any::<u8>(),
        ),
        1..6,
    )
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0usize..7, 1 => Just(usize::MAX), 1 => Just(1usize << 40), 1 => any::<usize>()]
}

fn grids() -> impl Strategy<Value = Option<Vec<GridThw>>> {
    prop::option::of(prop::collection::vec(
        (size(), size(), size()).prop_map(|(t, h, w)| GridThw::new(t, h, w)),
        0..4,
    ))
}

/// One target: a strategy and the call under test.
struct Target {
    name: &'static str,
    iterations: u64,
    run: Box<dyn FnMut(&mut TestRunner)>,
}

fn target<S: Strategy + 'static>(
    name: &'static str,
    strategy: S,
    mut call: impl FnMut(&S::Value) + 'static,
) -> Target
where
    S::Value: std::fmt::Debug,
{
    Target {
        name,
        iterations: 0,
        run: Box::new(move |runner| {
            let value = strategy.new_tree(runner).expect("strategy").current();
            if catch_unwind(AssertUnwindSafe(|| call(&value))).is_err() {
                panic!("{name}: panicked on {value:?}");
            }
        }),
    }
}

#[test]
#[ignore = "a timed fuzz run; see the module docs"]
fn fuzz_parsers_for_a_while() {
    let seconds: u64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let valid_st = valid_safetensors();
    let valid_cfg = valid_config();
    let st_path = Path::new("fuzz.safetensors");
    let mut targets = vec![
        target(
            "safetensors: random bytes",
            prop::collection::vec(any::<u8>(), 0..512),
            move |b| {
                let _ = SafetensorsHeader::parse(b, st_path);
                let mut framed = (b.len() as u64).to_le_bytes().to_vec();
                framed.extend_from_slice(b);
                let _ = SafetensorsHeader::parse(&framed, st_path);
            },
        ),
        target("safetensors: mutated valid file", edits(), move |e| {
            let mut bytes = valid_st.clone();
            mutate(&mut bytes, e);
            if let Ok(h) = SafetensorsHeader::parse(&bytes, st_path) {
                let data_len = bytes.len() - 8 - h.header_len;
                for t in h.tensors.values() {
                    assert!(t.data_offsets.0 <= t.data_offsets.1 && t.data_offsets.1 <= data_len);
                }
            }
        }),
        target(
            "config.json: random bytes",
            prop::collection::vec(any::<u8>(), 0..256),
            |b| {
                let _ = parse_config(b, Path::new("config.json"));
            },
        ),
        target("config.json: mutated valid config", edits(), move |e| {
            let mut bytes = valid_cfg.clone();
            mutate(&mut bytes, e);
            let _ = parse_config(&bytes, Path::new("config.json"));
        }),
        target(
            "get_rope_index + windows",
            (
                prop::collection::vec(
                    prop_oneof![Just(1i32), Just(7), Just(8), Just(9), any::<i32>()],
                    0..48,
                ),
                grids(),
                grids(),
                prop::option::of(prop::collection::vec(any::<bool>(), 0..48)),
                (size(), size()),
            ),
            |(ids, images, videos, mask, (offset, len))| {
                let input = RopeIndexInput {
                    input_ids: ids,
                    image_grid_thw: images.as_deref(),
                    video_grid_thw: videos.as_deref(),
                    attention_mask: mask.as_deref(),
                };
                if let Ok(index) = rope_index(&input, &TOKENS) {
                    let _ = index.window(*offset, (*len).min(1 << 26));
                    let _ = index.window(*offset, *len);
                }
            },
        ),
    ];
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        for t in &mut targets {
            for _ in 0..64 {
                (t.run)(&mut runner);
                t.iterations += 1;
            }
        }
    }
    println!("fuzz run: {seconds} s, no panic, no crash");
    for t in &targets {
        println!("  {:<36} {:>10} inputs", t.name, t.iterations);
    }
}
