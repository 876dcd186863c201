//! `REFUSALS.md` stays true to the code: every variant of the crate's
//! error enums has a row, and every row names a variant that exists.

use std::collections::BTreeSet;
use std::path::Path;

/// The error enums and the files that declare them.
const ENUMS: &[(&str, &str)] = &[
    ("src/config/error.rs", "ConfigError"),
    ("src/quantized/error.rs", "SpecError"),
    ("src/quantized/error.rs", "PayloadError"),
    ("src/quantized/error.rs", "LayerError"),
    ("src/quantized/adapters.rs", "AdapterError"),
    ("src/position/error.rs", "PositionError"),
    ("src/checkpoint/offload.rs", "OffloadError"),
    ("src/checkpoint/error.rs", "CheckpointError"),
    ("src/model/error.rs", "ModelError"),
];

/// `Enum::Variant` for every variant declared in `source`'s `pub enum name`
/// (lines at brace depth 1 that start with an upper-case identifier).
fn variants(source: &str, name: &str) -> Vec<String> {
    let start = source
        .find(&format!("pub enum {name} {{"))
        .unwrap_or_else(|| panic!("no `pub enum {name}`"));
    let mut depth = 0usize;
    let mut out = Vec::new();
    for line in source[start..].lines() {
        let trimmed = line.trim_start();
        if depth == 1 && !trimmed.starts_with("//") && !trimmed.starts_with('#') {
            let ident: String = trimmed
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if ident.starts_with(|c: char| c.is_ascii_uppercase()) {
                out.push(format!("{name}::{ident}"));
            }
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        if depth == 0 && !out.is_empty() {
            break;
        }
    }
    out
}

#[test]
fn every_error_variant_has_a_row_and_every_row_a_variant() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("REFUSALS.md")).unwrap();
    // The main table: before the closed gaps (variants that no longer exist).
    let main = table.split("\n## ").next().unwrap_or("");
    let rows: BTreeSet<String> = main
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .collect();
    let mut declared = BTreeSet::new();
    for (file, name) in ENUMS {
        let source = std::fs::read_to_string(root.join(file)).unwrap();
        let found = variants(&source, name);
        assert!(found.len() > 1, "{file}: {name} parsed as {found:?}");
        declared.extend(found);
    }
    let missing: Vec<_> = declared.difference(&rows).collect();
    let stale: Vec<_> = rows.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "variants with no row in REFUSALS.md: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "rows of REFUSALS.md naming no variant: {stale:?}"
    );
}
