//! The rows-regime finders' search: which counts `c` (rows of a batched
//! call, or tokens) give the bits of `c` calls of one (`matches[c - 1]`),
//! for `c` in `1 ..= probed`, without batching every count.
//!
//! A backend picks its kernel from the count, at switch points its source
//! names; inside one kernel class the answer is expected not to change. So
//! the search ([`Tier::Default`]) probes each side of every switch point
//! and the top of the range, bisects between the last matching and the
//! first differing count, then confirms around the limit it found (one
//! count below, the limit, two above). When every probe fits one step
//! (each count up to the limit matches, each above differs) it records that
//! step; when any probe contradicts it, it takes every probe (the full
//! sweep), so a pattern it sees is always recorded as measured. [`Tier::Deep`]
//! takes every probe from the start: it is what checks the step assumption
//! between the probes.
//!
//! Every recorded finding of MLX 0.32.2 (CPU and CUDA, all specs and
//! dtypes) is such a step, so both tiers record the same findings.

use std::collections::BTreeMap;

use crate::families::Tier;

/// What a search measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    /// `matches[c - 1]` for `c` in `1 ..= probed` (count 1, the single
    /// call itself, matches by definition).
    pub matches: Vec<bool>,
    /// Counts actually probed, ascending (count 1 excluded).
    pub probes: Vec<usize>,
}

/// Measures `matches` over `1 ..= probed` with `probe(c)` (does a batched
/// call of count `c` match the single calls?), as the module says.
/// `switch_points` are the first counts of each new kernel class on this
/// backend, in the finder's units (those outside `2 ..= probed` are
/// ignored).
pub fn measure<E>(
    probed: usize,
    switch_points: &[usize],
    tier: Tier,
    probe: impl FnMut(usize) -> Result<bool, E>,
) -> Result<Measured, E> {
    let mut p = Probes {
        known: BTreeMap::from([(1, true)]),
        probe,
    };
    let in_range = |c: usize| (2..=probed).contains(&c);
    if tier == Tier::Deep {
        return p.sweep(probed);
    }
    // Each side of every switch point, and the top of the range.
    for &s in switch_points {
        for c in [s.saturating_sub(1), s] {
            if in_range(c) {
                p.ask(c)?;
            }
        }
    }
    if in_range(probed) {
        p.ask(probed)?;
    }
    // Bisection between the largest match below the first differing count
    // and that count.
    let first_differing = p.known.iter().find(|(_, &m)| !m).map(|(&c, _)| c);
    let limit = match first_differing {
        None => probed,
        Some(mut hi) => {
            let mut lo = p.known.range(..hi).next_back().map_or(1, |(&c, _)| c);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if p.ask(mid)? {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo
        }
    };
    // Confirmation around the limit.
    for c in [limit.saturating_sub(1), limit, limit + 1, limit + 2] {
        if in_range(c) {
            p.ask(c)?;
        }
    }
    if !p.known.iter().all(|(&c, &m)| m == (c <= limit)) {
        return p.sweep(probed);
    }
    Ok(Measured {
        matches: (1..=probed).map(|c| c <= limit).collect(),
        probes: p.probes(),
    })
}

/// The probes taken so far, each taken once.
struct Probes<F> {
    known: BTreeMap<usize, bool>,
    probe: F,
}

impl<F> Probes<F> {
    fn ask<E>(&mut self, c: usize) -> Result<bool, E>
    where
        F: FnMut(usize) -> Result<bool, E>,
    {
        if let Some(&m) = self.known.get(&c) {
            return Ok(m);
        }
        let m = (self.probe)(c)?;
        self.known.insert(c, m);
        Ok(m)
    }

    /// Every count probed: the measured vector itself.
    fn sweep<E>(mut self, probed: usize) -> Result<Measured, E>
    where
        F: FnMut(usize) -> Result<bool, E>,
    {
        for c in 2..=probed {
            self.ask(c)?;
        }
        Ok(Measured {
            matches: (1..=probed).map(|c| self.known[&c]).collect(),
            probes: self.probes(),
        })
    }

    fn probes(&self) -> Vec<usize> {
        self.known.keys().copied().filter(|&c| c > 1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search on a known pattern, counting probes.
    fn run(truth: &[bool], switch_points: &[usize], tier: Tier) -> Measured {
        measure(truth.len(), switch_points, tier, |c| {
            assert!((2..=truth.len()).contains(&c), "probe {c} out of range");
            Ok::<_, ()>(truth[c - 1])
        })
        .expect("infallible probe")
    }

    fn step(probed: usize, limit: usize) -> Vec<bool> {
        (1..=probed).map(|c| c <= limit).collect()
    }

    #[test]
    fn every_step_is_found_exactly_with_fewer_probes() {
        for probed in [1, 2, 3, 12, 24] {
            for limit in 1..=probed {
                for points in [&[][..], &[2, 8][..], &[4][..], &[13, 14, 18][..]] {
                    let truth = step(probed, limit);
                    let found = run(&truth, points, Tier::Default);
                    assert_eq!(
                        found.matches, truth,
                        "probed {probed} limit {limit} {points:?}"
                    );
                    if probed >= 12 {
                        assert!(found.probes.len() < probed - 1, "{:?}", found.probes);
                    }
                }
            }
        }
    }

    #[test]
    fn the_cpu_search_probes_the_top_and_its_neighbour() {
        let found = run(&step(24, 24), &[], Tier::Default);
        assert_eq!(found.probes, vec![23, 24]);
    }

    #[test]
    fn a_contradicting_probe_falls_back_to_the_sweep() {
        // CUDA-like: differs from 8, but matches again at 24 (the top).
        let mut truth = step(24, 7);
        truth[23] = true;
        let found = run(&truth, &[2, 8], Tier::Default);
        assert_eq!(found.matches, truth);
        assert_eq!(found.probes, (2..=24).collect::<Vec<_>>());
        // A coincidence two above the limit is inside the confirmation.
        let mut truth = step(12, 3);
        truth[4] = true; // count 5
        let found = run(&truth, &[4], Tier::Default);
        assert_eq!(found.matches, truth);
    }

    #[test]
    fn deep_probes_every_count() {
        let mut truth = step(24, 7);
        truth[15] = true; // a coincidence the search cannot see
        let deep = run(&truth, &[2, 8], Tier::Deep);
        assert_eq!(deep.matches, truth);
        assert_eq!(deep.probes, (2..=24).collect::<Vec<_>>());
        let default = run(&truth, &[2, 8], Tier::Default);
        assert_ne!(
            default.matches, truth,
            "the default tier records the step it saw"
        );
    }

    #[test]
    fn probe_errors_propagate() {
        let r = measure(24, &[], Tier::Default, |c| {
            if c == 24 {
                Err(c)
            } else {
                Ok(true)
            }
        });
        assert_eq!(r, Err(24));
    }
}
