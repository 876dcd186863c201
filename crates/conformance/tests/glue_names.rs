//! The Rust–Python boundary by name: every glue function a case calls
//! exists in the glue package (`crates/oracle/python/reference_glue/`),
//! every public glue function is used (by name from Rust, or by the glue
//! itself), and every module of the package is embedded in the oracle, so
//! neither side can rot silently.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const GLUE_DIR: &str = "crates/oracle/python/reference_glue";

/// Every module of the glue package: (file name, source), by name.
fn glue_modules() -> Vec<(String, String)> {
    let mut modules: Vec<(String, String)> = std::fs::read_dir(workspace().join(GLUE_DIR))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "py"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect();
    modules.sort();
    assert!(!modules.is_empty(), "no glue modules in {GLUE_DIR}");
    modules
}

/// All glue sources, concatenated.
fn glue_source() -> String {
    glue_modules()
        .into_iter()
        .map(|(_, text)| text + "\n")
        .collect()
}

/// Top-level `def name(` without a leading underscore (in any module).
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
        "crates/conformance-core/src",
        "crates/conformance-cases/src",
        "crates/conformance/src",
        "crates/conformance/benches",
        "crates/conformance/tests",
    ] {
        rust_sources(&workspace().join(dir), &mut files);
    }
    let mut missing = Vec::new();
    let mut named = BTreeSet::new();
    // This file names the marker itself. `const F: &str = "name"` is how
    // a typed reference wrapper names the glue function it calls (the one
    // way a case reaches the glue: `Ctx::call` takes that name).
    for (path, text) in files.iter().filter(|(p, _)| !p.ends_with("glue_names.rs")) {
        for name in first_literal_args(text, "const F: &str =") {
            named.insert(name);
            if !glue.contains(name) {
                missing.push(format!("{}: `{name}`", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "glue functions called from Rust but not defined: {missing:#?}"
    );
    // Not vacuous: the marker is how cases name the glue (38 names when
    // this was written); none found means the convention moved.
    assert!(
        named.len() >= 30,
        "only {} glue names found after `const F: &str =`",
        named.len()
    );
}

#[test]
fn every_public_glue_function_is_used() {
    let source = glue_source();
    let mut rust = String::new();
    let mut files = Vec::new();
    for dir in [
        "crates/conformance-core",
        "crates/conformance-cases",
        "crates/conformance",
        "crates/oracle",
    ] {
        rust_sources(&workspace().join(dir), &mut files);
    }
    for (_, text) in files {
        rust.push_str(&text);
    }
    let functions = glue_functions(&source);
    assert!(
        functions.len() >= 40,
        "only {} public glue functions parsed",
        functions.len()
    );
    let unused: Vec<String> = functions
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

#[test]
fn every_glue_module_is_embedded() {
    let interpreter =
        std::fs::read_to_string(workspace().join("crates/oracle/src/interpreter.rs")).unwrap();
    // The names listed in `GLUE_MODULES = glue_modules![...]`.
    let list = interpreter
        .split_once("= glue_modules![")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("interpreter.rs lists the glue modules in `glue_modules![...]`")
        .0;
    let embedded: BTreeSet<String> = list
        .split(',')
        .map(|item| item.trim().trim_matches('"'))
        .filter(|name| !name.is_empty())
        .map(|name| format!("{name}.py"))
        .collect();
    let files: BTreeSet<String> = glue_modules().into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        embedded, files,
        "interpreter.rs GLUE_MODULES must embed exactly the files of {GLUE_DIR}"
    );
}
