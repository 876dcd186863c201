//! One test per typed safetensors / model-directory error, plus round trips.

mod checkpoint_support;

use checkpoint_support::{float_tensor, model_dir, normal, raw_safetensors, same_bits, TempDir};
use layers::checkpoint::{
    write_arrays, write_model_dir, Checkpoint, CheckpointError, RawTensor, SafetensorsFile,
    SafetensorsHeader, TensorDtype,
};
use mlx_rs::{Array, Dtype};
use serde_json::json;
use std::path::Path;

fn parse(bytes: &[u8]) -> Result<SafetensorsHeader, CheckpointError> {
    SafetensorsHeader::parse(bytes, Path::new("t.safetensors"))
}

fn u8_entry(start: u64, end: u64, n: u64) -> serde_json::Value {
    json!({"dtype": "U8", "shape": [n], "data_offsets": [start, end]})
}

#[test]
fn file_too_short() {
    let err = parse(&[1, 2, 3]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::FileTooShort { len: 3, .. }),
        "{err}"
    );
}

#[test]
fn header_length_past_end_of_file() {
    let mut bytes = raw_safetensors(&json!({}), &[]);
    bytes[..8].copy_from_slice(&1000u64.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::HeaderLengthPastEnd {
                header_len: 1000,
                ..
            }
        ),
        "{err}"
    );
    // A length that does not even fit in memory.
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&bytes).unwrap_err(),
        CheckpointError::HeaderLengthPastEnd { .. }
    ));
}

#[test]
fn invalid_header_json() {
    let text = b"{\"a\": ";
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text);
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(err, CheckpointError::InvalidHeaderJson { .. }),
        "{err}"
    );
    // Valid JSON of the wrong structure.
    for header in [
        json!([1, 2]),
        json!({"a": 5}),
        json!({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}),
        json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}),
        json!({"a": {"shape": [1], "data_offsets": [0, 1]}}),
        json!({"__metadata__": {"k": 1}}),
    ] {
        let err = parse(&raw_safetensors(&header, &[0])).unwrap_err();
        assert!(
            matches!(err, CheckpointError::InvalidHeaderJson { .. }),
            "{header}: {err}"
        );
    }
}

#[test]
fn unknown_dtype() {
    let header = json!({"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}});
    let err = parse(&raw_safetensors(&header, &[0])).unwrap_err();
    match err {
        CheckpointError::UnknownDtype { tensor, dtype, .. } => {
            assert_eq!((tensor.as_str(), dtype.as_str()), ("w", "F7"))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn offsets_out_of_range() {
    let err = parse(&raw_safetensors(&json!({"a": u8_entry(0, 8, 8)}), &[0; 6])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OffsetsOutOfRange { ref tensor, end: 8, data_len: 6, .. } if tensor == "a"),
        "{err}"
    );
    // Reversed offsets.
    let err = parse(&raw_safetensors(&json!({"a": u8_entry(4, 2, 2)}), &[0; 6])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OffsetsOutOfRange { .. }),
        "{err}"
    );
}

#[test]
fn overlapping_tensors_read_their_own_ranges() {
    // mx.load (mlx 0.32.2) reads overlapping ranges, each tensor its own;
    // so does the port (the conformance case compares the bits).
    let dir = TempDir::new("overlap");
    let path = dir.join("t.safetensors");
    let header = json!({"a": u8_entry(0, 4, 4), "b": u8_entry(2, 6, 4)});
    std::fs::write(&path, raw_safetensors(&header, &[1, 2, 3, 4, 5, 6])).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.tensor("a").unwrap().data, &[1, 2, 3, 4]);
    assert_eq!(file.tensor("b").unwrap().data, &[3, 4, 5, 6]);
    // A gap between tensors is accepted, as mx.load accepts it.
    let header = json!({"a": u8_entry(0, 2, 2), "b": u8_entry(4, 6, 2)});
    assert_eq!(
        parse(&raw_safetensors(&header, &[0; 6]))
            .unwrap()
            .tensors
            .len(),
        2
    );
}

#[test]
fn size_mismatch() {
    let header = json!({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}});
    let err = parse(&raw_safetensors(&header, &[0; 20])).unwrap_err();
    match err {
        CheckpointError::SizeMismatch {
            tensor,
            expected_bytes,
            actual_bytes,
            ..
        } => {
            assert_eq!(
                (tensor.as_str(), expected_bytes, actual_bytes),
                ("w", Some(24), 20)
            )
        }
        other => panic!("{other}"),
    }
    // A shape whose byte count overflows.
    let header =
        json!({"w": {"dtype": "F32", "shape": [u64::MAX, u64::MAX], "data_offsets": [0, 4]}});
    let err = parse(&raw_safetensors(&header, &[0; 4])).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::SizeMismatch {
                expected_bytes: None,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_dtype_mx_load_refuses_refuses_the_file() {
    let dir = TempDir::new("f8");
    for (dtype, bytes) in [("F8_E5M2", 2), ("F64", 16), ("F4", 1)] {
        let path = dir.join(&format!("{dtype}.safetensors"));
        let header = json!({
            "x": {"dtype": dtype, "shape": [2], "data_offsets": [0, bytes]},
            "e4": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [bytes, bytes + 2]},
        });
        let mut data = vec![1u8; bytes as usize];
        data.extend([3, 200]);
        std::fs::write(&path, raw_safetensors(&header, &data)).unwrap();
        let Err(err) = SafetensorsFile::open(&path) else {
            panic!("{dtype}: opened")
        };
        assert!(
            matches!(err, CheckpointError::UnsupportedArrayDtype { ref tensor, .. } if tensor == "x"),
            "{dtype}: {err}"
        );
        assert!(err.to_string().contains("unsupported dtype"), "{err}");
    }
    // F8_E4M3 loads as raw uint8, as mx.load does.
    let path = dir.join("e4.safetensors");
    let header = json!({"e4": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}});
    std::fs::write(&path, raw_safetensors(&header, &[3, 200])).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    let a = file.array("e4").unwrap();
    assert_eq!(a.dtype(), Dtype::Uint8);
    assert_eq!(a.as_slice::<u8>(), &[3, 200]);
}

#[test]
fn tensor_not_found() {
    let dir = model_dir("nf", &json!({}), vec![float_tensor("a", &[2], 0)]);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt.array("b").unwrap_err();
    assert!(
        matches!(err, CheckpointError::TensorNotFound { ref name } if name == "b"),
        "{err}"
    );
}

#[test]
fn config_missing() {
    let dir = TempDir::new("nocfg");
    write_arrays(dir.join("model.safetensors"), &[("a", &normal(&[2], 0))]).unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::ConfigMissing { .. }),
        "{err}"
    );
}

#[test]
fn config_malformed() {
    let dir = TempDir::new("badcfg");
    write_arrays(dir.join("model.safetensors"), &[("a", &normal(&[2], 0))]).unwrap();
    for text in ["{\"a\": ", "[1, 2]", "\u{0}"] {
        std::fs::write(dir.join("config.json"), text).unwrap();
        let err = Checkpoint::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, CheckpointError::ConfigMalformed { .. }),
            "{text:?}: {err}"
        );
    }
}

#[test]
fn no_weight_files() {
    let dir = TempDir::new("noweights");
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    // Only files matching model*.safetensors count, as in mlx_lm's glob.
    write_arrays(dir.join("adapters.safetensors"), &[("a", &normal(&[2], 0))]).unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::NoWeightFiles { .. }),
        "{err}"
    );
}

#[test]
fn sharded_checkpoint_with_index() {
    let dir = TempDir::new("sharded");
    let shards = vec![
        vec![float_tensor("a", &[2, 3], 1)],
        vec![float_tensor("b", &[4], 2), float_tensor("c", &[1], 3)],
    ];
    write_model_dir(dir.path(), &json!({"model_type": "x"}), &shards).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.tensor_names().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(ckpt.files().len(), 2);
    let b = ckpt.array("b").unwrap();
    assert_eq!((b.shape(), b.dtype()), (&[4][..], Dtype::Bfloat16));
    assert_eq!(ckpt.tensor("b").unwrap().data, shards[1][0].data.as_slice());
}

#[test]
fn the_index_is_not_read_as_load_model_does_not_read_it() {
    let dir = model_dir("index", &json!({}), vec![float_tensor("a", &[2], 0)]);
    let index = dir.join("model.safetensors.index.json");
    for text in [
        "{\"weight_map\": 3}".to_owned(),
        json!({"weight_map": {"a": "model-00002-of-00002.safetensors"}}).to_string(),
        json!({"weight_map": {"zz": "model.safetensors"}}).to_string(),
    ] {
        std::fs::write(&index, &text).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ckpt.tensor_names().collect::<Vec<_>>(), ["a"], "{text}");
    }
}

#[test]
fn duplicate_tensor_across_shards() {
    let dir = TempDir::new("dup");
    let shards = vec![
        vec![float_tensor("a", &[2], 1)],
        vec![float_tensor("a", &[2], 2)],
    ];
    write_model_dir(dir.path(), &json!({}), &shards).unwrap();
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::DuplicateTensor { ref tensor, .. } if tensor == "a"),
        "{err}"
    );
}

#[test]
fn io_error_names_the_file() {
    let err = SafetensorsFile::open("/nonexistent/x.safetensors").unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/x.safetensors"),
        "{err}"
    );
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    let dir = TempDir::new("dtypes");
    let base = normal(&[3, 5], 9);
    let arrays: Vec<(String, Array)> = [
        Dtype::Bool,
        Dtype::Uint8,
        Dtype::Uint16,
        Dtype::Uint32,
        Dtype::Uint64,
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::Float16,
        Dtype::Bfloat16,
        // Not Float64: mx.load refuses F64 files, and so does the port.
        Dtype::Float32,
    ]
    .into_iter()
    .map(|d| {
        (
            format!("{d:?}"),
            mlx_rs::ops::multiply(&base, Array::from_f32(50.0))
                .unwrap()
                .as_dtype(d)
                .unwrap(),
        )
    })
    .collect();
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let path = dir.join("model.safetensors");
    write_arrays(&path, &refs).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    for (name, a) in &arrays {
        let loaded = file.array(name).unwrap();
        assert!(same_bits(a, &loaded), "{name}");
    }
    // Bytes written by the safetensors crate directly load too.
    let raw = RawTensor {
        name: "r".into(),
        dtype: TensorDtype::I16,
        shape: vec![2],
        data: vec![1, 0, 255, 255],
    };
    layers::checkpoint::write_safetensors(dir.join("r.safetensors"), &[raw], None).unwrap();
    let r = SafetensorsFile::open(dir.join("r.safetensors"))
        .unwrap()
        .array("r")
        .unwrap();
    assert_eq!(r.as_slice::<i16>(), &[1, -1]);
}

#[test]
fn metadata_forms_mx_load_accepts_are_read() {
    // Before: `"__metadata__": null` (what mx.save_safetensors writes
    // without metadata) was refused as invalid JSON structure.
    let t = u8_entry(0, 1, 1);
    let cases = [
        (json!({"__metadata__": null, "a": t}), None),
        (json!({"a": t}), None),
        (
            json!({"__metadata__": {"format": "mlx"}, "a": t}),
            Some(vec![("format", "mlx")]),
        ),
        // MLX reads a bare string as the value of an empty key.
        (json!({"__metadata__": "x", "a": t}), Some(vec![("", "x")])),
        // Unknown fields in an entry, and integral float offsets, as mx.load.
        (
            json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.0], "extra": 7}}),
            None,
        ),
    ];
    for (header, expected) in cases {
        let parsed =
            parse(&raw_safetensors(&header, &[9])).unwrap_or_else(|e| panic!("{header}: {e}"));
        let expected = expected.map(|kv| {
            kv.into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<std::collections::BTreeMap<_, _>>()
        });
        assert_eq!(parsed.metadata, expected, "{header}");
        assert_eq!(parsed.tensors["a"].data_offsets, (0, 1), "{header}");
    }
    // Still refused, as by mx.load: non-string metadata values, fractional
    // or negative offsets.
    for header in [
        json!({"__metadata__": {"k": 1}, "a": t}),
        json!({"__metadata__": [1], "a": t}),
        json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0.5, 1]}}),
        json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 1]}}),
    ] {
        assert!(parse(&raw_safetensors(&header, &[9])).is_err(), "{header}");
    }
}

#[test]
fn files_written_by_the_safetensors_crate_are_read() {
    use safetensors::tensor::{serialize_to_file, TensorView};
    let dir = TempDir::new("crate-form");
    let f32s: Vec<u8> = [1.0f32, -2.5, 3.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let u32s: Vec<u8> = [7u32, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    for metadata in [
        None,
        Some(std::collections::HashMap::from([(
            "format".to_owned(),
            "pt".to_owned(),
        )])),
    ] {
        let path = dir.join("c.safetensors");
        let tensors = [
            (
                "w",
                TensorView::new(safetensors::Dtype::F32, vec![3], &f32s).unwrap(),
            ),
            (
                "ids",
                TensorView::new(safetensors::Dtype::U32, vec![1, 2], &u32s).unwrap(),
            ),
        ];
        serialize_to_file(tensors, metadata.clone(), &path).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        assert_eq!(
            file.array("w").unwrap().as_slice::<f32>(),
            &[1.0, -2.5, 3.25]
        );
        assert_eq!(file.array("ids").unwrap().shape(), &[1, 2]);
        assert_eq!(file.metadata().map(|m| m.len()), metadata.map(|m| m.len()),);
    }
}

#[test]
fn a_file_truncated_while_open_is_a_typed_error_not_a_crash() {
    // Before: the file was memory-mapped, and reading a tensor whose page
    // was cut off killed the process with SIGBUS.
    let dir = TempDir::new("shrink");
    let path = dir.join("s.safetensors");
    let big = vec![7u8; 1 << 16];
    let header =
        json!({"a": u8_entry(0, 1 << 16, 1 << 16), "b": u8_entry(1 << 16, (1 << 16) + 4, 4)});
    let mut data = big.clone();
    data.extend_from_slice(&[1, 2, 3, 4]);
    std::fs::write(&path, raw_safetensors(&header, &data)).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.tensor("b").unwrap().data, &[1, 2, 3, 4]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    for name in ["a", "b"] {
        let err = file.array(name).unwrap_err();
        assert!(
            matches!(err, CheckpointError::FileChanged { opened_len, now_len: 100, .. } if opened_len > 100),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("changed while open"), "{err}");
    }
}
