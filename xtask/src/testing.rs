//! `cargo xtask test [--backend B] [args...]`: the whole suite on a pinned
//! reference environment: `cargo test --workspace`, then the conformance
//! runner on CPU. A leading `--backend cuda` runs both against
//! `.reference-cuda/` (built in `target/cuda`; a GPU host is needed to run).

use std::ffi::OsString;
use std::path::Path;

use anyhow::Result;

use crate::conformance::explain_loader_failure;
use crate::env;
use crate::util;

/// [`util::status`], saying how long the step took (CI's time budget is
/// read off these lines).
fn timed(cmd: &mut std::process::Command, what: &str) -> Result<i32> {
    let start = std::time::Instant::now();
    let code = util::status(cmd, what)?;
    println!(
        "xtask test: {what}: exit {code} in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(code)
}

pub fn run(root: &Path, args: &[OsString]) -> Result<i32> {
    let args = &util::absolute_path_args(args);
    // A run xtask refuses must not leave the previous run's report looking
    // current (the runner clears its own `--out` once its flags are valid).
    let (layout, _, extra) = util::or_clear_reports(root, args, env::select_and_check(root, args))?;
    let code = timed(
        layout.cargo(root).args(["test", "--workspace"]),
        "cargo test",
    )?;
    if code != 0 {
        return Ok(code);
    }
    if !root.join("crates/conformance/Cargo.toml").exists() {
        println!("xtask test: crates/conformance does not exist yet; conformance run skipped");
        return Ok(0);
    }
    let mut cmd = layout.cargo(root);
    cmd.args(["run", "-p", "conformance", "--bin", "conformance", "--"]);
    // The CPU run is the default; an explicit `--device` replaces it.
    if !extra
        .iter()
        .any(|arg| arg == "--device" || arg.to_string_lossy().starts_with("--device="))
    {
        cmd.args(["--device", "cpu"]);
    }
    // The tests check every case: the deep tier, unless `--tier` is given.
    if !extra
        .iter()
        .any(|arg| arg.to_string_lossy().starts_with("--tier"))
    {
        cmd.args(["--tier", "deep"]);
    }
    cmd.args(extra);
    // The default run also exports the golden vectors of every must-equal
    // case, which are then re-read against their digests.
    let vectors = root.join("target/conformance-vectors");
    if extra.is_empty() {
        adopt_old_export(&vectors);
        cmd.arg("--export").arg(&vectors);
    }
    let code = timed(&mut cmd, "the conformance runner")?;
    explain_loader_failure(&layout, code);
    if code != 0 {
        return Ok(code);
    }
    if !extra.is_empty() {
        println!(
            "xtask test: protocol self-test and C++ candidate skipped (runner arguments given)"
        );
        return Ok(0);
    }
    // The candidate protocol's self-test (docs/src/guide/candidate.md):
    // this repository's port served through the protocol must get the
    // linked run's verdict on every case, case by case.
    let candidate = layout
        .target_dir(root)
        .join("debug/conformance-port-candidate");
    let linked = root.join("target/conformance/report.json");
    let mut cmd = layout.cargo(root);
    cmd.args(["run", "-p", "conformance", "--bin", "conformance", "--"])
        .arg("--verify-export")
        .arg(&vectors)
        .arg("--verify-against")
        .arg(&linked);
    let code = timed(&mut cmd, "the export's digests")?;
    if code != 0 {
        return Ok(code);
    }
    let mut cmd = layout.cargo(root);
    cmd.args(["run", "-p", "conformance", "--bin", "conformance", "--"])
        .args(["--device", "cpu", "--candidate"])
        .arg(&candidate)
        .arg("--same-verdicts-as")
        .arg(&linked)
        .arg("--out")
        .arg(root.join("target/conformance-candidate"));
    let code = timed(&mut cmd, "the protocol self-test")?;
    if code != 0 {
        return Ok(code);
    }
    // The second worked example, in C++ on the pinned libmlx: its ops
    // pass and its wrong variant fails with the first differing element.
    crate::cpp_candidate::run(root, &layout)
}

/// `target/conformance-vectors` (xtask's own fixed path) written by a
/// runner older than the ownership marker: removed when it holds nothing
/// but an export's names, so the runner (which clears only a directory
/// with its marker) does not refuse it. Anything else there is left for
/// the runner to refuse, naming it.
fn adopt_old_export(dir: &Path) {
    const EXPORT_NAMES: [&str; 4] = ["manifest.json", "vectors", "cases", "report"];
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
        || dir.join(".mlx-conformance-owned").exists()
    {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !names.is_empty() && names.iter().all(|n| EXPORT_NAMES.contains(&n.as_str())) {
        let _ = std::fs::remove_dir_all(dir);
    }
}
