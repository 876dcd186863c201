//! `cargo xtask libmlx [FILE]`: the pinned libmlx (the reference
//! environment's file) and its sha256; with FILE, whether FILE is the same
//! build (exit 0) or not (exit 1). A candidate in any language must load
//! this file, or a difference could come from two MLX builds.

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::env::{Backend, Layout};
use crate::util;

pub fn run(root: &Path, backend: Option<Backend>, file: Option<&Path>) -> Result<i32> {
    let layout = backend.map_or_else(Layout::host_default, Layout::of);
    let fingerprint = root.join(layout.fingerprint());
    let text = std::fs::read_to_string(&fingerprint).with_context(|| {
        format!(
            "reading {} (run `{}` first)",
            fingerprint.display(),
            layout.setup_command()
        )
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", fingerprint.display()))?;
    let Some(pinned) = json["libmlx"].as_str() else {
        bail!(
            "{} names no libmlx (run `{}`)",
            fingerprint.display(),
            layout.setup_command()
        );
    };
    let ours = util::sha256_file(Path::new(pinned))?;
    println!("pinned libmlx: {pinned}\nsha256 {ours}");
    let Some(file) = file else {
        return Ok(0);
    };
    let theirs = util::sha256_file(file)?;
    println!("{}\nsha256 {theirs}", file.display());
    if same_build(&ours, &theirs) {
        println!("the same build: a candidate loading it runs the reference's MLX");
        Ok(0)
    } else {
        println!("NOT the pinned build: a candidate loading it would compare two MLX builds; load the pinned file (docs/src/guide/candidate.md#the-same-libmlx)");
        Ok(1)
    }
}

/// Two libmlx files are one build when their bytes are: the same sha256
/// (not the same name, version string or path).
fn same_build(pinned_sha256: &str, file_sha256: &str) -> bool {
    pinned_sha256 == file_sha256
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_byte_makes_another_build() {
        let dir = std::env::temp_dir().join(format!("xtask-libmlx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (
            dir.join("a/libmlx.so"),
            dir.join("b/libmlx.so"),
            dir.join("c/libmlx.so"),
        );
        for (path, bytes) in [
            (&a, &b"\x7fELF mlx"[..]),
            (&b, b"\x7fELF mlx"),
            (&c, b"\x7fELF mlY"),
        ] {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let sha = |p: &Path| util::sha256_file(p).unwrap();
        assert!(
            same_build(&sha(&a), &sha(&b)),
            "a copy elsewhere is the same build"
        );
        assert!(
            !same_build(&sha(&a), &sha(&c)),
            "one byte differs: another build"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
