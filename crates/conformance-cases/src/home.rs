//! Where the runner's files are: the snapshot fixtures, the reference
//! environment's fingerprint, the lock it was built from, and the default
//! reports directory.
//!
//! Two layouts, chosen once per process:
//!
//! - **Workspace** (`cargo xtask conformance`, `cargo run -p conformance`,
//!   the test binaries): everything is found from the workspace this binary
//!   was compiled in: `<root>/fixtures`, `<env dir>/fingerprint.json` (the
//!   environment whose libmlx this binary links: `.reference`, or e.g.
//!   `.reference-cuda` for a build pointed at it with `MLX_REFERENCE_DIR`),
//!   the lock of that environment, and reports in `<root>/target/conformance`.
//! - **Bundle** (`cargo xtask bundle`; its launcher sets
//!   [`HOME_ENV`] to the bundle directory): `<home>/fixtures`,
//!   `<home>/fingerprint.json`, `<home>/requirements.lock`, and reports in
//!   `./target/conformance` under the *current directory*, because a bundle
//!   may be carried read-only (`--out` overrides, as everywhere).
//!   `--fixtures accept` writes into `<home>/fixtures/snapshots/<set>/`, to
//!   be copied back into a checkout by a maintainer.
//!
//! The embedded interpreter (crate `oracle`) reads the same variable to take
//! its standard library and the reference packages from the bundle.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Set by the bundle launcher to the bundle directory.
pub const HOME_ENV: &str = "MLX_CONFORMANCE_HOME";

/// Testing hook: a directory that replaces `fixtures/` (snapshot sets,
/// configs, checkpoints), so tests can accept snapshots and register
/// unusual config names in a scratch copy instead of the checkout.
pub const FIXTURES_ENV: &str = "MLX_CONFORMANCE_FIXTURES";

/// The resolved layout; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    /// The workspace root, or the bundle directory.
    pub root: PathBuf,
    /// Whether [`HOME_ENV`] selected a bundle.
    pub bundle: bool,
    /// Workspace only: the reference environment directory (absolute).
    env_dir: PathBuf,
    /// Where relative report paths are anchored (bundle: the current dir).
    cwd: PathBuf,
}

impl Home {
    /// The layout of this process (resolved on first use).
    pub fn get() -> &'static Home {
        static HOME: OnceLock<Home> = OnceLock::new();
        HOME.get_or_init(|| {
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            match std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
                Some(dir) => Home::bundle(absolute(&cwd, Path::new(&dir)), cwd),
                None => Home::workspace(compiled_workspace_root()),
            }
        })
    }

    /// The bundle layout rooted at `dir`; reports go under `cwd`.
    pub fn bundle(dir: PathBuf, cwd: PathBuf) -> Home {
        Home {
            env_dir: dir.clone(),
            root: dir,
            bundle: true,
            cwd,
        }
    }

    /// The workspace layout rooted at `root`, with the environment directory
    /// this binary was built against.
    pub fn workspace(root: PathBuf) -> Home {
        let env_dir = absolute(&root, &compiled_env_dir());
        Home {
            cwd: root.clone(),
            root,
            bundle: false,
            env_dir,
        }
    }

    /// `fixtures/` (holds `snapshots/<set>/` and `checkpoints/`).
    pub fn fixtures_dir(&self) -> PathBuf {
        match std::env::var_os(FIXTURES_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => absolute(&self.cwd, Path::new(&dir)),
            None => self.root.join("fixtures"),
        }
    }

    /// The reference environment's `fingerprint.json`.
    pub fn fingerprint(&self) -> PathBuf {
        self.env_dir.join("fingerprint.json")
    }

    /// The lock the reference environment was installed from. In a
    /// workspace: `reference/requirements.lock` for the default environment,
    /// `reference/<backend>/requirements.lock` for `.reference-<backend>`.
    pub fn lock(&self) -> PathBuf {
        if self.bundle {
            return self.root.join("requirements.lock");
        }
        let name = self
            .env_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match name.strip_prefix(".reference-") {
            Some(backend) if !backend.is_empty() => self
                .root
                .join("reference")
                .join(backend)
                .join("requirements.lock"),
            _ => self.root.join("reference/requirements.lock"),
        }
    }

    /// The lock's path as messages name it (relative to the root).
    pub fn lock_display(&self) -> String {
        let lock = self.lock();
        lock.strip_prefix(&self.root)
            .unwrap_or(&lock)
            .display()
            .to_string()
    }

    /// Where reports go without `--out`: `<root>/target/conformance` in a
    /// workspace, `./target/conformance` (current directory) for a bundle.
    pub fn default_reports_dir(&self) -> PathBuf {
        if self.bundle {
            self.cwd.join("target/conformance")
        } else {
            self.root.join("target/conformance")
        }
    }

    /// The command that fixes a missing or drifted environment, for messages.
    pub fn setup_fix(&self) -> String {
        if self.bundle {
            format!(
                "the bundle at {} is incomplete; rebuild it with `cargo xtask bundle`",
                self.root.display()
            )
        } else {
            "run `cargo xtask setup`".to_owned()
        }
    }
}

/// The workspace this binary was compiled in.
fn compiled_workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The reference environment directory this binary was built against:
/// mlx-sys's `MLX_SYS_REFERENCE_DIR` when the build exported it, else the
/// environment holding the libmlx this binary links
/// (`<env dir>/venv/lib/python3.X/site-packages/mlx/lib/libmlx.*`), else
/// `.reference`. Relative to the workspace root unless absolute.
fn compiled_env_dir() -> PathBuf {
    if let Some(dir) = option_env!("MLX_SYS_REFERENCE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    Path::new(mlx_sys::LINKED_LIBMLX)
        .ancestors()
        .nth(7)
        .filter(|dir| dir.join("fingerprint.json").is_file())
        .map_or_else(|| PathBuf::from(".reference"), Path::to_path_buf)
}

fn absolute(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_paths_are_under_home_and_reports_under_cwd() {
        let home = Home::bundle("/b".into(), "/work/here".into());
        assert_eq!(home.fixtures_dir(), Path::new("/b/fixtures"));
        assert_eq!(home.fingerprint(), Path::new("/b/fingerprint.json"));
        assert_eq!(home.lock(), Path::new("/b/requirements.lock"));
        assert_eq!(
            home.default_reports_dir(),
            Path::new("/work/here/target/conformance")
        );
    }

    #[test]
    fn workspace_paths_follow_the_env_dir() {
        let mut home = Home::workspace("/w".into());
        home.env_dir = "/w/.reference".into();
        assert_eq!(
            home.fingerprint(),
            Path::new("/w/.reference/fingerprint.json")
        );
        assert_eq!(home.lock(), Path::new("/w/reference/requirements.lock"));
        assert_eq!(
            home.default_reports_dir(),
            Path::new("/w/target/conformance")
        );
        home.env_dir = "/w/.reference-cuda".into();
        assert_eq!(
            home.fingerprint(),
            Path::new("/w/.reference-cuda/fingerprint.json")
        );
        assert_eq!(
            home.lock(),
            Path::new("/w/reference/cuda/requirements.lock")
        );
        assert_eq!(home.lock_display(), "reference/cuda/requirements.lock");
    }
}
