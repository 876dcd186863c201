//! The registry, as a value: which cases a run registers. It sits above
//! the families, the kept cases and the explorer, and composes them.

use crate::case::{Case, CaseError};
use crate::families::{self, describe::Described};

/// Which cases a run registers, as a value: the fixed cases, the kept
/// ones and optionally explorer samples, or the descriptions of a
/// `--cases FILE` alone. Built once from the command line; the runner and
/// its workers build the same one (see [`Registry::worker_cases_file`]).
#[derive(Debug, Default)]
pub struct Registry {
    /// `--cases FILE`: its path and descriptions.
    cases_file: Option<(std::path::PathBuf, Vec<Described>)>,
    /// `--explore-samples N --explore-seed S`.
    explore_samples: Option<(usize, u64)>,
    /// The runner's own copy of the descriptions it read, for its workers:
    /// a file in a private temporary directory (removed with the registry).
    worker_copy: std::sync::OnceLock<Result<(tempfile::TempDir, std::path::PathBuf), String>>,
}

impl Registry {
    /// The fixed and kept cases.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also registers the first `n` explorer samples of `seed` as
    /// must-equal cases `explore/<case>/s<seed>` after every other case
    /// (the release gate's run of explorer samples).
    pub fn with_explore_samples(mut self, n: usize, seed: u64) -> Self {
        self.explore_samples = Some((n, seed));
        self
    }

    /// Registers the descriptions of `path` alone (`--cases FILE`),
    /// instead of the fixed cases; the error names the file and what is
    /// wrong.
    pub fn with_cases_file(mut self, path: &std::path::Path) -> Result<Self, String> {
        let described = crate::families::describe::read_file(path)?;
        self.cases_file = Some((path.to_owned(), described));
        Ok(self)
    }

    /// Whether the cases come from a `--cases` file.
    pub fn has_cases_file(&self) -> bool {
        self.cases_file.is_some()
    }

    /// The `(n, seed)` of [`Registry::with_explore_samples`].
    pub fn explore_samples(&self) -> Option<(usize, u64)> {
        self.explore_samples
    }

    /// The file workers read the registered descriptions from: a private
    /// copy of what this runner read (written once into a new directory of
    /// an unpredictable name, mode 0700, so no planted link or file is
    /// written through; removed when the registry is dropped), so a file
    /// edited, replaced or deleted during the run (or a pipe) changes
    /// nothing.
    ///
    /// `prefix` starts the directory's name (the caller's, naming its
    /// owner, so that one left by a runner killed with SIGKILL is found).
    pub fn worker_cases_file(&self, prefix: &str) -> Option<Result<&std::path::Path, String>> {
        let (_, described) = self.cases_file.as_ref()?;
        let copy = self.worker_copy.get_or_init(|| {
            let dir = tempfile::Builder::new()
                .prefix(prefix)
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir()
                .map_err(|e| {
                    format!("a private temporary directory for the workers' --cases copy: {e}")
                })?;
            let path = dir.path().join("cases.jsonl");
            let text: String = described
                .iter()
                .map(|d| serde_json::to_string(d).map(|l| l + "\n"))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((dir, path))
        });
        Some(
            copy.as_ref()
                .map(|(_, p)| p.as_path())
                .map_err(Clone::clone),
        )
    }

    /// Every registered case's description, in report order: the fixed
    /// cases, the kept ones and the registered explorer samples (what
    /// `conformance --describe` prints). A kept file that cannot be read or
    /// samples that cannot be drawn have no description: [`Registry::cases`]
    /// reports them as failing cases.
    pub fn descriptions(&self) -> Vec<Described> {
        if let Some((_, described)) = &self.cases_file {
            return described.clone();
        }
        let mut cases = families::fixed_descriptions();
        if let Ok(kept) = crate::explore::read_kept(&crate::home::Home::get().fixtures_dir()) {
            cases.extend(kept.iter().map(|k| k.description.described("kept")));
        }
        if let Some((n, seed)) = self.explore_samples {
            if let Ok(samples) = crate::explore::samples(seed, n) {
                cases.extend(samples.iter().map(|d| d.described("explore")));
            }
        }
        cases
    }

    /// Every registered case, in report order: each built from its
    /// description alone.
    pub fn cases(&self) -> Vec<Case> {
        if let Some((_, described)) = &self.cases_file {
            return described.iter().map(families::build_or_failing).collect();
        }
        let mut cases: Vec<Case> = families::fixed_descriptions()
            .iter()
            .map(families::build_or_failing)
            .collect();
        cases.extend(kept_cases());
        if let Some((n, seed)) = self.explore_samples {
            match crate::explore::samples(seed, n) {
                Ok(samples) => cases.extend(samples.iter().map(|d| d.case("explore"))),
                // A strategy that cannot draw is one failing case, never a silent skip.
                Err(e) => cases.push(Case::must_equal(
                    "explore/undrawable",
                    "explore",
                    "the explorer's strategies",
                    move |_| Err(crate::case::CaseError::Harness(e.clone())),
                )),
            }
        }
        cases
    }
}

/// The fixed and kept cases' descriptions ([`Registry::descriptions`] of
/// a plain run).
pub fn descriptions() -> Vec<Described> {
    Registry::new().descriptions()
}

/// The fixed and kept cases ([`Registry::cases`] of a plain run).
pub fn all() -> Vec<Case> {
    Registry::new().cases()
}

/// `kept/…`: the explorer's shrunk violations, kept as ordinary must-equal
/// cases (`fixtures/explore/kept.json`, written by `cargo xtask explore
/// --keep`), each with the seed of its description. Snapshots pin them
/// like any case, so a regression stays in the suite.
fn kept_cases() -> Vec<Case> {
    const KEPT: &str = "kept";
    let fixtures = crate::home::Home::get().fixtures_dir();
    match crate::explore::read_kept(&fixtures) {
        Ok(kept) => kept.iter().map(|k| k.description.case(KEPT)).collect(),
        // An unreadable file is one failing case naming it, never a silent skip.
        Err(e) => vec![Case::must_equal(
            "kept/unreadable",
            KEPT,
            "fixtures/explore/kept.json",
            move |_| Err(CaseError::Harness(e.clone())),
        )],
    }
}

#[cfg(test)]
mod worker_copy {
    /// Issue 40, class 5: the copy went to the predictable
    /// `$TMPDIR/conformance-cases-<pid>.jsonl`, written through a planted
    /// link. Now it is a new private directory's file, removed with the
    /// registry, and a link planted at the old name is never written through.
    #[test]
    fn the_workers_copy_is_private_and_removed() {
        let scratch = tempfile::tempdir().unwrap();
        let first = super::Registry::new().descriptions().remove(0);
        let cases = scratch.path().join("cases.jsonl");
        std::fs::write(&cases, serde_json::to_string(&first).unwrap() + "\n").unwrap();
        let victim = scratch.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        let planted =
            std::env::temp_dir().join(format!("conformance-cases-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&planted);
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let registry = super::Registry::new().with_cases_file(&cases).unwrap();
        let copy = registry
            .worker_cases_file("conformance-cases-")
            .unwrap()
            .unwrap()
            .to_path_buf();
        let _ = std::fs::remove_file(&planted);
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "mine",
            "nothing written through the link"
        );
        assert_ne!(copy, planted);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(copy.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "a private directory");
        assert!(std::fs::read_to_string(&copy)
            .unwrap()
            .contains(&first.name));
        drop(registry);
        assert!(
            !copy.exists() && !copy.parent().unwrap().exists(),
            "removed with the registry"
        );
    }
}
