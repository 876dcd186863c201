//! The release gate end to end on real runs: the baseline gated against
//! itself exits 0 with every case unchanged; a candidate whose reference is
//! deliberately changed (the proof mode's perturbation) has its must-equal
//! cases classified "reference moved alone" and exits 1.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A few must-equal cases and a finding, to keep the test quick.
const FILTER: &str = "quantized/rows/affine-4b-gs64/bf16/M";

fn run(dir: &Path, perturb: bool) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
    cmd.env("CI", "true")
        .args([
            "--device",
            "cpu",
            "--no-snapshots",
            "--filter",
            FILTER,
            "--keep-outputs",
        ])
        .arg(dir.join("outputs"))
        .arg("--out")
        .arg(dir);
    if perturb {
        cmd.arg("--perturb");
    }
    let out = cmd.output().unwrap();
    assert!(
        dir.join("report.json").exists(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gate(name: &str, base: &Path, cand: &Path, out: &Path) -> (i32, serde_json::Value) {
    let status = Command::new(env!("CARGO_BIN_EXE_conformance-gate"))
        .arg(name)
        .arg(base)
        .arg(cand)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let json = std::fs::read_to_string(out.join("gate.json")).unwrap();
    (
        status.status.code().unwrap(),
        serde_json::from_str(&json).unwrap(),
    )
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gate-e2e-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn baseline_against_itself_is_unchanged_and_a_moved_reference_fails() {
    let (a, b, p) = (temp("a"), temp("b"), temp("p"));
    run(&a, false);
    run(&b, false);
    run(&p, true);
    let (code, g) = gate("self", &a, &b, &temp("self"));
    assert_eq!(code, 0, "{g:#}");
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() > 3);
    assert!(cases.iter().all(|c| c["class"] == "unchanged"), "{g:#}");

    let (code, g) = gate("perturbed", &a, &p, &temp("perturbed"));
    assert_eq!(code, 1, "{g:#}");
    for c in g["cases"].as_array().unwrap() {
        if c["expect"] == "must_equal" {
            assert_eq!(c["class"], "reference_moved_alone", "{c:#}");
            let port_unchanged = c["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o["port"]["outcome"] == "unchanged");
            assert!(port_unchanged, "{c:#}");
        }
    }
}
