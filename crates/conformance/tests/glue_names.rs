//! The Rust–Python boundary by name: every glue function a case calls
//! exists in `reference_glue.py`, and every public glue function is used
//! (by name from Rust, or by the glue itself), so neither side can rot
//! silently.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn glue_source() -> String {
    std::fs::read_to_string(workspace().join("crates/oracle/python/reference_glue.py")).unwrap()
}

/// Top-level `def name(` without a leading underscore.
fn glue_functions(glue: &str) -> BTreeSet<String> {
    glue.lines()
        .filter_map(|l| l.strip_prefix("def "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| !name.starts_with('_'))
        .map(str::to_owned)
        .collect()
}

fn rust_sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The string literal that opens the argument list after each `marker`.
fn first_literal_args<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(marker) {
        rest = &rest[at + marker.len()..];
        let trimmed = rest.trim_start();
        if let Some(body) = trimmed.strip_prefix('"') {
            if let Some(end) = body.find('"') {
                names.push(&body[..end]);
            }
        }
    }
    names
}

#[test]
fn every_glue_function_a_case_calls_exists() {
    let glue = glue_functions(&glue_source());
    let mut files = Vec::new();
    for dir in [
        "crates/conformance/src",
        "crates/conformance/benches",
        "crates/conformance/tests",
    ] {
        rust_sources(&workspace().join(dir), &mut files);
    }
    let mut missing = Vec::new();
    // This file names the markers itself.
    for (path, text) in files.iter().filter(|(p, _)| !p.ends_with("glue_names.rs")) {
        for marker in [".reference(", ".reference_tensor("] {
            for name in first_literal_args(text, marker) {
                if !glue.contains(name) {
                    missing.push(format!("{}: `{name}`", path.display()));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "glue functions called from Rust but not defined: {missing:#?}"
    );
}

#[test]
fn every_public_glue_function_is_used() {
    let source = glue_source();
    let mut rust = String::new();
    let mut files = Vec::new();
    for dir in ["crates/conformance", "crates/oracle"] {
        rust_sources(&workspace().join(dir), &mut files);
    }
    for (_, text) in files {
        rust.push_str(&text);
    }
    let unused: Vec<String> = glue_functions(&source)
        .into_iter()
        .filter(|name| {
            let quoted = format!("\"{name}\"");
            let called_in_glue = source.matches(&format!("{name}(")).count() > 1;
            !rust.contains(&quoted) && !called_in_glue
        })
        .collect();
    assert!(
        unused.is_empty(),
        "public glue functions nothing uses: {unused:?}"
    );
}
