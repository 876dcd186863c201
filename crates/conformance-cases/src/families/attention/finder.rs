//! The empirical boundary finder: where does appending a chunk of `c`
//! tokens at cache length `L` stop reproducing token-by-token (M = 1)
//! decoding, for one graph shape on one backend?
//!
//! Model: SDPA's arithmetic depends on the KV length through regimes
//! ([`layers::position::RegimeTable`]); with a boundary `B` (the last KV
//! length of a regime), a chunk at `L` covers KV lengths `L+1 ..= L+c` and
//! fails exactly when it holds both `B` and `B+1`, i.e. for
//! `L ∈ [B+1-c, B-1]`.
//!
//! Search, never a sweep from 0:
//! 1. probe one chunk straddling each candidate `b` (powers of two, the
//!    Metal table): `L = b - c/2`, so KV lengths `b-c/2+1 ..= b+c/2`
//!    (`b-1 ..= b+2` for `c = 4`): a boundary within ±`c/2` of a
//!    candidate is caught;
//! 2. around each failing probe `L`, probe `L ± c` (outside the failing
//!    run of a lone boundary), so every failure is bracketed locally;
//! 3. bisect every gap between adjacent probed lengths of which one
//!    matches and the other fails, down to neighbours: that gives each
//!    failing run `[first, last]` exactly;
//! 4. a closed run no longer than [`MAX_RESOLVED_RUN`] chunks is resolved
//!    into boundaries with chunks of 2 at each `L` of the run (a chunk of 2
//!    at `L` fails exactly when `L+1` is a boundary). Longer or open runs
//!    (a threshold beyond which chunking never matches, or a backend where
//!    it never does) are reported as such, not as boundaries.
//!
//! A boundary far (more than `c/2`) from every candidate is not looked for.

use std::collections::BTreeMap;

use serde::Serialize;

/// Answers whether appending `chunk` tokens at `cache_len` reproduces M = 1
/// bit for bit.
pub trait AppendProbe {
    type Error;
    fn matches(&mut self, cache_len: usize, chunk: usize) -> Result<bool, Self::Error>;
}

impl<E, F: FnMut(usize, usize) -> Result<bool, E>> AppendProbe for F {
    type Error = E;
    fn matches(&mut self, cache_len: usize, chunk: usize) -> Result<bool, E> {
        self(cache_len, chunk)
    }
}

/// The longest closed failing run (in chunks) resolved into boundaries.
pub const MAX_RESOLVED_RUN: usize = 4;

/// At most this many probes: on a backend where matches and failures
/// alternate irregularly, bisecting every gap would never end in useful
/// time; the search then stops bisecting and says so.
pub const MAX_PROBES: usize = 600;

/// One probe, in probing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProbeRecord {
    pub cache_len: usize,
    pub chunk: usize,
    pub matched: bool,
}

/// A maximal range of cache lengths where a chunk of the search's size
/// fails. `open_below`/`open_above`: no matching probe below/above it, so
/// `first`/`last` are only the extreme probed lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FailingRun {
    pub first: usize,
    pub last: usize,
    pub open_below: bool,
    pub open_above: bool,
}

/// What the finder located.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BoundarySearch {
    pub chunk: usize,
    pub probes: Vec<ProbeRecord>,
    pub failing_runs: Vec<FailingRun>,
    /// Located regime boundaries (inclusive KV lengths), increasing: the
    /// table [`layers::position::RegimeTable::from_measured`] takes.
    pub boundaries: Vec<usize>,
    /// Failing runs that are not regime boundaries (open, too long, or no
    /// chunk of 2 inside them fails).
    pub unresolved: Vec<FailingRun>,
    /// No probe matched at all.
    pub never_matches: bool,
    /// The search stopped bisecting at [`MAX_PROBES`].
    pub probe_budget_exhausted: bool,
}

impl BoundarySearch {
    /// What the search shows, in one phrase for reports: `no boundaries`,
    /// `a few boundaries`, `differs at most lengths` or `never matches`.
    /// "Most lengths": more than half of the straddling probes (one per
    /// candidate) fail.
    pub fn pattern(&self, candidates: usize) -> &'static str {
        let failing = self
            .probes
            .iter()
            .take(candidates)
            .filter(|p| !p.matched)
            .count();
        if self.never_matches {
            "never matches"
        } else if 2 * failing > candidates.min(self.probes.len()) {
            "differs at most lengths"
        } else if self.failing_runs.is_empty() {
            "no boundaries"
        } else {
            "a few boundaries"
        }
    }
}

struct Search<'p, P: AppendProbe> {
    probe: &'p mut P,
    log: Vec<ProbeRecord>,
    memo: BTreeMap<(usize, usize), bool>,
}

impl<P: AppendProbe> Search<'_, P> {
    fn at(&mut self, cache_len: usize, chunk: usize) -> Result<bool, P::Error> {
        if let Some(&m) = self.memo.get(&(cache_len, chunk)) {
            return Ok(m);
        }
        let matched = self.probe.matches(cache_len, chunk)?;
        self.memo.insert((cache_len, chunk), matched);
        self.log.push(ProbeRecord {
            cache_len,
            chunk,
            matched,
        });
        Ok(matched)
    }

    /// Probed lengths for `chunk`, increasing, with their outcome.
    fn probed(&self, chunk: usize) -> Vec<(usize, bool)> {
        self.memo
            .iter()
            .filter(|((_, c), _)| *c == chunk)
            .map(|(&(l, _), &m)| (l, m))
            .collect()
    }
}

/// Locates where chunks of `chunk` tokens stop matching M = 1 near
/// `candidates` (KV lengths), as described in the module documentation.
///
/// # Panics
/// If `chunk < 2` (a chunk of 1 is M = 1).
pub fn find_boundaries<P: AppendProbe>(
    probe: &mut P,
    candidates: &[usize],
    chunk: usize,
) -> Result<BoundarySearch, P::Error> {
    assert!(chunk >= 2, "a chunk of {chunk} cannot straddle a boundary");
    let mut s = Search {
        probe,
        log: Vec::new(),
        memo: BTreeMap::new(),
    };
    let mut straddles: Vec<usize> = candidates
        .iter()
        .map(|&b| b.saturating_sub(chunk / 2))
        .collect();
    straddles.sort_unstable();
    straddles.dedup();
    let mut failing = Vec::new();
    for &l in &straddles {
        if !s.at(l, chunk)? {
            failing.push(l);
        }
    }
    for l in failing {
        if l >= chunk {
            s.at(l - chunk, chunk)?;
        }
        s.at(l + chunk, chunk)?;
    }
    // Bisect every match/fail gap until the two sides are neighbours.
    loop {
        let probed = s.probed(chunk);
        let gaps: Vec<usize> = probed
            .windows(2)
            .filter(|w| w[0].1 != w[1].1 && w[1].0 - w[0].0 > 1)
            .map(|w| w[0].0 + (w[1].0 - w[0].0) / 2)
            .collect();
        if gaps.is_empty() || s.log.len() >= MAX_PROBES {
            break;
        }
        for mid in gaps {
            s.at(mid, chunk)?;
        }
    }
    let probed = s.probed(chunk);
    let mut failing_runs = Vec::new();
    let mut i = 0;
    while i < probed.len() {
        if probed[i].1 {
            i += 1;
            continue;
        }
        let mut j = i;
        while j + 1 < probed.len() && !probed[j + 1].1 {
            j += 1;
        }
        failing_runs.push(FailingRun {
            first: probed[i].0,
            last: probed[j].0,
            open_below: i == 0,
            open_above: j + 1 == probed.len(),
        });
        i = j + 1;
    }
    let mut boundaries = Vec::new();
    let mut unresolved = Vec::new();
    for run in &failing_runs {
        let closed = !run.open_below && !run.open_above;
        let mut found = Vec::new();
        if closed && run.last - run.first < MAX_RESOLVED_RUN * chunk {
            for l in run.first..=run.last {
                let fails = if chunk == 2 { true } else { !s.at(l, 2)? };
                if fails {
                    found.push(l + 1);
                }
            }
        }
        if found.is_empty() {
            unresolved.push(*run);
        }
        boundaries.extend(found);
    }
    boundaries.sort_unstable();
    boundaries.dedup();
    let never_matches = s.log.iter().all(|p| !p.matched);
    let probe_budget_exhausted = s.log.len() >= MAX_PROBES;
    Ok(BoundarySearch {
        probe_budget_exhausted,
        chunk,
        probes: s.log,
        failing_runs,
        boundaries,
        unresolved,
        never_matches,
    })
}

/// Dense candidates for backends whose behaviour is unknown (the GPU
/// backends): the default ones plus 48 irregular lengths spread over
/// `17 ..= 63_984` (every 1361 tokens), so that "a few boundaries" and
/// "differs at most lengths" are told apart rather than guessed from
/// powers of two.
pub fn dense_candidates(metal: &[usize]) -> Vec<usize> {
    let mut c = default_candidates(metal);
    c.extend((0..48).map(|k| 17 + 1361 * k));
    c.sort_unstable();
    c.dedup();
    c
}

/// The default candidates: powers of two `4 ..= 65536` and the Metal
/// table's boundaries.
pub fn default_candidates(metal: &[usize]) -> Vec<usize> {
    let mut c: Vec<usize> = (2..=16)
        .map(|k| 1usize << k)
        .chain(metal.iter().copied())
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use layers::position::{Backend, RegimeTable};

    use super::*;

    const METAL: [usize; 5] = [1023, 1024, 8192, 32768, 65536];

    /// A backend whose arithmetic follows `table` exactly.
    fn regime_probe(table: RegimeTable) -> impl FnMut(usize, usize) -> Result<bool, Infallible> {
        move |l, c| Ok(table.regime(l + 1) == table.regime(l + c))
    }

    #[test]
    fn recovers_the_metal_table() {
        let search = find_boundaries(
            &mut regime_probe(RegimeTable::metal()),
            &default_candidates(&METAL),
            4,
        )
        .unwrap();
        assert_eq!(search.boundaries, METAL);
        assert!(search.unresolved.is_empty());
        assert!(!search.never_matches);
        // Local work only: nowhere near a sweep.
        assert!(search.probes.len() < 80, "{}", search.probes.len());
    }

    #[test]
    fn finds_boundaries_near_candidates_only() {
        let table = RegimeTable::from_measured(Backend::Cpu, vec![4097, 5000]).unwrap();
        let search =
            find_boundaries(&mut regime_probe(table), &default_candidates(&METAL), 4).unwrap();
        assert_eq!(search.boundaries, vec![4097]);
    }

    #[test]
    fn empty_when_everything_matches() {
        let candidates = default_candidates(&METAL);
        let search =
            find_boundaries(&mut regime_probe(RegimeTable::cpu()), &candidates, 4).unwrap();
        assert!(search.boundaries.is_empty() && search.failing_runs.is_empty());
        assert_eq!(search.probes.len(), candidates.len());
    }

    #[test]
    fn a_threshold_is_an_open_run_not_a_boundary() {
        let mut probe = |l: usize, c: usize| Ok::<_, Infallible>(l + c <= 3000);
        let search = find_boundaries(&mut probe, &default_candidates(&METAL), 4).unwrap();
        assert!(search.boundaries.is_empty());
        assert_eq!(
            search.failing_runs,
            vec![FailingRun {
                first: 2997,
                last: 65538,
                open_below: false,
                open_above: true
            }]
        );
        assert_eq!(search.unresolved, search.failing_runs);
    }

    #[test]
    fn never_matching() {
        let mut probe = |_: usize, _: usize| Ok::<_, Infallible>(false);
        let search = find_boundaries(&mut probe, &default_candidates(&METAL), 4).unwrap();
        assert!(search.never_matches && search.boundaries.is_empty());
        assert!(search.failing_runs[0].open_below && search.failing_runs[0].open_above);
    }
}
