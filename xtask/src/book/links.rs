//! Relative links and anchors of the book and of the repository's front
//! pages resolve: a link's file exists (inside the repository), and its
//! `#anchor`, in a Markdown file, names one of that file's headings (slugged
//! as mdBook and GitHub slug them). Links with a scheme (`https:`) are not
//! fetched. Links are read from the Markdown source, relative to the file
//! that holds them, so they work where the repository is browsed.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

/// Markdown files checked besides every `.md` under `docs/src/`.
pub const FRONT_PAGES: &[&str] = &[
    "README.md",
    "CHANGELOG.md",
    "fixtures/gpu-runs/README.md",
    "fixtures/gate-runs/README.md",
];

/// Every broken link of the book and the front pages, one line each
/// (`file:line: ...`); empty when all resolve.
pub fn check_repository(root: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = FRONT_PAGES.iter().map(|p| root.join(p)).collect();
    markdown_under(&root.join(super::BOOK_DIR).join("src"), &mut files)?;
    check_files(root, &files)
}

/// The broken links of these Markdown files (paths resolved inside `root`).
pub fn check_files(root: &Path, files: &[PathBuf]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let shown = crate::util::rel(root, file);
        for link in links(&text) {
            if let Err(why) = resolve(root, file, &link.target) {
                problems.push(format!("{shown}:{}: {} ({why})", link.line, link.target));
            }
        }
    }
    Ok(problems)
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            markdown_under(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

/// The link targets of a Markdown text: inline links and images
/// `[text](target "title")`, reference definitions `[x]: target`, and
/// mdBook's `{{#include path}}`; not inside fenced code or code spans.
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim_start();
        for marker in ["```", "~~~"] {
            if trimmed.starts_with(marker) {
                fence = match fence {
                    None => Some(marker),
                    Some(open) if open == marker => None,
                    other => other,
                };
            }
        }
        if fence.is_some() || trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("{{#include ") {
            if let Some(path) = rest.strip_suffix("}}") {
                // `path:anchor` or `path:1:10` select part of the file.
                let path = path.trim().split(':').next().unwrap_or_default();
                out.push(Link {
                    line: line_no,
                    target: path.to_owned(),
                });
            }
            continue;
        }
        // A reference definition: `[label]: target`.
        if trimmed.starts_with('[') {
            if let Some(end) = trimmed.find("]:") {
                if !trimmed[..end].contains('(') {
                    let target = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
                    if !target.is_empty() {
                        out.push(Link {
                            line: line_no,
                            target: target.trim_matches(['<', '>']).to_owned(),
                        });
                    }
                    continue;
                }
            }
        }
        let code_free = without_code_spans(line);
        let bytes = code_free.as_bytes();
        let mut at = 0;
        while let Some(pos) = code_free[at..].find("](") {
            let start = at + pos + 2;
            // The target ends at the matching `)` (targets may hold
            // balanced parentheses) or at a space before a title.
            let mut depth = 0;
            let mut end = start;
            while end < bytes.len() {
                match bytes[end] {
                    b'(' => depth += 1,
                    b')' if depth == 0 => break,
                    b')' => depth -= 1,
                    b' ' => break,
                    _ => {}
                }
                end += 1;
            }
            let target = code_free[start..end].trim_matches(['<', '>']);
            if !target.is_empty() {
                out.push(Link {
                    line: line_no,
                    target: target.to_owned(),
                });
            }
            at = end.max(start);
        }
    }
    out
}

/// The line with every code span blanked (a `[a](b)` inside backticks is
/// text, not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks one target of `file`: Ok, or why it does not resolve.
fn resolve(root: &Path, file: &Path, target: &str) -> std::result::Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else if path.starts_with('/') {
        return Err("absolute path: write it relative to this file".into());
    } else {
        normalize(&file.parent().unwrap_or(root).join(path))
    };
    let root = normalize(root);
    if !resolved.starts_with(&root) {
        return Err("points outside the repository".into());
    }
    if !resolved.exists() {
        return Err("no such file".into());
    }
    let Some(anchor) = anchor else { return Ok(()) };
    if resolved.extension().is_none_or(|e| e != "md") {
        return Ok(());
    }
    let text = std::fs::read_to_string(&resolved).map_err(|e| e.to_string())?;
    if heading_ids(&text).contains(anchor) {
        Ok(())
    } else {
        Err(format!("no heading with id #{anchor} there"))
    }
}

/// `a/b/../c` → `a/c` without touching the file system (a missing file is
/// reported as missing, not as a canonicalisation error).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The ids of a Markdown file's headings (ATX `#` headings outside code
/// fences), as mdBook and GitHub make them: lower case, spaces to `-`,
/// only letters, digits, `-` and `_` kept; a repeated id gets `-1`, `-2`.
pub fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence || !trimmed.starts_with('#') {
            continue;
        }
        let title = trimmed.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title.trim().trim_end_matches('#').trim());
        let mut id = base.clone();
        let mut n = 1;
        while ids.contains(&id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        ids.insert(id);
    }
    ids
}

/// A heading's id: link text kept, link targets dropped.
pub fn slug(title: &str) -> String {
    let mut text = String::new();
    let mut rest = title;
    // `[text](target)` → `text`
    while let Some(open) = rest.find('[') {
        text += &rest[..open];
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) => {
                text += &after[..close];
                let tail = &after[close + 2..];
                rest = tail.find(')').map_or("", |end| &tail[end + 1..]);
            }
            None => {
                text += "[";
                rest = after;
            }
        }
    }
    text += rest;
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        crate::workspace_root()
    }

    /// The book and the front pages as committed: every link resolves.
    #[test]
    fn the_books_links_and_anchors_resolve() {
        let problems = check_repository(&workspace()).unwrap();
        assert!(
            problems.is_empty(),
            "broken links:\n{}",
            problems.join("\n")
        );
        // Not vacuous: the book has pages and they link.
        let mut files = Vec::new();
        markdown_under(&workspace().join("docs/src"), &mut files).unwrap();
        let count: usize = files
            .iter()
            .map(|f| links(&std::fs::read_to_string(f).unwrap()).len())
            .sum();
        assert!(
            files.len() >= 20 && count >= 100,
            "{} pages, {count} links",
            files.len()
        );
    }

    /// A planted broken file link, a planted broken anchor and a link out
    /// of the repository are each caught; the good ones next to them are not.
    #[test]
    fn a_broken_link_or_anchor_is_caught() {
        let dir = std::env::temp_dir().join(format!("xtask-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.as_path();
        std::fs::create_dir_all(root.join("src/sub")).unwrap();
        std::fs::write(
            root.join("src/sub/page.md"),
            "# A page\n\n## Two words `code`\n\n## Two words `code`\n",
        )
        .unwrap();
        let index = "# Index\n\
            [ok](sub/page.md) [ok anchor](sub/page.md#two-words-code) [dup](sub/page.md#two-words-code-1)\n\
            [self](#index) [web](https://example.com/x.md)\n\
            `[not a link](nowhere.md)`\n\
            ```\n[in a fence](nowhere.md)\n```\n\
            [missing](sub/nowhere.md)\n\
            [bad anchor](sub/page.md#three-words)\n\
            [outside](../../etc/passwd)\n\
            [ref]: sub/gone.md\n";
        std::fs::write(root.join("src/index.md"), index).unwrap();
        let problems = check_files(root, &[root.join("src/index.md")]).unwrap();
        let joined = problems.join("\n");
        assert_eq!(problems.len(), 4, "{joined}");
        assert!(
            joined.contains("src/index.md:8: sub/nowhere.md (no such file)"),
            "{joined}"
        );
        assert!(
            joined.contains(":9: sub/page.md#three-words (no heading with id #three-words there)"),
            "{joined}"
        );
        assert!(
            joined.contains(":10: ../../etc/passwd (points outside the repository)"),
            "{joined}"
        );
        assert!(
            joined.contains(":11: sub/gone.md (no such file)"),
            "{joined}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn slugs_follow_mdbook() {
        assert_eq!(slug("Snapshot sets"), "snapshot-sets");
        assert_eq!(
            slug("Updating snapshots (and who may)"),
            "updating-snapshots-and-who-may"
        );
        assert_eq!(
            slug("What CUDA measured (H200, 2026-12-01)"),
            "what-cuda-measured-h200-2026-12-01"
        );
        assert_eq!(slug("`cargo xtask book`"), "cargo-xtask-book");
        assert_eq!(slug("The [ops](ops.md) list"), "the-ops-list");
    }
}
