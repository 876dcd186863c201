//! What the cases actually send to each op and compare of its result, as
//! data: the export records every call's node types and which result
//! places a case compared ([`crate::schema::ManifestCall`]'s `types` and
//! `compared`); [`from_manifest`] folds them into one [`Signatures`] per
//! op. `docs/ops.json` is that of a whole export (`cargo xtask test`'s,
//! CPU, deep tier: `cargo xtask ops-doc`), and `docs/ops.md` is rendered
//! from it (`ops::markdown`, which reads [`documented`]). [`check`] is the doc's test: an
//! export that sends or compares anything `docs/ops.json` does not list,
//! or in another JSON type, dtype or rank, is a problem
//! (`--verify-export` runs it).

use std::collections::{BTreeMap, BTreeSet};

use oracle::{Arg, Value};
use serde::{Deserialize, Serialize};

/// Every op's signature as the cases use it, by op name.
pub type Signatures = BTreeMap<String, OpSignature>;

/// `docs/ops.json`: the ops' signatures, and the ops each exported case
/// calls (in first-call order) and each family's cases call (for a case
/// the export did not hold: `--cases`, the explorer's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Documented {
    pub ops: Signatures,
    pub cases: BTreeMap<String, Vec<String>>,
    pub families: BTreeMap<String, BTreeSet<String>>,
}

impl Documented {
    /// The ops case `name` (of `family`) calls, and whether they are its
    /// family's (the case itself is not in the doc). `None`: unknown.
    pub fn ops_of(&self, name: &str, family: &str) -> Option<(Vec<String>, bool)> {
        if let Some(ops) = self.cases.get(name) {
            return Some((ops.clone(), false));
        }
        self.families
            .get(family)
            .map(|ops| (ops.iter().cloned().collect(), true))
    }
}

/// What an export documents: its signatures and its cases' ops.
/// `family` gives a case's family (from the report or the registry).
pub fn documented_from(
    m: &crate::schema::Manifest,
    family: impl Fn(&str) -> Option<String>,
) -> Documented {
    let mut d = Documented {
        ops: from_manifest(m),
        ..Documented::default()
    };
    for case in &m.cases {
        let mut ops: Vec<String> = Vec::new();
        for call in &case.calls {
            if !ops.contains(&call.op) {
                ops.push(call.op.clone());
            }
        }
        if let Some(f) = family(&case.case) {
            d.families.entry(f).or_default().extend(ops.iter().cloned());
        }
        d.cases.insert(case.case.clone(), ops);
    }
    d
}

/// One op: its arguments and result places, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSignature {
    /// `x`, `lora_a`, `lora_a/*` (a list's items, any index).
    pub inputs: BTreeMap<String, Slot>,
    /// `value` (the whole result), `q`, `outputs/0`, ... (wire keys).
    pub outputs: BTreeMap<String, Slot>,
}

/// What was seen at one place, over every call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// JSON types: `array`, `int`, `float`, `bool`, `str`, `null`, `list`, `dict`.
    pub kinds: BTreeSet<String>,
    /// Array dtypes.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub dtypes: BTreeSet<String>,
    /// Array ranks.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub ranks: BTreeSet<usize>,
    /// Outputs only: the names cases compare this place as (empty:
    /// returned, never compared).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub compared_as: BTreeSet<String>,
}

/// The documented signatures and case ops: `docs/ops.json`, compiled in.
pub fn documented() -> Result<Documented, String> {
    serde_json::from_str(include_str!("../../../../docs/ops.json"))
        .map_err(|e| format!("docs/ops.json: {e}"))
}

/// A node's type as the manifest writes it.
fn type_of_tensor(t: &oracle::HostTensor) -> String {
    let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    format!("array {} [{}]", t.dtype.name(), shape.join(", "))
}

/// Every argument node's type, by `inputs/<path>` (wire's tensor keys).
pub fn arg_types(args: &[(&str, Arg)], out: &mut BTreeMap<String, String>) {
    fn walk(path: String, a: &Arg, out: &mut BTreeMap<String, String>) {
        let kind = match a {
            Arg::Tensor(t) => type_of_tensor(t),
            Arg::Int(_) => "int".into(),
            Arg::Float(_) => "float".into(),
            Arg::Bool(_) => "bool".into(),
            Arg::Str(_) => "str".into(),
            Arg::None => "null".into(),
            Arg::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(format!("{path}/{i}"), item, out);
                }
                "list".into()
            }
        };
        out.insert(path, kind);
    }
    for (name, a) in args {
        walk(format!("inputs/{name}"), a, out);
    }
}

/// Every result node: `(path, type, node digest)`, paths as wire's keys
/// (`value` for the whole result, a top-level dict's entries by key,
/// deeper ones `parent/key`).
pub fn value_nodes(v: &Value) -> Vec<(String, String, String)> {
    fn walk(path: &str, v: &Value, top: bool, out: &mut Vec<(String, String, String)>) {
        let child = |k: &str| {
            if top {
                k.to_owned()
            } else {
                format!("{path}/{k}")
            }
        };
        let kind = match v {
            Value::Tensor(t) => type_of_tensor(t),
            Value::Int(_) => "int".into(),
            Value::Float(_) => "float".into(),
            Value::Bool(_) => "bool".into(),
            Value::Str(_) => "str".into(),
            Value::None => "null".into(),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(&child(&i.to_string()), item, false, out);
                }
                "list".into()
            }
            Value::Dict(map) => {
                for (k, item) in map {
                    walk(&child(k), item, false, out);
                }
                "dict".into()
            }
        };
        out.push((path.to_owned(), kind, crate::case::node_digest(v)));
    }
    let mut out = Vec::new();
    walk("value", v, true, &mut out);
    out
}

/// An argument path with every list index as `*`.
fn any_index(path: &str) -> String {
    path.split('/')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl Slot {
    fn see(&mut self, ty: &str) {
        match ty.strip_prefix("array ") {
            Some(rest) => {
                self.kinds.insert("array".into());
                let (dtype, shape) = rest.split_once(' ').unwrap_or((rest, "[]"));
                self.dtypes.insert(dtype.to_owned());
                let dims = shape.trim_matches(['[', ']']);
                self.ranks.insert(if dims.is_empty() {
                    0
                } else {
                    dims.split(',').count()
                });
            }
            None => {
                self.kinds.insert(ty.to_owned());
            }
        }
    }
}

/// The signatures of every op an export's calls used.
pub fn from_manifest(m: &crate::schema::Manifest) -> Signatures {
    let mut out = Signatures::new();
    for case in &m.cases {
        for call in &case.calls {
            let op = out.entry(call.op.clone()).or_default();
            for (path, ty) in &call.types {
                if let Some(p) = path.strip_prefix("inputs/") {
                    op.inputs.entry(any_index(p)).or_default().see(ty);
                } else if let Some(p) = path.strip_prefix("outputs/") {
                    op.outputs.entry(p.to_owned()).or_default().see(ty);
                }
            }
            for (path, names) in &call.compared {
                let slot = op.outputs.entry(path.clone()).or_default();
                slot.compared_as.extend(names.iter().cloned());
            }
        }
    }
    out
}

/// What `seen` (an export's) uses that `documented` does not list: one
/// line per place, naming the op and the argument or output.
pub fn check(documented: &Signatures, seen: &Signatures) -> Vec<String> {
    let mut problems = Vec::new();
    let slot = |what: &str, op: &str, path: &str, doc: Option<&Slot>, s: &Slot| {
        let Some(doc) = doc else {
            return vec![format!("op `{op}`: {what} `{path}` is not in docs/ops.md")];
        };
        let mut p = Vec::new();
        let extra = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
            a.difference(b).cloned().collect::<Vec<_>>()
        };
        for (label, e) in [
            ("JSON type", extra(&s.kinds, &doc.kinds)),
            ("dtype", extra(&s.dtypes, &doc.dtypes)),
        ] {
            if !e.is_empty() {
                p.push(format!(
                    "op `{op}`: {what} `{path}` has {label} {} that docs/ops.md does not list",
                    e.join(", ")
                ));
            }
        }
        let ranks: Vec<String> = s
            .ranks
            .difference(&doc.ranks)
            .map(|r| r.to_string())
            .collect();
        if !ranks.is_empty() {
            p.push(format!(
                "op `{op}`: {what} `{path}` has rank {} that docs/ops.md does not list",
                ranks.join(", ")
            ));
        }
        if !s.compared_as.is_empty() && doc.compared_as.is_empty() {
            p.push(format!(
                "op `{op}`: output `{path}` is compared (as {}) but docs/ops.md lists it as not compared",
                s.compared_as.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        p
    };
    for (name, op) in seen {
        let Some(doc) = documented.get(name) else {
            problems.push(format!("op `{name}` is not in docs/ops.md"));
            continue;
        };
        for (path, s) in &op.inputs {
            problems.extend(slot("argument", name, path, doc.inputs.get(path), s));
        }
        for (path, s) in &op.outputs {
            problems.extend(slot("output", name, path, doc.outputs.get(path), s));
        }
    }
    if !problems.is_empty() {
        problems.push(
            "docs/ops.md is generated from a whole export: run `cargo xtask ops-doc` after `cargo xtask test` (or `cargo xtask export`)".into(),
        );
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Manifest, ManifestCall, ManifestCase};

    fn call(op: &str, types: &[(&str, &str)], compared: &[(&str, &str)]) -> ManifestCall {
        let mut c: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (p, n) in compared {
            c.entry((*p).into()).or_default().push((*n).into());
        }
        ManifestCall {
            args: serde_json::Value::Null,
            compared: c,
            file: String::new(),
            file_sha256: String::new(),
            glue: String::new(),
            op: op.into(),
            output_sha256: BTreeMap::new(),
            raised: None,
            result: serde_json::Value::Null,
            types: types
                .iter()
                .map(|(a, b)| ((*a).into(), (*b).into()))
                .collect(),
            version: 1,
        }
    }

    fn manifest(calls: Vec<ManifestCall>) -> Manifest {
        Manifest {
            cases: vec![ManifestCase {
                calls,
                case: "c".into(),
                reference: String::new(),
            }],
            environment: serde_json::Value::Null,
            protocol: 1,
            schema_version: 1,
            seed: 0,
            what: String::new(),
        }
    }

    fn mrope(extra: &[(&str, &str)], compared: &[(&str, &str)]) -> Manifest {
        let mut types = vec![
            ("inputs/q", "array bfloat16 [1, 2, 3, 8]"),
            ("inputs/mrope_section", "list"),
            ("inputs/mrope_section/0", "int"),
            ("outputs/value", "dict"),
            ("outputs/q", "array bfloat16 [1, 2, 3, 8]"),
            ("outputs/path", "str"),
        ];
        types.extend_from_slice(extra);
        let mut cmp = vec![("q", "q")];
        cmp.extend_from_slice(compared);
        manifest(vec![call("mrope_apply", &types, &cmp)])
    }

    #[test]
    fn a_manifest_folds_into_slots_with_list_items_as_any_index() {
        let s = from_manifest(&mrope(&[], &[]));
        let op = &s["mrope_apply"];
        assert_eq!(
            op.inputs["mrope_section/*"].kinds,
            ["int".to_owned()].into()
        );
        assert_eq!(op.inputs["q"].ranks, [4].into());
        assert_eq!(op.outputs["q"].compared_as, ["q".to_owned()].into());
        assert!(op.outputs["path"].compared_as.is_empty());
        assert!(check(&s, &s).is_empty());
    }

    /// The doc's test fails on an output a case compares that the doc
    /// does not list, on a returned place compared for the first time,
    /// and on another dtype or rank of a documented argument.
    #[test]
    fn the_check_fails_on_an_undocumented_output_type_or_comparison() {
        let doc = from_manifest(&mrope(&[], &[]));
        let added = from_manifest(&mrope(
            &[("outputs/inv_freq", "array float32 [4]")],
            &[("inv_freq", "inv_freq")],
        ));
        let p = check(&doc, &added);
        assert!(
            p[0].contains("op `mrope_apply`: output `inv_freq` is not in docs/ops.md"),
            "{p:?}"
        );
        let p = check(&doc, &from_manifest(&mrope(&[], &[("path", "path")])));
        assert!(
            p[0].contains("output `path` is compared (as path)"),
            "{p:?}"
        );
        let p = check(
            &doc,
            &from_manifest(&mrope(&[("inputs/q", "array float16 [1, 2, 8]")], &[])),
        );
        assert!(
            p.iter()
                .any(|l| l.contains("argument `q` has dtype float16")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.contains("argument `q` has rank 3")),
            "{p:?}"
        );
        let p = check(
            &doc,
            &from_manifest(&manifest(vec![call("nope", &[], &[])])),
        );
        assert!(p[0].contains("op `nope` is not in docs/ops.md"), "{p:?}");
    }

    /// docs/ops.json lists every op of the vocabulary a candidate is sent,
    /// and every output an op declares internal is a compared output there.
    #[test]
    fn the_documented_signatures_cover_the_vocabulary() {
        let doc = documented().unwrap();
        for op in super::super::ops::OPS {
            if !op.sent() {
                continue;
            }
            let Some(sig) = doc.ops.get(op.name) else {
                continue;
            };
            for internal in op.internal() {
                assert!(
                    sig.outputs
                        .get(*internal)
                        .is_some_and(|s| !s.compared_as.is_empty()),
                    "{}: internal output {internal} is not a compared output of docs/ops.json",
                    op.name
                );
            }
        }
    }
}
