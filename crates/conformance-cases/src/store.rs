//! Snapshot files on disk. Nothing here follows a symbolic link, and every
//! write is atomic: a temporary file in the set directory, fsync, rename
//! over the target, fsync of the directory. A write that fails (full disk,
//! read-only mount, a directory where the file should be) or is killed
//! leaves the previous snapshot whole, and at most a hidden temporary file
//! that the next run names ([`leftovers`]) and the next accept removes.
//!
//! Why not insta's writer: it writes in place (a full disk truncates an
//! existing snapshot) and writes through links (a `.snap` linking outside
//! the checkout would overwrite its target). The files keep insta's format.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Starts the name of a temporary file of an unfinished write
/// (`.unfinished-<pid>-<n>.snap-tmp`; never ends in `.snap`, so it is
/// never read as a snapshot).
const TEMP_PREFIX: &str = ".unfinished-";
const TEMP_SUFFIX: &str = ".snap-tmp";
/// What insta's era left behind when killed between write and seal.
const OLD_SEALING_MARK: &str = ".snap.sealing-";

/// A path of the snapshot store that cannot be used, in one line naming it
/// and the fix.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path} is a symbolic link; this tool never follows one where it reads or writes (a link could carry a write outside its directory, or a read to a device). Fix: replace it with a real {what}")]
    Link { path: PathBuf, what: &'static str },
    #[error(
        "{path} is a {found}, not a {what}. Fix: move it away (this tool reads or writes a {what} at this path)"
    )]
    NotA {
        path: PathBuf,
        what: &'static str,
        found: &'static str,
    },
    #[error("{path} resolves to {resolved}, outside {root}. Fix: snapshot sets must be real directories inside the snapshots directory")]
    Outside {
        path: PathBuf,
        resolved: PathBuf,
        root: PathBuf,
    },
    #[error("{path} is {len} bytes, more than {cap} bytes this reader takes; it is not what it should be. Fix: {}", role.fix())]
    TooLarge {
        path: PathBuf,
        len: u64,
        cap: u64,
        role: Role,
    },
    #[error("{rel} names a file outside {root} (an absolute path, a `..`, or a symbolic link on the way); only files inside it are read")]
    Escapes { root: PathBuf, rel: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a file read by [`read_limited`] / [`read_confined`] is, passed by
/// the caller: a refusal's fix depends on it (a candidate's outputs file is
/// not restored from git).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A committed file of fixtures/ (a snapshot, kept.json).
    Committed,
    /// A candidate's outputs file (the candidate protocol).
    CandidateOutputs,
    /// A run's report.json (`--same-verdicts-as`, `--verify-against`, a gate).
    Report,
    /// An export's manifest or vectors (`--verify-export`, `--ops-signatures`).
    Export,
    /// A run's `--keep-outputs` file.
    KeptOutputs,
    /// An explorer report given to `--merge`.
    ExplorerReport,
    /// A marker this tool writes into a directory it owns.
    Marker,
}

impl Role {
    /// The fix for a file of this role that is too large.
    pub fn fix(self) -> &'static str {
        match self {
            Role::Committed => "restore it from git (`git checkout -- <path>`), or re-record it with `cargo xtask fixtures accept`",
            Role::CandidateOutputs => "the candidate wrote it: make it write only the arrays it answers (the protocol's cap is above), then run again",
            Role::Report => "pass the report.json a run of this tool wrote (run that run again to write a new one)",
            Role::Export => "export again (`conformance --export DIR` or `cargo xtask export`) and verify that",
            Role::KeptOutputs => "run again with `--keep-outputs` to write the outputs anew",
            Role::ExplorerReport => "pass the explore.json an explorer run wrote (run that shard again)",
            Role::Marker => "move the directory away (this tool writes its marker small) and run again",
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_file() {
        "regular file"
    } else if file_type.is_symlink() {
        "symbolic link"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "device"
    }
}

/// Whether a directory of the store is there: `Ok(false)` when nothing is
/// at `path`; an error when something that is not a real directory is.
fn real_dir(path: &Path) -> Result<bool, StoreError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path)(e)),
        Ok(m) if m.file_type().is_symlink() => Err(StoreError::Link {
            path: path.into(),
            what: "directory",
        }),
        Ok(m) if !m.is_dir() => Err(StoreError::NotA {
            path: path.into(),
            what: "directory",
            found: kind(m.file_type()),
        }),
        Ok(_) => Ok(true),
    }
}

/// Checks a set directory `dir` inside the snapshots directory `root`:
/// `Ok(false)` when it does not exist yet, `Ok(true)` when it is a real
/// directory directly inside `root`; an error for a link (at either
/// level), a file, a link loop, or a path resolving elsewhere.
pub fn check_set_dir(root: &Path, dir: &Path) -> Result<bool, StoreError> {
    // `fixtures/` itself must not be a link either (it would carry every
    // set outside the checkout).
    if let Some(fixtures) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
        real_dir(fixtures)?;
    }
    if !real_dir(root)? || !real_dir(dir)? {
        return Ok(false);
    }
    let resolved = dir.canonicalize().map_err(io(dir))?;
    let root_resolved = root.canonicalize().map_err(io(root))?;
    if resolved.parent() != Some(root_resolved.as_path()) {
        return Err(StoreError::Outside {
            path: dir.into(),
            resolved,
            root: root_resolved,
        });
    }
    Ok(true)
}

/// Opens an existing store file for reading without following a link or
/// blocking on a FIFO; `Ok(None)` when nothing is there.
fn open_regular(path: &Path) -> Result<Option<File>, StoreError> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(StoreError::Link {
                path: path.into(),
                what: "file",
            })
        }
        Err(e) => return Err(io(path)(e)),
    };
    let m = file.metadata().map_err(io(path))?;
    if !m.is_file() {
        return Err(StoreError::NotA {
            path: path.into(),
            what: "regular file",
            found: kind(m.file_type()),
        });
    }
    Ok(Some(file))
}

/// The largest snapshot file read (committed ones are a few KiB): a
/// larger file is refused before it is read into memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 16 << 20;

/// The bytes of a snapshot file; `Ok(None)` when it does not exist.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    read_limited(path, MAX_SNAPSHOT_BYTES, Role::Committed)
}

/// The bytes of a regular file of at most `cap` bytes, read as a snapshot
/// is (no link followed, no FIFO or device blocked on); `Ok(None)` when it
/// does not exist.
pub fn read_limited(path: &Path, cap: u64, role: Role) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(file) = open_regular(path)? else {
        return Ok(None);
    };
    let len = file.metadata().map_err(io(path))?.len();
    if len > cap {
        return Err(StoreError::TooLarge {
            path: path.into(),
            len,
            cap,
            role,
        });
    }
    // Never more than `cap` (the file may grow while it is read).
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() as u64 > cap {
        return Err(StoreError::TooLarge {
            path: path.into(),
            len: bytes.len() as u64,
            cap,
            role,
        });
    }
    Ok(Some(bytes))
}

/// The one safe reader of files that come from outside (exports, reports,
/// candidates' outputs, wheels): `rel` inside `root`, read as
/// [`read_limited`] reads (a regular file of at most `cap` bytes, no link
/// followed, no FIFO or device blocked on), and refused when it names
/// anything outside `root`: an absolute path, a `..` or other non-plain
/// component, or a symbolic link at any component below `root`.
/// `Ok(None)` when nothing is there.
pub fn read_confined(
    root: &Path,
    rel: &str,
    cap: u64,
    role: Role,
) -> Result<Option<Vec<u8>>, StoreError> {
    use std::path::Component;
    let escapes = || StoreError::Escapes {
        root: root.into(),
        rel: rel.into(),
    };
    let relative = Path::new(rel);
    if rel.is_empty()
        || rel.contains('\0')
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(escapes());
    }
    // Every directory on the way is a real directory, not a link.
    let mut at = root.to_path_buf();
    let parts: Vec<_> = relative.components().collect();
    for part in &parts[..parts.len() - 1] {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&at)(e)),
            Ok(m) if m.file_type().is_symlink() => return Err(escapes()),
            Ok(m) if !m.is_dir() => {
                return Err(StoreError::NotA {
                    path: at,
                    what: "directory",
                    found: kind(m.file_type()),
                })
            }
            Ok(_) => {}
        }
    }
    match read_limited(&root.join(relative), cap, role) {
        Err(StoreError::Link { .. }) => Err(escapes()),
        other => other,
    }
}

/// Writes `text` as `dir/name` atomically, creating the set directory
/// (and the snapshots directory `root`) when missing. Refuses links and
/// non-files at the target; on any error the target is unchanged and no
/// temporary file is left.
pub fn write(root: &Path, dir: &Path, name: &str, text: &str) -> Result<(), StoreError> {
    if !check_set_dir(root, dir)? {
        if !real_dir(root)? {
            std::fs::create_dir_all(root).map_err(io(root))?;
        }
        match std::fs::create_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(dir)(e)),
            _ => {}
        }
        check_set_dir(root, dir)?;
    }
    let target = dir.join(name);
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(StoreError::Link {
                path: target,
                what: "file",
            })
        }
        Ok(m) if !m.is_file() => {
            return Err(StoreError::NotA {
                path: target,
                what: "regular file",
                found: kind(m.file_type()),
            })
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&target)(e)),
        _ => {}
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let temp = dir.join(format!(
        "{TEMP_PREFIX}{}-{}{TEMP_SUFFIX}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(io(&target)(e));
    }
    if let Err(e) = std::fs::rename(&temp, &target) {
        let _ = std::fs::remove_file(&temp);
        return Err(io(&target)(e));
    }
    // The rename itself is durable once the directory is synced.
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Removes a snapshot file (a link is removed itself, never its target).
pub fn remove(path: &Path) -> Result<(), StoreError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path)(e)),
        Ok(m) if m.is_dir() => Err(StoreError::NotA {
            path: path.into(),
            what: "regular file",
            found: "directory",
        }),
        Ok(_) => std::fs::remove_file(path).map_err(io(path)),
    }
}

/// One entry of a set directory, by its (lossless) file name.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    /// The name as text when it is UTF-8 (no case's file name is not).
    pub name: Option<String>,
}

/// The entries of a set directory (empty when it does not exist).
pub fn entries(dir: &Path) -> Result<Vec<Entry>, StoreError> {
    let read = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.map_err(io(dir))?,
    };
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(io(dir))?;
        out.push(Entry {
            path: entry.path(),
            name: entry.file_name().to_str().map(str::to_owned),
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Whether an entry's name is a snapshot's (`*.snap`; a non-UTF-8 name
/// counts when its bytes end so).
pub fn is_snapshot(entry: &Entry) -> bool {
    use std::os::unix::ffi::OsStrExt;
    entry
        .path
        .file_name()
        .is_some_and(|n| n.as_bytes().ends_with(b".snap"))
}

/// Temporary files of writes that did not finish (a killed accept; an
/// older writer's `*.snap.sealing-<pid>`). Only files and links: the
/// writer never makes a directory of that name, so one is not ours.
pub fn leftovers(dir: &Path) -> Vec<PathBuf> {
    entries(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| std::fs::symlink_metadata(&e.path).is_ok_and(|m| !m.is_dir()))
        .filter(|e| {
            e.name.as_deref().is_some_and(|n| {
                (n.starts_with(TEMP_PREFIX) && n.ends_with(TEMP_SUFFIX))
                    || n.contains(OLD_SEALING_MARK)
            })
        })
        .map(|e| e.path)
        .collect()
}

#[cfg(test)]
mod confined {
    use super::*;

    /// Issue 40, class 6: the verifier read `../`, absolute paths and
    /// links, read `/dev/zero` without limit and hung on a FIFO.
    #[test]
    fn only_small_regular_files_inside_the_root_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/ok"), b"fine").unwrap();
        std::fs::write(dir.path().join("outside"), b"secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("dirlink")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", root.join("zero")).unwrap();
        let fifo = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
            root.join("fifo").as_os_str(),
        ))
        .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert_eq!(
            read_confined(&root, "sub/ok", 16, Role::Export)
                .unwrap()
                .unwrap(),
            b"fine"
        );
        assert!(read_confined(&root, "missing", 16, Role::Export)
            .unwrap()
            .is_none());
        for bad in [
            "../outside",
            "/etc/passwd",
            "sub/../../outside",
            "link",
            "dirlink/outside",
            "zero",
            "",
        ] {
            let e = read_confined(&root, bad, 1 << 20, Role::Export);
            assert!(matches!(e, Err(StoreError::Escapes { .. })), "{bad}: {e:?}");
        }
        assert!(matches!(
            read_confined(&root, "fifo", 16, Role::Export),
            Err(StoreError::NotA { found: "FIFO", .. })
        ));
        assert!(matches!(
            read_confined(&root, "sub/ok", 3, Role::Export),
            Err(StoreError::TooLarge { .. })
        ));
        assert!(matches!(
            read_limited(Path::new("/dev/zero"), 16, Role::Export),
            Err(StoreError::NotA { .. })
        ));
    }
}

#[cfg(test)]
mod confined_trees {
    use super::*;
    use proptest::prelude::*;

    /// One entry of a random tree under the root.
    #[derive(Debug, Clone)]
    enum Node {
        File,
        Dir,
        LinkOutside,
        LinkInside,
        LinkDevZero,
        Fifo,
    }

    fn node() -> impl Strategy<Value = Node> {
        prop_oneof![
            Just(Node::File),
            Just(Node::Dir),
            Just(Node::LinkOutside),
            Just(Node::LinkInside),
            Just(Node::LinkDevZero),
            Just(Node::Fifo),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Issue 40, item 13: random manifest trees (files, directories,
        /// links out, in and to /dev/zero, FIFOs) and random relative
        /// paths: the confined reader never returns bytes from outside the
        /// root, never blocks, never panics.
        #[test]
        fn nothing_outside_is_ever_read(
            entries in proptest::collection::vec((0usize..3, node()), 1..8),
            rel in proptest::collection::vec(
                prop_oneof![Just("a"), Just("b"), Just("c"), Just(".."), Just("."), Just(""), Just("/etc")],
                1..5,
            ),
        ) {
            let scratch = tempfile::tempdir().unwrap();
            let outside = scratch.path().join("outside");
            std::fs::write(&outside, b"SECRET").unwrap();
            let root = scratch.path().join("root");
            std::fs::create_dir_all(&root).unwrap();
            let names = ["a", "b", "c"];
            for (i, (at, n)) in entries.iter().enumerate() {
                // Nested one level under an existing directory sometimes.
                let parent = if i % 2 == 0 { root.clone() } else { root.join(names[*at]) };
                if !parent.is_dir() {
                    continue;
                }
                let path = parent.join(names[(at + i) % 3]);
                if std::fs::symlink_metadata(&path).is_ok() {
                    continue;
                }
                match n {
                    Node::File => std::fs::write(&path, b"inside").unwrap(),
                    Node::Dir => std::fs::create_dir(&path).unwrap(),
                    Node::LinkOutside => std::os::unix::fs::symlink(&outside, &path).unwrap(),
                    Node::LinkInside => std::os::unix::fs::symlink(&root, &path).unwrap(),
                    Node::LinkDevZero => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
                    Node::Fifo => {
                        let c = std::ffi::CString::new(
                            std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()),
                        )
                        .unwrap();
                        // SAFETY: a valid NUL-terminated path.
                        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
                    }
                }
            }
            let rel = rel.join("/");
            let started = std::time::Instant::now();
            let read = read_confined(&root, &rel, 1 << 20, Role::Export);
            prop_assert!(started.elapsed().as_secs() < 5, "blocked on {rel}");
            if let Ok(Some(bytes)) = read {
                prop_assert_eq!(&bytes[..], b"inside", "{} read other bytes", rel);
            }
        }
    }
}
