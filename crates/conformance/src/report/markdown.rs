//! `report.md`, for a kernel change review: summary, each failure with its
//! first diff, findings that changed against the snapshots.

use std::fmt::Write;

use super::model::{first_diff, verdict_word, Report};
use crate::runner::Verdict;
use crate::snapshots::Status;

pub fn render(report: &Report) -> String {
    let s = &report.summary;
    let e = &report.environment;
    let mut md = String::new();
    let _ = writeln!(md, "# MLX conformance report\n");
    let _ = writeln!(
        md,
        "MLX {} · backend {} · device {} ({}, {}) · snapshot set `{}` · lock `{}` · seed {}\n",
        e.mlx_version,
        e.backend,
        e.device,
        e.device_name,
        e.architecture,
        e.snapshot_set,
        &e.lock_sha256[..e.lock_sha256.len().min(12)],
        e.seed
    );
    let _ = writeln!(
        md,
        "**{}** — {} cases: {} passed, {} failed, {} findings, {} skipped, {} errors, {} snapshot drifts; exit code {}\n",
        if s.exit_code == 0 { "PASS" } else { "NOT PASSING" },
        s.total, s.passed, s.failed, s.findings, s.skipped, s.errors, s.drifted, s.exit_code
    );
    if let Some(line) = &s.missing_snapshot_set {
        let _ = writeln!(md, "> {line}\n");
    }
    if let Some(line) = super::human::deep_only_line(e) {
        let _ = writeln!(md, "> {line}\n");
    }
    if let Some(candidate) = &e.candidate {
        let _ = writeln!(md, "> candidate: `{candidate}`\n");
    }
    if let Some(hook) = &e.testing_hook {
        let _ = writeln!(md, "> testing hook set: {hook}\n");
    }
    if e.perturb {
        let _ = writeln!(
            md,
            "> proof run (`--perturb`): the reference received perturbed inputs, so every must-equal case is meant to FAIL with each output differing (except \"Derived outputs\")\n"
        );
        if let Some(p) = &s.proof {
            let _ = writeln!(
                md,
                "> proof: {} must-equal outputs differ, {} derived, **{} undetected**{}\n",
                p.outputs_differ,
                p.derived,
                p.undetected.len(),
                if p.undetected.is_empty() {
                    String::new()
                } else {
                    format!(": {}", p.undetected.join("; "))
                }
            );
        }
    }
    if let Some(f) = &e.filter {
        let _ = writeln!(md, "> filtered: only cases whose name contains `{f}`\n");
    }
    if !e.poison {
        let _ = writeln!(
            md,
            "> buffer-cache poisoning off (`MLX_CONFORMANCE_POISON`): an unwritten output may hold zeros or a stale result instead of NaN\n"
        );
    }
    if !e.snapshots_checked && !e.perturb {
        let _ = writeln!(md, "> snapshots not checked in this run\n");
    }
    if !e.kernel_settings.is_empty() {
        let settings: Vec<String> = e
            .kernel_settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(md, "MLX kernel settings: {}\n", settings.join(" · "));
    }
    if !e.host.is_empty() {
        let host: Vec<String> = e.host.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(md, "host: {}\n", host.join(" · "));
    }
    // The exact oracle first: a reference outside its bound is the most
    // important thing a run can say.
    let x = &s.exact;
    let _ = writeln!(
        md,
        "**Exact oracle**: {} outputs checked against float64 definitions, {} within their derived bound, {} within a bound too wide to tell zeros (uninformative), **{} with the reference outside**, {} with the {} alone outside.\n",
        x.outputs_checked,
        x.within,
        x.uninformative.len(),
        x.reference_outside.len(),
        x.port_outside.len(),
        report.environment.side()
    );
    if !x.uninformative.is_empty() {
        let _ = writeln!(md, "<details><summary>Uninformative exact checks ({}): the bound is wider than every value</summary>\n", x.uninformative.len());
        for n in &x.uninformative {
            let _ = writeln!(md, "- `{n}`");
        }
        let _ = writeln!(md, "\n</details>\n");
    }
    if let Some(m) = &s.mutation {
        crate::mutation::markdown(m, &mut md);
    }
    crate::mutation::markdown_recorded(&s.mutation_recorded, &mut md);
    let outside = super::model::exact_outside(&report.cases);
    if !outside.is_empty() {
        let _ = writeln!(md, "## Outside the exact bound ({})\n", outside.len());
        let _ = writeln!(md, "| case | output | class | op, model | worst element | ratio | snapshot |\n|---|---|---|---|---|---:|---|");
        for (row, output, e) in &outside {
            let _ = writeln!(
                md,
                "| `{}` | {output} | {}{} | {} {} | {} | {} |",
                row.result.name,
                e.class.word_as(report.environment.side()),
                if e.bit_equal {
                    format!(" ({} bit-equal)", report.environment.side())
                } else {
                    String::new()
                },
                e.op,
                e.model,
                e.worst_cells(),
                match row.snapshot {
                    crate::snapshots::Status::Match | crate::snapshots::Status::Written { .. } =>
                        "pinned",
                    crate::snapshots::Status::NotChecked => "not checked",
                    _ => "NOT PINNED (drift)",
                }
            );
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "| family | cases | wall ms |\n|---|---:|---:|");
    for (f, fs) in &report.families {
        let _ = writeln!(md, "| {f} | {} | {:.1} |", fs.cases, fs.wall_ms);
    }
    let failures: Vec<_> = report
        .cases
        .iter()
        .filter(|r| matches!(r.result.verdict, Verdict::Fail | Verdict::Error))
        .collect();
    let _ = writeln!(md, "\n## Failures ({})\n", failures.len());
    for row in failures {
        let r = &row.result;
        let _ = writeln!(
            md,
            "### `{}` — {}\n\nreference: {}\n",
            r.name,
            verdict_word(row),
            r.reference
        );
        if let Some(out) = &r.output {
            for o in &out.outputs {
                let _ = writeln!(md, "- `{}`: {}", o.name, o.comparison.summary());
            }
        }
        if let Some(m) = &r.message {
            let _ = writeln!(md, "```\n{m}\n```");
        }
        md.push('\n');
    }
    let drifts: Vec<_> = report
        .cases
        .iter()
        .filter(|r| {
            matches!(
                r.snapshot,
                Status::Drift { .. } | Status::Missing | Status::Invalid { .. }
            )
        })
        .collect();
    let _ = writeln!(md, "\n## Snapshot and finding drift ({})\n", drifts.len());
    for row in drifts {
        let _ = writeln!(md, "### `{}`\n", row.result.name);
        match &row.snapshot {
            Status::Drift { recorded, now } => {
                let field = |v: &Option<serde_json::Value>, k: &str| {
                    v.as_ref()
                        .and_then(|v| v.get(k))
                        .map_or("(none)".into(), |x| x.to_string())
                };
                let now = Some(now.clone());
                let moved = crate::snapshots::moved_outputs(
                    recorded.as_ref(),
                    now.as_ref().unwrap_or(&serde_json::Value::Null),
                );
                if !moved.is_empty() {
                    let _ = writeln!(md, "- output bits moved: {}", moved.join(", "));
                }
                for k in ["finding", "path", "outputs"] {
                    let (a, b) = (field(recorded, k), field(&now, k));
                    if a != b {
                        let _ = writeln!(md, "- {k}: recorded `{a}`\n  now `{b}`");
                    }
                }
            }
            Status::Missing | Status::Invalid { .. } => {
                if let Some(note) = super::model::snapshot_note(&row.snapshot, &e.set_commands) {
                    let _ = writeln!(md, "- {note}");
                }
            }
            _ => {}
        }
        md.push('\n');
    }
    if !s.orphaned_snapshots.is_empty() {
        let _ = writeln!(md, "\n## Orphaned snapshots\n");
        for o in &s.orphaned_snapshots {
            let _ = writeln!(md, "- `{o}`");
        }
    }
    let findings: Vec<_> = report
        .cases
        .iter()
        .filter(|r| r.result.verdict == Verdict::Finding)
        .collect();
    let _ = writeln!(md, "\n## Findings ({})\n", findings.len());
    for row in findings {
        let f = row.result.output.as_ref().and_then(|o| o.finding.as_ref());
        let _ = writeln!(
            md,
            "- `{}`: {}",
            row.result.name,
            f.map_or("-".into(), |f| f.to_string())
        );
    }
    // Both-refuse cases record each side's message beside their verdict.
    let refusals: Vec<_> = report
        .cases
        .iter()
        .filter(|r| r.result.verdict != Verdict::Finding)
        .filter_map(|r| {
            let f = r.result.output.as_ref()?.finding.as_ref()?;
            let port = f.get("port")?.as_str()?;
            // A candidate run: the candidate's own message, from its row.
            let side = if report.environment.side() == "candidate" {
                r.result
                    .message
                    .as_deref()
                    .and_then(|m| m.strip_prefix(crate::runner::CANDIDATE_REFUSED))
                    .unwrap_or("computed")
            } else {
                port
            };
            Some((r, side, f.get("reference")?.as_str()?))
        })
        .collect();
    if !refusals.is_empty() {
        let _ = writeln!(
            md,
            "\n## Refusals ({}): each side's message\n",
            refusals.len()
        );
        for (row, port, reference) in refusals {
            let _ = writeln!(
                md,
                "- `{}` ({}): {}: {port} · reference: {reference}",
                row.result.name,
                row.result.verdict.word(),
                report.environment.side()
            );
        }
    }
    // Refusals the candidate declared in its hello (findings, not errors).
    let refused: Vec<_> = report
        .cases
        .iter()
        .filter(|r| r.result.error_kind == Some(crate::result::ErrorKind::Policy))
        .collect();
    if !refused.is_empty() {
        let _ = writeln!(
            md,
            "\n## Refused by the candidate's policy ({}): the candidate refuses by design where the reference computes\n",
            refused.len()
        );
        for row in refused {
            let _ = writeln!(
                md,
                "- `{}`: {}",
                row.result.name,
                row.result.message.as_deref().unwrap_or("")
            );
        }
    }
    // Internal intermediates a candidate left out (docs/ops.md).
    let uncompared: Vec<_> = report
        .cases
        .iter()
        .filter_map(|r| {
            let o = r.result.output.as_ref()?;
            (!o.not_compared.is_empty()).then_some((r, &o.not_compared))
        })
        .collect();
    if !uncompared.is_empty() {
        let _ = writeln!(
            md,
            "\n## Not compared ({}): internal outputs the candidate left out\n",
            uncompared.len()
        );
        for (row, places) in uncompared {
            let list: Vec<String> = places
                .iter()
                .map(|(name, why)| format!("`{name}` ({why})"))
                .collect();
            let _ = writeln!(md, "- `{}`: {}", row.result.name, list.join("; "));
        }
    }
    if let Some(vs) = &report.vs_cpu {
        let _ = writeln!(
            md,
            "\n## Findings that differ between CPU and {} ({})\n\nCPU values from the recorded set `{}`; {} findings agree, {} have no CPU record.\n",
            e.backend,
            e.device_name,
            vs.cpu_set,
            vs.same,
            vs.no_cpu_record
        );
        if !vs.differing.is_empty() {
            let _ = writeln!(
                md,
                "| case | field | cpu | {} |\n|---|---|---|---|",
                e.backend
            );
        }
        for d in &vs.differing {
            for (field, cpu, now) in differing_fields(&d.cpu, &d.now) {
                let _ = writeln!(md, "| `{}` | {field} | `{cpu}` | `{now}` |", d.case);
            }
        }
    }
    if let Some(set) = &report.vs_cpu_missing {
        let _ = writeln!(
            md,
            "\n## Findings that differ between CPU and {} ({})\n\nNot compared: the CPU set `{set}` (the CPU set of this run's device key) is not recorded. Record it on the same machine with `--device cpu` under the same `--device-family`.\n",
            e.backend, e.device_name
        );
    }
    let _ = writeln!(md, "\n## All cases\n\n| case | verdict | path | first diff | max ulp | ms |\n|---|---|---|---|---:|---:|");
    for row in &report.cases {
        let (d, u) = first_diff(&row.result);
        let path = row.result.output.as_ref().map_or("-", |o| o.path.as_str());
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} | {:.1} |",
            row.result.name,
            verdict_word(row),
            path,
            d,
            u,
            row.result.time_ms
        );
    }
    oracle_notes(&mut md, report);
    md
}

/// How each case's reference is built: glue-composed cases (no single
/// reference function exists) with the pieces they use, and must-equal
/// outputs declared derived (no perturbable argument reaches them), with
/// why. Grouped, with counts.
fn oracle_notes(md: &mut String, report: &Report) {
    let mut composed: std::collections::BTreeMap<(&str, Vec<String>), usize> = Default::default();
    let mut derived: std::collections::BTreeMap<(&str, &str, &str), usize> = Default::default();
    for row in &report.cases {
        let r = &row.result;
        if !r.glue_composed.is_empty() {
            *composed
                .entry((r.family.as_str(), r.glue_composed.clone()))
                .or_default() += 1;
        }
        for o in r.output.iter().flat_map(|out| &out.outputs) {
            if let Some(why) = &o.derived {
                *derived
                    .entry((r.family.as_str(), o.name.as_str(), why.as_str()))
                    .or_default() += 1;
            }
        }
    }
    let _ = writeln!(
        md,
        "\n## Glue-composed references ({} cases)\n",
        composed.values().sum::<usize>()
    );
    for ((family, pieces), n) in &composed {
        let _ = writeln!(md, "- `{family}` ({n} cases): {}", pieces.join("; "));
    }
    let _ = writeln!(
        md,
        "\n## Derived outputs ({})\n",
        derived.values().sum::<usize>()
    );
    for ((family, output, why), n) in &derived {
        let _ = writeln!(md, "- `{family}` · `{output}` ({n} cases): {why}");
    }
}

/// The top-level fields of two findings that differ (the whole value when
/// either is not an object), rendered compactly.
fn differing_fields(
    cpu: &serde_json::Value,
    now: &serde_json::Value,
) -> Vec<(String, String, String)> {
    let short = |v: Option<&serde_json::Value>| {
        let text = v.map_or("(absent)".to_owned(), |v| v.to_string());
        if text.chars().count() > 160 {
            format!("{}…", text.chars().take(160).collect::<String>())
        } else {
            text
        }
    };
    match (cpu.as_object(), now.as_object()) {
        (Some(a), Some(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .filter(|k| a.get(*k) != b.get(*k))
                .map(|k| (k.clone(), short(a.get(k)), short(b.get(k))))
                .collect()
        }
        _ => vec![("(value)".into(), short(Some(cpu)), short(Some(now)))],
    }
}
