//! Malformed input never panics: random bytes and mutated valid files fed to
//! the safetensors parser, random config bytes and random quantization
//! configs fed to the config loader and the spec resolver. Only errors.

mod checkpoint_support;

use std::path::Path;
use std::sync::OnceLock;

use checkpoint_support::{float_tensor, quantized_tensors, raw_safetensors, TempDir};
use layers::checkpoint::{
    parse_config, write_model_dir, Checkpoint, LayerKind, SafetensorsFile, SafetensorsHeader,
};
use layers::quantized::{Mode, QuantSpec};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const P: &str = "m.proj";

/// A valid safetensors file with a few tensors of several dtypes.
fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = TempDir::new("prop-valid");
        let mut tensors =
            quantized_tensors(P, &[4, 64], QuantSpec::new(Mode::Affine, 4, 32).unwrap(), 1);
        tensors.push(float_tensor("m.norm", &[3], 2));
        write_model_dir(dir.path(), &json!({}), &[tensors]).unwrap();
        std::fs::read(dir.join("model.safetensors")).unwrap()
    })
}

fn parse(bytes: &[u8]) {
    if let Ok(header) = SafetensorsHeader::parse(bytes, Path::new("fuzz.safetensors")) {
        // Every accepted range lies inside the data section.
        let data_len = bytes.len() - 8 - header.header_len;
        for t in header.tensors.values() {
            assert!(t.data_offsets.0 <= t.data_offsets.1 && t.data_offsets.1 <= data_len);
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, xor: u8 },
    Truncate { len: usize },
    HeaderLen(u64),
    Insert { at: usize, byte: u8 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        prop_oneof![any::<u64>(), 0u64..400].prop_map(Mutation::HeaderLen),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len();
    match *m {
        // An earlier truncation may have emptied the buffer: nothing to flip.
        Mutation::Flip { at, xor } if n > 0 => bytes[at % n] ^= xor,
        Mutation::Flip { .. } => {}
        Mutation::Truncate { len } => bytes.truncate(len % (n + 1)),
        Mutation::HeaderLen(v) => {
            if n >= 8 {
                bytes[..8].copy_from_slice(&v.to_le_bytes())
            }
        }
        Mutation::Insert { at, byte } => bytes.insert(at % (n + 1), byte),
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(-1i64),
            Just(0),
            Just(4),
            Just(8),
            Just(16),
            Just(32),
            Just(64),
            Just(7),
            any::<i64>()
        ]
        .prop_map(Value::from),
        Just(json!(4.0)),
        prop_oneof![
            Just("affine"),
            Just("mxfp4"),
            Just("mxfp8"),
            Just("nvfp4"),
            Just("int4"),
            Just(""),
            Just("mxfp4-pack-quantized"),
            Just("modelopt"),
            Just("NVFP4"),
            Just("compressed-tensors"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("group_size"),
                        Just("bits"),
                        Just("mode"),
                        Just(P),
                        Just("quant_method"),
                        Just("format"),
                        Just("quantize_input"),
                        Just("global_scale"),
                        Just("quantization"),
                        Just("quant_algo"),
                        Just("x"),
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        parse(&bytes);
        // A length prefix that fits, followed by random "JSON".
        let mut framed = (bytes.len() as u64).to_le_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        parse(&framed);
    }

    #[test]
    fn mutated_valid_files_never_panic(mutations in prop::collection::vec(mutation(), 1..4)) {
        let mut bytes = valid_file().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        parse(&bytes);
    }

    #[test]
    fn random_headers_never_panic(
        entries in prop::collection::vec(
            (
                prop_oneof![Just("F32"), Just("BF16"), Just("U8"), Just("BOOL"), Just("F4"), Just("F6_E2M3"), Just("F8_E5M2"), Just("C64"), Just("X")],
                prop::collection::vec(prop_oneof![0u64..5, any::<u64>()], 0..3),
                (0u64..40, 0u64..40),
            ),
            0..4,
        ),
        data_len in 0usize..40,
    ) {
        let header: Map<String, Value> = entries
            .iter()
            .enumerate()
            .map(|(i, (dtype, shape, (s, e)))| {
                (format!("t{i}"), json!({"dtype": dtype, "shape": shape, "data_offsets": [s, e]}))
            })
            .collect();
        let bytes = raw_safetensors(&Value::Object(header), &vec![7u8; data_len]);
        parse(&bytes);
    }

    #[test]
    fn random_config_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        let _ = parse_config(&bytes, Path::new("config.json"));
    }

    #[test]
    fn random_quantization_configs_only_error(
        quantization in json_value(),
        legacy in json_value(),
        in_features in prop_oneof![Just(64i32), Just(0), Just(96), 1i32..1000],
    ) {
        let dir = TempDir::new("prop-config");
        let tensors = quantized_tensors(P, &[4, 64], QuantSpec::new(Mode::Mxfp4, 4, 32).unwrap(), 3);
        let config = json!({"quantization": quantization, "quantization_config": legacy});
        write_model_dir(dir.path(), &config, &[tensors]).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        for kind in [LayerKind::Linear, LayerKind::Switch] {
            let _ = ckpt.resolve_quant_spec(P, kind, in_features);
            let _ = ckpt.quantized_tensors(P, kind, in_features);
        }
    }
}

#[test]
fn mutated_files_on_disk_only_error() {
    // The memory-mapped path, with every tensor converted to an MLX array.
    let dir = TempDir::new("prop-disk");
    let valid = valid_file();
    for i in 0..valid.len() {
        let mut bytes = valid.to_vec();
        bytes[i] ^= 0x5a;
        let path = dir.join("m.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(file) = SafetensorsFile::open(&path) {
            let names: Vec<String> = file.tensors().map(|(n, _)| n.to_owned()).collect();
            for n in names {
                let _ = file.array(&n);
            }
        }
    }
    let path = dir.join("empty.safetensors");
    std::fs::write(&path, b"").unwrap();
    assert!(SafetensorsFile::open(&path).is_err());
}
