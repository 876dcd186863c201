//! `--export DIR` (`cargo xtask export`): golden vectors. For every
//! must-equal case, every reference call it makes is written as one
//! safetensors file (the arguments under `inputs/<key>`, the reference's
//! result under `outputs/<key>`, keys as in [`crate::candidate::wire`]) and
//! described in `DIR/manifest.json`:
//!
//! ```text
//! DIR/manifest.json                         schema, environment, every case's calls
//! DIR/vectors/<case, / as __>/<n>-<op>.safetensors
//! ```
//!
//! Each call's entry gives the op and its version, the argument tree and
//! the result tree (their arrays named by key in the file), the reference's
//! exception line where it raised (refusal cases), the file's sha256, and
//! a sha256 of every output array's bits (dtype name, shape as u64 LE,
//! bytes: [`crate::case::digest_of`]). Nothing in it depends on time, paths
//! of this machine outside the export, or run order: the same seed gives
//! the same files.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use oracle::{Arg, HostTensor, Value};
use serde_json::{json, Value as Json};

use crate::candidate::{ops, wire};
use crate::schema::{Manifest, ManifestCall, ManifestCase};

/// The manifest's schema version.
pub const SCHEMA_VERSION: u64 = 1;

/// `--export DIR` as an interceptor: records every must-equal case's
/// reference calls, and writes them at the case's end.
pub struct Recorder {
    dir: PathBuf,
}

impl Recorder {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
}

impl crate::hooks::Interceptor for Recorder {
    fn case_start(&self, case: &crate::case::Case) {
        begin(case.expect == crate::case::Expect::MustEqual);
    }
    fn after_call(&self, call: &crate::hooks::ReferenceCall<'_>) {
        record(call.function, call.kwargs, call.result);
    }
    fn case_end(&self, case: &crate::case::Case, result: &mut crate::result::CaseResult) {
        use crate::result::Verdict;
        let kept = matches!(result.verdict, Verdict::Pass | Verdict::Fail);
        let origins = result
            .output
            .as_ref()
            .map(|o| o.origins.clone())
            .unwrap_or_default();
        if let Err(e) = finish(&self.dir, &case.name, case.reference, kept, &origins) {
            result.verdict = Verdict::Error;
            result.message = Some(format!("harness error: --export: {e}"));
            result.error_kind = Some(crate::result::ErrorKind::Harness);
        }
    }
}

/// Empties a claimed export directory (its marker says an earlier export
/// made it: [`crate::outdir::claim`]) of that export's files (the
/// manifest, `vectors/`, `cases/`); anything else in it is left alone.
pub fn clear(claim: &crate::outdir::Claim) -> Result<(), String> {
    let dir = claim.dir();
    for sub in ["vectors", "cases"] {
        let p = dir.join(sub);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let m = dir.join("manifest.json");
    if m.exists() {
        std::fs::remove_file(&m).map_err(|e| format!("{}: {e}", m.display()))?;
    }
    Ok(())
}

struct Call {
    glue: &'static str,
    args: wire::Encoded,
    outcome: Result<wire::Encoded, String>,
    /// Every argument and result node's type, by manifest path.
    types: std::collections::BTreeMap<String, String>,
    /// Every result node: its path and [`crate::case::node_digest`].
    nodes: Vec<(String, String)>,
}

thread_local! {
    /// The calls of the case in flight (`None`: not recording).
    static CALLS: RefCell<Option<Vec<Call>>> = const { RefCell::new(None) };
}

/// Starts recording a case's calls (must-equal cases).
fn begin(record: bool) {
    CALLS.with(|c| *c.borrow_mut() = record.then(Vec::new));
}

/// Records one reference call: its arguments and result, or the last line
/// of what it raised.
fn record(glue: &'static str, args: &[(&str, Arg)], result: Result<&Value, &oracle::OracleError>) {
    CALLS.with(|c| {
        if let Some(calls) = c.borrow_mut().as_mut() {
            let args: Vec<(&str, Arg)> = args.iter().map(|(k, a)| (*k, portable(a))).collect();
            let mut types = std::collections::BTreeMap::new();
            crate::candidate::signatures::arg_types(&args, &mut types);
            let mut nodes = Vec::new();
            if let Ok(v) = result {
                for (path, ty, digest) in crate::candidate::signatures::value_nodes(v) {
                    types.insert(format!("outputs/{path}"), ty);
                    nodes.push((path, digest));
                }
            }
            calls.push(Call {
                glue,
                args: wire::encode_args(&args),
                outcome: result.map(wire::encode_value).map_err(raised_line),
                types,
                nodes,
            });
        }
    });
}

/// A path argument as the manifest gives it: relative to the suite's home
/// (`fixtures/...`), or `$TMP/<name>` for a file a case wrote for the call
/// (the pid and random parts of its name dropped), so the export does not
/// depend on this machine. Other arguments unchanged.
fn portable(a: &Arg) -> Arg {
    match a {
        Arg::Str(s) if s.starts_with('/') => {
            let path = Path::new(s);
            let fixtures = crate::home::Home::get().fixtures_dir();
            if let Ok(rest) = path.strip_prefix(&fixtures) {
                return Arg::Str(format!("fixtures/{}", rest.to_string_lossy()));
            }
            if path.starts_with(std::env::temp_dir()) {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let stable: String = name
                    .split(['-', '.'])
                    .filter(|part| !part.chars().all(|c| c.is_ascii_digit()) && !looks_random(part))
                    .collect::<Vec<_>>()
                    .join("-");
                return Arg::Str(format!("$TMP/{stable}"));
            }
            a.clone()
        }
        Arg::List(items) => Arg::List(items.iter().map(portable).collect()),
        other => other.clone(),
    }
}

/// A tempfile-style random part (mixed letters and digits, 6+ long).
fn looks_random(part: &str) -> bool {
    part.len() >= 6
        && part.chars().any(|c| c.is_ascii_digit())
        && part.chars().any(|c| c.is_ascii_alphabetic())
}

/// The exception line of a reference error (`ValueError: ...`).
fn raised_line(e: &oracle::OracleError) -> String {
    match e {
        oracle::OracleError::Python { traceback, .. } => traceback
            .trim_end()
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_owned(),
        other => other.to_string(),
    }
}

/// Where a case's vectors go, relative to the export directory.
fn case_dir(case: &str) -> PathBuf {
    Path::new("vectors").join(crate::case::file_stem(case))
}

/// Writes the case's recorded calls (a `cases/<case>.json` fragment the
/// run assembles into the manifest, and one safetensors file per call).
/// `keep` is false for a case that ended in ERROR or was skipped: its calls
/// may be incomplete. A failed case's vectors are written: they are the
/// reference's, whatever the port did.
/// `origins` are the case's compared outputs and the reference node each
/// was read from: each call's `compared` lists the places they match.
fn finish(
    root: &Path,
    case: &str,
    reference: &str,
    keep: bool,
    origins: &[(String, Option<String>)],
) -> Result<(), String> {
    let Some(calls) = CALLS.with(|c| c.borrow_mut().take()) else {
        return Ok(());
    };
    if !keep {
        return Ok(());
    }
    let dir = case_dir(case);
    std::fs::create_dir_all(root.join(&dir))
        .map_err(|e| format!("{}: {e}", root.join(&dir).display()))?;
    let mut entries = Vec::new();
    for (n, call) in calls.into_iter().enumerate() {
        let op = ops::by_glue(call.glue).ok_or_else(|| {
            format!(
                "reference call `{}` is in no op of the vocabulary",
                call.glue
            )
        })?;
        let file = dir.join(format!("{n}-{}.safetensors", op.name));
        let mut tensors: Vec<(String, HostTensor)> = call
            .args
            .tensors
            .iter()
            .map(|(k, t)| (format!("inputs/{k}"), t.clone()))
            .collect();
        let (result, raised, output_sha256) = match &call.outcome {
            Ok(e) => {
                tensors.extend(
                    e.tensors
                        .iter()
                        .map(|(k, t)| (format!("outputs/{k}"), t.clone())),
                );
                let digests = e
                    .tensors
                    .iter()
                    .map(|(k, t)| (k.clone(), crate::case::digest_of(t)))
                    .collect();
                (prefixed(&e.json, "outputs/"), None, digests)
            }
            Err(line) => (Json::Null, Some(line.clone()), Default::default()),
        };
        crate::kept::write_file(&root.join(&file), &tensors, None)?;
        let bytes =
            std::fs::read(root.join(&file)).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut compared: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (path, digest) in &call.nodes {
            for (name, _) in origins
                .iter()
                .filter(|(_, o)| o.as_deref() == Some(digest.as_str()))
            {
                let names = compared.entry(path.clone()).or_default();
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        entries.push(ManifestCall {
            args: prefixed(&call.args.json, "inputs/"),
            compared,
            file: file.to_string_lossy().replace('\\', "/"),
            file_sha256: sha256_hex(&bytes),
            glue: op.glue.to_owned(),
            op: op.name.to_owned(),
            output_sha256,
            raised,
            result,
            types: call.types,
            version: op.version,
        });
    }
    let fragment = ManifestCase {
        calls: entries,
        case: case.to_owned(),
        reference: reference.to_owned(),
    };
    let path = root
        .join("cases")
        .join(format!("{}.json", crate::case::file_stem(case)));
    write_json(&path, &fragment)
}

/// `{"$tensor": k}` leaves renamed to the key they have in the file.
fn prefixed(tree: &Json, prefix: &str) -> Json {
    match tree {
        Json::Array(items) => Json::Array(items.iter().map(|j| prefixed(j, prefix)).collect()),
        Json::Object(o) if o.len() == 1 && o.get("$tensor").is_some_and(Json::is_string) => {
            json!({"$tensor": format!("{prefix}{}", o["$tensor"].as_str().unwrap_or_default())})
        }
        Json::Object(o) => Json::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), prefixed(v, prefix)))
                .collect(),
        ),
        other => other.clone(),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())? + "\n";
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", path.display())
        })
}

/// The run's last step: the manifest from the cases' fragments (sorted by
/// case name), with the environment the vectors came from. `environment`
/// holds backend, device, MLX version and lock hash.
pub fn write_manifest(root: &Path, environment: Json, seed: u64) -> Result<usize, String> {
    let cases_dir = root.join("cases");
    let mut fragments = Vec::new();
    if cases_dir.is_dir() {
        for entry in
            std::fs::read_dir(&cases_dir).map_err(|e| format!("{}: {e}", cases_dir.display()))?
        {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let fragment: ManifestCase =
                    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                fragments.push(fragment);
            }
        }
    }
    fragments.sort_by(|a, b| a.case.cmp(&b.case));
    let n = fragments.len();
    let manifest = Manifest {
        cases: fragments,
        environment,
        protocol: crate::candidate::client::PROTOCOL,
        schema_version: SCHEMA_VERSION,
        seed,
        what: "Golden vectors of the MLX conformance suite: per must-equal case, each reference call (op, arguments, the reference's result). Arrays are in the safetensors file named by `file`, under the keys the `$tensor` leaves name; output_sha256 is sha256(dtype name, shape as u64 LE, bytes). See docs/ops.md for the ops.".to_owned(),
    };
    write_json(&root.join("manifest.json"), &manifest)?;
    std::fs::remove_dir_all(&cases_dir).map_err(|e| format!("{}: {e}", cases_dir.display()))?;
    Ok(n)
}

/// The largest manifest.json [`verify`] reads (a whole suite's is a few
/// MiB): a larger one is refused unread.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// The largest vector file [`verify`] reads.
pub const MAX_VECTOR_BYTES: u64 = 1 << 30;

/// What [`verify`] checked.
#[derive(Debug, Default)]
pub struct Verified {
    pub cases: usize,
    pub calls: usize,
    pub outputs: usize,
    /// Whether the calls were checked against docs/ops.json (a CPU
    /// export's: the doc is generated from one; another backend runs
    /// cases a CPU run skips).
    pub doc_checked: bool,
}

/// Re-reads an export: every call's file has its `file_sha256`, holds
/// every array its argument and result trees name, and every output's bits
/// have their `output_sha256`. With `report` (the run's report.json),
/// every must-equal case that reached a verdict there (pass or FAIL) is
/// in the manifest. Every problem is listed, by file.
pub fn verify(root: &Path, report: Option<&Path>) -> Result<Verified, VerifyError> {
    use conformance_cases::store;
    let manifest_path = root.join("manifest.json");
    let bytes = match store::read_confined(
        root,
        "manifest.json",
        MAX_MANIFEST_BYTES,
        store::Role::Export,
    ) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(VerifyError::Unreadable(format!(
                "{}: no such file; give the directory an export wrote",
                manifest_path.display()
            )))
        }
        Err(e) => return Err(VerifyError::Unreadable(e.to_string())),
    };
    let manifest: Json = serde_json::from_slice(&bytes).map_err(|e| {
        VerifyError::Unreadable(format!("{}: not JSON: {e}", manifest_path.display()))
    })?;
    if manifest["schema_version"] != SCHEMA_VERSION {
        return Err(VerifyError::Unreadable(format!(
            "{}: schema_version {} (this runner reads {SCHEMA_VERSION}); export again with this runner",
            manifest_path.display(),
            manifest["schema_version"]
        )));
    }
    let manifest: Manifest = serde_json::from_value(manifest).map_err(|e| {
        VerifyError::Unreadable(format!(
            "{}: not an export manifest: {e}",
            manifest_path.display()
        ))
    })?;
    // An export of nothing verifies nothing: refused, not "every file matches".
    if manifest.cases.is_empty() {
        return Err(VerifyError::Unreadable(format!(
            "{}: lists no cases, so there is nothing to verify; export again (an export holds every must-equal case that reached a verdict)",
            manifest_path.display()
        )));
    }
    let cases = &manifest.cases;
    let mut problems = Vec::new();
    let mut done = Verified {
        cases: cases.len(),
        ..Verified::default()
    };
    for case in cases {
        let name = case.case.as_str();
        // Every exported case is a must-equal case that called the
        // reference: one with no calls had them stripped.
        if case.calls.is_empty() {
            problems.push(format!(
                "{name}: lists no reference calls (an exported must-equal case holds every call it made)"
            ));
        }
        for call in &case.calls {
            done.calls += 1;
            let file = call.file.as_str();
            let path = root.join(file);
            let bytes =
                match store::read_confined(root, file, MAX_VECTOR_BYTES, store::Role::Export) {
                    Ok(Some(b)) => b,
                    Ok(None) => {
                        problems.push(format!("{name}: {file}: no such file"));
                        continue;
                    }
                    Err(e) => {
                        problems.push(format!("{name}: {file}: {e}"));
                        continue;
                    }
                };
            if call.file_sha256 != sha256_hex(&bytes) {
                problems.push(format!(
                    "{name}: {file}: its sha256 is not the manifest's file_sha256"
                ));
            }
            let tensors: std::collections::BTreeMap<String, HostTensor> =
                match crate::kept::parse(&bytes, &path) {
                    Ok(t) => t.into_iter().collect(),
                    Err(e) => {
                        problems.push(format!("{name}: {e}"));
                        continue;
                    }
                };
            let mut named = Vec::new();
            tensor_keys(&call.args, &mut named);
            tensor_keys(&call.result, &mut named);
            for key in named {
                if !tensors.contains_key(&key) {
                    problems.push(format!(
                        "{name}: {file}: no array `{key}`, which the trees name"
                    ));
                }
            }
            for (key, digest) in &call.output_sha256 {
                done.outputs += 1;
                match tensors.get(&format!("outputs/{key}")) {
                    Some(t) if *digest == crate::case::digest_of(t) => {}
                    Some(_) => problems.push(format!(
                        "{name}: {file}: `outputs/{key}`'s bits are not the manifest's output_sha256"
                    )),
                    None => problems.push(format!("{name}: {file}: no array `outputs/{key}`")),
                }
            }
        }
    }
    // What the cases sent and compared is what docs/ops.md lists (the doc
    // is a CPU export's: another backend's export is not held to it).
    done.doc_checked = manifest.environment["backend"] == "cpu";
    if done.doc_checked {
        if cases
            .iter()
            .flat_map(|c| &c.calls)
            .any(|c| c.types.is_empty())
        {
            problems.push(
                "calls without `types` (an older runner's export): export again to check them against docs/ops.md".into(),
            );
        }
        let documented =
            crate::candidate::signatures::documented().map_err(VerifyError::Unreadable)?;
        problems.extend(crate::candidate::signatures::check(
            &documented.ops,
            &crate::candidate::signatures::from_manifest(&manifest),
        ));
        for case in cases {
            // A case with no calls is already a problem ("lists no reference
            // calls"): its calls were stripped, and docs/ops.md is not wrong.
            if case.calls.is_empty() {
                continue;
            }
            let mut ops: Vec<String> = Vec::new();
            for call in &case.calls {
                if !ops.contains(&call.op) {
                    ops.push(call.op.clone());
                }
            }
            if let Some(doc) = documented.cases.get(&case.case) {
                if *doc != ops {
                    problems.push(format!(
                        "{}: calls ops {} but docs/ops.md lists {} (run `cargo xtask ops-doc`)",
                        case.case,
                        ops.join(", "),
                        doc.join(", ")
                    ));
                }
            }
        }
    }
    if let Some(report) = report {
        let report = crate::schema::ReportFile::read(report).map_err(VerifyError::Unreadable)?;
        // The export and the report must be one run's: the same seed and
        // the same environment (backend, MLX, lock).
        let seed = report.environment["seed"].as_u64();
        if seed != Some(manifest.seed) {
            problems.push(format!(
                "the manifest's seed {} is not the report's ({}): they are not one run's",
                manifest.seed,
                seed.map_or("none".to_owned(), |s| s.to_string())
            ));
        }
        // An export is never of a --perturb run (the runner refuses the
        // pair): a perturbed report's reference is not the export's.
        if report.environment["perturb"].as_bool() == Some(true) {
            problems.push(
                "the report is of a --perturb run (a perturbed reference), an export never is: they are not one run's".to_owned(),
            );
        }
        for key in ["backend", "mlx_version", "lock_sha256"] {
            let (ours, theirs) = (&manifest.environment[key], &report.environment[key]);
            if ours != theirs {
                problems.push(format!(
                    "the manifest's environment {key} {ours} is not the report's ({theirs}): they are not one run's"
                ));
            }
        }
        let exported: std::collections::BTreeSet<&str> =
            cases.iter().map(|c| c.case.as_str()).collect();
        for c in &report.cases {
            use crate::result::Verdict;
            if matches!(c.verdict, Verdict::Pass | Verdict::Fail)
                && !exported.contains(c.name.as_str())
            {
                problems.push(format!(
                    "{}: a must-equal case of the report ({}) is not in the manifest",
                    c.name,
                    match c.verdict {
                        Verdict::Pass => "pass",
                        _ => "fail",
                    }
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(done)
    } else {
        Err(VerifyError::Problems(problems))
    }
}

/// Why [`verify`] did not pass.
#[derive(Debug)]
pub enum VerifyError {
    /// The manifest (or the report) cannot be read: not an export of this
    /// runner's schema.
    Unreadable(String),
    /// The export's files do not match it: every problem, by case and file.
    Problems(Vec<String>),
}

/// The `$tensor` keys a tree names.
fn tensor_keys(tree: &Json, out: &mut Vec<String>) {
    match tree {
        Json::Array(items) => items.iter().for_each(|j| tensor_keys(j, out)),
        Json::Object(o) if o.len() == 1 && o.get("$tensor").is_some_and(Json::is_string) => {
            out.push(o["$tensor"].as_str().unwrap_or_default().to_owned());
        }
        Json::Object(o) => o.values().for_each(|j| tensor_keys(j, out)),
        _ => {}
    }
}
