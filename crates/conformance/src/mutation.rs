//! `--exact-faults`: the exact oracle's mutation score. An interceptor
//! asks the core to plant each applicable fault of the catalogue
//! (`exactness::faults`) into a copy of every must-equal output's
//! reference side (a kernel bug both sides would share) and to measure it
//! against the exact oracle; the score is the fraction flagged, per
//! family, per kind, on the run's backend. Verdicts never change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The interceptor of `--exact-faults`.
pub struct PlantFaults;

impl crate::hooks::Interceptor for PlantFaults {
    fn injects_faults(&self) -> bool {
        true
    }
}

/// Flagged of planted.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Score {
    pub planted: usize,
    pub flagged: usize,
}

impl Score {
    pub(crate) fn add(&mut self, flagged: bool) {
        self.planted += 1;
        self.flagged += usize::from(flagged);
    }
    /// `98.9% (5454 of 5513)`, as report.md writes a score.
    pub fn percent(&self) -> String {
        format!(
            "{:.1}% ({} of {})",
            100.0 * self.fraction(),
            self.flagged,
            self.planted
        )
    }
    /// The fraction flagged (1 when nothing was planted).
    pub fn fraction(&self) -> f64 {
        if self.planted == 0 {
            1.0
        } else {
            self.flagged as f64 / self.planted as f64
        }
    }
}

/// A planted fault the oracle did not flag.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Escape {
    pub case: String,
    pub output: String,
    pub kind: String,
    /// The planted output's worst |error| / bound (below 1; `None`: not
    /// finite).
    pub max_ratio: Option<f64>,
    pub changed: usize,
    pub total: usize,
}

/// The run a score came from.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MutationRun {
    pub seed: u64,
    /// `--tier` (`default`, `deep`).
    pub tier: String,
    /// `--filter` (absent: every case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub mlx_version: String,
    /// The device, in words.
    pub device: String,
}

/// The mutation score of a run (report.json `summary.mutation`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MutationScore {
    /// The backend the faults were planted on.
    pub backend: String,
    /// The run that produced it.
    #[serde(default)]
    pub run: Option<MutationRun>,
    pub total: Score,
    pub by_family: BTreeMap<String, Score>,
    pub by_kind: BTreeMap<String, Score>,
    /// `family · kind`.
    pub by_family_kind: BTreeMap<String, Score>,
    pub escapes: Vec<Escape>,
}

/// The latest measured score of one backend, as recorded in
/// `crates/conformance/mutation-scores.json` (compiled in: a bundle carries
/// it) from the `--exact-faults` run named in it. Every report gives them
/// (report.json `summary.mutation_recorded`, a report.md section), so a
/// reader of any run sees how much the exact oracle catches, and where.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RecordedScore {
    pub backend: String,
    /// The day of the run (YYYY-MM-DD), the commit it ran, its command
    /// line, and where its evidence lies (a path in the repository).
    pub date: String,
    pub commit: String,
    pub command: String,
    pub evidence: String,
    pub run: MutationRun,
    pub total: Score,
    pub by_family: BTreeMap<String, Score>,
    /// Escapes of that run (`case · output · kind`), none when empty.
    #[serde(default)]
    pub escapes: Vec<String>,
}

/// The recorded scores, as compiled in.
pub const RECORDED: &str = include_str!("../mutation-scores.json");

/// Parses a list of recorded scores (an error names the problem): a known
/// backend each, at most one per backend, totals that add up.
pub fn parse_recorded(text: &str) -> Result<Vec<RecordedScore>, String> {
    let list: Vec<RecordedScore> =
        serde_json::from_str(text).map_err(|e| format!("mutation-scores.json: {e}"))?;
    let mut seen = std::collections::BTreeSet::new();
    for r in &list {
        if r.backend.parse::<crate::case::Backend>().is_err() || !seen.insert(&r.backend) {
            return Err(format!(
                "mutation-scores.json: backend `{}` unknown or recorded twice",
                r.backend
            ));
        }
        let planted: usize = r.by_family.values().map(|x| x.planted).sum();
        let flagged: usize = r.by_family.values().map(|x| x.flagged).sum();
        if (planted, flagged) != (r.total.planted, r.total.flagged) || flagged > planted {
            return Err(format!(
                "mutation-scores.json: `{}`: families add up to {flagged} of {planted}, the total says {} of {}",
                r.backend, r.total.flagged, r.total.planted
            ));
        }
    }
    Ok(list)
}

/// `report.md`'s section on the recorded scores: one column per backend.
pub fn markdown_recorded(list: &[RecordedScore], md: &mut String) {
    use std::fmt::Write;
    if list.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Mutation score of the exact oracle, as last recorded

The share of realistic kernel faults planted on the reference side that the exact oracle flags (`--exact-faults`; the book's exact-oracle page, \"Mutation score\", explains it), per family and backend, from the runs named below (`crates/conformance/mutation-scores.json`).
"
    );
    let _ = write!(md, "| family |");
    for r in list {
        let _ = write!(md, " {} |", r.backend);
    }
    let _ = write!(md, "\n|---|");
    for _ in list {
        let _ = write!(md, "---:|");
    }
    let _ = writeln!(md);
    let families: std::collections::BTreeSet<&String> =
        list.iter().flat_map(|r| r.by_family.keys()).collect();
    for f in families {
        let _ = write!(md, "| `{f}` |");
        for r in list {
            let cell = r.by_family.get(f).map_or("-".to_owned(), Score::percent);
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
    let _ = write!(md, "| **total** |");
    for r in list {
        let _ = write!(md, " **{}** |", Score::percent(&r.total));
    }
    let _ = writeln!(md, "\n");
    for r in list {
        let _ = writeln!(
            md,
            "- {}: {} at {} (seed {}, {} tier, MLX {}, {}): `{}`; evidence `{}`; {} escapes",
            r.backend,
            r.date,
            r.commit,
            r.run.seed,
            r.run.tier,
            r.run.mlx_version,
            r.run.device,
            r.command,
            r.evidence,
            r.escapes.len()
        );
    }
    let _ = writeln!(md);
}

/// `report.md`'s section.
pub fn markdown(s: &MutationScore, md: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(
        md,
        "## Mutation score of the exact oracle ({})\n\nEach applicable fault of the catalogue (`exactness::faults`) planted into the reference side of every must-equal output with an exact value: **{}** flagged (outside the bound).\n",
        s.backend,
        Score::percent(&s.total)
    );
    if let Some(r) = &s.run {
        let _ = writeln!(
            md,
            "This run: seed {}, {} tier{}, MLX {}, {}.\n",
            r.seed,
            r.tier,
            r.filter
                .as_ref()
                .map_or(String::new(), |f| format!(", --filter {f}")),
            r.mlx_version,
            r.device
        );
    }
    let _ = writeln!(md, "| family | flagged |\n|---|---:|");
    for (f, x) in &s.by_family {
        let _ = writeln!(md, "| `{f}` | {} |", Score::percent(x));
    }
    let _ = writeln!(md, "\n| kind | flagged |\n|---|---:|");
    for (k, x) in &s.by_kind {
        let _ = writeln!(md, "| `{k}` | {} |", Score::percent(x));
    }
    let _ = writeln!(md, "\n<details><summary>By family and kind</summary>\n\n| family · kind | flagged |\n|---|---:|");
    for (k, x) in &s.by_family_kind {
        let _ = writeln!(md, "| `{k}` | {} |", Score::percent(x));
    }
    let _ = writeln!(md, "\n</details>\n");
    if !s.escapes.is_empty() {
        let _ = writeln!(
            md,
            "### Escapes ({}): planted and within the bound\n\n| case | output | kind | worst error / bound | elements changed |\n|---|---|---|---:|---:|",
            s.escapes.len()
        );
        for e in &s.escapes {
            let _ = writeln!(
                md,
                "| `{}` | {} | `{}` | {} | {} of {} |",
                e.case,
                e.output,
                e.kind,
                e.max_ratio.map_or("-".into(), |r| format!("{r:.3}")),
                e.changed,
                e.total
            );
        }
        let _ = writeln!(md);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compiled-in record parses (a known backend, totals that add
    /// up) and report.md gives it per family and backend with its run; a
    /// record whose families do not add up is refused.
    #[test]
    fn the_recorded_scores_parse_and_are_listed_with_their_run() {
        let list = parse_recorded(RECORDED).unwrap();
        let cpu = list
            .iter()
            .find(|r| r.backend == "cpu")
            .expect("a CPU score");
        assert!(cpu.total.planted > 0 && !cpu.by_family.is_empty());
        let mut md = String::new();
        markdown_recorded(&list, &mut md);
        assert!(
            md.contains("## Mutation score of the exact oracle, as last recorded"),
            "{md}"
        );
        assert!(md.contains("| `attention/decode` |"), "{md}");
        assert!(
            md.contains(&format!("- cpu: {} at {}", cpu.date, cpu.commit)),
            "{md}"
        );
        let mut bad = cpu.clone();
        bad.total.flagged += 1;
        let text = serde_json::to_string(&vec![bad]).unwrap();
        assert!(parse_recorded(&text).unwrap_err().contains("add up"));
        let twice = serde_json::to_string(&vec![cpu.clone(), cpu.clone()]).unwrap();
        assert!(parse_recorded(&twice).is_err());
    }

    /// An escape is listed in report.md with its ratio and element count
    /// (the CPU suite has none since the attention enclosures: the CLI
    /// test no longer sees one).
    #[test]
    fn an_escape_is_listed_with_its_ratio() {
        let mut s = MutationScore {
            backend: "cpu".into(),
            ..MutationScore::default()
        };
        s.total = Score {
            planted: 2,
            flagged: 1,
        };
        s.escapes.push(Escape {
            case: "a/case".into(),
            output: "attn".into(),
            kind: "k-tail-dropped".into(),
            max_ratio: Some(0.055),
            changed: 3,
            total: 8,
        });
        let mut md = String::new();
        markdown(&s, &mut md);
        assert!(md.contains("**50.0% (1 of 2)**"), "{md}");
        assert!(md.contains("### Escapes (1)"), "{md}");
        assert!(
            md.contains("| `a/case` | attn | `k-tail-dropped` | 0.055 | 3 of 8 |"),
            "{md}"
        );
    }
}
