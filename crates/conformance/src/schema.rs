//! The typed shape of the files this tool writes and then reads back, so
//! no reader indexes untyped JSON by string: `report.json` ([`ReportFile`])
//! as the gate, the protocol's self-test (`--same-verdicts-as`) and the
//! export's check (`--verify-against`) read it; the export's
//! `manifest.json` ([`Manifest`]), written and verified as this type.
//! The other writers' types live with their writers, above this module
//! (which names none of them): `report::Report` (report.json),
//! `gate::Gate` (gate.json, read by no program) and `explore::Search`
//! (explore.json, read back by `--merge` as the same type).
//!
//! A reader takes what it needs and tolerates fields it does not know (a
//! newer writer's additions); a missing required field is an error
//! naming the file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::case::Expect;
use crate::result::{ErrorKind, Verdict};

/// `report.json` as its readers see it.
#[derive(Debug, Clone, Deserialize)]
pub struct ReportFile {
    /// The run's environment, kept as written (the gate shows it whole).
    #[serde(default)]
    pub environment: serde_json::Value,
    pub cases: Vec<ReportCase>,
    #[serde(default)]
    pub summary: ReportSummary,
}

/// `report.json`'s `summary`, as far as a reader needs it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReportSummary {
    /// `--exact-faults` runs: the exact oracle's mutation score.
    #[serde(default)]
    pub mutation: Option<crate::mutation::MutationScore>,
}

/// One row of `report.json`'s `cases`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReportCase {
    pub name: String,
    #[serde(default)]
    pub family: String,
    pub expect: Expect,
    pub verdict: Verdict,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub error_kind: Option<ErrorKind>,
    #[serde(default)]
    pub output: Option<ReportOutput>,
}

/// A row's `output`: what the readers compare.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReportOutput {
    /// What the port side ran (a model case adds its first divergence).
    #[serde(default)]
    pub path: String,
    /// Each compared output's name and exact check.
    #[serde(default)]
    pub outputs: Vec<ReportCompared>,
    /// The measured relation of a finding.
    #[serde(default)]
    pub finding: Option<serde_json::Value>,
    /// sha256 of each output's bits, by name, in order.
    #[serde(default)]
    pub digests: Vec<(String, String)>,
}

/// One compared output of a row.
#[derive(Debug, Clone, Deserialize)]
pub struct ReportCompared {
    pub name: String,
    /// Each side against the exact oracle (`port`, `reference`).
    #[serde(default)]
    pub exact: Option<BTreeMap<String, serde_json::Value>>,
}

impl ReportCompared {
    /// How many elements of `side` are outside the exact bound, where the
    /// output is in the exact oracle's scope.
    pub fn outside(&self, side: &str) -> Option<u64> {
        self.exact.as_ref()?.get(side)?.get("outside")?.as_u64()
    }
}

impl ReportFile {
    /// The largest report.json read (a whole suite's is a few MiB).
    pub const MAX_BYTES: u64 = 1 << 30;

    /// Reads `path` through the one safe reader (a regular file of at most
    /// [`Self::MAX_BYTES`]; a link, FIFO or device is refused, not read or
    /// waited on); the error names it.
    pub fn read(path: &Path) -> Result<ReportFile, String> {
        let bytes = match conformance_cases::store::read_limited(
            path,
            Self::MAX_BYTES,
            conformance_cases::store::Role::Report,
        ) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(format!("{}: no such file", path.display())),
            Err(conformance_cases::store::StoreError::Link { .. }) => {
                // A report named through a link is the user's choice: read
                // its target, with the same checks.
                let target =
                    std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
                conformance_cases::store::read_limited(
                    &target,
                    Self::MAX_BYTES,
                    conformance_cases::store::Role::Report,
                )
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{}: no such file", path.display()))?
            }
            Err(e) => return Err(e.to_string()),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a report.json: {e}", path.display()))
    }

    /// The rows by case name.
    pub fn by_name(&self) -> BTreeMap<&str, &ReportCase> {
        self.cases.iter().map(|c| (c.name.as_str(), c)).collect()
    }
}

/// The export's `manifest.json` (`--export DIR`), written and read as
/// this type. Fields are in name order: the bytes are those the manifest
/// always had (serde_json writes an untyped object's keys sorted).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Every exported must-equal case, sorted by name.
    pub cases: Vec<ManifestCase>,
    /// The run's environment (backend, device, MLX version, lock, ...).
    pub environment: serde_json::Value,
    /// The candidate protocol version whose value encoding the trees use.
    pub protocol: u64,
    pub schema_version: u64,
    /// The run's `--seed`.
    pub seed: u64,
    /// One paragraph saying what the files are.
    pub what: String,
}

/// One case of the manifest (also the fragment `cases/<case>.json` a
/// worker writes before the run assembles them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestCase {
    pub calls: Vec<ManifestCall>,
    pub case: String,
    pub reference: String,
}

/// One reference call of a case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestCall {
    /// The argument tree (`$tensor` leaves name arrays in `file`).
    pub args: serde_json::Value,
    /// The call's safetensors file, relative to the export directory.
    pub file: String,
    pub file_sha256: String,
    /// Which compared outputs of the case were read from which place of
    /// the result: result path (as in `types`, without `outputs/`) ->
    /// the case's output names. A place not here was returned but not
    /// compared by this case.
    #[serde(default)]
    pub compared: BTreeMap<String, Vec<String>>,
    /// The glue function the reference call went through.
    pub glue: String,
    /// The op of the vocabulary (docs/ops.md).
    pub op: String,
    /// sha256 of each output array's bits (`case::digest_of`), by key.
    pub output_sha256: BTreeMap<String, String>,
    /// The reference's exception line, where it raised (refusal cases).
    pub raised: Option<String>,
    /// The result tree (null where it raised).
    pub result: serde_json::Value,
    /// Every node's type, by path: `inputs/<argument>[/<index>]` and
    /// `outputs/<key>[/<key or index>]` (`outputs/value`: the whole
    /// result): `array <dtype> [<shape>]`, `int`, `float`, `bool`, `str`,
    /// `null`, `list`, `dict` (candidate::signatures; docs/ops.md is
    /// generated from them).
    #[serde(default)]
    pub types: BTreeMap<String, String>,
    pub version: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the runner writes is what the readers read: a report written
    /// by [`crate::report::Report`] reads back with its verdicts, kinds,
    /// digests and findings.
    #[test]
    fn a_written_report_reads_back() {
        use crate::case::CaseOutput;
        use crate::report::{Report, Row};
        use crate::result::CaseResult;
        use crate::snapshots::Status;
        let mut out = CaseOutput::new("p").with_finding(serde_json::json!({"parts": 3}));
        let t = oracle::HostTensor::new(oracle::DType::Uint8, vec![1], vec![7]).unwrap();
        out.compare("y", &t, &crate::case::Expected::for_tests(t.clone()));
        let row = |name: &str, verdict: Verdict, kind: Option<ErrorKind>| Row {
            result: CaseResult {
                verdict,
                output: (kind.is_none()).then(|| out.clone()),
                message: kind.map(|_| "why".to_owned()),
                error_kind: kind,
                ..CaseResult::new(name, "f", "r", Expect::MustEqual)
            },
            snapshot: Status::NotChecked,
        };
        let report = Report::new(
            crate::report::tests::environment("cpu", "k", false),
            vec![
                row("a", Verdict::Pass, None),
                row("b", Verdict::Error, Some(ErrorKind::Timeout)),
            ],
            &[],
            1.0,
        );
        let text = serde_json::to_string(&report).unwrap();
        let read: ReportFile = serde_json::from_str(&text).unwrap();
        let rows = read.by_name();
        assert_eq!(rows["a"].verdict, Verdict::Pass);
        let a = rows["a"].output.as_ref().unwrap();
        assert_eq!(a.digests.len(), 1);
        assert_eq!(a.finding, Some(serde_json::json!({"parts": 3})));
        assert_eq!(a.outputs[0].name, "y");
        assert_eq!(rows["b"].verdict, Verdict::Error);
        assert_eq!(rows["b"].error_kind, Some(ErrorKind::Timeout));
        assert_eq!(rows["b"].message.as_deref(), Some("why"));
    }
}
