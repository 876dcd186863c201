//! `--exact-faults`: the exact oracle's mutation score. An interceptor
//! asks the core to plant each applicable fault of the catalogue
//! (`exactness::faults`) into a copy of every must-equal output's
//! reference side (a kernel bug both sides would share) and to measure it
//! against the exact oracle; the score is the fraction flagged, per
//! family, per kind, on the run's backend. Verdicts never change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::Row;

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
    fn add(&mut self, flagged: bool) {
        self.planted += 1;
        self.flagged += usize::from(flagged);
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

/// The mutation score of a run (report.json `summary.mutation`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MutationScore {
    /// The backend the faults were planted on.
    pub backend: String,
    pub total: Score,
    pub by_family: BTreeMap<String, Score>,
    pub by_kind: BTreeMap<String, Score>,
    /// `family · kind`.
    pub by_family_kind: BTreeMap<String, Score>,
    pub escapes: Vec<Escape>,
}

impl MutationScore {
    /// Over the must-equal rows' planted faults.
    pub fn of(rows: &[Row], backend: &str) -> Self {
        let mut s = MutationScore {
            backend: backend.to_owned(),
            ..Self::default()
        };
        for row in rows {
            let r = &row.result;
            if r.expect != crate::case::Expect::MustEqual {
                continue;
            }
            let Some(out) = &r.output else { continue };
            for f in &out.faults {
                let kind = f.kind.name();
                s.total.add(f.flagged);
                s.by_family
                    .entry(r.family.clone())
                    .or_default()
                    .add(f.flagged);
                s.by_kind.entry(kind.to_owned()).or_default().add(f.flagged);
                s.by_family_kind
                    .entry(format!("{} · {kind}", r.family))
                    .or_default()
                    .add(f.flagged);
                if !f.flagged {
                    s.escapes.push(Escape {
                        case: r.name.clone(),
                        output: f.output.clone(),
                        kind: kind.to_owned(),
                        max_ratio: f.max_ratio,
                        changed: f.changed,
                        total: f.total,
                    });
                }
            }
        }
        s
    }
}

/// `report.md`'s section.
pub fn markdown(s: &MutationScore, md: &mut String) {
    use std::fmt::Write;
    let pct = |x: &Score| {
        format!(
            "{:.1}% ({} of {})",
            100.0 * x.fraction(),
            x.flagged,
            x.planted
        )
    };
    let _ = writeln!(
        md,
        "## Mutation score of the exact oracle ({})\n\nEach applicable fault of the catalogue (`exactness::faults`) planted into the reference side of every must-equal output with an exact value: **{}** flagged (outside the bound).\n",
        s.backend,
        pct(&s.total)
    );
    let _ = writeln!(md, "| family | flagged |\n|---|---:|");
    for (f, x) in &s.by_family {
        let _ = writeln!(md, "| `{f}` | {} |", pct(x));
    }
    let _ = writeln!(md, "\n| kind | flagged |\n|---|---:|");
    for (k, x) in &s.by_kind {
        let _ = writeln!(md, "| `{k}` | {} |", pct(x));
    }
    let _ = writeln!(md, "\n<details><summary>By family and kind</summary>\n\n| family · kind | flagged |\n|---|---:|");
    for (k, x) in &s.by_family_kind {
        let _ = writeln!(md, "| `{k}` | {} |", pct(x));
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
