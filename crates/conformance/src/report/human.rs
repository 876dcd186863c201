//! The terminal table.

use super::{first_diff, verdict_word, Report, Row};

/// One line per case (plain output when not on a terminal).
pub fn line(row: &Row) -> String {
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
    if let Some(m) = &row.result.message {
        s.push_str(&format!("\n        {}", m.replace('\n', "\n        ")));
    }
    s
}

/// The summary printed after the table.
pub fn summary(report: &Report) -> String {
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
    // The plain closing line CI reads: passed = verdicts that hold, failed =
    // everything that makes the exit code non-zero.
    let bad = s.failed + s.errors + s.drifted + s.orphaned_snapshots.len();
    out.push_str(&format!(
        "snapshot set {} · MLX {} · {} ({})\n",
        report.environment.snapshot_set,
        report.environment.mlx_version,
        report.environment.backend,
        report.environment.device
    ));
    out.push_str(&format!(
        "conformance: {} passed, {} failed, {} skipped\n",
        s.passed + s.findings,
        bad,
        s.skipped
    ));
    out
}
