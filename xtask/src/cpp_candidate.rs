//! `cargo xtask test`'s C++ candidate step: the second worked example of
//! the candidate protocol (`candidates/cpp/`), built once against the
//! reference environment's mlx headers and libmlx (cached in `target/`),
//! must pass every case its ops serve, and its `--wrong` variant must FAIL
//! the inv_freq cases naming the first differing element: the protocol is
//! language-neutral, as documented.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value as Json;

use crate::env::Layout;
use crate::util;

/// The ops the C++ candidate serves (its `OPS`), as `--ops` takes them.
const OPS: &str = "quantized_linear,quantized_matmul,inv_freq";

/// Builds (unless the cached binary is newer than its inputs) and runs
/// both variants; `Ok(code)` is the step's exit code.
pub fn run(root: &Path, layout: &Layout) -> Result<i32> {
    let binary = build(root, layout)?;
    let command = binary.display().to_string();
    let out = root.join("target/conformance-cpp-candidate");
    let (code, report) = conformance(root, layout, &command, &out, "the C++ candidate")?;
    let rows = case_rows(&report, &out)?;
    let not_passed: Vec<_> = rows.iter().filter(|(_, v, _)| v != "pass").collect();
    if code != 0 || !not_passed.is_empty() {
        println!("xtask test: the C++ candidate must pass every case of --ops {OPS}: exit {code}, not passed: {not_passed:?}");
        return Ok(1);
    }
    println!(
        "xtask test: the C++ candidate passed {} cases (--ops {OPS})",
        rows.len()
    );

    let out = root.join("target/conformance-cpp-candidate-wrong");
    let (code, report) = conformance(
        root,
        layout,
        &format!("{command} --wrong"),
        &out,
        "the wrong C++ candidate",
    )?;
    let rows = case_rows(&report, &out)?;
    // The deliberate bug is in inv_freq alone: those cases FAIL naming the
    // first differing element, everything else still passes.
    let wrong: Vec<_> = rows
        .iter()
        .filter(|(name, verdict, message)| {
            let inv_freq = name.starts_with("position/inv-freq/");
            let expected = if inv_freq {
                verdict == "fail"
                    && message.contains("(op `inv_freq`, result `value`)")
                    && message.contains("first at [")
            } else {
                verdict == "pass"
            };
            !expected
        })
        .collect();
    let failed = rows.iter().filter(|(_, v, _)| v == "fail").count();
    if code != 1 || failed == 0 || !wrong.is_empty() {
        println!("xtask test: the wrong C++ candidate must FAIL the inv_freq cases naming the first differing element and pass the rest: exit {code}, {failed} failed, unexpected rows: {wrong:?}");
        return Ok(1);
    }
    println!("xtask test: the wrong C++ candidate failed {failed} inv_freq cases with their first differing element, as it must");
    Ok(0)
}

/// `target/cpp-candidate/mlx-cpp-candidate`, built by the example's own
/// `build.sh` when missing or older than its source, its build script or
/// the libmlx it links.
fn build(root: &Path, layout: &Layout) -> Result<PathBuf> {
    let fingerprint = root.join(layout.fingerprint());
    let text = std::fs::read_to_string(&fingerprint).with_context(|| {
        format!(
            "reading {} (run `{}`)",
            fingerprint.display(),
            layout.setup_command()
        )
    })?;
    let json: Json = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", fingerprint.display()))?;
    let (Some(mlx_dir), Some(libmlx)) = (json["mlx_dir"].as_str(), json["libmlx"].as_str()) else {
        bail!(
            "{} names no mlx_dir or libmlx (run `{}`)",
            fingerprint.display(),
            layout.setup_command()
        );
    };
    let source = root.join("candidates/cpp");
    let binary = root.join("target/cpp-candidate/mlx-cpp-candidate");
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let inputs = [
        source.join("mlx_cpp_candidate.cpp"),
        source.join("build.sh"),
        PathBuf::from(libmlx),
    ];
    let fresh = modified(&binary).is_some_and(|built| {
        inputs
            .iter()
            .all(|input| modified(input).is_some_and(|m| m <= built))
    });
    if !fresh {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg(source.join("build.sh")).arg(mlx_dir).arg(&binary);
        let start = std::time::Instant::now();
        let code = util::status(
            &mut cmd,
            "building the C++ candidate (candidates/cpp/build.sh)",
        )?;
        if code != 0 {
            bail!(
                "candidates/cpp/build.sh exited {code} (it needs a C++20 compiler, `g++` or $CXX)"
            );
        }
        println!(
            "xtask test: built the C++ candidate in {:.0} s",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(binary)
}

/// One run of `--candidate COMMAND --ops OPS` on CPU; its exit code and
/// report.json.
fn conformance(
    root: &Path,
    layout: &Layout,
    command: &str,
    out: &Path,
    what: &str,
) -> Result<(i32, Json)> {
    let mut cmd = layout.cargo(root);
    cmd.args(["run", "-p", "conformance", "--bin", "conformance", "--"])
        .args([
            "--device",
            "cpu",
            "--ops",
            OPS,
            "--candidate",
            command,
            "--out",
        ])
        .arg(out);
    let start = std::time::Instant::now();
    let code = util::status(&mut cmd, what)?;
    println!(
        "xtask test: {what}: exit {code} in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    let path = out.join("report.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{what}: reading {}", path.display()))?;
    Ok((
        code,
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
    ))
}

/// Each case's (name, verdict, message); an empty report is an error (a
/// check over no rows proves nothing).
fn case_rows(report: &Json, out: &Path) -> Result<Vec<(String, String, String)>> {
    let rows: Vec<_> = report["cases"]
        .as_array()
        .map(|cases| {
            cases
                .iter()
                .map(|c| {
                    let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                    (field("name"), field("verdict"), field("message"))
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        bail!(
            "{}/report.json has no case: --ops {OPS} selected nothing",
            out.display()
        );
    }
    Ok(rows)
}
