//! `cargo xtask conformance [--backend B] [args...]`: the conformance runner,
//! after the check of the selected reference environment. A leading
//! `--backend cuda` selects `.reference-cuda/` (built in `target/cuda`); the
//! other arguments pass through unchanged and the runner's exit code
//! (0/1/2/3, documented by the runner) is ours.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Result};

use crate::env::{self, Backend, Layout};
use crate::util;

pub fn run(root: &Path, args: &[OsString]) -> Result<i32> {
    let args = &util::absolute_path_args(args);
    // A run xtask refuses must not leave the previous run's report looking
    // current (the runner clears its own `--out` once its flags are valid).
    let (layout, _, args) = util::or_clear_reports(root, args, env::select_and_check(root, args))?;
    if !root.join("crates/conformance/Cargo.toml").exists() {
        bail!("crates/conformance does not exist in this workspace");
    }
    let code = util::status(
        with_caller_dir(&mut layout.cargo(root))
            .args(["run", "-p", "conformance", "--bin", "conformance", "--"])
            .args(args),
        "the conformance runner",
    )?;
    explain_loader_failure(&layout, code);
    Ok(code)
}

/// `cargo xtask explore [--backend B] [args...]`: the shape explorer
/// (`conformance-explore`), after the same environment check; its exit
/// code (0 nothing found, 1 a violation, 3 usage or environment) is ours.
pub fn explore(root: &Path, args: &[OsString]) -> Result<i32> {
    let args = &util::absolute_path_args(args);
    let (layout, _, args) = env::select_and_check(root, args)?;
    let code = util::status(
        with_caller_dir(&mut layout.cargo(root))
            .args([
                "run",
                "-p",
                "conformance",
                "--bin",
                "conformance-explore",
                "--",
            ])
            .args(args),
        "the shape explorer",
    )?;
    explain_loader_failure(&layout, code);
    Ok(code)
}

/// `cargo xtask export [--backend B] --out DIR [args...]`: the runner with
/// `--export DIR` and its reports in DIR/report; its exit code is ours.
pub fn export(root: &Path, args: &[OsString]) -> Result<i32> {
    let mut rest = Vec::new();
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            out = it.next().cloned();
        } else if let Some(v) = a.to_str().and_then(|s| s.strip_prefix("--out=")) {
            out = Some(v.into());
        } else {
            rest.push(a.clone());
        }
    }
    let Some(out) = out else {
        bail!("cargo xtask export needs --out DIR: where the vectors and DIR/manifest.json go");
    };
    let out = std::path::absolute(&out)?;
    // The same backend for the verification (a leading `--backend B`).
    let mut verify: Vec<OsString> = match rest.first().and_then(|a| a.to_str()) {
        Some("--backend") => rest.iter().take(2).cloned().collect(),
        Some(a) if a.starts_with("--backend=") => rest.iter().take(1).cloned().collect(),
        _ => Vec::new(),
    };
    rest.extend([
        "--export".into(),
        out.as_os_str().to_owned(),
        "--out".into(),
        out.join("report").into_os_string(),
    ]);
    let code = run(root, &rest)?;
    // 0, 1 (a FAIL) and 2 (findings drifted) ran every case to the end:
    // the export is whole, and is re-read against its digests.
    if code > 2 {
        return Ok(code);
    }
    verify.extend([
        "--verify-export".into(),
        out.as_os_str().to_owned(),
        "--verify-against".into(),
        out.join("report/report.json").into_os_string(),
    ]);
    Ok(code.max(run(root, &verify)?))
}

/// `cargo xtask ops-doc [--from DIR]`: docs/ops.json from an export's
/// manifest (the runner's `--ops-signatures`), then docs/ops.md (the
/// runner's `--ops-doc`, rebuilt with the new docs/ops.json compiled in;
/// xtask links no MLX).
pub fn ops_doc(root: &Path, from: Option<std::path::PathBuf>) -> Result<i32> {
    let (layout, _, _) = env::select_and_check(root, &[])?;
    let from =
        std::path::absolute(from.unwrap_or_else(|| root.join("target/conformance-vectors")))?;
    let runner = |args: &[&std::ffi::OsStr]| -> Result<Vec<u8>> {
        let output = layout
            .cargo(root)
            .args([
                "run",
                "-q",
                "-p",
                "conformance",
                "--bin",
                "conformance",
                "--",
            ])
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()?;
        if !output.status.success() {
            bail!("the runner's {:?} failed ({})", args, output.status);
        }
        Ok(output.stdout)
    };
    std::fs::create_dir_all(root.join("docs"))?;
    let json = runner(&["--ops-signatures".as_ref(), from.as_os_str()])?;
    let path = root.join("docs/ops.json");
    std::fs::write(&path, &json)?;
    println!(
        "wrote {} from {}",
        path.display(),
        from.join("manifest.json").display()
    );
    let md = runner(&["--ops-doc".as_ref()])?;
    let path = root.join("docs/ops.md");
    std::fs::write(&path, &md)?;
    println!("wrote {}", path.display());
    Ok(0)
}

/// Exit code of a process the dynamic loader could not start.
pub const LOADER_FAILURE: i32 = 127;

/// After a CUDA binary exited 127 (the loader did not find a library):
/// says what a GPU host needs.
pub fn explain_loader_failure(layout: &Layout, code: i32) {
    if layout.backend == Backend::Cuda && code == LOADER_FAILURE {
        eprintln!(
            "xtask: exit {LOADER_FAILURE}: if the dynamic loader could not find a library \
             (libcuda.so.1, libcublasLt.so.13, libcudnn.so.9, libnccl.so.2, libcufft.so.12, \
             libnvrtc.so.13), this is not a GPU host with the NVIDIA driver and libraries the \
             CUDA libmlx needs; `cargo xtask setup --backend cuda` prints the list and \
             reference/cuda/README.md says how to provide them (LD_LIBRARY_PATH, CUDA_HOME)"
        );
    }
}

/// The runner's `MLX_CONFORMANCE_CANDIDATE_CWD`: the directory xtask was
/// run in (unless the user set it), so a relative path in `--candidate`
/// resolves from there like `--cases`, `--out` and the other paths
/// ([`util::absolute_path_args`]); the runner itself runs in the
/// checkout's top level.
pub const CANDIDATE_CWD_ENV: &str = "MLX_CONFORMANCE_CANDIDATE_CWD";

fn with_caller_dir(cmd: &mut std::process::Command) -> &mut std::process::Command {
    if std::env::var_os(CANDIDATE_CWD_ENV).is_none() {
        if let Ok(dir) = std::env::current_dir() {
            cmd.env(CANDIDATE_CWD_ENV, dir);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    /// Issue 40 (re-check): the runner started by `cargo xtask conformance`
    /// is told the caller's directory for the candidate command (it runs
    /// in the checkout's top level; tests/candidate.rs
    /// a_relative_candidate_runs_in_the_directory_xtask_was_called_from
    /// checks that the runner honours it).
    #[test]
    fn the_runner_is_told_the_callers_directory() {
        let mut cmd = std::process::Command::new("true");
        cmd.current_dir("/");
        super::with_caller_dir(&mut cmd);
        let set = cmd
            .get_envs()
            .find(|(k, _)| *k == super::CANDIDATE_CWD_ENV)
            .and_then(|(_, v)| v.map(std::path::PathBuf::from));
        if std::env::var_os(super::CANDIDATE_CWD_ENV).is_none() {
            assert_eq!(set, Some(std::env::current_dir().unwrap()));
        }
    }
}
