//! The shape explorer: samples case descriptions where kernels switch,
//! checks each three ways, shrinks every violation to its smallest
//! reproducing description, and keeps it (`cargo xtask explore`).
//!
//! Checks per sample:
//! - (a) port vs reference, bit for bit (a violation when they differ);
//! - (b) both against the exact-math oracle (a violation when either side
//!   is outside its derived bound);
//! - (c) invariances, recorded as findings for the regime map, never
//!   violations: the port's batched forward against the same rows alone;
//!   for `gather_qmm`, sorted against unsorted routing and the batch
//!   against each token alone; for SDPA, the batch against each request
//!   alone, a chunk against its rows alone (M = 1) and the cache-buffer
//!   view against the contiguous one.
//!
//! Samples run many to a process, in one interpreter, as serving does.
//! Deterministic: sample `i` of seed `s` is drawn from its own generator
//! (seeded by `s` and `i`), so shards (`i % n`) and reruns draw the same.
//!
//! Families so far: `quantized/linear` (`quantized_matmul`),
//! `quantized/switch` (`gather_qmm`), `attention/sdpa` (SDPA on a KV
//! cache: batch composition, chunk vs rows alone, cache layout) and
//! `position/mrope` (Qwen3.5 interleaved mRoPE: sections, rotary dims,
//! vision grids, decode offsets; a batch against each row alone). Each family's description is the
//! serde data its fixed cases are built from (`families::describe`).

pub mod rate;
pub mod report;

// What a sample is and how it is drawn live with the cases.
pub use conformance_cases::explore::{samples, strategy, Description};

use std::time::{Duration, Instant};

use oracle::Oracle;
use proptest::strategy::ValueTree;
use serde::{Deserialize, Serialize};

use crate::case::Backend;
use crate::exactness::ExactClass;
use crate::runner::{self, RunOptions, Verdict};

/// What one sample showed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Observation {
    pub bits_equal: bool,
    /// The first differing element, as the report's comparison line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_diff: Option<String>,
    /// The exact oracle's class of the output (absent: not in its scope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<ExactClass>,
    /// Invariances of the port (c), by name: whether each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invariances: Vec<(String, bool)>,
    /// The case could not run (a harness or port error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whose error it was (with `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<crate::result::ErrorKind>,
    pub time_ms: f64,
}

/// The kinds of violation the explorer shrinks and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// Port and reference bits differ.
    Bits,
    /// A side is outside the exact oracle's bound.
    Exact,
    /// The port raised where the reference computed (a port that refuses
    /// what the reference accepts is a conformance failure).
    PortError,
    /// The case errored otherwise (the reference refused the description,
    /// or the harness).
    Error,
}

impl Observation {
    pub fn violation(&self) -> Option<Violation> {
        if self.error.is_some() {
            Some(if self.error_kind == Some(crate::result::ErrorKind::Port) {
                Violation::PortError
            } else {
                Violation::Error
            })
        } else if !self.bits_equal {
            Some(Violation::Bits)
        } else if self.exact.is_some_and(|c| c != ExactClass::Within) {
            Some(Violation::Exact)
        } else {
            None
        }
    }
}

/// Runs one description in this process and observes it.
pub fn observe(oracle: &Oracle, backend: Backend, d: &Description) -> Observation {
    let started = Instant::now();
    let case = d.case("explore");
    let options = RunOptions {
        backend,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let result = runner::run_case(&case, oracle, &options);
    let mut o = Observation {
        bits_equal: result.verdict == Verdict::Pass,
        first_diff: None,
        exact: None,
        invariances: Vec::new(),
        error: None,
        error_kind: None,
        time_ms: 0.0,
    };
    match (&result.verdict, &result.output) {
        (Verdict::Pass | Verdict::Fail, Some(out)) => {
            o.first_diff = out
                .outputs
                .iter()
                .find(|x| !x.comparison.is_equal())
                .map(|x| format!("{}: {}", x.name, x.comparison.summary()));
            o.exact = out
                .exact_checks()
                .map(|(_, e)| e.class)
                .max_by_key(|c| *c as u8);
            match d.invariances() {
                Ok(v) => o.invariances = v,
                Err(e) => o.error = Some(format!("invariance: {e}")),
            }
        }
        _ => {
            o.error = Some(result.message.unwrap_or_else(|| "no output".into()));
            o.error_kind = result.error_kind;
        }
    }
    o.time_ms = started.elapsed().as_secs_f64() * 1e3;
    o
}

/// How a search runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub budget: Duration,
    /// At most this many samples (of this shard).
    pub max_samples: Option<usize>,
    /// Families to sample (empty: all).
    pub families: Vec<String>,
    /// `(i, n)`: this process takes samples `j` with `j % n == i`.
    pub shard: (usize, usize),
    pub backend: Backend,
    /// Shrink steps per violation, at most (the budget bounds shrinking and
    /// extent sweeps too: on a GPU every new shape compiles kernels).
    pub max_shrink_steps: usize,
    /// Sweep each shrunk violation along its axes (M, N, K).
    pub extent: bool,
}

/// Samples drawn at a time and run grouped by kernel class.
const BLOCK: usize = 32;

/// One sample's record for the regime map.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sampled {
    pub index: usize,
    /// When it ran in this process (0 first).
    #[serde(default)]
    pub order: usize,
    pub description: Description,
    pub observation: Observation,
}

/// A violation, shrunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Found {
    pub kind: Violation,
    /// The sample as first drawn.
    pub original: Description,
    /// The smallest description that still shows `kind`.
    pub minimal: Description,
    pub observation: Observation,
    pub shrink_steps: usize,
    /// The samples this process ran just before the first sighting (a
    /// violation that depends on what ran before shows here).
    pub preceded_by: Vec<String>,
    /// Where the violation extends: the minimal description swept along
    /// each axis, and whether each value still shows it.
    pub extent: Vec<Extent>,
    /// The first sighting rerun alone in a fresh process: whether it shows
    /// there too (false: it misbehaves only after `preceded_by`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone: Option<Alone>,
}

/// A sample rerun alone, in a fresh process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Alone {
    /// It shows the same kind of violation alone.
    pub shows: bool,
    pub observation: Observation,
}

impl Found {
    /// What was seen, in one line: the first differing element, the
    /// error, or (a bound violation with equal bits) that.
    pub fn seen(&self) -> &str {
        self.observation
            .first_diff
            .as_deref()
            .or(self.observation.error.as_deref())
            .unwrap_or("bits equal; outside the exact bound")
    }
}

/// One axis of a violation's extent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Extent {
    pub axis: String,
    /// The values that show the violation.
    pub shows: Vec<usize>,
    /// The values that do not.
    pub clean: Vec<usize>,
}

/// Sweeps `minimal` along its axes.
fn extent(
    oracle: &Oracle,
    config: &Config,
    deadline: Instant,
    minimal: &Description,
    kind: Violation,
) -> Vec<Extent> {
    minimal
        .axes()
        .into_iter()
        .map(|(axis, points)| {
            let mut e = Extent {
                axis: axis.into(),
                shows: Vec::new(),
                clean: Vec::new(),
            };
            for (value, d) in points {
                if d.check().is_err() || Instant::now() >= deadline {
                    continue;
                }
                match observe(oracle, config.backend, &d).violation() == Some(kind) {
                    true => e.shows.push(value),
                    false => e.clean.push(value),
                }
            }
            e
        })
        .collect()
}

/// A whole search's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Search {
    pub seed: u64,
    pub shard: (usize, usize),
    pub backend: String,
    pub families: Vec<String>,
    pub samples: Vec<Sampled>,
    pub found: Vec<Found>,
    pub wall_s: f64,
}

/// Runs a search: draws samples until the budget or the sample cap, and
/// shrinks the first violation of each kind in each kernel class (later
/// ones are in the samples and the regime map).
pub fn search(
    oracle: &Oracle,
    config: &Config,
    progress: &dyn Fn(usize, usize),
    alone: &dyn Fn(&Description) -> Option<Observation>,
) -> Result<Search, String> {
    let strategies = strategy::for_families(&config.families)?;
    let started = Instant::now();
    // A budget too large to add to now is a century (never a panic).
    let budget = config.budget.min(Duration::from_secs(100 * 365 * 86_400));
    let out_of_time = || started.elapsed() >= budget || runner::interrupted();
    let (shard, shards) = config.shard;
    let mut samples = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let mut index = 0usize;
    // Samples are drawn in blocks and run grouped by kernel class, so a
    // GPU compiles each class's kernels once per block (the first sample of
    // a class in this process carries its compilation; `explore.md`
    // reports that time apart). Which samples a seed draws never depends
    // on the order they run in.
    let mut block: std::collections::VecDeque<(usize, Box<dyn ValueTree<Value = Description>>)> =
        Default::default();
    loop {
        if out_of_time() || config.max_samples.is_some_and(|m| samples.len() >= m) {
            break;
        }
        if block.is_empty() {
            // A sample cap draws exactly the capped samples (the first by
            // index), so shards of a capped search merge into the whole.
            let want = config
                .max_samples
                .map_or(BLOCK, |m| BLOCK.min(m - samples.len()));
            let mut drawn = Vec::new();
            // The budget and an interrupt stop the drawing too (a shard of
            // a huge `n` matches rarely).
            while drawn.len() < want && !out_of_time() {
                let j = index;
                let Some(next) = index.checked_add(1) else {
                    break;
                };
                index = next;
                if j % shards != shard {
                    continue;
                }
                let (family, strategy) = &strategies[j % strategies.len()];
                drawn.push((j, strategy::draw(strategy, config.seed, j, family)?));
            }
            drawn.sort_by_cached_key(|(j, t)| (t.current().kernel_class(), *j));
            if drawn.is_empty() {
                break;
            }
            block.extend(drawn);
        }
        let (j, mut tree) = block.pop_front().expect("a block was just drawn");
        let description = tree.current();
        let observation = observe(oracle, config.backend, &description);
        // One shrink per kind of violation and kernel class: the next
        // sighting in a class already shrunk is recorded, not shrunk again.
        let known = |kind| {
            found.iter().any(|f: &Found| {
                f.kind == kind && f.original.kernel_class() == description.kernel_class()
            })
        };
        if let Some(kind) = observation.violation().filter(|k| !known(*k)) {
            let preceded_by = samples
                .iter()
                .rev()
                .take(3)
                .map(|s: &Sampled| s.description.name("explore"))
                .collect();
            let deadline = started + budget;
            // Before shrinking: does the first sighting show alone, in a
            // fresh process (nothing run before it)?
            let rerun = alone(&description).map(|o| Alone {
                shows: o.violation() == Some(kind),
                observation: o,
            });
            let (minimal, minimal_observation, steps) = shrink(
                oracle,
                config,
                deadline,
                &mut *tree,
                kind,
                description.clone(),
                observation.clone(),
            );
            if !found.iter().any(|f| f.minimal == minimal) {
                let extent = if config.extent {
                    extent(oracle, config, deadline, &minimal, kind)
                } else {
                    Vec::new()
                };
                found.push(Found {
                    kind,
                    original: description.clone(),
                    minimal,
                    observation: minimal_observation,
                    shrink_steps: steps,
                    preceded_by,
                    extent,
                    alone: rerun,
                });
            }
        }
        if let Some(f) = found.last().filter(|_| observation.violation().is_some()) {
            if f.original == description {
                crate::errln!(
                    "explore: {:?} at {} (shrunk from {} in {} steps)",
                    f.kind,
                    f.minimal.name("explore"),
                    f.original.name("explore"),
                    f.shrink_steps
                );
            }
        }
        samples.push(Sampled {
            index: j,
            order: samples.len(),
            description,
            observation,
        });
        progress(samples.len(), found.len());
    }
    // By index (each keeps its run order in `order`).
    samples.sort_by_key(|s| s.index);
    Ok(Search {
        seed: config.seed,
        shard: config.shard,
        backend: config.backend.as_str().into(),
        families: strategies.iter().map(|(f, _)| f.clone()).collect(),
        samples,
        found,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// proptest's shrinking (simplify while it still fails, complicate when
/// it passes) with this sample's violation as the failure, then a greedy
/// pass over [`Description::simpler`] to a fixpoint: the result is a
/// description none of whose simpler neighbours shows the violation.
fn shrink(
    oracle: &Oracle,
    config: &Config,
    deadline: Instant,
    tree: &mut dyn ValueTree<Value = Description>,
    kind: Violation,
    mut best: Description,
    mut best_observation: Observation,
) -> (Description, Observation, usize) {
    let mut steps = 0;
    let mut simplified = tree.simplify();
    let open = |steps: usize| steps < config.max_shrink_steps && Instant::now() < deadline;
    while simplified && open(steps) {
        steps += 1;
        let candidate = tree.current();
        let o = observe(oracle, config.backend, &candidate);
        if o.violation() == Some(kind) {
            best = candidate;
            best_observation = o;
            simplified = tree.simplify();
        } else {
            simplified = tree.complicate();
        }
    }
    'greedy: while open(steps) {
        for candidate in best.simpler() {
            if !open(steps) {
                break 'greedy;
            }
            steps += 1;
            let o = observe(oracle, config.backend, &candidate);
            if o.violation() == Some(kind) {
                best = candidate;
                best_observation = o;
                continue 'greedy;
            }
        }
        break;
    }
    (best, best_observation, steps)
}

/// Merges shard searches of one seed into one (samples in index order).
pub fn merge(mut shards: Vec<Search>) -> Result<Search, String> {
    let first = shards.first().ok_or("no shard reports to merge")?.clone();
    if shards
        .iter()
        .any(|s| s.seed != first.seed || s.backend != first.backend)
    {
        return Err("shard reports of different seeds or backends cannot be merged".into());
    }
    if shards.iter().any(|s| s.families != first.families) {
        return Err("shard reports of different --family sets cannot be merged: run every shard with the same families".into());
    }
    // Every shard of one split, once each: a partial merge would read as
    // the whole search.
    let n = first.shard.1;
    let mut have: Vec<usize> = shards.iter().map(|s| s.shard.0).collect();
    have.sort_unstable();
    if shards.iter().any(|s| s.shard.1 != n) || have != (0..n).collect::<Vec<_>>() {
        let missing: Vec<String> = (0..n)
            .filter(|i| !have.contains(i))
            .map(|i| format!("{i}/{n}"))
            .collect();
        return Err(format!(
            "these reports are not every shard of one {n}-way split (shards given: {}; missing: {}); merge all n shards of one search",
            shards.iter().map(|s| format!("{}/{}", s.shard.0, s.shard.1)).collect::<Vec<_>>().join(", "),
            if missing.is_empty() { "none, but the reports overlap: a shard appears twice".to_owned() } else { missing.join(", ") }
        ));
    }
    // Reports are data: every description must be one the suite can run.
    for s in &shards {
        for d in s
            .samples
            .iter()
            .map(|x| &x.description)
            .chain(s.found.iter().flat_map(|f| [&f.original, &f.minimal]))
        {
            d.check().map_err(|e| {
                format!(
                    "a report holds a description that cannot run ({}): {e}",
                    d.name("explore")
                )
            })?;
        }
    }
    let mut merged = Search {
        shard: (0, 1),
        samples: Vec::new(),
        found: Vec::new(),
        wall_s: 0.0,
        ..first
    };
    let mut seen = std::collections::BTreeSet::new();
    for s in shards.drain(..) {
        if let Some(dup) = s.samples.iter().find(|x| !seen.insert(x.index)) {
            return Err(format!(
                "shard reports overlap (sample {} is in two of them): merge each shard once",
                dup.index
            ));
        }
        merged.wall_s = merged.wall_s.max(s.wall_s);
        merged.samples.extend(s.samples);
        for f in s.found {
            if !merged.found.iter().any(|g| g.minimal == f.minimal) {
                merged.found.push(f);
            }
        }
    }
    merged.samples.sort_by_key(|s| s.index);
    Ok(merged)
}
