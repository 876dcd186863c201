//! Guards that fail loudly when the process is not what the suite assumes.
//!
//! Bit-exactness is only meaningful when the port and the reference run on
//! the same MLX binary: two libmlx copies, or a Python MLX of another
//! version, would make a difference come from two builds instead of the port.

use std::collections::BTreeSet;

/// A broken process invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("{} libmlx images are mapped in this process ({}); exactly one must be, or Rust and Python run different MLX builds. Fix: rebuild after `cargo xtask setup` so mlx-sys links the wheel's libmlx", .0.len(), .0.iter().cloned().collect::<Vec<_>>().join(", "))]
    LibmlxCount(BTreeSet<String>),
    #[error("Python imported mlx {python} but the Rust side was linked against MLX {linked}. Fix: `cargo xtask setup --force`, then rebuild")]
    VersionMismatch { python: String, linked: String },
    #[error("cannot list the images mapped in this process: {0}")]
    Unreadable(String),
}

/// Distinct files named `libmlx.*` mapped in this process.
pub fn mapped_libmlx() -> Result<BTreeSet<String>, GuardError> {
    Ok(mapped_images()?
        .into_iter()
        .filter(|path| {
            let file = path.rsplit('/').next().unwrap_or(path);
            file.starts_with("libmlx.") || file == "libmlx"
        })
        .collect())
}

/// Errors unless exactly one libmlx is mapped.
pub fn check_single_libmlx() -> Result<String, GuardError> {
    let set = mapped_libmlx()?;
    if set.len() == 1 {
        Ok(set.into_iter().next().expect("one element"))
    } else {
        Err(GuardError::LibmlxCount(set))
    }
}

/// Errors unless Python's `mlx.core.__version__` equals the linked MLX version.
pub fn check_versions(python: &str) -> Result<(), GuardError> {
    let linked = mlx_sys::LINKED_MLX_VERSION;
    if python == linked {
        Ok(())
    } else {
        Err(GuardError::VersionMismatch {
            python: python.into(),
            linked: linked.into(),
        })
    }
}

#[cfg(target_os = "linux")]
fn mapped_images() -> Result<Vec<String>, GuardError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| GuardError::Unreadable(format!("/proc/self/maps: {e}")))?;
    Ok(maps
        .lines()
        .filter_map(maps_path)
        .filter(|p| p.starts_with('/'))
        .map(|p| std::fs::canonicalize(p).map_or(p.to_owned(), |c| c.display().to_string()))
        .collect())
}

/// The pathname of one `/proc/<pid>/maps` line: what follows its five
/// fixed fields (address, perms, offset, dev, inode) and their padding,
/// taken whole, so a path with spaces (a checkout in `~/My Projects`) is
/// one path, not its first word.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn maps_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start_matches(' ');
        rest = &rest[rest.find(' ')?..];
    }
    let path = rest.trim_start_matches(' ');
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod maps_tests {
    /// Issue 40, class 16: a path with a space failed every run with
    /// "0 libmlx images are mapped": the line was split on whitespace.
    #[test]
    fn a_path_with_spaces_is_read_whole() {
        let line = "7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 1234567                    /home/a user/my proj/.reference/venv/lib/python3.11/site-packages/mlx/lib/libmlx.so";
        assert_eq!(
            super::maps_path(line),
            Some("/home/a user/my proj/.reference/venv/lib/python3.11/site-packages/mlx/lib/libmlx.so")
        );
        assert_eq!(super::maps_path("7f-7f rw-p 00000000 00:00 0 "), None);
        assert_eq!(super::maps_path("7f-7f rw-p 00000000 00:00 0"), None);
        assert_eq!(
            super::maps_path("7f-7f rw-p 00000000 00:00 0    [heap]"),
            Some("[heap]")
        );
    }
}

#[cfg(target_vendor = "apple")]
fn mapped_images() -> Result<Vec<String>, GuardError> {
    extern "C" {
        fn _dyld_image_count() -> u32;
        fn _dyld_get_image_name(index: u32) -> *const std::ffi::c_char;
    }
    // SAFETY: dyld's image list API; names are NUL-terminated C strings
    // owned by dyld.
    unsafe {
        Ok((0.._dyld_image_count())
            .filter_map(|i| {
                let p = _dyld_get_image_name(i);
                (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
            })
            .map(|p| std::fs::canonicalize(&p).map_or(p, |c| c.display().to_string()))
            .collect())
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn mapped_images() -> Result<Vec<String>, GuardError> {
    Err(GuardError::Unreadable(
        "no image list on this platform".into(),
    ))
}
