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
//!   a case needs goes through `conformance_core::hooks`;
//! - inside each crate no file imports another in a circle (the modules
//!   `crate::` and `super::` paths name in code outside `#[cfg(test)]`;
//!   names of the crate root do not count), so every folder reads one way.

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

/// The module a source file is, as `crate::` paths name it (`a::b` for
/// `src/a/b.rs` and `src/a/b/mod.rs`; "" for `lib.rs` and `main.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts.join("::")
}

/// `text` without comments (after [`without_strings`], so a `//` in a
/// string is gone already): what the compiler resolves paths in.
fn code_only(text: &str) -> String {
    let text = without_strings(text);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The paths a `crate::` or `super::` occurrence names: `a::b` of
/// `crate::a::b::C`, and each item of a brace group (`crate::a::{b, c::D}`
/// names `a::b`, `a::c::D` and `a`).
fn named_paths(after: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let head: String = after.chars().take_while(|&c| ident(c)).collect();
    let mut paths = vec![head.trim_end_matches(':').to_owned()];
    if let Some(group) = after[head.len()..].strip_prefix('{') {
        let (mut depth, mut item) = (1, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 || (c == ',' && depth == 1) {
                let name: String = item.trim().chars().take_while(|&c| ident(c)).collect();
                if !name.is_empty() && name != "self" {
                    paths.push(format!("{}{name}", head));
                }
                item.clear();
                if depth == 0 {
                    break;
                }
                continue;
            }
            item.push(c);
        }
    }
    paths
}

/// Each module's imports of other modules of its crate: the longest
/// module prefix of every path a `crate::…` or `super::…` occurrence
/// names (`super` alone: the parent), in code before the first
/// `#[cfg(test)]` (comments and strings do not count). The crate root is
/// never a target (its own items are the crate's face).
fn module_imports(files: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let modules: std::collections::BTreeSet<&str> = files
        .iter()
        .map(|(m, _)| m.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    files
        .iter()
        .map(|(module, text)| {
            let code = code_only(text.split("#[cfg(test)]").next().unwrap_or(""));
            let parent = module
                .rsplit_once("::")
                .map_or(String::new(), |(p, _)| p.to_owned());
            let mut targets = std::collections::BTreeSet::new();
            for (prefix, base) in [("crate::", ""), ("super::", parent.as_str())] {
                for (at, _) in code.match_indices(prefix) {
                    if code[..at].chars().last().is_some_and(ident) {
                        continue;
                    }
                    for named in named_paths(&code[at + prefix.len()..]) {
                        let path: Vec<&str> = named.split("::").filter(|p| !p.is_empty()).collect();
                        let found = (1..=path.len()).rev().find_map(|k| {
                            let tail = path[..k].join("::");
                            let m = if base.is_empty() {
                                tail
                            } else {
                                format!("{base}::{tail}")
                            };
                            modules.contains(m.as_str()).then_some(m)
                        });
                        let found = found.or_else(|| {
                            (prefix == "super::" && !base.is_empty()).then(|| base.to_owned())
                        });
                        if let Some(m) = found.filter(|m| m != module) {
                            targets.insert(m);
                        }
                    }
                }
            }
            (module.clone(), targets.into_iter().collect())
        })
        .collect()
}

/// The modules that import each other in a loop: every strongly connected
/// set of more than one, with its edges.
fn circles(graph: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    let index: std::collections::BTreeMap<&str, usize> = graph
        .iter()
        .enumerate()
        .map(|(i, (m, _))| (m.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = graph
        .iter()
        .map(|(_, ts)| {
            ts.iter()
                .filter_map(|t| index.get(t.as_str()).copied())
                .collect()
        })
        .collect();
    let reach = |from: usize| {
        let mut seen = vec![false; graph.len()];
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            for &w in &edges[v] {
                if !seen[w] {
                    seen[w] = true;
                    stack.push(w);
                }
            }
        }
        seen
    };
    let reached: Vec<Vec<bool>> = (0..graph.len()).map(reach).collect();
    let mut done = vec![false; graph.len()];
    let mut out = Vec::new();
    for v in 0..graph.len() {
        if done[v] || !reached[v][v] {
            continue;
        }
        let members: Vec<usize> = (0..graph.len())
            .filter(|&w| reached[v][w] && reached[w][v])
            .collect();
        for &w in &members {
            done[w] = true;
        }
        out.push(
            members
                .iter()
                .flat_map(|&a| {
                    edges[a]
                        .iter()
                        .filter(|b| members.contains(b))
                        .map(move |&b| format!("{} -> {}", graph[a].0, graph[b].0))
                })
                .collect(),
        );
    }
    out
}

#[test]
fn no_file_imports_another_in_a_circle() {
    let mut found = Vec::new();
    for krate in [
        "conformance",
        "conformance-cases",
        "conformance-core",
        "exact",
        "layers",
    ] {
        let src = workspace().join("crates").join(krate).join("src");
        let mut sources = Vec::new();
        rust_sources(&src, &mut sources);
        // Binaries are crates of their own.
        let files: Vec<(String, String)> = sources
            .into_iter()
            .filter(|(p, _)| !p.strip_prefix(&src).unwrap().starts_with("bin"))
            .map(|(p, t)| (module_of(&src, &p), t))
            .collect();
        assert!(files.len() > 5, "{krate}: sources not read");
        for c in circles(&module_imports(&files)) {
            found.push(format!("{krate}: {}", c.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other in a circle (ARCHITECTURE.md: move what both need below them):\n{}",
        found.join("\n")
    );
}

/// The circle check can fail: a child naming its parent's item while the
/// parent names the child, and two siblings naming each other, are found;
/// a parent naming its children alone is no circle.
#[test]
fn the_circle_check_sees_a_planted_circle() {
    let files = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .collect()
    };
    let planted = files(&[
        ("a", "use crate::a::b::X; // parent names its child"),
        ("a::b", "use super::Y; // and the child its parent"),
        ("c", "fn f() { crate::d::g() }"),
        ("d", "use crate::{c::f, e};"),
        ("e", "use crate::a::b::X;"),
    ]);
    let found = circles(&module_imports(&planted));
    assert_eq!(found.len(), 2, "{found:?}");
    let clean = files(&[
        ("a", "use crate::a::b::X;"),
        // Back edges only in a comment, a test module and a string.
        (
            "a::b",
            "fn g() {} // crate::a::X\n#[cfg(test)] mod tests { use super::*; }",
        ),
        ("c", "let s = \"crate::d\"; use crate::Root;"),
        ("d", "/// [`crate::c`]\nuse crate::c::F;"),
    ]);
    assert!(circles(&module_imports(&clean)).is_empty());
}
