//! Directories the tool writes and later clears (`--export DIR`, the
//! explorer's `--out`): each carries an ownership marker the tool wrote,
//! and the tool clears only a directory that holds its own marker, of the
//! same kind. A directory that is missing or empty is claimed (the marker
//! written); anything else is refused in one line naming what was found,
//! and nothing in it is touched.
//!
//! A claimed directory is also locked (an advisory `flock` on the
//! directory itself, so no lock file is left behind) for as long as the
//! [`Claim`] lives: a second writer of the same directory is refused
//! rather than deleting the first one's files under it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The marker's file name inside a claimed directory.
pub const MARKER: &str = ".mlx-conformance-owned";

/// What a claimed directory holds (written into the marker, checked on
/// reuse: an export directory is never cleared as an explorer's output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Export,
    Explore,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Export => "export",
            Kind::Explore => "explore",
        }
    }
    fn marker_text(self) -> String {
        format!(
            "{{\"tool\": \"mlx-conformance\", \"kind\": \"{}\"}}\n",
            self.as_str()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutDirError {
    #[error("{dir} holds {found} but no {MARKER}: it is not a directory this tool made for {kind}, so nothing in it was removed. Fix: give a new or empty directory (or remove this one yourself)", kind = kind.as_str())]
    NotOurs {
        dir: PathBuf,
        kind: Kind,
        found: String,
    },
    #[error("{dir}/{MARKER} says this directory was made for {found}, not {kind}; nothing in it was removed. Fix: give a new or empty directory", kind = kind.as_str())]
    OtherKind {
        dir: PathBuf,
        kind: Kind,
        found: String,
    },
    #[error("{path} is a {found}, not a directory. Fix: give a directory path")]
    NotADir { path: PathBuf, found: &'static str },
    #[error("{dir} is being written by another run right now (its lock is held); nothing was removed. Fix: wait for that run to end, or give another directory")]
    Busy { dir: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutDirError + '_ {
    move |source| OutDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A claimed, locked directory; the lock is released when dropped.
#[derive(Debug)]
pub struct Claim {
    dir: PathBuf,
    _lock: File,
}

impl Claim {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Up to three entry names of a directory, and how many more.
fn some_entries(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let n = names.len();
    let shown: Vec<String> = names.iter().take(3).map(|s| format!("`{s}`")).collect();
    let more = if n > 3 {
        format!(" and {} more", n - 3)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

/// Locks the directory itself (no file is created); refuses when another
/// process holds it.
pub fn lock_dir(dir: &Path) -> Result<File, OutDirError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io(dir))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(OutDirError::Busy { dir: dir.into() }),
        Err(std::fs::TryLockError::Error(e)) => Err(io(dir)(e)),
    }
}

/// Claims `dir` for `kind` (see the module's text): creates it when
/// missing, marks an empty one, accepts one holding its own marker of the
/// same kind, refuses anything else; then locks it.
pub fn claim(dir: &Path, kind: Kind) -> Result<Claim, OutDirError> {
    let resolved;
    let mut dir = dir;
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        Err(e) => return Err(io(dir)(e)),
        // A link to a directory is followed here (the user named it); what
        // is cleared is then judged by the marker inside, as any directory.
        Ok(m) if m.file_type().is_symlink() => {
            if !dir.is_dir() {
                return Err(OutDirError::NotADir {
                    path: dir.into(),
                    found: "symbolic link to no directory",
                });
            }
            resolved = dir.canonicalize().map_err(io(dir))?;
            dir = &resolved;
        }
        Ok(m) if !m.is_dir() => {
            return Err(OutDirError::NotADir {
                path: dir.into(),
                found: if m.is_file() {
                    "regular file"
                } else {
                    "special file"
                },
            })
        }
        Ok(_) => {}
    }
    let lock = lock_dir(dir)?;
    let marker = dir.join(MARKER);
    match conformance_cases::store::read_limited(
        &marker,
        4096,
        conformance_cases::store::Role::Marker,
    ) {
        Ok(Some(bytes)) => {
            let text = String::from_utf8_lossy(&bytes);
            let found: Option<String> = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .filter(|v| v["tool"] == "mlx-conformance")
                .and_then(|v| v["kind"].as_str().map(str::to_owned));
            match found {
                Some(k) if k == kind.as_str() => {}
                Some(k) => {
                    return Err(OutDirError::OtherKind {
                        dir: dir.into(),
                        kind,
                        found: k,
                    })
                }
                None => {
                    return Err(OutDirError::NotOurs {
                        dir: dir.into(),
                        kind,
                        found: format!("a {MARKER} this tool did not write"),
                    })
                }
            }
        }
        Ok(None) => {
            let empty = std::fs::read_dir(dir).map_err(io(dir))?.next().is_none();
            if !empty {
                return Err(OutDirError::NotOurs {
                    dir: dir.into(),
                    kind,
                    found: some_entries(dir),
                });
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&marker)
                .map_err(io(&marker))?;
            f.write_all(kind.marker_text().as_bytes())
                .map_err(io(&marker))?;
        }
        Err(_) => {
            return Err(OutDirError::NotOurs {
                dir: dir.into(),
                kind,
                found: format!("a {MARKER} that is not a small regular file"),
            })
        }
    }
    Ok(Claim {
        dir: dir.to_path_buf(),
        _lock: lock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_directory_of_the_same_kind_is_claimed_and_one_writer_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        // Missing: made and marked.
        let fresh = root.path().join("a/b");
        drop(claim(&fresh, Kind::Export).unwrap());
        assert!(fresh.join(MARKER).is_file());
        // Marked: claimed again.
        let held = claim(&fresh, Kind::Export).unwrap();
        // A second writer while the first holds it: refused.
        let busy = claim(&fresh, Kind::Export).unwrap_err();
        assert!(matches!(busy, OutDirError::Busy { .. }), "{busy}");
        drop(held);
        // Another kind's directory: refused.
        let other = claim(&fresh, Kind::Explore).unwrap_err();
        assert!(matches!(other, OutDirError::OtherKind { .. }), "{other}");
        // A user's directory (bin/conformance, a manifest): refused, named.
        let user = root.path().join("user");
        std::fs::create_dir_all(user.join("bin")).unwrap();
        std::fs::write(user.join("manifest.json"), "{}").unwrap();
        let e = claim(&user, Kind::Export).unwrap_err().to_string();
        assert!(e.contains("`bin`") && e.contains("`manifest.json`"), "{e}");
        assert!(!user.join(MARKER).exists());
        // A forged marker: refused.
        let forged = root.path().join("forged");
        std::fs::create_dir_all(&forged).unwrap();
        std::fs::write(forged.join(MARKER), "x").unwrap();
        assert!(claim(&forged, Kind::Export).is_err());
        // A link to a directory the user named: its target is claimed
        // (and judged by its marker, as any directory).
        let target = root.path().join("target");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(claim(&link, Kind::Export).is_err(), "a link to nothing");
        std::fs::create_dir(&target).unwrap();
        drop(claim(&link, Kind::Export).unwrap());
        assert!(target.join(MARKER).is_file());
        // A file: refused.
        std::fs::write(root.path().join("f"), "").unwrap();
        assert!(matches!(
            claim(&root.path().join("f"), Kind::Export).unwrap_err(),
            OutDirError::NotADir { .. }
        ));
    }
}
