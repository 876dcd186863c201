//! The snapshot gate: per case, a digest of the port's output bits plus the
//! findings, pinned per backend × device family × MLX version under
//! `fixtures/snapshots/<set>/`, so a change inside MLX shows even when both
//! sides move together.
//!
//! Files are in insta's `.snap` format (a YAML header, then the body), written
//! by our own atomic writer ([`store`]: no link followed, no half-written
//! file). `cargo xtask conformance` only checks (nothing is written);
//! `cargo xtask fixtures review` prints the diffs and `cargo xtask fixtures
//! accept` is the only writer. Each snapshot carries a
//! `seal`: the sha256 of the whole file (insta's header with the provenance,
//! and the body) with the seal's own value blanked, so a hand-edited or
//! corrupted file, header included, is a typed error naming it rather than
//! a silent pass.

pub use conformance_cases::store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::result::{CaseResult, Verdict};

/// What the gate does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Compare only; never write.
    Check,
    /// Compare, print each drift's diff; never write.
    Review,
    /// Write every snapshot that differs, delete orphans.
    Accept,
}

/// A snapshot file problem, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {file} is corrupted: {reason}. Fix: restore it from git, or re-record with `cargo xtask fixtures accept`")]
    Corrupt { file: PathBuf, reason: String },
    #[error("snapshot {file} was edited by hand (its seal does not match its content). Snapshots are written only by `cargo xtask fixtures accept`")]
    HandEdited { file: PathBuf },
    #[error("cannot read snapshot: {0}")]
    Store(#[from] store::StoreError),
}

/// Gate status of one case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Status {
    Match,
    /// No snapshot recorded for this case.
    Missing,
    /// The recorded snapshot differs: `recorded` and `now` are the bodies.
    Drift {
        recorded: Option<Value>,
        now: Value,
    },
    /// Written by `fixtures accept`; `previous` says what was there.
    Written {
        previous: Previous,
    },
    Invalid {
        error: String,
    },
    /// Skipped, errored or failed cases are not gated.
    NotChecked,
}

/// What an accepted snapshot replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Previous {
    /// No snapshot: a new one.
    None,
    /// A snapshot with another body: changed.
    Different,
    /// A corrupted or hand-edited snapshot: re-recorded.
    Invalid,
}

/// Provenance written into every snapshot's metadata (not part of the
/// sealed body: a set recorded on one GPU of a declared family stays valid
/// on another, and the recorded architecture says where it came from).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Provenance {
    pub mlx_version: String,
    pub backend: String,
    /// The set's device key (see [`device_key`]).
    pub device: String,
    /// The device's own name as MLX reports it (`NVIDIA H200`, …).
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub device_name: String,
    /// The device's architecture string (`applegpu_g13s`, `air64_v26`,
    /// `sm_90`, `x86_64`).
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub architecture: String,
    /// Host versions that can change GPU bits (CUDA: driver, runtime).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub host: BTreeMap<String, String>,
    pub lock_sha256: String,
    pub date: String,
    /// MLX's kernel-affecting settings the set was recorded with
    /// (`crate::kernel_settings`); absent in files recorded before they
    /// were recorded.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub kernel_settings: BTreeMap<String, String>,
}

/// The snapshot set directory for this backend, device key and MLX version:
/// `fixtures/snapshots/<backend>-<device key>-mlx<version>/`.
pub fn set_dir(fixtures: &Path, backend: &str, device_family: &str, mlx_version: &str) -> PathBuf {
    fixtures
        .join("snapshots")
        .join(format!("{backend}-{device_family}-mlx{mlx_version}"))
}

/// The default device key of a set (the naming policy; README "Snapshot
/// sets"). Bits may legitimately differ between devices of one backend
/// (MLX picks kernels per GPU architecture), so by default a set is keyed
/// by the device it was recorded on:
///
/// - `cpu`: `<os>-<arch>` (`linux-x86_64`, `macos-aarch64`);
/// - `metal`: the GPU's architecture string as MLX reports it
///   (`applegpu_g13s` on an M1 Mac; the hosted macos-14 runners report
///   their virtual GPU, e.g. `air64_v26`);
/// - `cuda`: the device's own name, lower-cased with non-alphanumerics as
///   `-` (`NVIDIA H200` → `nvidia-h200`).
///
/// A run can *declare* the key instead (`--device-family` or
/// `MLX_CONFORMANCE_DEVICE_FAMILY`), so that the set a maintainer records
/// for a CI runner family is exactly the one that CI reads; the
/// architecture string is then kept as provenance in every snapshot.
pub fn device_key(backend: crate::case::Backend, architecture: &str, device_name: &str) -> String {
    use crate::case::Backend;
    match backend {
        Backend::Cpu => format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        Backend::Metal => slug(architecture),
        Backend::Cuda => slug(device_name),
    }
}

/// The device key of the CPU set a GPU run's findings are compared with:
/// the GPU run's declared key when it declared one (a CI runner family
/// records both its CPU and its GPU set under that key), else the CPU's
/// derived key (`<os>-<arch>`).
pub fn cpu_key_beside(declared: Option<&str>) -> String {
    match declared {
        Some(key) => key.to_owned(),
        None => device_key(crate::case::Backend::Cpu, "", ""),
    }
}

/// Lower-case ASCII letters, digits and `_`; everything else becomes one
/// `-` (never leading or trailing). Empty input gives `unknown`.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

/// Checks a declared device key (`--device-family`): 1 to 64 of lowercase
/// ASCII letters, digits, `.`, `_` and `-`, not starting with `.` — it
/// becomes part of a directory name.
pub fn check_device_key(key: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
    if key.is_empty() || key.len() > 64 || key.starts_with('.') || !key.chars().all(allowed) {
        return Err(format!(
            "--device-family `{key}` cannot name a snapshot set: use 1 to 64 lowercase letters, digits, '.', '_' or '-', not starting with '.' (e.g. `gha-macos-14`)"
        ));
    }
    Ok(())
}

/// Whether a recorded set exists: its directory (a real one, directly
/// inside the snapshots directory) holds at least one `.snap` file. A set
/// path that is a link, a file or a link loop is an error naming it, not a
/// missing set.
pub fn set_exists(dir: &Path) -> Result<bool, store::StoreError> {
    let root = dir.parent().unwrap_or(Path::new("."));
    if !store::check_set_dir(root, dir)? {
        return Ok(false);
    }
    Ok(store::entries(dir)?.iter().any(store::is_snapshot))
}

/// The commands that review and record a set, as the terminal, report.md
/// and the missing-set line print them (one source for all three).
#[derive(Debug, Clone, Serialize)]
pub struct SetCommands {
    pub review: String,
    pub accept: String,
}

impl SetCommands {
    /// `extra`: the runner flags that select this set (`--device gpu`,
    /// `--device-family …`), appended to both commands.
    pub fn new(xtask_prefix: &str, extra: &str) -> Self {
        let tail = if extra.is_empty() {
            String::new()
        } else {
            format!(" {extra}")
        };
        Self {
            review: format!("cargo xtask fixtures review{xtask_prefix}{tail}"),
            accept: format!("cargo xtask fixtures accept{xtask_prefix}{tail}"),
        }
    }

    /// The same commands for a run bundle (no cargo there): its launcher
    /// with `--fixtures review|accept`.
    pub fn for_bundle(launcher: &Path, extra: &str) -> Self {
        let tail = if extra.is_empty() {
            String::new()
        } else {
            format!(" {extra}")
        };
        let launcher = launcher.display();
        Self {
            review: format!("{launcher} --fixtures review{tail}"),
            accept: format!("{launcher} --fixtures accept{tail}"),
        }
    }
}

/// Whether this process runs under CI (`CI=true` or `CI=1`, as GitHub
/// Actions and most CI services set it): snapshots are never written, and
/// a missing set fails the run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Where a run happens, for what a missing set means and who records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPlace {
    /// A user's machine: a missing set leaves the verdicts standing (exit
    /// 0 when they pass); the line names the accept command.
    Local,
    /// CI on macOS: the set is recorded by the apple-silicon workflow's
    /// bootstrap dispatch (CI refuses the accept command).
    CiMacos,
    /// CI elsewhere: the set is recorded outside CI on a machine of the
    /// runner's kind, and committed.
    Ci,
}

impl RunPlace {
    /// This process's place.
    pub fn here() -> Self {
        match (in_ci(), cfg!(target_os = "macos")) {
            (false, _) => RunPlace::Local,
            (true, true) => RunPlace::CiMacos,
            (true, false) => RunPlace::Ci,
        }
    }

    /// Whether a missing set fails the run (exit 2): under CI only, as
    /// insta treats a new snapshot. A user's first run on a device no set
    /// was recorded for still exits 0 when every must-equal case passes.
    pub fn requires_set(self) -> bool {
        self != RunPlace::Local
    }
}

/// The one-line diagnosis of a missing set: its name, where it is looked
/// for, what that means here and how it gets recorded.
pub fn missing_set_line(dir: &Path, commands: &SetCommands, place: RunPlace) -> String {
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let dir = dir.display();
    match place {
        RunPlace::Local => format!(
            "bits are not pinned on this device: snapshot set {name} is missing (no .snap files in {dir}), so the verdicts are port vs reference only; record the set with `{}` (README: \"Snapshot sets\")",
            commands.accept
        ),
        RunPlace::CiMacos => format!(
            "snapshot set {name} is missing: no .snap files in {dir}; CI never writes snapshots: record it with the bootstrap run of the apple-silicon workflow (Actions → apple-silicon → Run workflow, input `bootstrap` ticked) and commit the sets from its artifact (README: \"Apple Silicon CI\")"
        ),
        RunPlace::Ci => format!(
            "snapshot set {name} is missing: no .snap files in {dir}; CI never writes snapshots: record it outside CI on a machine of this runner's kind with `{}` and commit it (README: \"Snapshot sets\")",
            commands.accept
        ),
    }
}

/// The file name of a case's snapshot.
pub fn file_name(case: &str) -> String {
    format!("{}.snap", crate::case::file_stem(case))
}

/// The seal's value while the seal is computed.
const UNSEALED: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The body pinned for a case: one digest per output (so a drift names the
/// output that moved), reference path, outputs' verdicts, and the finding
/// (the seal is added when the file is written).
pub fn body(result: &CaseResult) -> Option<Value> {
    let out = result.output.as_ref()?;
    let outputs: serde_json::Map<String, Value> = out
        .outputs
        .iter()
        .map(|o| (o.name.clone(), json!(o.comparison.summary())))
        .collect();
    let mut body = json!({
        "case": result.name,
        "expect": result.expect,
        "path": out.path,
        "digests": out.digests.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "outputs": outputs,
        "finding": out.finding,
    });
    // Outputs outside the exact oracle's bound, pinned like findings (one
    // appearing or disappearing is drift). Absent when every output is
    // within, so such snapshots are unchanged by the exact oracle.
    let outside: serde_json::Map<String, Value> = out
        .exact_checks()
        .filter(|(_, e)| e.class != crate::exactness::ExactClass::Within)
        .map(|(name, e)| (name.to_owned(), json!(e.class)))
        .collect();
    if !outside.is_empty() {
        body["exact_outside"] = Value::Object(outside);
    }
    Some(body)
}

/// Where the seal's value is in a snapshot file: the body's last key
/// (serde_json sorts keys; `seal` sorts after every other top-level key).
fn seal_span(text: &str) -> Option<std::ops::Range<usize>> {
    const KEY: &str = "\"seal\": \"";
    let start = text.rfind(KEY)? + KEY.len();
    let value = text.get(start..start + UNSEALED.len())?;
    value
        .bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then_some(start..start + UNSEALED.len())
}

/// The seal of a snapshot file's text: sha256 of the whole text with the
/// seal's value replaced by [`UNSEALED`].
fn seal_of_text(text: &str, span: std::ops::Range<usize>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(&text.as_bytes()[..span.start]);
    hasher.update(UNSEALED.as_bytes());
    hasher.update(&text.as_bytes()[span.end..]);
    format!("{:x}", hasher.finalize())
}

/// The text of a snapshot file: insta's header (`source`, then the
/// provenance as `info`), `---`, and the body with its seal, computed over
/// the whole text.
pub fn render(body: &Value, provenance: &Provenance) -> String {
    let mut body = body.clone();
    body["seal"] = json!(UNSEALED);
    let mut text = String::from("---\nsource: crates/conformance/src/snapshots.rs\ninfo:\n");
    let mut field = |indent: &str, key: &str, value: &str| {
        if !value.is_empty() {
            text.push_str(&format!("{indent}{key}: {}\n", yaml_scalar(value)));
        }
    };
    field("  ", "mlx_version", &provenance.mlx_version);
    field("  ", "backend", &provenance.backend);
    field("  ", "device", &provenance.device);
    field("  ", "device_name", &provenance.device_name);
    field("  ", "architecture", &provenance.architecture);
    if !provenance.host.is_empty() {
        text.push_str("  host:\n");
        let mut host = |key: &str, value: &str| {
            text.push_str(&format!("    {key}: {}\n", yaml_scalar(value)));
        };
        for (key, value) in &provenance.host {
            host(key, value);
        }
    }
    let mut field = |key: &str, value: &str| {
        text.push_str(&format!("  {key}: {}\n", yaml_scalar(value)));
    };
    field("lock_sha256", &provenance.lock_sha256);
    field("date", &provenance.date);
    if !provenance.kernel_settings.is_empty() {
        text.push_str("  kernel_settings:\n");
        for (key, value) in &provenance.kernel_settings {
            text.push_str(&format!("    {key}: {}\n", yaml_scalar(value)));
        }
    }
    text.push_str("---\n");
    text.push_str(&serde_json::to_string_pretty(&body).expect("json"));
    text.push('\n');
    let span = seal_span(&text).expect("the seal was just written");
    let seal = seal_of_text(&text, span.clone());
    text.replace_range(span, &seal);
    text
}

/// A YAML scalar as insta writes it: plain when YAML reads it back as the
/// same string, else double-quoted (JSON escapes are YAML's too).
fn yaml_scalar(value: &str) -> String {
    let safe_char = |c: char| c.is_ascii_alphanumeric() || " ._-()/@+".contains(c);
    let reads_as_other = value.parse::<f64>().is_ok()
        || matches!(
            value.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
        );
    let plain = !value.is_empty()
        && value.chars().all(safe_char)
        && !value.starts_with([' ', '-', '@', '('])
        && !value.ends_with(' ')
        && !reads_as_other;
    if plain {
        value.to_owned()
    } else {
        serde_json::to_string(value).expect("json")
    }
}

/// Reads a recorded snapshot body (without its seal), verifying the seal
/// over the whole file. Never follows a link.
pub fn read(file: &Path) -> Result<Option<Value>, SnapshotError> {
    let Some(bytes) = store::read(file)? else {
        return Ok(None);
    };
    let corrupt = |reason: &str| SnapshotError::Corrupt {
        file: file.into(),
        reason: reason.into(),
    };
    let text = String::from_utf8(bytes).map_err(|_| corrupt("not UTF-8 text"))?;
    let rest = text
        .strip_prefix("---\n")
        .ok_or_else(|| corrupt("no `---` header"))?;
    let end = rest
        .find("\n---\n")
        .ok_or_else(|| corrupt("header is not closed by `---`"))?;
    let mut body: Value = serde_json::from_str(&rest[end + 5..])
        .map_err(|e| corrupt(&format!("body is not JSON ({e})")))?;
    let span = seal_span(&text).ok_or_else(|| corrupt("no seal"))?;
    let recorded = body
        .as_object_mut()
        .and_then(|map| map.remove("seal"))
        .ok_or_else(|| corrupt("no seal in the body"))?;
    if recorded.as_str() != Some(&text[span.clone()])
        || text[span.clone()] != seal_of_text(&text, span)
    {
        return Err(SnapshotError::HandEdited { file: file.into() });
    }
    Ok(Some(body))
}

/// The `kernel_settings` block of a snapshot file's header, as
/// [`render`] writes it (empty when the file has none).
pub fn header_kernel_settings(text: &str) -> BTreeMap<String, String> {
    let header = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.find("\n---\n").map(|end| &rest[..end]))
        .unwrap_or("");
    header
        .lines()
        .skip_while(|l| *l != "  kernel_settings:")
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .filter_map(|l| {
            let (key, value) = l.trim_start().split_once(':')?;
            let value = value.trim_start();
            let value = if value.starts_with('"') {
                serde_json::from_str::<String>(value).ok()?
            } else {
                value.to_owned()
            };
            Some((key.to_owned(), value))
        })
        .collect()
}

/// The kernel settings a set was recorded with: those its snapshot files
/// name (files recorded before settings were recorded name none). Files
/// that disagree are an error naming both.
pub fn recorded_kernel_settings(dir: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut recorded: BTreeMap<String, (String, PathBuf)> = BTreeMap::new();
    for entry in store::entries(dir).map_err(|e| e.to_string())? {
        if !store::is_snapshot(&entry) {
            continue;
        }
        let Ok(Some(bytes)) = store::read(&entry.path) else {
            continue;
        };
        for (key, value) in header_kernel_settings(&String::from_utf8_lossy(&bytes)) {
            match recorded.get(&key) {
                Some((was, other)) if *was != value => {
                    return Err(format!(
                        "snapshot set {}: {} records {key}={value}, {} records {key}={was};                          re-record the set with one value",
                        dir.display(),
                        entry.path.display(),
                        other.display()
                    ))
                }
                Some(_) => {}
                None => {
                    recorded.insert(key, (value, entry.path.clone()));
                }
            }
        }
    }
    Ok(recorded.into_iter().map(|(k, (v, _))| (k, v)).collect())
}

/// What one gate pass over a set found and did.
#[derive(Debug, Default)]
pub struct Gated {
    /// One per result, in order.
    pub statuses: Vec<Status>,
    /// Snapshot files no registered case names (judged on complete runs
    /// only; removed by accept).
    pub orphans: Vec<PathBuf>,
    /// Temporary files of an unfinished write (removed by accept).
    pub leftovers: Vec<PathBuf>,
    /// Accept only: what could not be written or removed, one line each
    /// (the run then exits 3 and prints no success line).
    pub write_errors: Vec<String>,
    /// Accept only: what was written, kept and removed.
    pub counts: Counts,
}

/// What accept did to a set.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub new: usize,
    pub changed: usize,
    pub unchanged: usize,
    pub removed: usize,
}

impl Counts {
    fn of(statuses: &[Status], removed: usize) -> Self {
        let mut c = Counts {
            removed,
            ..Counts::default()
        };
        for s in statuses {
            match s {
                Status::Written {
                    previous: Previous::None,
                } => c.new += 1,
                Status::Written { .. } => c.changed += 1,
                Status::Match => c.unchanged += 1,
                _ => {}
            }
        }
        c
    }
}

/// Gates every result against the set in `dir`. `registered`: the
/// snapshot file names of every registered case when the selection was the
/// whole registry (orphans are judged then, and only files no registered
/// case names are orphans: a case that errored or crashed keeps its
/// snapshot); `None` for a filtered run.
pub fn gate(
    dir: &Path,
    results: &[CaseResult],
    mode: Mode,
    provenance: &Provenance,
    registered: Option<&BTreeSet<String>>,
) -> Gated {
    // A set path that is a link, a file or a loop: nothing in it is read,
    // listed, written or removed (the runner refuses it before any case).
    if let Err(e) = store::check_set_dir(dir.parent().unwrap_or(Path::new(".")), dir) {
        let error = format!("snapshot set {}", e);
        return Gated {
            statuses: vec![
                Status::Invalid {
                    error: error.clone()
                };
                results.len()
            ],
            write_errors: vec![error],
            ..Gated::default()
        };
    }
    let mut gated = Gated {
        leftovers: store::leftovers(dir),
        ..Gated::default()
    };
    gated.statuses = results
        .iter()
        .map(|r| gate_one(dir, r, mode, provenance))
        .collect();
    if mode == Mode::Accept {
        for s in &gated.statuses {
            if let Status::Invalid { error } = s {
                gated.write_errors.push(error.clone());
            }
        }
    }
    if let Some(registered) = registered {
        match store::entries(dir) {
            Ok(entries) => {
                gated.orphans = entries
                    .into_iter()
                    .filter(|e| {
                        store::is_snapshot(e)
                            && !e.name.as_ref().is_some_and(|n| registered.contains(n))
                    })
                    .map(|e| e.path)
                    .collect();
            }
            Err(e) => gated.write_errors.push(e.to_string()),
        }
    }
    // Removal only after every write succeeded: a failed accept removes
    // nothing ("the rest is unchanged" holds).
    if mode == Mode::Accept && gated.write_errors.is_empty() {
        for path in gated.orphans.iter().chain(&gated.leftovers) {
            if let Err(e) = store::remove(path) {
                gated.write_errors.push(format!("cannot remove {e}"));
            }
        }
        gated.counts = Counts::of(&gated.statuses, gated.orphans.len());
    }
    gated
}

fn gate_one(dir: &Path, result: &CaseResult, mode: Mode, provenance: &Provenance) -> Status {
    // A failed must-equal or an errored case has no trustworthy bits to pin.
    if matches!(
        result.verdict,
        Verdict::Fail | Verdict::Error | Verdict::Skip
    ) {
        return Status::NotChecked;
    }
    let Some(now) = body(result) else {
        return Status::NotChecked;
    };
    let file = dir.join(file_name(&result.name));
    let (recorded, previous) = match read(&file) {
        Ok(None) => (None, Previous::None),
        Ok(Some(r)) => (Some(r), Previous::Different),
        // A link or a non-file is never overwritten, only named.
        Err(e @ SnapshotError::Store(_)) => {
            return Status::Invalid {
                error: e.to_string(),
            }
        }
        Err(e) if mode != Mode::Accept => {
            return Status::Invalid {
                error: e.to_string(),
            }
        }
        Err(_) => (None, Previous::Invalid),
    };
    // Outputs a candidate left out by permission (internal
    // intermediates, docs/ops.md) are not compared: the recorded body is
    // checked without them, so their absence is no drift.
    let left_out: Vec<&str> = result
        .output
        .as_ref()
        .map(|o| o.not_compared.iter().map(|(n, _)| n.as_str()).collect())
        .unwrap_or_default();
    let recorded = recorded.map(|mut r| {
        for key in ["digests", "outputs", "exact_outside"] {
            if let Some(m) = r.get_mut(key).and_then(Value::as_object_mut) {
                for name in &left_out {
                    m.remove(*name);
                }
            }
        }
        // A body pins `exact_outside` only when some output is outside.
        if !left_out.is_empty()
            && r.get("exact_outside")
                .and_then(Value::as_object)
                .is_some_and(|m| m.is_empty())
        {
            if let Some(o) = r.as_object_mut() {
                o.remove("exact_outside");
            }
        }
        r
    });
    if recorded.as_ref() == Some(&now) {
        // Accept also brings an unchanged snapshot's recorded kernel
        // settings up to this run's (its bits are the same).
        if mode == Mode::Accept {
            let stale = store::read(&file).ok().flatten().is_some_and(|bytes| {
                header_kernel_settings(&String::from_utf8_lossy(&bytes))
                    != provenance.kernel_settings
            });
            if stale {
                let text = render(&now, provenance);
                if let Err(e) = store::write(
                    dir.parent().unwrap_or(Path::new(".")),
                    dir,
                    &file_name(&result.name),
                    &text,
                ) {
                    return Status::Invalid {
                        error: format!("cannot write the snapshot of {}: {e}", result.name),
                    };
                }
            }
        }
        return Status::Match;
    }
    match mode {
        Mode::Accept => {
            let text = render(&now, provenance);
            match store::write(
                dir.parent().unwrap_or(Path::new(".")),
                dir,
                &file_name(&result.name),
                &text,
            ) {
                Ok(()) => Status::Written { previous },
                Err(e) => Status::Invalid {
                    error: format!("cannot write the snapshot of {}: {e}", result.name),
                },
            }
        }
        Mode::Check | Mode::Review => {
            if mode == Mode::Review {
                err!("{}", review_diff(&file, recorded.as_ref(), &now));
            }
            match recorded {
                None => Status::Missing,
                Some(recorded) => Status::Drift {
                    recorded: Some(recorded),
                    now,
                },
            }
        }
    }
}

/// The outputs whose digest differs between a recorded body and this
/// run's (added, removed or moved), in name order.
pub fn moved_outputs(recorded: Option<&Value>, now: &Value) -> Vec<String> {
    let digests = |v: Option<&Value>| -> BTreeMap<String, Value> {
        v.and_then(|v| v.get("digests"))
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let (old, new) = (digests(recorded), digests(Some(now)));
    old.keys()
        .chain(new.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect()
}

/// A drift as `fixtures review` prints it: a unified diff of the recorded
/// body against this run's (nothing is written).
pub fn review_diff(file: &Path, recorded: Option<&Value>, now: &Value) -> String {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("json") + "\n";
    let old = recorded.map(pretty).unwrap_or_default();
    let new = pretty(now);
    let label = file.display().to_string();
    let diff = similar::TextDiff::from_lines(&old, &new);
    let mut out = format!(
        "-- {} {label}\n",
        if recorded.is_some() {
            "drift:"
        } else {
            "new (no snapshot recorded):"
        }
    );
    out.push_str(
        &diff
            .unified_diff()
            .context_radius(3)
            .header("recorded", "this run")
            .to_string(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{CaseOutput, Expect};

    fn result(name: &str) -> CaseResult {
        let mut output = CaseOutput::new("pure-mlx");
        output.digest(
            "y",
            &oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![1]).unwrap(),
        );
        CaseResult {
            name: name.into(),
            family: "f".into(),
            reference: "r".into(),
            glue_composed: Vec::new(),
            expect: Expect::MustEqual,
            verdict: Verdict::Pass,
            output: Some(output),
            message: None,
            error_kind: None,
            time_ms: 1.0,
        }
    }

    fn provenance() -> Provenance {
        Provenance {
            mlx_version: "0.32.2".into(),
            backend: "cpu".into(),
            device: "d".into(),
            device_name: String::new(),
            architecture: String::new(),
            host: BTreeMap::new(),
            lock_sha256: "l".into(),
            date: "2026-12-01".into(),
            kernel_settings: BTreeMap::new(),
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("conformance-snap-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A snapshot file as accept leaves it.
    fn record(dir: &Path, r: &CaseResult) -> PathBuf {
        let file = dir.join(file_name(&r.name));
        std::fs::write(&file, render(&body(r).unwrap(), &provenance())).unwrap();
        file
    }

    /// The gate with the registry taken to be `results` (complete) or
    /// unknown (a filtered run): statuses and orphans.
    fn gate_t(
        dir: &Path,
        results: &[CaseResult],
        mode: Mode,
        provenance: &Provenance,
        complete: bool,
    ) -> (Vec<Status>, Vec<PathBuf>) {
        let names: BTreeSet<String> = results.iter().map(|r| file_name(&r.name)).collect();
        let g = gate(dir, results, mode, provenance, complete.then_some(&names));
        (g.statuses, g.orphans)
    }

    #[test]
    fn recorded_body_matches_and_a_changed_digest_drifts() {
        let dir = temp_dir("drift");
        let r = result("a/b");
        record(&dir, &r);
        let (s, orphans) = gate_t(
            &dir,
            std::slice::from_ref(&r),
            Mode::Check,
            &provenance(),
            true,
        );
        assert_eq!(s, vec![Status::Match]);
        assert!(orphans.is_empty());
        let mut moved = r.clone();
        moved.output.as_mut().unwrap().digests[0].1 = "abd".into();
        let (s, _) = gate_t(&dir, &[moved], Mode::Check, &provenance(), true);
        assert!(matches!(s[0], Status::Drift { .. }));
    }

    #[test]
    fn a_finding_that_disappears_is_drift() {
        let dir = temp_dir("finding");
        let mut r = result("f/x");
        r.expect = Expect::Finding;
        r.verdict = Verdict::Finding;
        r.output.as_mut().unwrap().finding = Some(json!({"differs": 3}));
        record(&dir, &r);
        r.output.as_mut().unwrap().finding = Some(json!({"differs": 0}));
        let (s, _) = gate_t(&dir, &[r], Mode::Check, &provenance(), true);
        assert!(matches!(s[0], Status::Drift { .. }));
    }

    /// An exact check of class `class` on output `y` of a result.
    fn with_exact(mut r: CaseResult, class: crate::exactness::ExactClass) -> CaseResult {
        let side = exact::Side {
            outside: usize::from(class != crate::exactness::ExactClass::Within),
            total: 1,
            max_ratio: 2.0,
            worst_index: 0,
            worst_value: f64::NAN,
            worst_exact: 1.0,
            worst_bound: 0.1,
            computed_len: None,
        };
        let check = crate::exactness::ExactCheck {
            op: "quantized_matmul".into(),
            model: exact::Model::Gpu,
            class,
            port: side.clone(),
            reference: side,
            bit_equal: true,
            informative: true,
        };
        r.output
            .as_mut()
            .unwrap()
            .exact_only
            .push(("y".into(), check));
        r
    }

    #[test]
    fn a_reference_outside_its_bound_is_pinned_both_ways() {
        use crate::exactness::ExactClass;
        let dir = temp_dir("exact");
        // Within: nothing is added to the body (existing snapshots unchanged).
        let within = with_exact(result("e/x"), ExactClass::Within);
        assert!(body(&within).unwrap().get("exact_outside").is_none());
        let outside = with_exact(result("e/x"), ExactClass::ReferenceOutside);
        assert_eq!(
            body(&outside).unwrap()["exact_outside"]["y"],
            json!("reference_outside")
        );
        // Recorded outside: appearing-then-disappearing and the reverse drift.
        record(&dir, &outside);
        let (s, _) = gate_t(
            &dir,
            std::slice::from_ref(&outside),
            Mode::Check,
            &provenance(),
            true,
        );
        assert_eq!(s, vec![Status::Match]);
        let (s, _) = gate_t(
            &dir,
            std::slice::from_ref(&within),
            Mode::Check,
            &provenance(),
            true,
        );
        assert!(matches!(s[0], Status::Drift { .. }), "disappearing: {s:?}");
        record(&dir, &within);
        let (s, _) = gate_t(&dir, &[outside], Mode::Check, &provenance(), true);
        assert!(matches!(s[0], Status::Drift { .. }), "appearing: {s:?}");
    }

    #[test]
    fn hand_edited_and_corrupted_snapshots_are_typed_errors_naming_the_file() {
        let dir = temp_dir("edit");
        let r = result("a/b");
        let file = record(&dir, &r);
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("\"pure-mlx\"", "\"pure-mlY\"");
        std::fs::write(&file, text).unwrap();
        let err = read(&file).unwrap_err();
        assert!(matches!(err, SnapshotError::HandEdited { .. }));
        assert!(err.to_string().contains(&file.display().to_string()));
        // The provenance header is sealed too (before: only the body was).
        let file = record(&dir, &r);
        assert!(read(&file).is_ok());
        for (from, to) in [
            ("mlx_version: 0.32.2", "mlx_version: 0.32.3"),
            ("date: 2026-12-01", "date: 2027-01-01"),
        ] {
            let text = std::fs::read_to_string(&file).unwrap();
            std::fs::write(&file, text.replace(from, to)).unwrap();
            assert!(
                matches!(read(&file).unwrap_err(), SnapshotError::HandEdited { .. }),
                "{to}"
            );
            let text = std::fs::read_to_string(&file).unwrap();
            std::fs::write(&file, text.replace(to, from)).unwrap();
            assert!(read(&file).is_ok());
        }
        std::fs::write(&file, "not a snapshot").unwrap();
        assert!(matches!(
            read(&file).unwrap_err(),
            SnapshotError::Corrupt { .. }
        ));
        let (s, _) = gate_t(&dir, &[r], Mode::Check, &provenance(), true);
        assert!(matches!(&s[0], Status::Invalid { error } if error.contains("a__b.snap")));
    }

    #[test]
    fn orphaned_snapshots_are_reported_on_complete_runs_only() {
        let dir = temp_dir("orphan");
        let r = result("a/b");
        record(&dir, &r);
        record(&dir, &result("gone/case"));
        let (_, orphans) = gate_t(
            &dir,
            std::slice::from_ref(&r),
            Mode::Check,
            &provenance(),
            true,
        );
        assert_eq!(orphans.len(), 1);
        assert!(orphans[0].ends_with("gone__case.snap"));
        let (_, orphans) = gate_t(&dir, &[r], Mode::Check, &provenance(), false);
        assert!(orphans.is_empty());
    }

    /// Before: orphans were the files no case *with an output* named, so
    /// a case that errored or crashed in a complete run lost its snapshot
    /// to the next accept.
    #[test]
    fn an_errored_case_keeps_its_snapshot_and_only_unregistered_names_are_orphans() {
        let dir = temp_dir("errored");
        let ok = result("a/b");
        let mut errored = result("c/d");
        record(&dir, &ok);
        let kept = record(&dir, &errored);
        let gone = record(&dir, &result("gone/case"));
        errored.verdict = Verdict::Error;
        errored.output = None;
        let results = [ok, errored];
        let names: BTreeSet<String> = results.iter().map(|r| file_name(&r.name)).collect();
        let g = gate(&dir, &results, Mode::Accept, &provenance(), Some(&names));
        assert_eq!(g.orphans, vec![gone.clone()]);
        assert!(kept.exists() && !gone.exists());
        assert_eq!(g.statuses[1], Status::NotChecked);
        assert_eq!(g.counts.removed, 1);
    }

    /// Second hostile round: an accept with a failed write removed the
    /// orphans and leftovers anyway, and said "the rest is unchanged".
    #[test]
    fn a_failed_accept_removes_no_orphan_or_leftover() {
        let dir = temp_dir("failed-accept").join("set");
        std::fs::create_dir_all(&dir).unwrap();
        let (ok, blocked) = (result("a/b"), result("c/d"));
        std::fs::create_dir(dir.join(file_name("c/d"))).unwrap();
        let orphan = record(&dir, &result("gone/case"));
        let leftover = dir.join(".unfinished-1-1.snap-tmp");
        std::fs::write(&leftover, "").unwrap();
        let results = [ok, blocked];
        let names: BTreeSet<String> = results.iter().map(|r| file_name(&r.name)).collect();
        let g = gate(&dir, &results, Mode::Accept, &provenance(), Some(&names));
        assert_eq!(g.write_errors.len(), 1, "{:?}", g.write_errors);
        assert!(orphan.exists() && leftover.exists(), "nothing removed");
        assert_eq!(
            g.statuses[0],
            Status::Written {
                previous: Previous::None
            }
        );
    }

    /// Second hostile round: `fixtures/` itself a link carried every set
    /// outside the checkout.
    #[test]
    fn a_fixtures_directory_that_is_a_link_is_refused() {
        let base = temp_dir("fixtures-link");
        let real = base.join("elsewhere");
        std::fs::create_dir_all(real.join("snapshots/set")).unwrap();
        std::os::unix::fs::symlink(&real, base.join("fixtures")).unwrap();
        let root = base.join("fixtures/snapshots");
        let err = store::check_set_dir(&root, &root.join("set")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let r = result("a/b");
        let g = gate(&root.join("set"), &[r], Mode::Accept, &provenance(), None);
        assert!(!g.write_errors.is_empty());
        assert_eq!(
            std::fs::read_dir(real.join("snapshots/set"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_snapshot_larger_than_any_is_refused_unread() {
        let dir = temp_dir("huge");
        let file = dir.join("a__b.snap");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(store::MAX_SNAPSHOT_BYTES + 1)
            .unwrap();
        assert!(matches!(
            read(&file),
            Err(SnapshotError::Store(store::StoreError::TooLarge { .. }))
        ));
    }

    #[test]
    fn declared_keys_must_be_plain_names() {
        assert!(check_device_key("gha-macos-14").is_ok());
        assert!(check_device_key("nvidia-h200_sxm.1").is_ok());
        for bad in ["", "../../etc", "a/b", "UPPER", ".hidden", &"x".repeat(65)] {
            let err = check_device_key(bad).unwrap_err();
            assert!(err.contains("--device-family"), "{err}");
        }
    }

    #[test]
    fn set_names_follow_the_policy() {
        use crate::case::Backend;
        assert_eq!(
            device_key(Backend::Cuda, "sm_90", "NVIDIA H200"),
            "nvidia-h200"
        );
        assert_eq!(
            device_key(Backend::Metal, "applegpu_g13s", "Apple M1"),
            "applegpu_g13s"
        );
        assert_eq!(
            device_key(Backend::Cpu, "x86_64", "x"),
            format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
        );
        assert_eq!(slug("  NVIDIA  H200 (PCIe) "), "nvidia-h200-pcie");
        assert_eq!(slug("///"), "unknown");
    }

    #[test]
    fn a_set_exists_only_with_snapshot_files_and_its_absence_is_one_line() {
        let dir = temp_dir("set");
        assert!(!set_exists(&dir.join("nope")).unwrap());
        assert!(!set_exists(&dir).unwrap());
        record(&dir, &result("a/b"));
        assert!(set_exists(&dir).unwrap());
        let commands = SetCommands::new("", "--device gpu");
        for place in [RunPlace::Local, RunPlace::CiMacos, RunPlace::Ci] {
            let line = missing_set_line(&dir.join("metal-x-mlx0"), &commands, place);
            assert!(!line.contains('\n'));
            assert!(line.contains("metal-x-mlx0"), "{line}");
            // Under CI on macOS the accept command is refused: the line
            // names the bootstrap dispatch instead.
            assert_eq!(
                line.contains("cargo xtask fixtures accept --device gpu"),
                place != RunPlace::CiMacos,
                "{line}"
            );
            assert_eq!(
                line.contains("bootstrap"),
                place == RunPlace::CiMacos,
                "{line}"
            );
            assert_eq!(
                line.starts_with("bits are not pinned on this device"),
                place == RunPlace::Local,
                "{line}"
            );
        }
        assert!(!RunPlace::Local.requires_set());
        assert!(RunPlace::Ci.requires_set() && RunPlace::CiMacos.requires_set());
    }

    #[test]
    fn review_prints_a_plain_diff_without_panic_text() {
        let dir = temp_dir("review");
        let r = result("a/b");
        record(&dir, &r);
        let mut moved = r.clone();
        moved.output.as_mut().unwrap().digests[0].1 = "abd".into();
        let now = body(&moved).unwrap();
        let recorded = read(&dir.join(file_name("a/b"))).unwrap();
        let diff = review_diff(&dir.join("a__b.snap"), recorded.as_ref(), &now);
        assert!(diff.contains("+    \"y\": \"abd\""), "{diff}");
        assert!(
            !diff.contains("panicked") && !diff.contains("insta"),
            "{diff}"
        );
        // Review mode gates as check does and writes nothing.
        let (s, _) = gate_t(&dir, &[moved], Mode::Review, &provenance(), true);
        assert!(matches!(s[0], Status::Drift { .. }));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn missing_snapshot_is_reported_and_check_never_writes() {
        let dir = temp_dir("missing");
        let r = result("new/case");
        let (s, _) = gate_t(&dir, &[r], Mode::Check, &provenance(), true);
        assert_eq!(s, vec![Status::Missing]);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    /// The header's fields as `render` takes them (a test-only reader of
    /// the two-level YAML the writer emits).
    fn parse_header(text: &str) -> Provenance {
        let mut p = provenance();
        p.date.clear();
        let header = &text[4..text[4..].find("\n---\n").unwrap() + 4];
        // The kernel settings block has its own reader (production code).
        p.kernel_settings = header_kernel_settings(text);
        let mut in_settings = false;
        for line in header.lines().skip(2) {
            if line == "  kernel_settings:" {
                in_settings = true;
                continue;
            }
            if in_settings && line.starts_with("    ") {
                continue;
            }
            in_settings = false;
            let (key, value) = line.trim_start().split_once(':').unwrap();
            let value = value.trim_start();
            let value = if value.starts_with('"') {
                serde_json::from_str::<String>(value).unwrap()
            } else {
                value.to_owned()
            };
            let field = match key {
                "mlx_version" => &mut p.mlx_version,
                "backend" => &mut p.backend,
                "device" => &mut p.device,
                "device_name" => &mut p.device_name,
                "architecture" => &mut p.architecture,
                "lock_sha256" => &mut p.lock_sha256,
                "date" => &mut p.date,
                "host" => continue,
                host => {
                    p.host.insert(host.to_owned(), value);
                    continue;
                }
            };
            *field = value;
        }
        p
    }

    /// Our writer keeps insta's format: every committed snapshot (written
    /// by insta) is reproduced byte for byte from its body and header.
    #[test]
    fn the_writer_reproduces_every_committed_snapshot_byte_for_byte() {
        let root =
            crate::home::Home::workspace(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
                .fixtures_dir()
                .join("snapshots");
        let mut checked = 0;
        for set in std::fs::read_dir(&root).unwrap().flatten() {
            for file in std::fs::read_dir(set.path()).unwrap().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap();
                let body = read(&file.path()).unwrap().unwrap();
                assert_eq!(
                    render(&body, &parse_header(&text)),
                    text,
                    "{}",
                    file.path().display()
                );
                checked += 1;
            }
        }
        assert!(checked > 100, "{checked}");
    }

    /// Random set trees (links, files for directories, loops, FIFOs,
    /// non-UTF-8 names and bytes, leftovers) never panic, hang, write or
    /// remove outside the set, or touch a link; after accept every
    /// registered case's regular file holds this run's body.
    mod trees {
        use super::*;
        use proptest::prelude::*;

        const NAMES: [&[u8]; 5] = [
            b"a__b.snap",
            b"c__d.snap",
            b"gone.snap",
            b"\xff.snap",
            b".unfinished-9-9.snap-tmp",
        ];

        fn make(path: &Path, kind: u8, outside: &Path, valid: &str) {
            use std::os::unix::fs::symlink;
            // One entry per name (writing again would follow the test's own link).
            if std::fs::symlink_metadata(path).is_ok() {
                return;
            }
            let _ = match kind {
                0 => std::fs::write(path, valid),
                1 => std::fs::write(path, b"---\nnot: sealed\n---\n{"),
                2 => std::fs::write(path, b""),
                3 => std::fs::create_dir(path),
                4 => symlink(outside.join("victim"), path),
                5 => symlink(path, path),
                6 => {
                    use std::os::unix::ffi::OsStrExt;
                    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
                    // SAFETY: a valid NUL-terminated path.
                    unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
                    Ok(())
                }
                _ => std::fs::write(path, b"\xff\xfe\x00"),
            };
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            #[test]
            fn random_set_trees_stay_inside_and_never_panic(
                set_kind in 0u8..5,
                entries in proptest::collection::vec((0usize..5, 0u8..8), 0..7),
                accept_first in any::<bool>(),
            ) {
                use std::os::unix::ffi::OsStrExt;
                let base = temp_dir("tree");
                let (root, outside) = (base.join("snapshots"), base.join("outside"));
                std::fs::create_dir_all(&root).unwrap();
                std::fs::create_dir_all(&outside).unwrap();
                std::fs::write(outside.join("victim"), "keep").unwrap();
                std::fs::write(outside.join(".unfinished-1-1.snap-tmp"), "keep").unwrap();
                let dir = root.join("cpu-x-mlx0");
                let results = [result("a/b"), result("c/d")];
                let valid = render(&body(&results[0]).unwrap(), &provenance());
                match set_kind {
                    0 => {}
                    1 => std::fs::create_dir(&dir).unwrap(),
                    2 => std::fs::write(&dir, "x").unwrap(),
                    3 => std::os::unix::fs::symlink(&outside, &dir).unwrap(),
                    _ => std::os::unix::fs::symlink(&dir, &dir).unwrap(),
                }
                if set_kind == 1 {
                    for (name, kind) in &entries {
                        let path = dir.join(std::ffi::OsStr::from_bytes(NAMES[*name]));
                        make(&path, *kind, &outside, &valid);
                    }
                }
                let links = |d: &Path| -> Vec<(PathBuf, PathBuf)> {
                    std::fs::read_dir(d).into_iter().flatten().flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
                        .map(|e| (e.path(), std::fs::read_link(e.path()).unwrap()))
                        .collect()
                };
                let links_before = if set_kind == 1 { links(&dir) } else { vec![] };
                let _ = set_exists(&dir);
                let modes = if accept_first {
                    [Mode::Accept, Mode::Check]
                } else {
                    [Mode::Check, Mode::Accept]
                };
                let names: BTreeSet<String> = results.iter().map(|r| file_name(&r.name)).collect();
                for mode in modes {
                    let g = gate(&dir, &results, mode, &provenance(), Some(&names));
                    prop_assert_eq!(g.statuses.len(), 2);
                    if set_kind != 0 && set_kind != 1 {
                        prop_assert!(!g.write_errors.is_empty() || mode != Mode::Accept);
                        let all_invalid = g.statuses.iter().all(|s| matches!(s, Status::Invalid { .. }));
                        prop_assert!(all_invalid);
                    }
                }
                // Nothing outside changed.
                prop_assert_eq!(std::fs::read_to_string(outside.join("victim")).unwrap(), "keep");
                prop_assert!(outside.join(".unfinished-1-1.snap-tmp").exists());
                prop_assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 2);
                if set_kind == 1 {
                    // Links are never replaced, followed or removed unless orphaned.
                    for (link, target) in links_before {
                        let name = link.file_name().unwrap().to_string_lossy().into_owned();
                        if names.contains(&name) {
                            prop_assert_eq!(std::fs::read_link(&link).unwrap(), target);
                        }
                    }
                    for r in &results {
                        let file = dir.join(file_name(&r.name));
                        let is_file = std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_file());
                        if is_file {
                            prop_assert_eq!(read(&file).unwrap(), Some(body(r).unwrap()));
                        }
                    }
                }
                let _ = std::fs::remove_dir_all(&base);
            }
        }
    }
}
