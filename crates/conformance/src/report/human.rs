//! The terminal table.

use super::model::{first_diff, snapshot_note, verdict_word, Report, Row};
use crate::snapshots::SetCommands;

/// One line per case (plain output when not on a terminal).
/// `side` names what stood for the port: `port`, or `candidate` in a
/// `--candidate` run.
pub fn line(row: &Row, commands: &SetCommands, side: &str) -> String {
    let (diff, ulp) = first_diff(&row.result);
    let path = row.result.output.as_ref().map_or("-", |o| o.path.as_str());
    let mut s = format!(
        "{:<7} {:<58} {:<14} {:>8.1} ms  ulp {:<4} {}",
        verdict_word(row),
        row.result.name,
        path,
        row.result.time_ms,
        ulp,
        diff
    );
    let mut notes: Vec<String> = row.result.message.iter().cloned().collect();
    notes.extend(snapshot_note(&row.snapshot, commands));
    if let Some(o) = row
        .result
        .output
        .as_ref()
        .filter(|o| !o.not_compared.is_empty())
    {
        let list: Vec<String> = o
            .not_compared
            .iter()
            .map(|(name, why)| format!("{name} ({why})"))
            .collect();
        notes.push(format!("not compared: {}", list.join("; ")));
    }
    // Under the row: every output outside the exact oracle's bound.
    for (_, output, e) in super::model::exact_outside(std::slice::from_ref(row)) {
        notes.push(format!("exact oracle: {}", e.line_as(output, side)));
    }
    for m in notes {
        s.push_str(&format!("\n        {}", m.replace('\n', "\n        ")));
    }
    s
}

/// The table's header row.
pub fn header() -> String {
    format!(
        "{:<7} {:<58} {:<14} {:>11}  {:<8} {}",
        "verdict", "case", "path", "time", "max ulp", "first diff"
    )
}

/// Whether a row needs attention (anything but a clean pass or finding,
/// or an output outside the exact oracle's bound).
pub fn notable(row: &Row) -> bool {
    !matches!(super::model::verdict_word(row), "pass" | "finding")
        || !super::model::exact_outside(std::slice::from_ref(row)).is_empty()
}

/// The summary printed after the table.
pub fn summary(report: &Report) -> String {
    let side = report.environment.side();
    let s = &report.summary;
    let mut out = format!(
        "\n{} cases: {} passed, {} failed, {} findings, {} skipped, {} errors, {} snapshot drifts ({:.1} s)\n",
        s.total,
        s.passed,
        s.failed,
        s.findings,
        s.skipped,
        s.errors,
        s.drifted,
        s.wall_ms / 1e3
    );
    for (family, f) in &report.families {
        out.push_str(&format!(
            "  {family:<28} {:>4} cases {:>9.1} ms\n",
            f.cases, f.wall_ms
        ));
    }
    for o in &s.orphaned_snapshots {
        out.push_str(&format!("orphaned snapshot (no case records it): {o}\n"));
    }
    if let Some(line) = &s.missing_snapshot_set {
        out.push_str(line);
        out.push('\n');
    }
    if let Some(line) = deep_only_line(&report.environment) {
        out.push_str(&line);
        out.push('\n');
    }
    // The plain closing line CI reads, counted per case as the summary
    // line counts them: passed = clean `pass` rows, findings = clean
    // `finding` rows, failed = every row that makes the exit code non-zero
    // (FAIL, ERROR, DRIFT) plus orphaned snapshots and a missing set.
    let count = |word: &str| {
        report
            .cases
            .iter()
            .filter(|r| verdict_word(r) == word)
            .count()
    };
    let notable = report
        .cases
        .iter()
        .filter(|r| !matches!(verdict_word(r), "pass" | "finding" | "skip"))
        .count();
    if let Some(m) = &s.mutation {
        out.push_str(&format!(
            "exact oracle's mutation score ({}): {} of {} planted faults flagged ({:.1}%), {} escapes (report.md lists them)\n",
            m.backend,
            m.total.flagged,
            m.total.planted,
            100.0 * m.total.fraction(),
            m.escapes.len()
        ));
    }
    // The exact oracle, in its own block just above the closing lines: a
    // reference outside its bound computes the wrong thing.
    let x = &s.exact;
    out.push_str(&format!(
        "exact oracle: {} outputs checked, {} within their bound ({} more within a bound too wide to tell zeros), {} with the REFERENCE OUTSIDE, {} with the {side} alone outside\n",
        x.outputs_checked,
        x.within,
        x.uninformative.len(),
        x.reference_outside.len(),
        x.port_outside.len()
    ));
    for (row, output, e) in super::model::exact_outside(&report.cases) {
        out.push_str(&format!(
            "  !! {} {}\n",
            row.result.name,
            e.line_as(output, side)
        ));
    }
    if let Some(p) = &s.proof {
        out.push_str(&format!(
            "proof (--perturb): {} must-equal outputs differ, {} derived, {} UNDETECTED\n",
            p.outputs_differ,
            p.derived,
            p.undetected.len()
        ));
        for u in &p.undetected {
            out.push_str(&format!("  !! undetected: {u}\n"));
        }
    }
    let bad = notable
        + s.orphaned_snapshots.len()
        + usize::from(s.missing_snapshot_set.is_some() && s.missing_set_fails);
    let (passed, findings) = (count("pass"), count("finding"));
    let e = &report.environment;
    // The set was not read: say so where the reader looks, not only in report.md.
    let unchecked = if e.snapshots_checked {
        ""
    } else {
        " (not checked in this run: --perturb, --no-snapshots or another --seed)"
    };
    out.push_str(&format!(
        "snapshot set {}{unchecked} · MLX {} · {} ({}, {})\n",
        report.environment.snapshot_set,
        report.environment.mlx_version,
        report.environment.backend,
        report.environment.device_name,
        report.environment.architecture
    ));
    if let Some(hook) = &e.testing_hook {
        out.push_str(&format!("testing hook set: {hook}\n"));
    }
    out.push_str(&format!(
        "conformance: {passed} passed, {findings} findings, {bad} failed, {} skipped\n",
        s.skipped
    ));
    out
}

/// The line saying how many selected cases this tier left to a deeper
/// one (none when it left none).
pub(crate) fn deep_only_line(e: &super::model::Environment) -> Option<String> {
    (e.deep_only_not_run > 0).then(|| {
        format!(
            "tier {}: {} selected case(s) run only in the deep tier (findings over another schedule, a sweep or a long window); `--tier deep` runs them, as CI and the gate do",
            e.tier.as_str(),
            e.deep_only_not_run
        )
    })
}
