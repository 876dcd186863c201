//! The exit codes and environment variables of the tools, as data, and the
//! two reference pages generated from them. Each table is checked against
//! the sources both ways, wherever H1's split moves the files: every
//! `pub const NAME: i32 = N` of a `mod exit` under `crates/` is a row with
//! that name and code, and every `MLX_CONFORMANCE_*`, `MLX_BENCH_*` and
//! kernel-setting name the sources read is a row; a row whose name no
//! source mentions is an error too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{bail, Result};

/// One exit code of one tool.
pub struct ExitCode {
    pub tool: &'static str,
    pub code: i32,
    /// The `mod exit` constant that holds it, where one does.
    pub constant: Option<&'static str>,
    pub meaning: &'static str,
}

pub const EXIT_CODES: &[ExitCode] = &[
    ExitCode { tool: "conformance", code: 0, constant: Some("PASS"), meaning: "every must-equal case passed and every snapshot matches (or, outside CI, no snapshot set was recorded for this device and every verdict passed)" },
    ExitCode { tool: "conformance", code: 1, constant: Some("MUST_EQUAL_FAILURE"), meaning: "a must-equal case failed; under `--perturb`, an output went undetected; `--verify-export` found a problem; `--same-verdicts-as` found a differing verdict" },
    ExitCode { tool: "conformance", code: 2, constant: Some("DRIFT"), meaning: "snapshot or finding drift: bits or a finding changed, or a snapshot is missing, orphaned, corrupted or hand-edited; under `CI=true` also a missing snapshot set" },
    ExitCode { tool: "conformance", code: 3, constant: Some("ENVIRONMENT"), meaning: "environment or harness problem: set-up missing or drifted, a case errored, bad command-line usage, an unknown `--filter`" },
    ExitCode { tool: "conformance", code: 127, constant: Some("LOADER_FAILURE"), meaning: "the CUDA runner could not start: the dynamic loader found no NVIDIA driver or libraries (not a GPU host; xtask names what is missing)" },
    ExitCode { tool: "conformance", code: 130, constant: None, meaning: "interrupted (Ctrl-C or SIGTERM): no further case started, no report left" },
    ExitCode { tool: "conformance-gate (`cargo xtask gate`)", code: 0, constant: Some("UNCHANGED"), meaning: "nothing changed" },
    ExitCode { tool: "conformance-gate (`cargo xtask gate`)", code: 1, constant: Some("MUST_EQUAL_FAILS"), meaning: "a must-equal case fails on the candidate" },
    ExitCode { tool: "conformance-gate (`cargo xtask gate`)", code: 2, constant: Some("CHANGED"), meaning: "bits or findings changed, but every must-equal case still passes on the candidate" },
    ExitCode { tool: "conformance-gate (`cargo xtask gate`)", code: 3, constant: Some("ENVIRONMENT"), meaning: "a side not set up, the runner does not build against the candidate (version skew: the reason is in gate.json), a case errors, or the baseline itself does not pass" },
    ExitCode { tool: "conformance-explore (`cargo xtask explore`)", code: 0, constant: None, meaning: "nothing found" },
    ExitCode { tool: "conformance-explore (`cargo xtask explore`)", code: 1, constant: None, meaning: "port and reference bits differ, or the port raised where the reference computed (a port bug)" },
    ExitCode { tool: "conformance-explore (`cargo xtask explore`)", code: 2, constant: None, meaning: "findings about the reference only" },
    ExitCode { tool: "conformance-explore (`cargo xtask explore`)", code: 3, constant: None, meaning: "usage or environment" },
    ExitCode { tool: "conformance-explore (`cargo xtask explore`)", code: 130, constant: None, meaning: "interrupted" },
    ExitCode { tool: "cargo xtask", code: 3, constant: Some("EXIT_ENVIRONMENT"), meaning: "a failure of xtask itself: missing, half-built or drifted environment, a set-up step that failed (`error: <message>`); otherwise a wrapped child's code passes through unchanged" },
    ExitCode { tool: "cargo xtask", code: 130, constant: None, meaning: "SIGINT, SIGTERM or SIGHUP forwarded to the running child's process group: the child's code (128 + signal), and no further step" },
];

/// One environment variable.
pub struct EnvVar {
    pub name: &'static str,
    pub kind: Kind,
    pub meaning: &'static str,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    /// Set by a user or CI.
    User,
    /// An MLX variable that changes which kernel runs (pinned per snapshot set).
    KernelSetting,
    /// A hook for the suite's own tests.
    Testing,
    /// Set by the tool for its own child processes.
    Internal,
}

impl Kind {
    fn heading(self) -> &'static str {
        match self {
            Kind::User => "For users and CI",
            Kind::KernelSetting => "MLX kernel settings (pinned per snapshot set)",
            Kind::Testing => "Testing hooks",
            Kind::Internal => "Set by the tools for their own children",
        }
    }
}

pub const ENV_VARS: &[EnvVar] = &[
    EnvVar { name: "CI", kind: Kind::User, meaning: "`true`: a missing snapshot set exits 2 instead of 0, nothing is ever written to `fixtures/`, and `cargo xtask book` checks its generated pages instead of writing them" },
    EnvVar { name: "MLX_CONFORMANCE_DEVICE_FAMILY", kind: Kind::User, meaning: "declares the snapshot set's device key, as `--device-family KEY` (1 to 64 of `a-z0-9._-`; empty means not declared)" },
    EnvVar { name: "MLX_CONFORMANCE_POISON", kind: Kind::User, meaning: "`0`, `off`, `false` or `no` turns off the NaN-sentinel buffer poisoning (the run says so in its reports)" },
    EnvVar { name: "MLX_CONFORMANCE_NVIDIA_LIBS", kind: Kind::User, meaning: "the CUDA bundle's launcher: where the NVIDIA libraries are (default: every `nvidia/*/lib` of the first `python3` on PATH)" },
    EnvVar { name: "MLX_PTX_CACHE_DIR", kind: Kind::User, meaning: "MLX's CUDA kernel cache (default `/tmp/mlx/<version>/ptx`); the CUDA bundle's launcher points it at a carried cache when unset" },
    EnvVar { name: "MLX_BENCH_DEVICE", kind: Kind::User, meaning: "benches: `cpu` (default) or `gpu`" },
    EnvVar { name: "MLX_BENCH_LAYERS", kind: Kind::User, meaning: "the serving bench's stack depth" },
    EnvVar { name: "MLX_BENCH_ITERATIONS", kind: Kind::User, meaning: "the model bench's runs per figure (default 20)" },
    EnvVar { name: "MLX_BENCH_MODEL_DIR", kind: Kind::User, meaning: "the model bench's checkpoint (default: the `model/` family's tiny ones)" },
    EnvVar { name: "FUZZ_SECONDS", kind: Kind::User, meaning: "the ignored fuzz test's budget (`cargo test --release -p layers --test fuzz_parsers -- --ignored`)" },
    EnvVar { name: "MLX_ENABLE_TF32", kind: Kind::KernelSetting, meaning: "CUDA: float32 matmuls in TF32 unless 0" },
    EnvVar { name: "MLX_CUDA_USE_CUDNN_SDPA", kind: Kind::KernelSetting, meaning: "CUDA: SDPA through cuDNN unless 0" },
    EnvVar { name: "MLX_SDPA_BLOCKS", kind: Kind::KernelSetting, meaning: "Metal: SDPA's split" },
    EnvVar { name: "MLX_METAL_GPU_ARCH", kind: Kind::KernelSetting, meaning: "Metal: the architecture kernels are chosen for" },
    EnvVar { name: "MLX_CONV_UNFOLD_TILE_ROWS", kind: Kind::KernelSetting, meaning: "Metal: convolution tiling" },
    EnvVar { name: "MLX_DISABLE_COMPILE", kind: Kind::KernelSetting, meaning: "every backend: `mx.compile` runs op by op when set" },
    EnvVar { name: "MLX_CONFORMANCE_FAULT", kind: Kind::Testing, meaning: "`<signal>@<case text>`: a worker raises SIGSEGV, SIGABRT, SIGFPE, SIGBUS or SIGSTOP in that case (workers only)" },
    EnvVar { name: "MLX_CONFORMANCE_PLANT", kind: Kind::Testing, meaning: "`<family>:<condition>[,after=K]`: a planted port fault the explorer must find and shrink" },
    EnvVar { name: "MLX_CONFORMANCE_FIXTURES", kind: Kind::Testing, meaning: "replaces `fixtures/` for one run (tests write snapshots into a scratch copy)" },
    EnvVar { name: "MLX_CONFORMANCE_HOME", kind: Kind::Internal, meaning: "the bundle's launcher: the bundle's root (fixtures, interpreter)" },
    EnvVar { name: "MLX_CONFORMANCE_RUNNER_PID", kind: Kind::Internal, meaning: "a worker's runner, for dying with it" },
    EnvVar { name: "MLX_CONFORMANCE_PROTOCOL", kind: Kind::Internal, meaning: "the candidate protocol's version, for the candidate process" },
    EnvVar { name: "MLX_CONFORMANCE_LAUNCHER_PARENT", kind: Kind::Internal, meaning: "a candidate launcher's worker, for dying with it" },
    EnvVar { name: "MLX_CONFORMANCE_CANDIDATE_CWD", kind: Kind::Internal, meaning: "`cargo xtask conformance` and `explore`: the directory they were run in, where the `--candidate` command runs (a relative path in it resolves from there, as `--cases` and `--out` do; unset: the runner's working directory)" },
    EnvVar { name: "MLX_CONFORMANCE_CANDIDATE_OWNER", kind: Kind::Internal, meaning: "a candidate's worker (`<pid>-<start>`), inherited by what the candidate starts: a later run ends what a SIGKILLed worker and launcher left" },
];

pub fn exit_codes_page(root: &Path) -> Result<String> {
    check_exit_codes(root)?;
    let mut s = super::generated_header(
        "Exit codes",
        "xtask/src/book/tables.rs (checked against every `mod exit` under crates/)",
    );
    s += "When several apply to one run of `conformance`, the first in the order 1, 3, 2 wins. \
          The closing line `conformance: N passed, N findings, N failed, N skipped` counts what CI gates on \
          ([Reading a report](../guide/reports.md)).\n";
    let mut tool = "";
    for row in EXIT_CODES {
        if row.tool != tool {
            tool = row.tool;
            s += &format!("\n## {tool}\n\n| code | meaning |\n|---:|---|\n");
        }
        s += &format!("| {} | {} |\n", row.code, row.meaning);
    }
    Ok(s)
}

pub fn environment_page(root: &Path) -> Result<String> {
    check_environment(root)?;
    let mut s = super::generated_header(
        "Environment variables",
        "xtask/src/book/tables.rs (checked against the names the sources read)",
    );
    s +=
        "Kernel settings are set to MLX's default when unset, recorded in `report.json` and every \
          snapshot, and a run checking a set recorded with other values is refused \
          ([Snapshot sets](../guide/snapshots.md)).\n";
    for kind in [
        Kind::User,
        Kind::KernelSetting,
        Kind::Testing,
        Kind::Internal,
    ] {
        s += &format!(
            "\n## {}\n\n| variable | meaning |\n|---|---|\n",
            kind.heading()
        );
        for var in ENV_VARS.iter().filter(|v| v.kind == kind) {
            s += &format!("| `{}` | {} |\n", var.name, var.meaning);
        }
    }
    Ok(s)
}

/// Every `pub const NAME: i32 = N;` inside a `mod exit { .. }` block, and
/// the xtask exit constants, of the Rust sources under `crates/` and `xtask/src`.
fn exit_constants(root: &Path) -> Result<BTreeMap<String, BTreeSet<i32>>> {
    let mut found: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for (_, text) in rust_sources(root)? {
        let mut in_exit = false;
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with("pub mod exit {") {
                in_exit = true;
                continue;
            }
            if in_exit && t == "}" {
                in_exit = false;
                continue;
            }
            let top_level =
                t.starts_with("const EXIT_") || t.starts_with("pub const LOADER_FAILURE");
            if !(in_exit || top_level) {
                continue;
            }
            let Some(rest) = t
                .strip_prefix("pub const ")
                .or_else(|| t.strip_prefix("const "))
            else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": i32 =") else {
                continue;
            };
            if let Ok(code) = value.trim().trim_end_matches(';').parse() {
                found
                    .entry(name.trim().to_owned())
                    .or_default()
                    .insert(code);
            }
        }
    }
    Ok(found)
}

fn check_exit_codes(root: &Path) -> Result<()> {
    let found = exit_constants(root)?;
    if found.is_empty() {
        bail!(
            "no `mod exit` constants found under crates/: the exit-code check has nothing to check"
        );
    }
    let mut problems = Vec::new();
    for (name, codes) in &found {
        for code in codes {
            if !EXIT_CODES
                .iter()
                .any(|r| r.constant == Some(name.as_str()) && r.code == *code)
            {
                problems.push(format!(
                    "exit constant {name} = {code} has no row in xtask/src/book/tables.rs"
                ));
            }
        }
    }
    for row in EXIT_CODES {
        if let Some(name) = row.constant {
            if !found
                .get(name)
                .is_some_and(|codes| codes.contains(&row.code))
            {
                problems.push(format!(
                    "the row {} {name} = {} names no exit constant of the sources",
                    row.tool, row.code
                ));
            }
        }
    }
    if !problems.is_empty() {
        bail!("exit codes: {}", problems.join("; "));
    }
    Ok(())
}

/// The variable names the sources read that the page must document:
/// `MLX_CONFORMANCE_*` and `MLX_BENCH_*` anywhere in crates/ and xtask/src,
/// and the kernel settings (`name: "MLX_..."` entries).
fn names_read(root: &Path) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for (_, text) in rust_sources(root)? {
        for prefix in ["\"MLX_CONFORMANCE_", "\"MLX_BENCH_", "name: \"MLX_"] {
            let mut rest = text.as_str();
            while let Some(at) = rest.find(prefix) {
                let start = at + prefix.find("MLX_").unwrap_or(0);
                let name: String = rest[start..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.ends_with('_') && rest[start + name.len()..].starts_with('"') {
                    names.insert(name);
                }
                rest = &rest[at + prefix.len()..];
            }
        }
    }
    Ok(names)
}

fn check_environment(root: &Path) -> Result<()> {
    let read = names_read(root)?;
    let documented: BTreeSet<&str> = ENV_VARS.iter().map(|v| v.name).collect();
    let mut problems: Vec<String> = read
        .iter()
        .filter(|n| !documented.contains(n.as_str()))
        .map(|n| format!("{n} is read by the sources but has no row in xtask/src/book/tables.rs"))
        .collect();
    // Rows must name something that exists: any source, script or lock.
    let mut everything = String::new();
    for (_, text) in rust_sources(root)? {
        everything += &text;
    }
    for extra in [".ci/run", "xtask/src/bundle.rs"] {
        everything += &std::fs::read_to_string(root.join(extra)).unwrap_or_default();
    }
    for var in ENV_VARS {
        if !everything.contains(var.name) {
            problems.push(format!("{} has a row but no source mentions it", var.name));
        }
    }
    if read.is_empty() {
        problems
            .push("no variable names found in the sources: the check has nothing to check".into());
    }
    if !problems.is_empty() {
        bail!("environment variables: {}", problems.join("; "));
    }
    Ok(())
}

/// Every `.rs` file under `crates/` and `xtask/` (sorted), with its text.
fn rust_sources(root: &Path) -> Result<Vec<(std::path::PathBuf, String)>> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            if entry.file_type()?.is_dir() {
                if name != "target" && !name.to_string_lossy().starts_with('.') {
                    walk(&path, out)?;
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(&root.join("crates"), &mut files)?;
    walk(&root.join("xtask"), &mut files)?;
    files.sort();
    // This file names every variable: it must not vouch for itself.
    files.retain(|f| !f.ends_with("xtask/src/book/tables.rs"));
    files
        .into_iter()
        .map(|f| Ok((f.clone(), std::fs::read_to_string(&f)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two generated tables are current: each check against the
    /// sources passes, and the committed pages are what they generate.
    #[test]
    fn the_exit_code_and_environment_pages_are_current() {
        let root = crate::workspace_root();
        for (path, page) in [
            (
                super::super::EXIT_CODES_PAGE,
                exit_codes_page(&root).unwrap(),
            ),
            (
                super::super::ENVIRONMENT_PAGE,
                environment_page(&root).unwrap(),
            ),
        ] {
            let committed = std::fs::read_to_string(root.join(path)).unwrap_or_default();
            assert!(
                committed == page,
                "{path} is stale: run `cargo xtask book` locally and commit"
            );
        }
        // Not vacuous: the scans found the constants and names they check.
        assert!(exit_constants(&root).unwrap().len() >= 8);
        assert!(names_read(&root).unwrap().len() >= 10);
    }
}
