//! `conformance --candidate CMD` and `--export DIR` as a user runs them:
//! the Python `mlx.core` candidate passes its ops and its wrong variant
//! fails with the first differing element; every way a candidate can break
//! the protocol is one clear row and the run ends; exported vectors match
//! their manifest's digests and are the same on a second export.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// The repository root (two levels above this crate).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The reference environment's Python (it has mlx.core).
fn python() -> String {
    root()
        .join(".reference/venv/bin/python")
        .display()
        .to_string()
}

fn conformance(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(args)
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .env("CI", "true")
        .output()
        .expect("the conformance binary starts")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `filter` against `candidate`, reports in a fresh directory.
fn run_candidate(
    candidate: &str,
    filter: &str,
    extra: &[&str],
) -> (Output, Json, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap().to_owned();
    let mut args = vec![
        "--device",
        "cpu",
        "--filter",
        filter,
        "--candidate",
        candidate,
        "--out",
        &out_dir,
    ];
    args.extend_from_slice(extra);
    let out = conformance(&args);
    let report = std::fs::read_to_string(dir.path().join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}): {}", text(&out)));
    (out, serde_json::from_str(&report).unwrap(), dir)
}

fn cases(report: &Json) -> &Vec<Json> {
    report["cases"].as_array().unwrap()
}

/// How many cases `--list --filter filter` names: what a run of that filter
/// must have one row each for (a loop over rows proves nothing when there
/// are none).
fn listed(filter: &str) -> usize {
    let out = conformance(&["--list", "--filter", filter]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let n = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(n > 0, "--filter {filter} lists no case");
    n
}

fn python_candidate(extra: &str) -> String {
    let script = root().join("candidates/python/mlx_core_candidate.py");
    format!("{} {} {extra}", python(), script.display())
}

fn bad(mode: &str) -> String {
    let script = root().join("crates/conformance/tests/candidates/bad_candidate.py");
    format!("{} {} {mode}", python(), script.display())
}

/// Two bf16 2-D RoPE cases: one op each (`rope2d_apply`).
const TWO: &str = "position/rope2d/2d/hd64/bf16";

#[test]
fn the_python_candidate_passes_its_four_ops() {
    for filter in [
        "quantized/linear/affine-4b-gs64",
        "quantized/switch/",
        "position/rope2d/",
        "position/mrope/accepted",
    ] {
        let (out, report, _dir) = run_candidate(&python_candidate(""), filter, &[]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{filter}: {all}");
        let passed = cases(&report)
            .iter()
            .filter(|c| c["verdict"] == "pass")
            .count();
        assert!(passed >= 4, "{filter}: {passed} passed: {all}");
        assert_eq!(cases(&report).len(), listed(filter), "{filter}: {all}");
        for c in cases(&report) {
            let message = c["message"].as_str().unwrap_or_default();
            assert!(
                c["verdict"] == "pass"
                    || message.starts_with("unsupported by the candidate")
                    || message.starts_with("a finding"),
                "{filter}: {c}"
            );
        }
        assert_eq!(
            report["environment"]["candidate"].as_str(),
            Some(python_candidate("").as_str())
        );
    }
}

#[test]
fn the_wrong_python_candidate_fails_with_the_first_differing_element() {
    let (out, report, _dir) = run_candidate(
        &python_candidate("--wrong"),
        "position/rope2d/2d/hd64/",
        &[],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_eq!(cases(&report).len(), listed("position/rope2d/2d/hd64/"));
    for c in cases(&report) {
        let name = c["name"].as_str().unwrap();
        let comparison = &c["output"]["outputs"][0]["comparison"];
        if name.contains("/bf16/") {
            assert_eq!(c["verdict"], "fail", "{c}");
            assert_eq!(comparison["outcome"], "differs", "{c}");
            assert!(comparison["first_index"].is_array(), "{c}");
            assert!(all.contains("first diff"), "{all}");
            // report.json's message names the output, the op and the
            // place in its result, and the first differing element, and
            // calls it the candidate's (before: no message).
            let message = c["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with("output `")
                    && message.contains("(op `rope2d_apply`, result `value`)")
                    && message.contains("first at [")
                    && message.contains(": candidate ")
                    && message.contains("ulp at the output's scale)"),
                "{c}"
            );
        } else {
            assert_eq!(c["verdict"], "pass", "float32 agrees: {c}");
        }
    }
    assert!(
        !all.contains(" port "),
        "a candidate run never says port: {all}"
    );
}

/// The one row of each case in a bad candidate's run.
fn rows(mode: &str, extra: &[&str]) -> (Vec<(String, String)>, Output, Duration) {
    let start = Instant::now();
    let (out, report, _dir) = run_candidate(&bad(mode), TWO, extra);
    let rows = cases(&report)
        .iter()
        .map(|c| {
            (
                c["verdict"].as_str().unwrap().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect::<Vec<_>>();
    assert_eq!(rows.len(), listed(TWO), "one row per case: {}", text(&out));
    (rows, out, start.elapsed())
}

#[test]
fn a_crashing_candidate_is_an_error_row_per_case_and_is_restarted() {
    let (rows, _, _) = rows("crash", &[]);
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error", "{message}");
        assert!(
            message.contains("exited") && message.contains("crashing on purpose"),
            "{message}"
        );
    }
}

#[test]
fn a_candidate_on_another_libmlx_is_an_error_row_naming_both_digests() {
    let (rows, out, _) = rows("other-libmlx", &[]);
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error", "{}", text(&out));
        assert!(
            message.contains("the candidate loaded libmlx")
                && message.contains("not the reference's build")
                && message.matches("(sha256 ").count() == 2,
            "{message}"
        );
    }
}

#[test]
fn a_hanging_candidate_is_killed_at_the_timeout() {
    let (rows, out, took) = rows("hang", &["--candidate-timeout", "2"]);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error", "{}", text(&out));
        assert!(message.contains("no answer within 2 s"), "{message}");
    }
}

#[test]
fn malformed_json_and_stray_stdout_are_error_rows() {
    for mode in ["malformed", "stray-stdout"] {
        let (rows, out, _) = rows(mode, &[]);
        for (verdict, message) in &rows {
            assert_eq!(verdict, "error", "{mode}: {}", text(&out));
            assert!(message.contains("not JSON"), "{mode}: {message}");
        }
    }
}

#[test]
fn a_wrong_dtype_or_shape_fails_saying_which() {
    for (mode, outcome) in [
        ("wrong-dtype", "dtype_mismatch"),
        ("wrong-shape", "shape_mismatch"),
    ] {
        let (out, report, _dir) = run_candidate(&bad(mode), TWO, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert_eq!(cases(&report).len(), listed(TWO), "{mode}");
        for c in cases(&report) {
            assert_eq!(c["verdict"], "fail", "{mode}: {c}");
            assert_eq!(
                c["output"]["outputs"][0]["comparison"]["outcome"], outcome,
                "{mode}: {c}"
            );
        }
    }
}

/// Issue 40, class 14: a candidate answering NaN bits was an ERROR
/// ("could not read" the worker's answer: the NaN went over as `null`),
/// not the FAIL an in-process comparison gives. Now the row is a FAIL
/// naming the first differing element, its value "NaN" (as report.json
/// writes it) and its bits.
#[test]
fn a_nan_answer_fails_with_its_first_differing_element() {
    for extra in [&[][..]] {
        let (out, report, _dir) = run_candidate(&bad("nan"), TWO, extra);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", text(&out));
        assert_eq!(cases(&report).len(), listed(TWO), "{extra:?}");
        for c in cases(&report) {
            assert_eq!(c["verdict"], "fail", "{extra:?}: {c}");
            let comparison = &c["output"]["outputs"][0]["comparison"];
            assert_eq!(comparison["outcome"], "differs", "{extra:?}: {c}");
            assert_eq!(comparison["actual"]["value"], "NaN", "{extra:?}: {c}");
        }
    }
}

/// Issue 40, class 25 (re-check): a zero-length answer where the
/// reference has 65536 elements compared no element. The console said so,
/// but report.md's "Outside the exact bound" table said `flat [0] = NaN vs
/// exact ... (65536 of 65536 outside)` and report.json `worst_index` 0,
/// `worst_value` "NaN" next to `computed_len` 0: each now says what the
/// console says.
#[test]
fn an_empty_answer_names_no_element_in_any_report() {
    let (out, report, dir) = run_candidate(&bad("empty"), "position/rope2d/2d/hd64/f32/B1", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let says = "0 elements where the definition has 65536: no element compared";
    assert!(text(&out).contains(says), "{}", text(&out));
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    let table = markdown
        .split("## Outside the exact bound")
        .nth(1)
        .expect("report.md has the table")
        .split("\n## ")
        .next()
        .unwrap();
    assert!(table.contains(says) && !table.contains("flat ["), "{table}");
    let mut sides = 0;
    for c in cases(&report) {
        let port = &c["output"]["outputs"][0]["exact"]["port"];
        if port.is_object() {
            sides += 1;
            assert_eq!(port["computed_len"], 0, "{port}");
            for key in ["worst_index", "worst_value", "worst_exact", "worst_bound"] {
                assert!(port.get(key).is_none(), "{key}: {port}");
            }
        }
    }
    assert!(sides > 0, "no exact check in report.json: {}", text(&out));
}

/// Issue 40 (re-check): through `cargo xtask conformance` (which runs the
/// runner in the checkout's top level) a relative candidate path resolved
/// from there, while `--cases` etc. resolved from the caller's directory.
/// xtask now names the caller's directory in `MLX_CONFORMANCE_CANDIDATE_CWD`
/// and the candidate command runs there: `cand.py` below exists only in
/// that directory (before: `can't open file ... cand.py`, every row ERROR).
#[test]
fn a_relative_candidate_runs_in_the_directory_xtask_was_called_from() {
    let caller = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("crates/conformance/tests/candidates/bad_candidate.py"),
        caller.path().join("cand.py"),
    )
    .unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--filter", TWO, "--candidate"])
        .arg(format!("{} cand.py nan", python()))
        .arg("--out")
        .arg(out_dir.path())
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .env("CI", "true")
        .env("MLX_CONFORMANCE_CANDIDATE_CWD", caller.path())
        .output()
        .unwrap();
    // The NaN answers FAIL (exit 1); a candidate that did not start is ERROR (3).
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!text(&out).contains("cand.py"), "{}", text(&out));
}

/// Issue 42: a candidate run's words never call the candidate "the port":
/// an answer outside the exact oracle's bound (NaN) is "candidate outside
/// bound" in the console, report.md and junit.xml (junit's test names said
/// "port outside bound").
#[test]
fn a_candidate_outside_the_exact_bound_is_never_called_the_port() {
    let (out, report, dir) = run_candidate(&bad("nan"), TWO, &[]);
    let exact: Vec<&Json> = cases(&report)
        .iter()
        .filter_map(|c| c["output"]["outputs"][0]["exact"].as_object().map(|_| c))
        .collect();
    assert!(
        !exact.is_empty(),
        "the exact oracle checked no output: {}",
        text(&out)
    );
    let junit = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(junit.contains("candidate outside bound"), "{junit}");
    assert!(markdown.contains("candidate outside bound"), "{markdown}");
    // The header names the candidate command (the author's second trial
    // found only report.json did).
    assert!(markdown.contains("> candidate: `"), "{markdown}");
    for (what, words) in [
        ("console", text(&out)),
        ("junit.xml", junit),
        ("report.md", markdown),
    ] {
        let said = words.to_lowercase();
        assert!(
            !said.contains(" port ") && !said.contains("port outside") && !said.contains("port's"),
            "{what} says port: {words}"
        );
    }
}

/// Issue 40, class 15: a candidate returning the wrong kind of value was
/// "harness error: compared no output"; the recorded reason is the row's.
#[test]
fn a_wrong_kind_of_value_is_the_candidates_error_with_its_reason() {
    let (rows, out, _) = rows("wrong-kind", &[]);
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error", "{}", text(&out));
        assert!(
            message.contains("an int") && !message.contains("compared no output"),
            "{message}"
        );
    }
}

/// Issue 40, classes 12 and 13: one stderr line that is not UTF-8 closed
/// the relay (the candidate then died of SIGPIPE on its next write, and a
/// case became a crash), and a 100 MB message was copied into every report.
#[test]
fn a_noisy_candidate_is_relayed_and_its_huge_message_clipped() {
    let (rows, out, _) = rows("noisy", &[]);
    for (verdict, message) in &rows {
        assert_eq!(
            verdict,
            "error",
            "{}",
            &text(&out)[..2000.min(text(&out).len())]
        );
        assert!(
            message.contains("noisy") && !message.contains("exited"),
            "{}",
            &message[..500.min(message.len())]
        );
        assert!(message.contains("more bytes dropped") && message.len() < 70_000);
    }
}

/// Issue 40, round 4b: a candidate's message (and its stderr) reached the
/// terminal and report.md with its control characters raw: escape
/// sequences that set the terminal's title, clear the screen or colour
/// what follows, and NULs. They are now written escaped (`\u{1b}`).
#[test]
fn a_candidates_control_characters_reach_no_terminal_or_report_raw() {
    let (out, report, dir) = run_candidate(&bad("control-chars"), TWO, &[]);
    let rows = cases(&report);
    assert_eq!(rows.len(), listed(TWO), "{}", text(&out));
    for c in rows {
        assert_eq!(c["verdict"], "error", "{c}");
        let m = c["message"].as_str().unwrap();
        assert!(m.contains("red") && m.contains("\\u{1b}"), "{m}");
    }
    let printed = [&out.stdout[..], &out.stderr[..]].concat();
    let md = std::fs::read(dir.path().join("report.md")).unwrap();
    for (what, bytes) in [("output", &printed), ("report.md", &md)] {
        assert!(
            !bytes
                .iter()
                .any(|b| *b == 0x1b || *b == 0 || *b == 0x07 || *b == 0x08),
            "{what} holds a raw control character: {}",
            String::from_utf8_lossy(bytes).escape_debug()
        );
    }
}

/// Issue 40, class 13 (names): a candidate's name goes into every row
/// message; a 1 MiB one is clipped, saying how much was dropped.
#[test]
fn a_huge_candidate_name_is_clipped_in_the_rows() {
    let (rows, out, _) = rows("long-name", &[]);
    for (verdict, message) in &rows {
        assert_eq!(
            verdict,
            "skip",
            "{}",
            &text(&out)[..500.min(text(&out).len())]
        );
        assert!(
            message.contains("does not implement") && message.contains("more bytes dropped"),
            "{}",
            &message[..300.min(message.len())]
        );
        assert!(message.len() < 1000, "{} bytes", message.len());
    }
}

#[test]
fn an_unsupported_op_is_a_skip_row_with_the_reason() {
    let (rows, out, _) = rows("unsupported", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for (verdict, message) in &rows {
        assert_eq!(verdict, "skip");
        assert!(
            message.contains("does not implement op `rope2d_apply`"),
            "{message}"
        );
        // Every op the case calls that the candidate lacks, in one row.
        assert!(
            message.contains("the case calls 1 op(s) it lacks: `rope2d_apply` v1"),
            "{message}"
        );
    }
}

#[test]
fn a_candidate_raising_where_the_reference_computes_is_the_ports_error() {
    let (rows, _, _) = rows("raises", &[]);
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error");
        assert!(
            message.contains("the candidate raised where the reference computed")
                && message.contains("refuses everything")
                && !message.contains("port"),
            "{message}"
        );
        // It names the op the author serves, not the glue function behind
        // it (it said "op of `position_rope2d`").
        assert!(
            message.contains("op `rope2d_apply`") && !message.contains("position_rope2d"),
            "{message}"
        );
    }
}

#[test]
fn a_candidate_run_refuses_to_accept_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args([
            "--device",
            "cpu",
            "--filter",
            TWO,
            "--fixtures",
            "accept",
            "--candidate",
            "true",
        ])
        .arg("--out")
        .arg(dir.path())
        .env_remove("CI")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("--candidate runs never write snapshots"),
        "{}",
        text(&out)
    );
}

/// Every output's bits in the exported files match the manifest's sha256,
/// and a second export writes the same bytes.
#[test]
fn exported_vectors_match_their_digests_and_are_deterministic() {
    let filter = "quantized/linear/affine-4b-gs64/bf16";
    let export = |dir: &Path| {
        let out = conformance(&[
            "--device",
            "cpu",
            "--filter",
            filter,
            "--export",
            dir.to_str().unwrap(),
            "--out",
            dir.join("report").to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    export(a.path());
    export(b.path());
    let manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(a.path().join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["schema_version"], 1);
    for key in ["backend", "device", "mlx_version", "lock_sha256"] {
        assert!(
            manifest["environment"][key].is_string(),
            "{key}: {manifest}"
        );
    }
    let list = conformance(&["--list", "--filter", filter]);
    let must_equal = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.contains("MustEqual"))
        .count();
    let exported = manifest["cases"].as_array().unwrap();
    assert_eq!(
        exported.len(),
        must_equal,
        "every must-equal case is exported"
    );
    for case in exported {
        for call in case["calls"].as_array().unwrap() {
            assert!(call["op"].is_string() && call["version"] == 1, "{call}");
            let file = call["file"].as_str().unwrap();
            let bytes = std::fs::read(a.path().join(file)).unwrap();
            assert_eq!(
                bytes,
                std::fs::read(b.path().join(file)).unwrap(),
                "{file} differs between exports"
            );
            let tensors = conformance::kept::read_file(&a.path().join(file)).unwrap();
            let digests = call["output_sha256"].as_object().unwrap();
            assert!(!digests.is_empty(), "{call}");
            for (key, digest) in digests {
                let t = &tensors
                    .iter()
                    .find(|(k, _)| *k == format!("outputs/{key}"))
                    .unwrap()
                    .1;
                assert_eq!(
                    conformance::case::digest_of(t),
                    digest.as_str().unwrap(),
                    "{file} {key}"
                );
            }
        }
    }
    assert_eq!(
        std::fs::read(a.path().join("manifest.json")).unwrap(),
        std::fs::read(b.path().join("manifest.json")).unwrap(),
        "the manifest is the same on a second export"
    );

    // The runner's own verifier agrees, and sees one flipped bit.
    let report = a.path().join("report/report.json");
    let out = conformance(&[
        "--verify-export",
        a.path().to_str().unwrap(),
        "--verify-against",
        report.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("every must-equal case of the report is in it"),
        "{}",
        text(&out)
    );
    let file = exported[0]["calls"][0]["file"].as_str().unwrap();
    let mut bytes = std::fs::read(b.path().join(file)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(b.path().join(file), bytes).unwrap();
    let out = conformance(&["--verify-export", b.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{file}: its sha256 is not the manifest's file_sha256"
        )),
        "{}",
        text(&out)
    );
    // An unreadable report to verify against is a usage error too.
    let out = conformance(&[
        "--verify-export",
        a.path().to_str().unwrap(),
        "--verify-against",
        a.path().join("no-such-report.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("no-such-report.json"), "{}", text(&out));
    // A directory that holds no export is a usage error, said so.
    let empty = tempfile::tempdir().unwrap();
    let out = conformance(&["--verify-export", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("--verify-export: ") && text(&out).contains("manifest.json"),
        "{}",
        text(&out)
    );
}

/// docs/ops.md is what the vocabulary generates, and each op's inputs are
/// its glue function's parameters, in order.
#[test]
fn the_op_vocabulary_document_is_current_and_matches_the_glue() {
    let doc = std::fs::read_to_string(root().join("docs/ops.md")).unwrap();
    assert!(
        doc == conformance::candidate::ops::markdown(),
        "docs/ops.md is stale: run `cargo xtask ops-doc`"
    );
    let glue_dir = root().join("crates/oracle/python/reference_glue");
    let mut sources = String::new();
    for entry in std::fs::read_dir(glue_dir).unwrap() {
        sources += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
    }
    for op in conformance::candidate::ops::OPS {
        let start = sources
            .find(&format!("\ndef {}(", op.glue))
            .unwrap_or_else(|| panic!("no glue function {}", op.glue));
        let rest = &sources[start + 5 + op.glue.len() + 1..];
        let params: Vec<String> = rest[..rest.find("):").unwrap()]
            .split(',')
            .map(|p| p.split('=').next().unwrap().trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        let inputs: Vec<&str> = op.inputs.iter().map(|i| i.name).collect();
        assert_eq!(params, inputs, "op {} vs glue {}", op.name, op.glue);
    }
}

/// The self-test's comparison (`--same-verdicts-as`) can fail: the port
/// candidate gets the linked run's verdicts, the wrong Python candidate's
/// FAILs are listed as differing, and an op a candidate does not serve
/// fails it too.
#[test]
fn same_verdicts_as_fails_on_a_differing_verdict_or_an_unsupported_op() {
    let filter = "position/rope2d/2d/hd64/";
    let linked = tempfile::tempdir().unwrap();
    let out = conformance(&[
        "--device",
        "cpu",
        "--filter",
        filter,
        "--out",
        linked.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = linked.path().join("report.json");
    let same = ["--same-verdicts-as", report.to_str().unwrap()];

    let port = env!("CARGO_BIN_EXE_conformance-port-candidate");
    let (out, _, _dir) = run_candidate(port, filter, &same);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("0 unsupported by the candidate, 0 differ"),
        "{}",
        text(&out)
    );

    let (out, _, _dir) = run_candidate(&python_candidate("--wrong"), filter, &same);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("differs: position/rope2d/2d/hd64/bf16"),
        "{}",
        text(&out)
    );

    let (out, _, _dir) = run_candidate(&bad("unsupported"), filter, &same);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("  unsupported: position/rope2d/2d/hd64/"),
        "{}",
        text(&out)
    );
}

/// Issue 40, classes 2, 3, 6 and 17 on `--export` / `--verify-export`:
/// an export into a directory it did not make deleted its `vectors/`,
/// `cases/` and `manifest.json`; two exports at once deleted each other's
/// vectors; the verifier read outside the export, read `/dev/zero` without
/// limit, hung on a FIFO, aborted on a huge manifest, and passed an empty
/// manifest, a stripped one and one of another seed.
#[test]
fn exports_own_their_directory_and_the_verifier_is_honest() {
    use std::os::unix::ffi::OsStrExt;
    let filter = "quantized/linear/affine-4b-gs64/bf16";
    let export_cmd = |dir: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_conformance"));
        c.args(["--device", "cpu", "--filter", filter, "--export"])
            .arg(dir)
            .arg("--out")
            .arg(dir.join("report"))
            .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
            .env("CI", "true");
        // SAFETY: umask is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                libc::umask(0o022);
                Ok(())
            });
        }
        c
    };
    let root = tempfile::tempdir().unwrap();
    // A user's directory holding names an export writes: refused, intact.
    let user = root.path().join("user");
    std::fs::create_dir_all(user.join("vectors")).unwrap();
    std::fs::write(user.join("vectors/mine.txt"), "mine").unwrap();
    std::fs::write(user.join("manifest.json"), "{}").unwrap();
    let out = export_cmd(&user).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains(".mlx-conformance-owned"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(user.join("vectors/mine.txt")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(user.join("manifest.json")).unwrap(),
        "{}"
    );

    // Two exports into one directory at once: the second is refused while
    // the first holds it, and the first's export is whole.
    let a = root.path().join("a");
    let first = export_cmd(&a)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !a.join(".mlx-conformance-owned").exists() && started.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = export_cmd(&a).output().unwrap();
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(second.status.code(), Some(3), "{}", text(&second));
    assert!(text(&second).contains("another run"), "{}", text(&second));
    let report = a.join("report/report.json");
    let verify = |dir: &Path, against: bool| {
        let mut args = vec!["--verify-export".to_owned(), dir.display().to_string()];
        if against {
            args.extend(["--verify-against".to_owned(), report.display().to_string()]);
        }
        let started = Instant::now();
        let out = conformance(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(started.elapsed() < Duration::from_secs(30), "no hang");
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
        out
    };
    assert_eq!(verify(&a, true).status.code(), Some(0));
    // Class 24: the files follow the umask (they were 0600 whatever it was).
    use std::os::unix::fs::PermissionsExt;
    let case_dir = std::fs::read_dir(a.join("vectors"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for f in std::fs::read_dir(case_dir).unwrap() {
        let mode = f.unwrap().metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "a vector under umask 022");
    }
    // The same export again into its own directory: accepted (its marker).
    assert_eq!(export_cmd(&a).output().unwrap().status.code(), Some(0));

    let manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(a.join("manifest.json")).unwrap()).unwrap();
    let forged = |name: &str, change: &dyn Fn(&mut Json)| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(a.join("vectors"), dir.join("vectors")).unwrap_or(());
        let mut m = manifest.clone();
        change(&mut m);
        std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
        dir
    };
    let empty = forged("empty", &|m| m["cases"] = serde_json::json!([]));
    let out = verify(&empty, false);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("lists no cases"), "{}", text(&out));
    let not_list = forged("notlist", &|m| m["cases"] = serde_json::json!({"a": 1}));
    assert_eq!(verify(&not_list, false).status.code(), Some(3));
    let stripped = forged("stripped", &|m| {
        for c in m["cases"].as_array_mut().unwrap() {
            c["calls"] = serde_json::json!([]);
        }
    });
    let out = verify(&stripped, true);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("lists no reference calls"),
        "{}",
        text(&out)
    );
    // Not also a misleading "calls ops  but docs/ops.md lists ... (run
    // `cargo xtask ops-doc`)": the calls were stripped, the doc is right.
    assert!(!text(&out).contains("docs/ops.md lists"), "{}", text(&out));
    let other_seed = forged("seed", &|m| m["seed"] = serde_json::json!(5));
    let out = verify(&other_seed, true);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("seed 5"), "{}", text(&out));
    // Files outside the export, a device, a FIFO: problems, never read.
    let outside = forged("outside", &|m| {
        let calls = m["cases"][0]["calls"].as_array_mut().unwrap();
        calls[0]["file"] = serde_json::json!("../a/manifest.json");
        let last = calls.len() - 1;
        calls[last]["file"] = serde_json::json!("/etc/hostname");
    });
    let out = verify(&outside, false);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("outside"), "{}", text(&out));
    let zero = forged("zero", &|m| {
        m["cases"][0]["calls"][0]["file"] = serde_json::json!("zero");
    });
    std::os::unix::fs::symlink("/dev/zero", zero.join("zero")).unwrap();
    assert_eq!(verify(&zero, false).status.code(), Some(1));
    let special = forged("special", &|m| {
        m["cases"][0]["calls"][0]["file"] = serde_json::json!("fifo");
    });
    let fifo = std::ffi::CString::new(special.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let out = verify(&special, false);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FIFO"), "{}", text(&out));
    // The manifest itself a FIFO, or of 1 GiB: refused unread, exit 3.
    let fifo_dir = root.path().join("fifo-manifest");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let m = std::ffi::CString::new(fifo_dir.join("manifest.json").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(m.as_ptr(), 0o644) }, 0);
    assert_eq!(verify(&fifo_dir, false).status.code(), Some(3));
    let huge = root.path().join("huge");
    std::fs::create_dir_all(&huge).unwrap();
    std::fs::File::create(huge.join("manifest.json"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = verify(&huge, false);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

/// Whether every pid listed in `file` is gone (or a zombie nobody needs)
/// within 10 s.
fn all_gone(file: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let pids: Vec<&str> = text.lines().collect();
    if pids.is_empty() {
        return Err("no pid recorded".into());
    }
    let started = Instant::now();
    loop {
        let alive: Vec<&str> = pids
            .iter()
            .copied()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    s.rfind(')')
                        .and_then(|i| s[i + 1..].split_whitespace().next())
                        .is_some_and(|state| state != "Z" && state != "X")
                })
            })
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            // Leave nothing behind for the next test either.
            for pid in &alive {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            return Err(format!("still running: {alive:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 40, classes 7, 8 and 9: a candidate busy when its worker was
/// killed (the case timeout) was left running, re-parented to init; one
/// that closed its stdout and ran on blocked past --candidate-timeout and
/// was orphaned; one that exited orphaned the child in its group, and a
/// grandchild in its own session escaped the group kill. Now nothing a
/// candidate starts outlives its worker, and the timeout holds.
#[cfg(target_os = "linux")]
#[test]
fn nothing_a_candidate_starts_outlives_its_worker() {
    let dir = tempfile::tempdir().unwrap();
    let with_pids = |mode: &str, name: &str| {
        let file = dir.path().join(name);
        (
            format!("BAD_CANDIDATE_PIDS={} {}", file.display(), bad(mode)),
            file,
        )
    };
    // Exits, leaving a child in its group and a detached grandchild.
    let (cmd, pids) = with_pids("orphans", "orphans");
    let (out, report, _d) = run_candidate(&cmd, TWO, &[]);
    for c in cases(&report) {
        assert_eq!(c["verdict"], "error", "{}", text(&out));
        assert!(c["message"].as_str().unwrap().contains("exited"), "{c}");
    }
    all_gone(&pids).unwrap();
    // Closes its stdout and runs on: ended at --candidate-timeout.
    let (cmd, pids) = with_pids("close-stdout", "closed");
    let started = Instant::now();
    let (out, report, _d) = run_candidate(&cmd, TWO, &["--candidate-timeout", "2"]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    for c in cases(&report) {
        assert_eq!(c["verdict"], "error", "{}", text(&out));
        // Whether its stdout's end reaches the runner (`sh` may hold a
        // copy), the wait ends at --candidate-timeout.
        let m = c["message"].as_str().unwrap();
        assert!(
            m.contains("closed its stdout") || m.contains("no answer within 2 s"),
            "{c}"
        );
    }
    all_gone(&pids).unwrap();
    // Kills its own launcher, then hangs (ignoring SIGTERM, a detached
    // child): its worker adopted both, and ends them at the timeout.
    let (cmd, pids) = with_pids("kill-launcher", "killer");
    let (out, report, _d) = run_candidate(&cmd, TWO, &["--candidate-timeout", "2"]);
    for c in cases(&report) {
        assert_eq!(c["verdict"], "error", "{}", text(&out));
    }
    all_gone(&pids).unwrap();
    // Busy (ignoring SIGTERM, a detached grandchild) when the case timeout
    // kills its worker.
    let (cmd, pids) = with_pids("busy", "busy");
    let (out, report, _d) = run_candidate(
        &cmd,
        TWO,
        &["--case-timeout", "3", "--candidate-timeout", "600"],
    );
    for c in cases(&report) {
        assert_eq!(c["verdict"], "error", "{}", text(&out));
    }
    all_gone(&pids).unwrap();
}

/// Issue 40, round 4b: `--export DIR --perturb` wrote the perturbed
/// reference's results as golden vectors, in a manifest that looked like
/// any other and verified (even against the unperturbed run's report).
/// The combination is refused before any case; nothing is written.
#[test]
fn an_export_of_a_perturbed_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("vectors");
    let out = conformance(&[
        "--device",
        "cpu",
        "--filter",
        TWO,
        "--perturb",
        "--no-snapshots",
        "--export",
        export.to_str().unwrap(),
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(
        all.contains("--export") && all.contains("--perturb"),
        "{all}"
    );
    assert!(!export.join("manifest.json").exists(), "{all}");
    // Nor does an export verify against a --perturb run's report (before:
    // "every must-equal case of the report is in it", exit 0).
    let reports = dir.path().join("perturbed");
    let perturbed = conformance(&[
        "--device",
        "cpu",
        "--filter",
        TWO,
        "--perturb",
        "--no-snapshots",
        "--out",
        reports.to_str().unwrap(),
    ]);
    assert!(reports.join("report.json").exists(), "{}", text(&perturbed));
    let made = conformance(&[
        "--device",
        "cpu",
        "--filter",
        TWO,
        "--export",
        export.to_str().unwrap(),
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    let verified = conformance(&[
        "--verify-export",
        export.to_str().unwrap(),
        "--verify-against",
        reports.join("report.json").to_str().unwrap(),
    ]);
    let all = text(&verified);
    assert_eq!(verified.status.code(), Some(1), "{all}");
    assert!(all.contains("--perturb"), "{all}");
}

/// The pid of the process whose command line holds every one of `words`.
#[cfg(target_os = "linux")]
fn pid_running(words: &[&str]) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            words.iter().all(|w| cmdline.contains(w)).then_some(pid)
        })
}

/// Every process below `pid` (children, theirs, ...).
#[cfg(target_os = "linux")]
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid = stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The scratch directories left in `tmp`.
fn scratch_dirs(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("conformance-candidate-"))
        .collect()
}

/// Issue 40: a SIGKILL of both a candidate's launcher and its worker left
/// the candidate's scratch directory (with its inputs) in $TMPDIR for
/// good, and the candidate's own processes (`sh -c` forks the program,
/// which has no parent-death signal) running under init. The directory's
/// name and the candidate's environment now record their owner, and the
/// next candidate started removes and ends what owners that are gone left.
#[cfg(target_os = "linux")]
#[test]
fn a_scratch_dir_left_by_a_killed_worker_and_launcher_is_reclaimed_by_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().to_str().unwrap().to_owned();
    let reports = tempfile::tempdir().unwrap();
    let run = |candidate: &str| {
        Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(["--device", "cpu", "--jobs", "1", "--filter", TWO])
            .args(["--candidate", candidate, "--candidate-timeout", "600"])
            .arg("--out")
            .arg(reports.path())
            .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
            .env("CI", "true")
            .env("TMPDIR", &tmp_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // A candidate that never answers: its launcher is found by the
    // scratch directory in its command line.
    let mut first = run(&bad("hang"));
    let started = Instant::now();
    let launcher = loop {
        if let Some(pid) = pid_running(&["--candidate-launcher", &tmp_path]) {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no launcher started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The candidate itself (the Python program below `sh -c`), once it
    // has a call (its inputs are in the scratch directory): it hangs in
    // the call, where it would have ended at the end of its stdin.
    let candidate = loop {
        let called = scratch_dirs(tmp.path()).iter().any(|d| {
            std::fs::read_dir(tmp.path().join(d)).is_ok_and(|mut e| {
                e.any(|f| {
                    f.is_ok_and(|f| f.file_name().to_string_lossy().ends_with(".in.safetensors"))
                })
            })
        });
        let below = descendants(launcher);
        if called && below.len() >= 2 {
            break below;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the candidate did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stat = std::fs::read_to_string(format!("/proc/{launcher}/stat")).unwrap();
    let worker: i32 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    // Both stopped first, so that no parent's death lets them clean up,
    // then the runner (no new worker starts) and both killed: nobody is
    // left to remove the directory.
    unsafe {
        libc::kill(launcher, libc::SIGSTOP);
        libc::kill(worker, libc::SIGSTOP);
    }
    let _ = first.kill();
    let _ = first.wait();
    unsafe {
        libc::kill(worker, libc::SIGKILL);
        libc::kill(launcher, libc::SIGKILL);
    }
    std::thread::sleep(Duration::from_millis(500));
    let left = scratch_dirs(tmp.path());
    assert!(!left.is_empty(), "the kill left no scratch directory");
    // A later run of a candidate (one that serves nothing: quick).
    let mut second = run(&bad("unsupported"));
    let status = second.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let now = scratch_dirs(tmp.path());
    assert!(
        left.iter().all(|d| !now.contains(d)),
        "still there: {now:?} (left by the kill: {left:?})"
    );
    let pids = tmp.path().join("candidate.pids");
    let list: String = candidate.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(&pids, list).unwrap();
    all_gone(&pids).unwrap();
}

/// Issue 40, round 4b: a candidate that never completes its hello (it
/// hangs, or its command is not found) was started again for every case,
/// each waiting out `--candidate-timeout` (default 60 s: hours for the
/// default suite); `--candidate ""` ran every case as an ERROR saying the
/// candidate "exited without answering". Now a worker stops starting a
/// candidate whose last two starts failed (each later case is an ERROR
/// at once, quoting the failure), and an empty command is refused before
/// any case.
#[test]
fn a_candidate_that_never_starts_is_not_started_again_for_every_case() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let cmd = format!("echo start >> '{}'; exec sleep 100", starts.display());
    let filter = "position/rope2d/2d/hd64";
    let n = listed(filter);
    assert!(n > 2, "{filter} lists {n} cases");
    let (out, report, _d) =
        run_candidate(&cmd, filter, &["--jobs", "1", "--candidate-timeout", "1"]);
    let rows = cases(&report);
    assert_eq!(rows.len(), n, "{}", text(&out));
    for c in rows {
        assert_eq!(c["verdict"], "error", "{c}");
    }
    let started = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert_eq!(
        started,
        2,
        "starts: {started} for {n} cases: {}",
        text(&out)
    );
    let last = rows[n - 1]["message"].as_str().unwrap();
    assert!(
        last.contains("not started again") && last.contains("no answer within 1 s"),
        "{last}"
    );
    // Round 4b: `--candidate-timeout 0` silently meant 1 s (where
    // `--case-timeout 0` means no limit): every slower answer an ERROR.
    let out = conformance(&[
        "--device",
        "cpu",
        "--filter",
        filter,
        "--candidate",
        &cmd,
        "--candidate-timeout",
        "0",
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(
        all.contains("--candidate-timeout") && all.contains("at least 1"),
        "{all}"
    );
    assert!(!all.contains("ERROR "), "refused before any case: {all}");
    for empty in ["", "  "] {
        let out = conformance(&["--device", "cpu", "--filter", filter, "--candidate", empty]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{all}");
        assert!(all.contains("--candidate"), "{all}");
        assert!(!all.contains("ERROR "), "refused before any case: {all}");
    }
}

/// Issue 40, class 19: a missing `--same-verdicts-as` file was reported
/// only after the whole run, and a FIFO there hung the run (ignoring
/// SIGTERM). Both are refused before any case now.
#[test]
fn same_verdicts_as_is_checked_before_any_case() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.json");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let candidate = python_candidate("");
    for path in [dir.path().join("missing.json"), fifo] {
        let started = Instant::now();
        let out = conformance(&[
            "--device",
            "cpu",
            "--filter",
            TWO,
            "--candidate",
            &candidate,
            "--same-verdicts-as",
            path.to_str().unwrap(),
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ]);
        assert!(started.elapsed() < Duration::from_secs(30), "no hang");
        assert_eq!(out.status.code(), Some(3), "{}", text(&out));
        assert!(text(&out).contains("--same-verdicts-as"), "{}", text(&out));
        assert!(
            !text(&out).contains("passed"),
            "no case ran: {}",
            text(&out)
        );
    }
    // Round 4b: a report of another seed or a --perturb run was compared
    // as if it were this run's ("4 same"); now refused before any case.
    for (extra, why) in [
        (["--seed", "7"], "seed 7"),
        (["--perturb", "--no-snapshots"], "--perturb"),
    ] {
        let linked = dir
            .path()
            .join(format!("linked-{}", extra[0].trim_start_matches('-')));
        let mut args = vec![
            "--device",
            "cpu",
            "--filter",
            TWO,
            "--out",
            linked.to_str().unwrap(),
        ];
        args.extend(extra);
        let first = conformance(&args);
        assert!(linked.join("report.json").exists(), "{}", text(&first));
        let out = conformance(&[
            "--device",
            "cpu",
            "--filter",
            TWO,
            "--candidate",
            &candidate,
            "--same-verdicts-as",
            linked.join("report.json").to_str().unwrap(),
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{all}");
        assert!(
            all.contains("--same-verdicts-as") && all.contains(why),
            "{all}"
        );
        assert!(!all.contains("passed"), "no case ran: {all}");
    }
}

/// docs/ops.md is generated from what the cases send and compare
/// (docs/ops.json, from a whole export): an export of the mRoPE prompt
/// cases checks against it, its manifest says which result places each
/// case compared (mRoPE's `rope_deltas`, `inv_freq` and
/// `position_selector` too), and the check fails when a call returns and
/// compares an output the doc does not list.
#[test]
fn the_ops_doc_lists_what_the_cases_send_and_compare() {
    let filter = "position/mrope/qwen3.5/bf16/text-L24";
    let dir = tempfile::tempdir().unwrap();
    let out = conformance(&[
        "--device",
        "cpu",
        "--filter",
        filter,
        "--export",
        dir.path().to_str().unwrap(),
        "--out",
        dir.path().join("report").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let verify = || conformance(&["--verify-export", dir.path().to_str().unwrap()]);
    let out = verify();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let path = dir.path().join("manifest.json");
    let mut manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let call = &mut manifest["cases"][0]["calls"][0];
    assert_eq!(call["op"], "mrope_prefill", "{call}");
    for place in ["q", "k", "rope_deltas", "inv_freq", "position_selector"] {
        assert!(
            call["compared"][place].is_array(),
            "{place}: {}",
            call["compared"]
        );
    }
    assert!(
        call["types"]["inputs/q"]
            .as_str()
            .unwrap()
            .starts_with("array "),
        "{}",
        call["types"]
    );
    // An output the doc does not list, returned and compared: the check fails.
    call["types"]["outputs/undocumented"] = Json::from("array float32 [4]");
    call["compared"]["undocumented"] = serde_json::json!(["extra"]);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
    let out = verify();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("op `mrope_prefill`: output `undocumented` is not in docs/ops.md"),
        "{}",
        text(&out)
    );
}

/// A candidate may leave out a result place docs/ops.md marks internal
/// (mrope_apply's `inv_freq`, `position_selector`, `path`): the case
/// compares the observable ones, passes, and its row says what was not
/// compared. (Before: ERROR "the candidate's `(the result)` has no key
/// `inv_freq`".)
#[test]
fn a_candidate_may_omit_internal_outputs_and_the_row_says_so() {
    let filter = "position/mrope/accepted";
    let (out, report, _dir) = run_candidate(&python_candidate("--observable-only"), filter, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let rows = cases(&report);
    assert_eq!(rows.len(), listed(filter), "{all}");
    let mut passed = 0;
    for c in rows {
        if c["verdict"] != "pass" {
            continue;
        }
        passed += 1;
        let outputs: Vec<&str> = c["output"]["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert!(outputs.contains(&"q") && outputs.contains(&"k"), "{c}");
        let skipped = c["output"]["not_compared"].to_string();
        for place in ["inv_freq", "position_selector"] {
            assert!(skipped.contains(place), "{place}: {c}");
        }
    }
    assert!(passed >= 4, "{passed} passed: {all}");
}

/// Each case's ops: `--describe` lines carry them (and `--cases` reads the
/// lines back), `--list --ops all` prints them, and `--ops LIST` selects
/// the must-equal cases whose every op is in the list.
#[test]
fn describe_and_list_give_each_cases_ops_and_ops_selects_what_a_candidate_serves() {
    let out = conformance(&["--describe", "--filter", TWO]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!lines.trim().is_empty());
    for line in lines.lines() {
        let d: Json = serde_json::from_str(line).unwrap();
        assert_eq!(d["ops"], serde_json::json!(["rope2d_apply"]), "{line}");
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &lines).unwrap();
    let back = conformance(&["--cases", file.path().to_str().unwrap(), "--list"]);
    assert_eq!(back.status.code(), Some(0), "{}", text(&back));
    let out = conformance(&["--list", "--ops", "all", "--filter", "position/"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listed.lines().all(|l| l.contains(" ops: ")), "{listed}");
    assert!(listed.contains(" ops: mrope_prefill"), "{listed}");
    let out = conformance(&["--list", "--ops", "rope2d_apply,mrope_apply"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let served = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        served.contains("position/rope2d/") && served.contains("position/mrope/accepted/"),
        "{served}"
    );
    for l in served.lines() {
        let ops = l.split(" ops: ").nth(1).unwrap_or("");
        assert!(
            ops.split(',')
                .all(|op| op == "rope2d_apply" || op == "mrope_apply"),
            "{l}"
        );
    }
    let out = conformance(&["--list", "--ops", "no_such_op"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("`no_such_op` is no op"),
        "{}",
        text(&out)
    );
}

/// A refusal the candidate's hello declares (op and a condition its
/// message contains) is a finding row where the reference computes,
/// listed in report.md; a raise its policy does not cover stays an ERROR.
#[test]
fn a_declared_refusal_is_a_finding_row_and_an_undeclared_one_an_error() {
    let (out, report, dir) = run_candidate(&bad("refuses-by-policy"), TWO, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let found = cases(&report);
    assert_eq!(found.len(), listed(TWO));
    for c in found {
        assert_eq!(c["verdict"], "finding", "{c}");
        assert_eq!(c["error_kind"], "policy", "{c}");
        let m = c["message"].as_str().unwrap();
        assert!(
            m.contains("the candidate refuses by policy")
                && m.contains("\"no 2-D RoPE on this engine\" on op `rope2d_apply`"),
            "{m}"
        );
    }
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    let heading = format!("## Refused by the candidate's policy ({})", listed(TWO));
    assert!(md.contains(&heading), "{md}");
    let (rows, _, _) = rows("refuses-off-policy", &[]);
    for (verdict, message) in &rows {
        assert_eq!(verdict, "error", "{message}");
        assert!(
            message.contains("the candidate raised where the reference computed"),
            "{message}"
        );
    }
    // Round 4b: a blank condition (contained in every message with a
    // space) turned every raise into a finding, exit 0; it is refused at
    // the hello like an empty one.
    let (blank, out, _) = self::rows("refuses-blank-policy", &[]);
    for (verdict, message) in &blank {
        assert_eq!(verdict, "error", "{message}: {}", text(&out));
        assert!(message.contains("`refusals`"), "{message}");
    }
}

/// Where both sides refuse (`position/rope2d/refused/`), report.md's
/// "Refusals" section shows the candidate's own message labelled candidate
/// (never this repository's port's), and report.json's row message holds it
/// (the finding stays the snapshot's, `port` the linked port's message).
#[test]
fn a_refusal_row_shows_the_candidates_own_message() {
    const REFUSED: &str = "position/rope2d/refused/";
    let (out, report, dir) = run_candidate(&bad("raises"), REFUSED, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let found = cases(&report);
    assert_eq!(found.len(), listed(REFUSED));
    let theirs = "ValueError: this candidate refuses everything";
    for c in found {
        assert_eq!(c["verdict"], "pass", "{c}");
        let said = c["message"].as_str().unwrap_or_default();
        assert_eq!(
            said,
            format!("the candidate refused too: op `rope2d_apply`: {theirs}"),
            "{c}"
        );
        assert!(
            c["output"]["finding"]["reference"].as_str().is_some(),
            "{c}"
        );
    }
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    let section = md
        .split("## Refusals (")
        .nth(1)
        .unwrap_or_else(|| panic!("no Refusals section: {md}"));
    let lines: Vec<&str> = section.lines().filter(|l| l.starts_with("- `")).collect();
    assert_eq!(lines.len(), listed(REFUSED), "{section}");
    for line in lines {
        assert!(
            line.contains(&format!("candidate: op `rope2d_apply`: {theirs}")),
            "{line}"
        );
    }
}
