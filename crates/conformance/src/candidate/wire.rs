//! The protocol's value encoding, shared by `--candidate` requests and
//! replies and by the exported vectors (`--export`): a JSON tree whose
//! array leaves are `{"$tensor": "<key>"}`, the arrays themselves in one
//! safetensors file beside it under those keys.
//!
//! | value | JSON |
//! | --- | --- |
//! | array | `{"$tensor": "x"}` (dtype and shape in the safetensors header) |
//! | int, bool, string, None | a JSON integer, `true`/`false`, a string, `null` |
//! | float | a JSON number with a fraction or exponent (`10000.0`); NaN and ±inf as `{"$float": "nan" \| "inf" \| "-inf"}` |
//! | list (Python list or tuple) | a JSON array |
//! | dict (results only) | a JSON object (no key starts with `$`) |
//!
//! Tensor keys are the leaf's path: argument `lora_a`'s second array is
//! `lora_a/1`, a result dict's entry `y` is `y`, a result that is one
//! array is `value`.

use std::collections::BTreeMap;

use oracle::{Arg, HostTensor, Value};
use serde_json::{json, Map, Value as Json};

/// The cap on a tensors file, kept with the safetensors reader.
pub use crate::kept::MAX_TENSORS_BYTES;

/// A tree and the arrays its `$tensor` leaves name.
#[derive(Debug, Default)]
pub struct Encoded {
    pub json: Json,
    pub tensors: Vec<(String, HostTensor)>,
}

/// Encodes keyword arguments as one JSON object keyed by name.
pub fn encode_args(args: &[(&str, Arg)]) -> Encoded {
    let mut tensors = Vec::new();
    let mut object = Map::new();
    for (name, arg) in args {
        object.insert((*name).to_owned(), arg_json(name, arg, &mut tensors));
    }
    Encoded {
        json: Json::Object(object),
        tensors,
    }
}

fn float_json(v: f64) -> Json {
    if v.is_finite() {
        // serde_json writes a float with a fraction (`1.0`), so a reader
        // in any language tells it from an integer.
        Json::from(v)
    } else if v.is_nan() {
        json!({"$float": "nan"})
    } else if v > 0.0 {
        json!({"$float": "inf"})
    } else {
        json!({"$float": "-inf"})
    }
}

fn arg_json(path: &str, arg: &Arg, tensors: &mut Vec<(String, HostTensor)>) -> Json {
    match arg {
        Arg::Tensor(t) => {
            tensors.push((path.to_owned(), t.clone()));
            json!({"$tensor": path})
        }
        Arg::Int(i) => Json::from(*i),
        Arg::Float(f) => float_json(*f),
        Arg::Bool(b) => Json::from(*b),
        Arg::Str(s) => Json::from(s.as_str()),
        Arg::None => Json::Null,
        Arg::List(items) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, a)| arg_json(&format!("{path}/{i}"), a, tensors))
                .collect(),
        ),
    }
}

/// Encodes a result (a reference's or a candidate's).
pub fn encode_value(v: &Value) -> Encoded {
    let mut tensors = Vec::new();
    let json = value_json("value", v, &mut tensors, true);
    Encoded { json, tensors }
}

fn value_json(path: &str, v: &Value, tensors: &mut Vec<(String, HostTensor)>, top: bool) -> Json {
    let child = |key: &str| {
        if top {
            key.to_owned()
        } else {
            format!("{path}/{key}")
        }
    };
    match v {
        Value::Tensor(t) => {
            tensors.push((path.to_owned(), t.clone()));
            json!({"$tensor": path})
        }
        Value::Int(i) => Json::from(*i),
        Value::Float(f) => float_json(*f),
        Value::Bool(b) => Json::from(*b),
        Value::Str(s) => Json::from(s.as_str()),
        Value::None => Json::Null,
        Value::List(items) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| value_json(&child(&i.to_string()), v, tensors, false))
                .collect(),
        ),
        Value::Dict(map) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), value_json(&child(k), v, tensors, false)))
                .collect(),
        ),
    }
}

/// A leaf that is a `{"$...": ...}` marker, if `object` is one.
fn marker<'a>(object: &'a Map<String, Json>, name: &str) -> Option<&'a Json> {
    (object.len() == 1).then(|| object.get(name)).flatten()
}

/// Decodes a result tree; `tensors` are the arrays of its safetensors
/// file. The error names the path of the first leaf that does not decode.
pub fn decode_value(json: &Json, tensors: &BTreeMap<String, HostTensor>) -> Result<Value, String> {
    decode_at("(the result)", json, tensors)
}

fn decode_at(
    path: &str,
    json: &Json,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<Value, String> {
    Ok(match json {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) if !n.is_f64() => Value::Int(i),
            _ => Value::Float(
                n.as_f64()
                    .ok_or_else(|| format!("`{path}`: the number {n} fits neither i64 nor f64"))?,
            ),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(items) => Value::List(
            items
                .iter()
                .enumerate()
                .map(|(i, j)| decode_at(&format!("{path}[{i}]"), j, tensors))
                .collect::<Result<_, _>>()?,
        ),
        Json::Object(object) => {
            if let Some(key) = marker(object, "$tensor") {
                let key = key
                    .as_str()
                    .ok_or_else(|| format!("`{path}`: `$tensor` must name a key (a string)"))?;
                let t = tensors.get(key).ok_or_else(|| {
                    format!("`{path}`: `$tensor` names `{key}`, which the reply's safetensors file does not hold")
                })?;
                Value::Tensor(t.clone())
            } else if let Some(f) = marker(object, "$float") {
                Value::Float(match f.as_str() {
                    Some("nan") => f64::NAN,
                    Some("inf") => f64::INFINITY,
                    Some("-inf") => f64::NEG_INFINITY,
                    _ => {
                        return Err(format!(
                            "`{path}`: `$float` is \"nan\", \"inf\" or \"-inf\", not {f}"
                        ))
                    }
                })
            } else if let Some(k) = object.keys().find(|k| k.starts_with('$')) {
                return Err(format!(
                    "`{path}`: unknown marker `{k}` (only `$tensor` and `$float` exist)"
                ));
            } else {
                Value::Dict(
                    object
                        .iter()
                        .map(|(k, j)| {
                            Ok((k.clone(), decode_at(&format!("{path}.{k}"), j, tensors)?))
                        })
                        .collect::<Result<_, String>>()?,
                )
            }
        }
    })
}

/// Decodes keyword arguments (the candidate's side of a request).
pub fn decode_args(
    json: &Json,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<Vec<(String, Value)>, String> {
    let Json::Object(object) = json else {
        return Err("`args` must be a JSON object".into());
    };
    object
        .iter()
        .map(|(k, j)| Ok((k.clone(), decode_at(k, j, tensors)?)))
        .collect()
}

/// The tensors of a safetensors file by key, read through the one safe
/// reader: a regular file of at most [`MAX_TENSORS_BYTES`], no link
/// followed (a candidate's outputs linked to `/dev/zero` were read until
/// memory ran out), no FIFO waited on. A missing file is an error.
pub fn read_tensors(path: &std::path::Path) -> Result<BTreeMap<String, HostTensor>, String> {
    let bytes = match conformance_cases::store::read_limited(
        path,
        MAX_TENSORS_BYTES,
        conformance_cases::store::Role::CandidateOutputs,
    ) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(format!("{}: no such file", path.display())),
        Err(e) => return Err(e.to_string()),
    };
    Ok(crate::kept::parse(&bytes, path)?.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oracle::DType;

    fn json_tree() -> impl proptest::strategy::Strategy<Value = Json> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<f64>().prop_map(|f| json!(f)),
            "[a-z$]{0,6}".prop_map(Json::String),
            "[a-z]{0,3}".prop_map(|k| json!({"$tensor": k})),
            "[a-z-]{0,4}".prop_map(|k| json!({"$float": k})),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
                proptest::collection::btree_map("[a-z$]{1,3}", inner, 0..4)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Issue 40, item 13: random hostile replies (result trees, and
        /// safetensors files of any header: dtypes, shapes past memory,
        /// offsets, lengths, bytes) decode to a value or an error naming
        /// it, never a panic.
        #[test]
        fn hostile_replies_are_errors_not_panics(
            tree in json_tree(),
            dtype in proptest::prop_oneof![
                proptest::strategy::Just("BF16"), proptest::strategy::Just("F32"),
                proptest::strategy::Just("F64"), proptest::strategy::Just("I8"),
                proptest::strategy::Just("U64"), proptest::strategy::Just("XX")
            ],
            shape in proptest::collection::vec(
                proptest::prop_oneof![0u64..4, proptest::strategy::Just(1u64 << 40), proptest::strategy::Just(u64::MAX)],
                0..4,
            ),
            offsets in (0u64..64, 0u64..64),
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let header = json!({"a": {"dtype": dtype, "shape": shape, "data_offsets": [offsets.0, offsets.1]}})
                .to_string();
            let mut file = (header.len() as u64).to_le_bytes().to_vec();
            file.extend_from_slice(header.as_bytes());
            file.extend_from_slice(&data);
            let path = std::path::Path::new("reply.safetensors");
            let tensors: BTreeMap<String, HostTensor> = match crate::kept::parse(&file, path) {
                Ok(t) => t.into_iter().collect(),
                Err(e) => {
                    proptest::prop_assert!(e.contains("reply.safetensors"), "{e}");
                    BTreeMap::new()
                }
            };
            let _ = crate::kept::parse(&raw, path);
            let _ = decode_value(&tree, &tensors);
            let _ = decode_args(&tree, &tensors);
        }
    }

    /// Issue 40, class 10: an outputs file linked to /dev/zero was read
    /// until 4 GiB or OOM, and a FIFO hung.
    #[test]
    fn an_outputs_file_that_is_a_link_or_a_fifo_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("1.out.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let started = std::time::Instant::now();
        assert!(read_tensors(&zero).unwrap_err().contains("symbolic link"));
        let fifo = dir.path().join("2.out.safetensors");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(read_tensors(&fifo).unwrap_err().contains("FIFO"));
        assert!(started.elapsed().as_secs() < 5);
    }

    /// Issue 40 (re-check): a too-large file's fix fits its role. A
    /// candidate's outputs file and a `--same-verdicts-as` report were told
    /// "restore it (a snapshot from git; ...)".
    #[test]
    fn a_too_large_file_is_told_the_fix_of_its_role() {
        let dir = tempfile::tempdir().unwrap();
        let big = |name: &str, len: u64| {
            let path = dir.path().join(name);
            // Sparse: no disk used, nothing read (the size is refused first).
            std::fs::File::create(&path).unwrap().set_len(len).unwrap();
            path
        };
        let outputs = big("1.out.safetensors", MAX_TENSORS_BYTES + 1);
        let e = read_tensors(&outputs).unwrap_err();
        assert!(
            !e.contains("git") && e.contains("the candidate wrote it"),
            "{e}"
        );
        let report = big("report.json", crate::schema::ReportFile::MAX_BYTES + 1);
        let e = crate::schema::ReportFile::read(&report).unwrap_err();
        assert!(
            !e.contains("git") && e.contains("report.json a run of this tool wrote"),
            "{e}"
        );
    }

    #[test]
    fn trees_survive_the_round_trip() {
        let t = HostTensor::new(DType::Bfloat16, vec![2], vec![1, 2, 3, 4]).unwrap();
        let mut map = BTreeMap::new();
        map.insert("y".to_owned(), Value::Tensor(t.clone()));
        map.insert("n".to_owned(), Value::Int(3));
        map.insert("theta".to_owned(), Value::Float(10000.0));
        map.insert("inf".to_owned(), Value::Float(f64::INFINITY));
        map.insert(
            "l".to_owned(),
            Value::List(vec![Value::Tensor(t.clone()), Value::None]),
        );
        let v = Value::Dict(map);
        let e = encode_value(&v);
        let text = e.json.to_string();
        assert!(text.contains("10000.0"), "{text}");
        let tensors: BTreeMap<_, _> = e.tensors.into_iter().collect();
        assert_eq!(tensors.len(), 2);
        let back = decode_value(&serde_json::from_str(&text).unwrap(), &tensors).unwrap();
        assert_eq!(format!("{back:?}"), format!("{v:?}"));
    }

    #[test]
    fn a_missing_tensor_names_its_path() {
        let err = decode_value(&json!({"y": {"$tensor": "y"}}), &BTreeMap::new()).unwrap_err();
        assert!(
            err.contains("(the result).y") && err.contains("does not hold"),
            "{err}"
        );
    }
}
