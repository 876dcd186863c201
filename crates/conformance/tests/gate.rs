//! The release gate end to end on real runs (its inputs are the runner's
//! own report.json and kept outputs, never text written here): the
//! baseline gated against itself exits 0 with every case unchanged; a
//! candidate whose reference is deliberately changed (the proof mode's
//! perturbation) has its must-equal cases classified "reference moved
//! alone" and exits 1; a candidate run on other inputs (another seed: port
//! and reference move together) exits 2; a candidate run where a case
//! crashed, or an environment error, exits 3.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A few must-equal cases and a finding, to keep the test quick.
const FILTER: &str = "quantized/rows/affine-4b-gs64/bf16/M";

fn run(dir: &Path, perturb: bool) {
    run_with(dir, perturb, &[], None)
}

/// A run of FILTER into `dir` with `extra` flags, `fault` as
/// MLX_CONFORMANCE_FAULT.
fn run_with(dir: &Path, perturb: bool, extra: &[&str], fault: Option<&str>) {
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
    cmd.args(extra);
    if let Some(fault) = fault {
        cmd.env("MLX_CONFORMANCE_FAULT", fault);
    }
    let out = cmd.output().unwrap();
    assert!(
        dir.join("report.json").exists(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gate(name: &str, base: &Path, cand: &Path, out: &Path) -> (i32, serde_json::Value) {
    gate_with(name, base, cand, out, &[])
}

fn gate_with(
    name: &str,
    base: &Path,
    cand: &Path,
    out: &Path,
    extra: &[&str],
) -> (i32, serde_json::Value) {
    let status = Command::new(env!("CARGO_BIN_EXE_conformance-gate"))
        .arg(name)
        .arg(base)
        .arg(cand)
        .arg("--out")
        .arg(out)
        .args(extra)
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

/// The other two exits the gate's table promises, from real runs.
#[test]
fn other_inputs_exit_2_and_a_crashed_case_or_an_environment_error_exit_3() {
    let (a, seeded) = (temp("a2"), temp("seed1"));
    run(&a, false);
    // Another seed: every input moves, so port and reference bits move
    // together; must-equal cases still pass.
    run_with(&seeded, false, &["--seed", "1"], None);
    let (code, g) = gate("seeded", &a, &seeded, &temp("seeded"));
    assert_eq!(code, 2, "{g:#}");
    let cases = g["cases"].as_array().unwrap();
    let must_equal: Vec<_> = cases
        .iter()
        .filter(|c| c["expect"] == "must_equal")
        .collect();
    assert!(!must_equal.is_empty(), "{g:#}");
    for c in must_equal {
        assert_eq!(c["class"], "both_moved_together", "{c:#}");
    }

    // One case crashes in the candidate run: that case is a candidate
    // error, and the gate exits 3.
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("report.json")).unwrap()).unwrap();
    let crashing = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["expect"] == "must_equal")
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let crashed = temp("crashed");
    run_with(
        &crashed,
        false,
        &["--jobs", "1"],
        Some(&format!("SIGSEGV@{crashing}")),
    );
    let (code, g) = gate("crashed", &a, &crashed, &temp("crashed-gate"));
    assert_eq!(code, 3, "{g:#}");
    let row = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == crashing.as_str())
        .unwrap();
    assert_eq!(row["class"], "candidate_error", "{row:#}");

    // An environment error found before the runs: 3, recorded.
    let (code, g) = gate_with(
        "env",
        &a,
        &a,
        &temp("env"),
        &[
            "--environment-error",
            "the candidate's wheel did not install",
        ],
    );
    assert_eq!(code, 3, "{g:#}");
    assert_eq!(
        g["environment_errors"][0], "the candidate's wheel did not install",
        "{g:#}"
    );
}

/// Issue 40, round 4b: a kept output linked to `/dev/zero` (or a FIFO in
/// its place) made the gate read without end (or block forever). Kept
/// outputs are now read as snapshots are: no link followed, no FIFO or
/// device opened for reading, a size cap; the case is an error naming the
/// file and the gate ends.
#[cfg(unix)]
#[test]
fn a_kept_output_that_is_a_link_or_a_fifo_is_an_error_not_a_hang() {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (temp("hostile-a"), temp("hostile-b"));
    run(&a, false);
    run(&b, false);
    let mut files: Vec<PathBuf> = std::fs::read_dir(b.join("outputs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    std::fs::remove_file(&files[0]).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &files[0]).unwrap();
    std::fs::remove_file(&files[1]).unwrap();
    let c = std::ffi::CString::new(files[1].as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = temp("hostile-gate");
    let mut child = Command::new(env!("CARGO_BIN_EXE_conformance-gate"))
        .arg("hostile")
        .arg(&a)
        .arg(&b)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gate hung on a kept output linked to /dev/zero or a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(3));
    let gate = std::fs::read_to_string(out.join("gate.json")).unwrap();
    for f in &files[..2] {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(gate.contains(name), "{name} not named: {gate}");
    }
}
