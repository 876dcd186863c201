//! Case families. Each module declares its cases in one place; [`all`]
//! is the registry.

use crate::case::Case;

pub mod attention;
pub mod configs;
pub mod describe;
pub mod kept;
pub mod model;
pub mod position;
pub mod quantized;
pub mod safetensors;
pub mod smoke;
pub(crate) mod support;

/// `--explore-samples N --explore-seed S` of this process (the runner and
/// its workers register the same cases).
static EXPLORE_SAMPLES: std::sync::OnceLock<(usize, u64)> = std::sync::OnceLock::new();

/// Registers the first `n` explorer samples of `seed` as must-equal cases
/// `explore/<case>/s<seed>` after every other case (the release gate's
/// run of explorer samples). Set once, before [`all`].
pub fn register_explore_samples(n: usize, seed: u64) {
    let _ = EXPLORE_SAMPLES.set((n, seed));
}

/// How much a finder measures (`--tier`): the same finding either way,
/// from fewer or from all of its probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Tier {
    /// Finders search for their limit (probes at the kernel switch points
    /// MLX's source names, bisection, a confirmation around the limit) and
    /// fall back to every probe when one contradicts the search: the run a
    /// user waits for.
    #[default]
    Default,
    /// Finders also take every probe of their range (the full sweep): what
    /// CI, the release gate and the Apple bootstrap run.
    Deep,
}

impl Tier {
    /// The name `--tier` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Default => "default",
            Tier::Deep => "deep",
        }
    }
}

/// `--tier` of this process (the runner and its workers hold the same).
static TIER: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();

/// Sets this process's tier. Set once, before any case runs.
pub fn register_tier(tier: Tier) {
    let _ = TIER.set(tier);
}

/// The tier registered by [`register_tier`] ([`Tier::Default`] if none).
pub fn tier() -> Tier {
    TIER.get().copied().unwrap_or_default()
}

/// The `--cases FILE` of this process: its path and descriptions.
static CASES_FILE: std::sync::OnceLock<(std::path::PathBuf, Vec<describe::Described>)> =
    std::sync::OnceLock::new();

/// The runner's own copy of the descriptions it read, for its workers.
static WORKER_COPY: std::sync::OnceLock<Result<std::path::PathBuf, String>> =
    std::sync::OnceLock::new();

/// Makes the registry the descriptions of `path` alone (`--cases FILE`),
/// instead of the fixed cases. Set once, before [`all`]; the error names
/// the file and what is wrong.
pub fn register_cases_file(path: &std::path::Path) -> Result<(), String> {
    let described = describe::read_file(path)?;
    let _ = CASES_FILE.set((path.to_owned(), described));
    Ok(())
}

/// The file workers read the registered descriptions from: a private copy
/// of what this runner read (written once, removed by
/// [`remove_worker_copy`]), so a file edited, replaced or deleted during
/// the run (or a pipe) changes nothing.
pub fn cases_file() -> Option<Result<&'static std::path::Path, String>> {
    let (_, described) = CASES_FILE.get()?;
    let copy = WORKER_COPY.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("conformance-cases-{}.jsonl", std::process::id()));
        let text: String = described
            .iter()
            .map(|d| serde_json::to_string(d).map(|l| l + "\n"))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    });
    Some(copy.as_ref().map(|p| p.as_path()).map_err(Clone::clone))
}

/// Removes the workers' copy of the descriptions, if one was written.
pub fn remove_worker_copy() {
    if let Some(Ok(path)) = WORKER_COPY.get() {
        let _ = std::fs::remove_file(path);
    }
}

/// The `(n, seed)` registered by [`register_explore_samples`].
pub fn explore_samples() -> Option<(usize, u64)> {
    EXPLORE_SAMPLES.get().copied()
}

/// The fixed cases' descriptions, in report order.
pub fn fixed_descriptions() -> Vec<describe::Described> {
    let mut cases = Vec::new();
    cases.extend(smoke::descriptions());
    cases.extend(quantized::descriptions());
    cases.extend(safetensors::descriptions());
    cases.extend(position::descriptions());
    cases.extend(attention::descriptions());
    cases.extend(configs::descriptions());
    cases.extend(model::descriptions());
    cases
}

/// Every registered case's description, in report order: the fixed
/// cases, the kept ones and the registered explorer samples (what
/// `conformance --describe` prints). A kept file that cannot be read or
/// samples that cannot be drawn have no description: [`all`] reports
/// them as failing cases.
pub fn descriptions() -> Vec<describe::Described> {
    if let Some((_, described)) = CASES_FILE.get() {
        return described.clone();
    }
    let mut cases = fixed_descriptions();
    if let Ok(kept) = crate::explore::report::read_kept(&crate::home::Home::get().fixtures_dir()) {
        cases.extend(kept.iter().map(|k| k.description.described("kept")));
    }
    if let Some((n, seed)) = explore_samples() {
        if let Ok(samples) = crate::explore::samples(seed, n) {
            cases.extend(samples.iter().map(|d| d.described("explore")));
        }
    }
    cases
}

/// Every registered case, in report order: each built from its
/// description alone.
pub fn all() -> Vec<Case> {
    if let Some((_, described)) = CASES_FILE.get() {
        return described.iter().map(describe::build_or_failing).collect();
    }
    let mut cases: Vec<Case> = fixed_descriptions()
        .iter()
        .map(describe::build_or_failing)
        .collect();
    cases.extend(kept::cases());
    if let Some((n, seed)) = explore_samples() {
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

#[cfg(test)]
mod refusal_table {
    /// Every case `crates/layers/REFUSALS.md` names (its last column) is a
    /// registered case.
    #[test]
    fn every_case_the_refusal_table_names_is_registered() {
        let table = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../layers/REFUSALS.md"),
        )
        .unwrap();
        let registered: std::collections::BTreeSet<String> = super::fixed_descriptions()
            .into_iter()
            .map(|d| d.name)
            .collect();
        let mut named = 0;
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let last = row.trim_end_matches('|').rsplit('|').next().unwrap_or("");
            for case in last.split('`').skip(1).step_by(2) {
                named += 1;
                assert!(
                    registered.contains(case),
                    "REFUSALS.md names `{case}`, no such case"
                );
            }
        }
        assert!(named > 0, "REFUSALS.md names no case");
    }
}
