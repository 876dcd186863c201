//! The crate map's invariants (ARCHITECTURE.md), checked on the sources,
//! in the manner of rust-analyzer's `xtask/src/tidy.rs`:
//!
//! - the order is one-way: `conformance-core` depends on neither
//!   `conformance-cases` nor `conformance`; `conformance-cases` does not
//!   depend on `conformance` (any dependency table, dev ones included:
//!   cargo would allow a dev-dependency back);
//! - the core names no run mode, no pinned record, no driver and no list
//!   of cases, in code or comments (its user-visible messages, string
//!   literals, are exempt: they stay byte-identical);
//! - the cases call no test hook and reach no mode or tool module: a hook
//!   a case needs goes through `conformance_core::hooks`.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path, text));
        }
    }
}

/// `text` with every string and char literal's contents blanked (raw
/// strings included), line structure kept. Comments are kept.
fn without_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        // A line comment: copied as is to its end (a quote in it is no string).
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b[i] as char);
                i += 1;
            }
            continue;
        }
        // r"..." or r#"..."#
        if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&b'"') {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let mut k = j + 1;
                while k < b.len() && !b[k..].starts_with(&close) {
                    k += 1;
                }
                out.push('"');
                out.extend(text[j + 1..k.min(b.len())].chars().map(|c| {
                    if c == '\n' {
                        '\n'
                    } else {
                        ' '
                    }
                }));
                out.push('"');
                i = (k + close.len()).min(b.len());
                continue;
            }
        }
        if c == b'"' {
            let mut k = i + 1;
            while k < b.len() && b[k] != b'"' {
                if b[k] == b'\\' {
                    k += 1;
                }
                k += 1;
            }
            out.push('"');
            out.extend(
                text[i + 1..k.min(b.len())]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            out.push('"');
            i = k + 1;
            continue;
        }
        out.push(text[i..].chars().next().unwrap());
        i += text[i..].chars().next().unwrap().len_utf8();
    }
    out
}

/// Every `(file:line, word)` where a source under `dir` (strings blanked)
/// contains one of `words` (ASCII case-insensitive).
fn mentions(dir: &Path, words: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_sources(dir, &mut files);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut found = Vec::new();
    for (path, text) in &files {
        for (n, line) in without_strings(text).lines().enumerate() {
            let lower = line.to_ascii_lowercase();
            for w in words {
                if lower.contains(&w.to_ascii_lowercase()) {
                    found.push(format!(
                        "{}:{}: `{w}`: {}",
                        path.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

/// The crates named in any dependency table of a Cargo.toml.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.contains("dependencies");
            continue;
        }
        if in_deps && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                out.push(name.trim().to_owned());
            }
        }
    }
    out
}

/// What the core may not name: the modes (and their flags), the pinned
/// records, the driver and the list of cases.
const CORE_FORBIDDEN: &[&str] = &[
    "poison",
    "export",
    "candidate",
    "keep-outputs",
    "keep_outputs",
    "keepoutputs",
    "plant",
    "snapshot",
    "runner",
    "registry",
    "families",
    "conformance::",
    "conformance_cases",
];

/// What the cases may not reach: the tool's modules and test hooks.
const CASES_FORBIDDEN: &[&str] = &[
    "conformance::",
    "explore::plant",
    "plant::",
    "crate::poison",
    "crate::export",
    "crate::candidate",
    "crate::snapshots",
    "crate::runner",
    "crate::config",
    "crate::kept",
    "MLX_CONFORMANCE_PLANT",
    "MLX_CONFORMANCE_FAULT",
    "MLX_CONFORMANCE_POISON",
    "Expected::for_tests",
];

#[test]
fn the_crate_order_is_one_way() {
    let crates = workspace().join("crates");
    let core = dependencies(&crates.join("conformance-core/Cargo.toml"));
    let cases = dependencies(&crates.join("conformance-cases/Cargo.toml"));
    let tool = dependencies(&crates.join("conformance/Cargo.toml"));
    assert!(
        core.iter().any(|d| d == "oracle"),
        "core's dependencies not read: {core:?}"
    );
    for d in ["conformance", "conformance-cases"] {
        assert!(
            !core.iter().any(|c| c == d),
            "conformance-core depends on {d}"
        );
    }
    assert!(
        !cases.iter().any(|c| c == "conformance"),
        "conformance-cases depends on conformance"
    );
    assert!(cases.iter().any(|c| c == "conformance-core"));
    assert!(tool.iter().any(|c| c == "conformance-cases"));
}

#[test]
fn the_core_names_no_mode_record_driver_or_registry() {
    let found = mentions(
        &workspace().join("crates/conformance-core/src"),
        CORE_FORBIDDEN,
    );
    assert!(
        found.is_empty(),
        "the core names what it must not (ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cases_reach_no_mode_or_test_hook() {
    let found = mentions(
        &workspace().join("crates/conformance-cases/src"),
        CASES_FORBIDDEN,
    );
    assert!(
        found.is_empty(),
        "the cases reach what they must not (ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

/// The checks can fail: each forbidden word in a core-like line is found,
/// and a string literal is exempt.
#[test]
fn the_checks_see_code_and_comments_but_not_strings() {
    let dir = std::env::temp_dir().join(format!("tidy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body: String = CORE_FORBIDDEN
        .iter()
        .map(|w| format!("// {w}\nfn f() {{ let _ = \"{w}\"; let _ = r#\"{w}\"#; }}\n"))
        .collect();
    std::fs::write(dir.join("a.rs"), body).unwrap();
    let found = mentions(&dir, CORE_FORBIDDEN);
    std::fs::remove_dir_all(&dir).unwrap();
    // One comment line per word (strings blanked), some words inside others.
    for w in CORE_FORBIDDEN {
        assert!(
            found.iter().any(|f| f.contains(&format!("`{w}`"))),
            "{w} not seen: {found:?}"
        );
    }
    assert!(
        found.iter().all(|f| f.contains("// ")),
        "a string was read: {found:?}"
    );
}
