//! Case parameters as data. Every registered case is a [`Described`]: its
//! name, its seed and its family's typed parameters (serde). The registry
//! ([`crate::registry::Registry`]) lists descriptions and builds each case from its
//! description alone, through the builder its `builder` key names
//! (the `families!` list in `families/mod.rs`), so a
//! case can be printed (`conformance --describe`), persisted, edited and
//! run again as data (`conformance --cases FILE`). The explorer samples,
//! shrinks and keeps descriptions of the same types
//! (`fixtures/explore/kept.json`).
//!
//! Also the serde forms the descriptions share: a quantization spec as its
//! case-name spelling (`affine-4b-gs64`), dtypes as `mlx.core` names.

use layers::quantized::{Mode, QuantSpec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::case::{seed_of, Case};

/// One case as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Described {
    /// The case's name (its report line and snapshot key).
    pub name: String,
    /// Which builder reads `params`: the family module's key (e.g.
    /// `quantized/float`); `families::builders()` lists them.
    pub builder: String,
    /// The case's seed offset: its inputs come from the run's `--seed`
    /// plus this. A fixed case keeps the seed its name gave it when cases
    /// were closures (FNV-1a of the name, [`seed_of`]), so its inputs and
    /// snapshots did not move; from here on the seed is data.
    pub seed: u64,
    /// The builder's typed parameters.
    pub params: serde_json::Value,
}

/// A family's typed parameters: what one builder reads.
pub trait Params: Serialize + DeserializeOwned {
    /// The builder's key ([`Described::builder`]).
    const BUILDER: &'static str;
    /// The case these parameters describe, named `name` (its seed is set
    /// from the description afterwards).
    fn build(self, name: String) -> Case;
}

/// `params` of case `name`, with the seed the name gives it.
pub fn described<P: Params>(name: impl Into<String>, params: &P) -> Described {
    let name = name.into();
    Described {
        seed: seed_of(&name),
        builder: P::BUILDER.to_owned(),
        // Typed parameters always serialize (no maps with non-string keys).
        params: serde_json::to_value(params).unwrap_or(serde_json::Value::Null),
        name,
    }
}

/// A description read back from `--describe`'s output: its `ops` and
/// `ops_of_family` (the ops the tool says the case calls, for reading
/// only) dropped; every
/// other unknown key is still refused.
fn without_ops(mut v: serde_json::Value) -> Result<Described, serde_json::Error> {
    if let Some(o) = v.as_object_mut() {
        o.remove("ops");
        o.remove("ops_of_family");
    }
    serde_json::from_value(v)
}

/// A builder: a case from its name and its parameters as JSON.
pub type BuildFn = fn(String, serde_json::Value) -> Result<Case, String>;

/// Why dimensions cannot make a case, if so: each named one must be
/// positive, and their product (the work of one forward, about) at most
/// `max`. For the builders whose parameters are data.
pub fn dims(named: &[(&str, usize)], max: usize) -> Result<(), crate::case::CaseError> {
    let zero: Vec<&str> = named
        .iter()
        .filter(|(_, d)| *d == 0)
        .map(|(n, _)| *n)
        .collect();
    if !zero.is_empty() {
        return Err(crate::case::CaseError::Harness(format!(
            "parameters {} must be positive",
            zero.join(", ")
        )));
    }
    let product = named.iter().try_fold(1usize, |a, (_, d)| a.checked_mul(*d));
    if product.is_none_or(|p| p > max) {
        let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
        return Err(crate::case::CaseError::Harness(format!(
            "parameters {} multiply past {max}: a case this size is refused (shrink them)",
            names.join(" × ")
        )));
    }
    Ok(())
}

/// The largest integer a description's parameters may hold (a dimension,
/// a count, an offset): larger ones are refused before anything is
/// allocated. The fixed cases stay far below it (65 600 at most).
pub const MAX_PARAM_INTEGER: u64 = 1 << 20;

/// The builder of parameters `P` ([`BuildFn`]).
pub fn build_as<P: Params>(name: String, params: serde_json::Value) -> Result<Case, String> {
    let typed = serde_json::from_value::<P>(params.clone()).map_err(|e| e.to_string())?;
    // serde ignores fields a type does not have (and a unit variant takes
    // any): the typed value written back must hold every field given.
    let written = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    // Checked as typed (a float field given as an integer is a float).
    check_values(&written, "params")?;
    let mut unknown = Vec::new();
    unknown_fields(&params, &written, "params", &mut unknown);
    if !unknown.is_empty() {
        return Err(format!(
            "unknown or misplaced field{} {} (a typo? `--describe` prints the fields this builder reads)",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", ")
        ));
    }
    Ok(typed.build(name))
}

/// Integers at most [`MAX_PARAM_INTEGER`], and every `dtype` (or
/// `…_dtype`) a float dtype: the activations, weights and adapters of
/// every family are float.
fn check_values(v: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_u64() || n.is_i64() => {
            let too_big = n.as_u64().is_none_or(|u| u > MAX_PARAM_INTEGER);
            let negative = n.as_i64().is_some_and(|i| i < 0);
            if negative || too_big {
                return Err(format!(
                    "`{path}` = {n}: integers here are 0 to 2^20 (dimensions, counts, offsets)"
                ));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_values(item, &format!("{path}[{i}]"))?;
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let at = format!("{path}.{key}");
                if key == "dtype" || key.ends_with("_dtype") {
                    if let Value::String(d) = item {
                        if !["bfloat16", "float16", "float32"].contains(&d.as_str()) {
                            return Err(format!(
                                "`{at}` = \"{d}\": a float dtype (bfloat16, float16 or float32)"
                            ));
                        }
                    }
                }
                check_values(item, &at)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Fields of `given` that `written` (the typed value serialized back)
/// lacks: unknown names, or a value of the wrong shape (a list where an
/// object is read). A `null` given for an absent optional field is fine.
fn unknown_fields(
    given: &serde_json::Value,
    written: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (given, written) {
        (Value::Object(g), Value::Object(w)) => {
            for (key, value) in g {
                match w.get(key) {
                    Some(wv) => unknown_fields(value, wv, &format!("{path}.{key}"), out),
                    None if value.is_null() => {}
                    None => out.push(format!("`{path}.{key}`")),
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                unknown_fields(gv, wv, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Array(_), Value::Object(_)) => {
            out.push(format!("`{path}` (an object of named fields, not a list)"))
        }
        _ => {}
    }
}

/// The most bytes a `--cases` file may hold (64 MiB).
const MAX_CASES_FILE: u64 = 64 << 20;

/// The descriptions in `path`: a JSON array of [`Described`], or one per
/// line (what `conformance --describe` prints). Errors name the file, the
/// entry and what is wrong.
/// The longest case file name (`file_stem`) a `--cases` entry may have.
pub const MAX_STEM_BYTES: usize = 200;

pub fn read_file(path: &std::path::Path) -> Result<Vec<Described>, String> {
    use std::io::Read;
    let at = || format!("--cases {}", path.display());
    // Any readable file: a link, a pipe (`/dev/stdin`, `<(…)`) included.
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{}: no such file", at()),
        _ => format!("{}: {e}", at()),
    })?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(format!("{}: a directory, not a file of descriptions", at()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CASES_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", at()))?;
    if bytes.len() as u64 > MAX_CASES_FILE {
        return Err(format!(
            "{}: more than 64 MiB of descriptions; split it",
            at()
        ));
    }
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{}: not UTF-8 ({e})", at()))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let described: Vec<Described> = if text.trim_start().starts_with('[') {
        let entries: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("--cases {}: {e}", path.display()))?;
        entries
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let name = v.get("name").and_then(|n| n.as_str()).map(str::to_owned);
                without_ops(v).map_err(|e| {
                    let which = name.map_or_else(String::new, |n| format!(" (`{n}`)"));
                    format!("--cases {} entry {}{which}: {e}", path.display(), i + 1)
                })
            })
            .collect::<Result<_, _>>()?
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .and_then(without_ops)
                    .map_err(|e| format!("--cases {} line {}: {e}", path.display(), i + 1))
            })
            .collect::<Result<_, _>>()?
    };
    if described.is_empty() {
        return Err(format!("--cases {}: no descriptions", path.display()));
    }
    // Names become report lines, snapshot and `--keep-outputs` file names.
    let mut files = std::collections::BTreeMap::new();
    for (i, d) in described.iter().enumerate() {
        // The case's file name (`file_stem`: snapshots, kept outputs,
        // export vectors) must be one real name of at most 200 bytes, so
        // every suffix a writer adds still fits in 255: `.` or `..` would
        // name the directory itself or its parent.
        let stem = crate::case::file_stem(&d.name);
        if d.name.is_empty()
            || stem.len() > MAX_STEM_BYTES
            || stem == "."
            || stem == ".."
            || d.name.chars().any(char::is_control)
        {
            return Err(format!(
                "--cases {} entry {}: name {:?}: a file name of 1 to {MAX_STEM_BYTES} bytes (each / counts two), not `.` or `..`, no control characters",
                path.display(),
                i + 1,
                d.name
            ));
        }
        if let Some(j) = files.insert(crate::case::file_stem(&d.name), i) {
            return Err(format!(
                "--cases {}: entries {} and {} (`{}`, `{}`) name the same case file; rename one",
                path.display(),
                j + 1,
                i + 1,
                described[j].name,
                d.name
            ));
        }
    }
    Ok(described)
}

/// `QuantSpec` as its case-name spelling (`affine-4b-gs64`, `nvfp4-4b-gs16`).
pub mod spec {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(spec: &QuantSpec, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(spec)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QuantSpec, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// `<mode>-<bits>b-gs<group_size>`, validated as `mx.quantize` would.
    pub fn parse(text: &str) -> Result<QuantSpec, String> {
        let bad = || format!("`{text}` is not a spec like `affine-4b-gs64`");
        let mut parts = text.splitn(3, '-');
        let mode: Mode = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let bits = parts
            .next()
            .and_then(|b| b.strip_suffix('b'))
            .and_then(|b| b.parse().ok())
            .ok_or_else(bad)?;
        let group_size = parts
            .next()
            .and_then(|g| g.strip_prefix("gs"))
            .and_then(|g| g.parse().ok())
            .ok_or_else(bad)?;
        QuantSpec::new(mode, bits, group_size).map_err(|e| format!("`{text}`: {e}"))
    }
}

/// `Option<QuantSpec>` as its case-name spelling or `null`.
pub mod spec_opt {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(spec: &Option<QuantSpec>, s: S) -> Result<S::Ok, S::Error> {
        match spec {
            Some(spec) => s.collect_str(spec),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<QuantSpec>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| spec::parse(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{build, build_or_failing, builders};

    /// What a built case is, apart from its run function.
    fn identity(c: &Case) -> String {
        format!(
            "{} {} {} {:?} {:?} {:?} {:?}",
            c.name, c.seed, c.family, c.expect, c.applies, c.reference, c.glue_composed
        )
    }

    /// Every fixed case is its description: printed as JSON text, read
    /// back and built, it is the registry's case (name, seed, family,
    /// promise, backends, reference); every builder key is known, and
    /// the fixed cases keep the seeds their names gave them.
    #[test]
    fn every_fixed_case_round_trips_through_its_json_description() {
        let registered: Vec<String> = crate::registry::all().iter().map(identity).collect();
        let fixed = crate::families::fixed_descriptions();
        assert!(fixed.len() > 400, "{} fixed descriptions", fixed.len());
        for (i, d) in fixed.iter().enumerate() {
            let text = serde_json::to_string(d).unwrap();
            let back: Described = serde_json::from_str(&text).unwrap();
            assert_eq!(&back, d);
            let case = build(&back).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(identity(&case), registered[i]);
            assert_eq!(d.seed, seed_of(&d.name), "{}", d.name);
            assert!(builders().contains(&d.builder.as_str()), "{}", d.builder);
        }
    }

    #[test]
    fn a_description_names_what_cannot_be_built() {
        let mut d = crate::families::fixed_descriptions().remove(0);
        d.seed = 42;
        assert_eq!(build(&d).unwrap().seed, 42, "the seed is the description's");
        let unknown = Described {
            builder: "no-such".into(),
            ..d.clone()
        };
        let e = build(&unknown).err().unwrap();
        assert!(
            e.contains("no builder `no-such`") && e.contains("quantized/linear"),
            "{e}"
        );
        let bad = Described {
            params: serde_json::json!({"m": 8}),
            ..d.clone()
        };
        let e = build(&bad).err().unwrap();
        assert!(e.contains(&d.name) && e.contains("missing field"), "{e}");
        // Built anyway, as a case that fails with the reason.
        assert_eq!(build_or_failing(&bad).name, d.name);
    }

    /// Hand-edited parameters: a misspelt or extra field, a list for an
    /// object, an integer past 2^20 and an integer dtype are refused,
    /// naming the field, before anything is built.
    #[test]
    fn parameters_are_checked_as_data() {
        let fixed = crate::families::fixed_descriptions();
        let linear = fixed
            .iter()
            .find(|d| d.name == "quantized/linear/affine-4b-gs64/bf16/M8")
            .unwrap();
        let refused = |edit: &dyn Fn(&mut serde_json::Value), needle: &str| {
            let mut d = linear.clone();
            edit(&mut d.params);
            let e = build(&d).err().unwrap_or_else(|| panic!("{needle}: built"));
            assert!(e.contains(needle), "{needle}: {e}");
        };
        refused(
            &|p| p["x_veiw"] = serde_json::json!("sliced"),
            "`params.x_veiw`",
        );
        refused(
            &|p| p["m"] = serde_json::json!(1u64 << 40),
            "`params.m` = 1099511627776",
        );
        refused(
            &|p| p["dtype"] = serde_json::json!("int32"),
            "`params.dtype` = \"int32\"",
        );
        let unit = fixed
            .iter()
            .find(|d| d.name.ends_with("/scale-convention"))
            .unwrap();
        let mut d = unit.clone();
        d.params["zz"] = serde_json::json!(1);
        assert!(build(&d).err().unwrap().contains("`params.zz`"));
        let smoke = &fixed[0];
        let d = Described {
            params: serde_json::json!([8, 256, 128]),
            ..smoke.clone()
        };
        assert!(build(&d).err().unwrap().contains("not a list"));
        // A float field written as an integer is a float.
        let theta = fixed
            .iter()
            .find(|d| d.name.contains("inv-freq/device/theta-1e7"))
            .unwrap();
        let mut d = theta.clone();
        d.params["rope_theta"] = serde_json::json!(10_000_000u64);
        assert!(build(&d).is_ok());
    }

    #[test]
    fn a_cases_file_is_lines_or_an_array_and_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("describe-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixed = crate::families::fixed_descriptions();
        let two = &fixed[..2];
        let lines: String = two
            .iter()
            .map(|d| serde_json::to_string(d).unwrap() + "\n")
            .collect();
        let (a, b, c, e) = (dir.join("a"), dir.join("b"), dir.join("c"), dir.join("e"));
        std::fs::write(&a, &lines).unwrap();
        std::fs::write(&b, serde_json::to_string(two).unwrap()).unwrap();
        std::fs::write(&c, format!("{lines}\n{{\"name\": \"x\"}}\n")).unwrap();
        std::fs::write(&e, "\n").unwrap();
        assert_eq!(read_file(&a).unwrap(), two);
        assert_eq!(read_file(&b).unwrap(), two);
        let err = read_file(&c).unwrap_err();
        assert!(err.contains("line 4"), "{err}");
        assert!(read_file(&e).unwrap_err().contains("no descriptions"));
        // With a byte-order mark; names that cannot be report lines or
        // file names; two names of one case file.
        std::fs::write(&e, format!("\u{feff}{lines}")).unwrap();
        assert_eq!(read_file(&e).unwrap(), two);
        // Issue 40, class 20: `.`, `..` and names of 250+ bytes passed a
        // plain run but errored with --export or --keep-outputs.
        let long = "a".repeat(250);
        let slashes = "a/".repeat(70);
        for bad in ["", "a\nb", ".", "..", long.as_str(), slashes.as_str()] {
            let d = Described {
                name: bad.into(),
                ..two[0].clone()
            };
            std::fs::write(&e, serde_json::to_string(&[d]).unwrap()).unwrap();
            assert!(
                read_file(&e).unwrap_err().contains("no control characters"),
                "{bad:?}"
            );
        }
        let (x, y) = (
            Described {
                name: "a/b".into(),
                ..two[0].clone()
            },
            Described {
                name: "a__b".into(),
                ..two[1].clone()
            },
        );
        std::fs::write(&e, serde_json::to_string(&[x, y]).unwrap()).unwrap();
        assert!(read_file(&e)
            .unwrap_err()
            .contains("name the same case file"));
        assert!(read_file(&dir).unwrap_err().contains("a directory"));
        // An array's bad entry is named by its place and name.
        let mut bad = serde_json::to_value(two).unwrap();
        bad[1].as_object_mut().unwrap().remove("builder");
        std::fs::write(&e, bad.to_string()).unwrap();
        let err = read_file(&e).unwrap_err();
        assert!(
            err.contains("entry 2") && err.contains(&two[1].name) && err.contains("builder"),
            "{err}"
        );
        assert!(read_file(&dir.join("missing"))
            .unwrap_err()
            .contains("no such file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_spec_round_trips_through_its_name() {
        for bits in [2, 3, 4, 5, 6, 8] {
            for group_size in [32, 64, 128] {
                let s = QuantSpec::new(Mode::Affine, bits, group_size).unwrap();
                assert_eq!(spec::parse(&s.to_string()).unwrap(), s);
            }
        }
        for mode in [Mode::Mxfp4, Mode::Mxfp8, Mode::Nvfp4] {
            let s = QuantSpec::defaults(mode);
            assert_eq!(spec::parse(&s.to_string()).unwrap(), s);
        }
        for bad in [
            "",
            "affine",
            "affine-4b",
            "affine-4-gs64",
            "affine-7b-gs64",
            "int4-4b-gs64",
        ] {
            assert!(spec::parse(bad).is_err(), "{bad}");
        }
    }
}
