//! The first divergence of a `model/` case is named at the right layer and
//! operation: four faults planted in the port (the `fault` parameter of a
//! `model` case, run through `--cases FILE`), each failing with the layer
//! and operation where the fault adds its difference.

use std::process::Command;

use conformance::result::Verdict;
use conformance::schema::ReportFile;
use serde_json::json;

/// (fault, the point the report must name).
const FAULTS: [(&str, &str); 4] = [
    // Prefill leaves the state in float32; written back in bf16, it first
    // changes the next call's recurrence output.
    (
        "recurrent-state-bf16",
        "call 1 (decode step 0): layer 0 (linear_attention) · recurrence",
    ),
    (
        "gated-norm-eps",
        "call 0 (prefill chunk 0): layer 0 (linear_attention) · gated_norm",
    ),
    (
        "conv-state-shift",
        "call 1 (decode step 0): layer 0 (linear_attention) · conv",
    ),
    // Same bits on the CPU; the layout itself parts.
    (
        "kv-contiguous",
        "call 0 (prefill chunk 0): layer 3 (full_attention) · kv_layout",
    ),
];

#[test]
fn each_planted_fault_fails_naming_its_layer_and_operation() {
    let dir = std::env::temp_dir().join(format!("conformance-model-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cases: String = FAULTS
        .iter()
        .map(|(fault, _)| {
            let d = json!({
                "name": format!("model/qwen3_5-tiny/fault-{fault}"),
                "seed": 7,
                "builder": "model",
                "params": {
                    "checkpoint": "qwen3_5-tiny",
                    "prompt_len": 16,
                    "chunk": 0,
                    "steps": 2,
                    "fault": fault,
                }
            });
            d.to_string() + "\n"
        })
        .collect();
    let file = dir.join("faults.jsonl");
    std::fs::write(&file, cases).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--no-snapshots", "--cases"])
        .arg(&file)
        .arg("--out")
        .arg(dir.join("out"))
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .output()
        .expect("the conformance binary starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = ReportFile::read(&dir.join("out/report.json")).expect(&text);
    let rows = &report.cases;
    assert_eq!(rows.len(), FAULTS.len(), "{text}");
    for (fault, expected) in FAULTS {
        let row = rows
            .iter()
            .find(|r| r.name.ends_with(fault))
            .unwrap_or_else(|| panic!("no row for {fault}: {text}"));
        assert_eq!(row.verdict, Verdict::Fail, "{fault}: {row:?}");
        let path = row.output.as_ref().map_or("", |o| o.path.as_str());
        assert!(
            path.contains(&format!("first divergence: {expected}")),
            "{fault}: expected `{expected}` in `{path}`"
        );
    }
    // And without a fault the same case passes (the test can tell).
    let _ = std::fs::remove_dir_all(&dir);
}

/// The verify case catches a port that checks its drafts in one batched
/// call (as the reference's own block call does) instead of rows
/// independently: on the dense model that call parts from the single
/// steps (the `finding-block-vs-single-steps` finding), so it must FAIL.
#[test]
fn a_verify_run_as_one_block_fails() {
    let dir = std::env::temp_dir().join(format!("conformance-model-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let case = |fault: Option<&str>| {
        json!({
            "name": format!("model/qwen3_5-tiny/verify-k4/{}", fault.unwrap_or("clean")),
            "seed": 7,
            "builder": "model-verify",
            "params": { "checkpoint": "qwen3_5-tiny", "prompt_len": 16, "k": 4, "fault": fault }
        })
        .to_string()
            + "\n"
    };
    let file = dir.join("verify.jsonl");
    std::fs::write(&file, case(None) + &case(Some("verify-as-block"))).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--no-snapshots", "--cases"])
        .arg(&file)
        .arg("--out")
        .arg(dir.join("out"))
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .output()
        .expect("the conformance binary starts");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = ReportFile::read(&dir.join("out/report.json")).expect(&text);
    assert_eq!(report.cases.len(), 2, "{text}");
    let verdict = |suffix: &str| {
        report
            .cases
            .iter()
            .find(|r| r.name.ends_with(suffix))
            .map(|r| r.verdict.clone())
            .unwrap_or_else(|| panic!("no row {suffix}: {text}"))
    };
    assert_eq!(verdict("/clean"), Verdict::Pass, "{text}");
    assert_eq!(verdict("/verify-as-block"), Verdict::Fail, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
