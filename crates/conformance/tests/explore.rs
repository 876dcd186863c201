//! The explorer end to end on the CPU: a planted port fault
//! (`MLX_CONFORMANCE_PLANT`) is found, shrunk to its minimal description,
//! written with a reproducer, kept, and then fails as an ordinary case;
//! the same seed draws the same samples; shards merge into the whole.
//!
//! Budgets are small on purpose (CI's time): each search's seed and sample
//! count are the fewest that still draw a sample in the planted region
//! (far from the minimal shape, so the shrink has its whole way to go) and
//! that keep the explorer's expensive shapes (long KV windows) out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PLANT: &str = "quantized/linear:m>=3,n%2==1";

fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("conformance-explore-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn explore(out: &Path, fixtures: &Path, extra: &[&str], plant: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance-explore"));
    cmd.args([
        "--seed",
        "7",
        "--budget",
        "10m",
        "--family",
        "quantized/linear",
        "--out",
    ])
    .arg(out)
    .args(extra)
    // --keep refuses under CI=true; these runs keep into a scratch copy.
    .env_remove("CI")
    .env("MLX_CONFORMANCE_FIXTURES", fixtures);
    if plant {
        cmd.env("MLX_CONFORMANCE_PLANT", PLANT);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_planted_violation_is_shrunk_kept_and_then_fails_as_a_case() {
    let root = scratch("plant");
    let fixtures = root.join("fixtures");
    let out = explore(
        &root.join("out"),
        &fixtures,
        &["--samples", "10", "--keep", "--shrink-steps", "400"],
        true,
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let search = json(&root.join("out/explore.json"));
    let bits: Vec<&serde_json::Value> = search["found"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "bits")
        .collect();
    assert_eq!(
        bits.len(),
        1,
        "one planted region, one shrunk violation: {all}"
    );
    let minimal = &bits[0]["minimal"]["shape"];
    // The search drew it elsewhere: the shrink did the work.
    assert_ne!(&bits[0]["original"]["shape"], minimal, "{all}");
    // The smallest description the plant still covers: M 3, N 1, one
    // group of the first spec, no batch, no bias.
    assert_eq!(minimal["m"], 3, "{minimal}");
    assert_eq!(minimal["n"], 1, "{minimal}");
    assert_eq!(minimal["k"], 64, "{minimal}");
    assert_eq!(minimal["spec"], "affine-4b-gs64", "{minimal}");
    assert_eq!(minimal["batch"], serde_json::json!([]), "{minimal}");
    assert_eq!(minimal["bias"], "none", "{minimal}");
    assert!(bits[0]["observation"]["first_diff"]
        .as_str()
        .unwrap()
        .contains("y:"));
    let md = std::fs::read_to_string(root.join("out/explore.md")).unwrap();
    assert!(md.contains("Regime map") && md.contains("Bits"), "{md}");
    // The reproducer uses mlx.core only; what it reproduces is its data
    // file's (`<i>.json` beside `<i>.py`).
    let repro = std::fs::read_dir(root.join("out/repro"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .find(|p| std::fs::read_to_string(p).unwrap().contains("Bits"))
        .map(|p| std::fs::read_to_string(p.with_extension("py")).unwrap())
        .unwrap();
    assert!(
        repro.contains("import mlx.core as mx") && !repro.contains("mlx.nn"),
        "{repro}"
    );
    // Kept: an ordinary must-equal case that fails with the plant and
    // passes without it.
    let kept = json(&fixtures.join("explore/kept.json"));
    assert_eq!(kept.as_array().unwrap().len(), 1, "{kept}");
    for (plant, code, verdict) in [(true, 1, "FAIL"), (false, 0, "pass")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
        cmd.args([
            "--device",
            "cpu",
            "--filter",
            "kept/",
            "--no-snapshots",
            "--out",
        ])
        .arg(root.join("suite"))
        .env("CI", "true")
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures);
        if plant {
            cmd.env("MLX_CONFORMANCE_PLANT", PLANT);
        }
        let run = cmd.output().unwrap();
        let all = text(&run);
        assert_eq!(run.status.code(), Some(code), "{all}");
        assert!(
            all.contains(&format!(
                "{verdict:<7} kept/quantized/linear/affine-4b-gs64/bf16/M3/K64-N1/s"
            )),
            "{all}"
        );
    }
    // A second keep adds nothing.
    let again = explore(
        &root.join("out2"),
        &fixtures,
        &["--samples", "10", "--keep", "--shrink-steps", "400"],
        true,
    );
    assert!(text(&again).contains("kept: 0 new"), "{}", text(&again));
}

/// The attention family end to end: a plant at batch >= 2 and odd KV
/// length is shrunk to two requests of one head of the smallest head_dim
/// at L = 1 (contiguous keys, bf16, M = 1), kept, and fails as a case.
/// Seed 16's violating sample is B3-H24-KV4-D64, L511, M14, in a cache
/// buffer: every axis has to shrink.
#[test]
fn a_planted_attention_violation_is_shrunk_to_two_requests_at_one_key() {
    const SDPA_PLANT: &str = "attention/sdpa:m>=2,n%2==1";
    let root = scratch("plant-sdpa");
    let fixtures = root.join("fixtures");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .args([
            "--seed",
            "16",
            "--budget",
            "10m",
            "--family",
            "attention/sdpa",
            "--samples",
            "6",
            "--keep",
            "--no-extent",
            "--out",
        ])
        .arg(root.join("out"))
        .env_remove("CI")
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
        .env("MLX_CONFORMANCE_PLANT", SDPA_PLANT)
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let search = json(&root.join("out/explore.json"));
    let minimal: Vec<&serde_json::Value> = search["found"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "bits")
        .map(|f| &f["minimal"]["shape"])
        .collect();
    let smallest = serde_json::json!({
        "dtype": "bfloat16", "batch": 2, "n_heads": 1, "n_kv_heads": 1, "head_dim": 8,
        "kv_len": 1, "m": 1, "kv_view": "contiguous"
    });
    assert!(minimal.contains(&&smallest), "{minimal:?}\n{all}");
    for f in search["found"].as_array().unwrap() {
        assert_ne!(f["original"]["shape"], f["minimal"]["shape"], "{f}");
    }
    // The plant does not depend on what ran before: it shows alone too.
    for f in search["found"].as_array().unwrap() {
        assert_eq!(f["alone"]["shows"], true, "{f}");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
    cmd.args([
        "--device",
        "cpu",
        "--filter",
        "kept/attention/sdpa/bf16/B2-H1-KV1-D8/L1-M1/",
        "--no-snapshots",
        "--out",
    ])
    .arg(root.join("suite"))
    .env("CI", "true")
    .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
    .env("MLX_CONFORMANCE_PLANT", SDPA_PLANT);
    let run = cmd.output().unwrap();
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    assert!(
        text(&run).contains("FAIL    kept/attention/sdpa/bf16/B2-H1-KV1-D8/L1-M1/s"),
        "{}",
        text(&run)
    );
}

/// A fault that shows only after other samples ran (`,after=3`) is
/// reported as misbehaving in sequence, not alone, with what preceded it.
#[test]
fn a_fault_that_needs_a_sequence_is_told_apart_from_one_that_shows_alone() {
    let root = scratch("sequence");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .args([
            "--seed",
            "16",
            "--family",
            "attention/sdpa",
            "--samples",
            "8",
            "--shrink-steps",
            "0",
            "--no-extent",
            "--out",
        ])
        .arg(root.join("out"))
        .env("MLX_CONFORMANCE_FIXTURES", root.join("fixtures"))
        .env(
            "MLX_CONFORMANCE_PLANT",
            "attention/sdpa:m>=2,n%2==1,after=3",
        )
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let search = json(&root.join("out/explore.json"));
    let found = &search["found"][0];
    assert_eq!(found["alone"]["shows"], false, "{found}");
    assert!(
        !found["preceded_by"].as_array().unwrap().is_empty(),
        "{found}"
    );
    let md = std::fs::read_to_string(root.join("out/explore.md")).unwrap();
    assert!(
        md.contains("does NOT show; it misbehaves only in sequence"),
        "{md}"
    );
}

/// The gate's run of explorer samples registers exactly what a search of
/// the same seed and sample count draws (names in index order).
#[test]
fn explore_samples_in_the_runner_are_the_searchs_samples() {
    let root = scratch("samples");
    let fixtures = root.join("fixtures");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .args([
            "--seed",
            "5",
            "--samples",
            "9",
            "--shrink-steps",
            "0",
            "--no-extent",
            "--out",
        ])
        .arg(root.join("out"))
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
        .output()
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c != 3), "{}", text(&out));
    let search = json(&root.join("out/explore.json"));
    let families: Vec<String> = search["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["description"]["family"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(families.len(), 9);
    let list = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args([
            "--list",
            "--no-snapshots",
            "--explore-samples",
            "9",
            "--explore-seed",
            "5",
            "--filter",
            "explore/",
        ])
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
        .output()
        .unwrap();
    let listed: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(listed.len(), 9, "{}", text(&list));
    for (name, family) in listed.iter().zip(&families) {
        assert!(
            name.starts_with(&format!("explore/{family}/")) && name.contains("/s"),
            "{name} vs {family}"
        );
    }
    // Without --no-snapshots it is refused, saying why.
    let refused = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--list", "--explore-samples", "9"])
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    assert!(
        text(&refused).contains("--no-snapshots"),
        "{}",
        text(&refused)
    );
}

#[test]
fn the_same_seed_draws_the_same_samples_and_shards_merge_into_the_whole() {
    let root = scratch("shards");
    let fixtures = root.join("fixtures");
    let names = |dir: &Path| -> Vec<String> {
        json(&dir.join("explore.json"))["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| format!("{}#{}", s["index"], s["description"]))
            .collect()
    };
    explore(
        &root.join("a"),
        &fixtures,
        &["--samples", "12", "--shrink-steps", "0"],
        false,
    );
    explore(
        &root.join("b"),
        &fixtures,
        &["--samples", "12", "--shrink-steps", "0"],
        false,
    );
    assert_eq!(names(&root.join("a")).len(), 12, "12 samples drawn");
    assert_eq!(names(&root.join("a")), names(&root.join("b")));
    explore(
        &root.join("s0"),
        &fixtures,
        &["--samples", "6", "--shard", "0/2", "--shrink-steps", "0"],
        false,
    );
    explore(
        &root.join("s1"),
        &fixtures,
        &["--samples", "6", "--shard", "1/2", "--shrink-steps", "0"],
        false,
    );
    let merged = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .arg("--merge")
        .arg(root.join("s0/explore.json"))
        .arg(root.join("s1/explore.json"))
        .arg("--out")
        .arg(root.join("m"))
        .output()
        .unwrap();
    assert!(
        merged.status.code().is_some_and(|c| c <= 1),
        "{}",
        text(&merged)
    );
    assert_eq!(names(&root.join("m")), names(&root.join("a")));
    for bad in ["2/2", "x", "1/0"] {
        let o = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
            .args(["--shard", bad])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{bad}: {}", text(&o));
    }
}

/// Second hostile round on the explorer: a FIFO at kept.json (before:
/// every run, `--list` included, hung), `--keep` through a link (before:
/// wrote outside), a shard merged twice (before: counted twice), a huge
/// budget (before: a silent panic) and a shard of a huge n (before: a
/// hang that ignored the budget and signals).
#[test]
fn hostile_inputs_to_the_explorer_end_in_one_line_not_a_hang() {
    use std::os::unix::ffi::OsStrExt;
    let root = scratch("hostile");
    let fixtures = root.join("fixtures");
    std::fs::create_dir_all(fixtures.join("explore")).unwrap();
    let fifo =
        std::ffi::CString::new(fixtures.join("explore/kept.json").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let started = std::time::Instant::now();
    let list = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--list", "--filter", "kept/"])
        .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
        .output()
        .unwrap();
    assert!(started.elapsed().as_secs() < 60, "no hang");
    assert!(text(&list).contains("kept/unreadable"), "{}", text(&list));

    let linked = root.join("linked");
    std::fs::create_dir_all(linked.join("fixtures")).unwrap();
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join("fixtures/explore")).unwrap();
    let keep = explore(
        &root.join("o1"),
        &linked.join("fixtures"),
        &["--samples", "10", "--keep", "--no-extent"],
        true,
    );
    assert_eq!(keep.status.code(), Some(3), "{}", text(&keep));
    assert!(text(&keep).contains("symbolic link"), "{}", text(&keep));
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );

    let a = explore(
        &root.join("a"),
        &fixtures,
        &["--samples", "4", "--shrink-steps", "0"],
        false,
    );
    assert!(a.status.code().is_some_and(|c| c <= 2), "{}", text(&a));
    let twice = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .arg("--merge")
        .arg(root.join("a/explore.json"))
        .arg(root.join("a/explore.json"))
        .arg("--out")
        .arg(root.join("m"))
        .output()
        .unwrap();
    assert_eq!(twice.status.code(), Some(3), "{}", text(&twice));
    assert!(text(&twice).contains("overlap"), "{}", text(&twice));

    // Third round: a merge never deletes its own input; one shard of two
    // is not the whole search; a report's descriptions are checked; a
    // search of no time or no samples is refused; absurd kept sizes are a
    // typed error, not an overflow panic.
    let own = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .arg("--merge")
        .arg(root.join("a/explore.json"))
        .arg("--out")
        .arg(root.join("a"))
        .output()
        .unwrap();
    assert!(own.status.code().is_some_and(|c| c <= 2), "{}", text(&own));
    assert!(root.join("a/explore.json").exists(), "the input survives");
    explore(
        &root.join("h0"),
        &fixtures,
        &["--samples", "4", "--shard", "0/2", "--shrink-steps", "0"],
        false,
    );
    let half = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .arg("--merge")
        .arg(root.join("h0/explore.json"))
        .arg("--out")
        .arg(root.join("m2"))
        .output()
        .unwrap();
    assert_eq!(half.status.code(), Some(3), "{}", text(&half));
    assert!(text(&half).contains("missing: 1/2"), "{}", text(&half));
    let mut bad = json(&root.join("a/explore.json"));
    bad["samples"][0]["description"] = serde_json::json!({
        "family": "quantized/switch",
        "shape": {"spec": "affine-4b-gs64", "dtype": "bfloat16", "experts": 2, "top": 1, "batch": 4294967296u64,
                  "len": 4294967296u64, "sorted": false, "bias": false, "k": 64, "n": 8},
        "seed": 0
    });
    std::fs::write(root.join("bad.json"), bad.to_string()).unwrap();
    let crafted = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
        .arg("--merge")
        .arg(root.join("bad.json"))
        .arg("--out")
        .arg(root.join("m3"))
        .output()
        .unwrap();
    assert_eq!(crafted.status.code(), Some(3), "{}", text(&crafted));
    assert!(text(&crafted).contains("cannot run"), "{}", text(&crafted));
    // Issue 40, class 23: a budget too short to run one sample (before:
    // exit 0 having checked nothing) is refused too.
    for zero in [
        &["--budget", "0s"][..],
        &["--samples", "0"],
        &["--budget", "1ns"],
    ] {
        let o = explore(&root.join("z"), &fixtures, zero, false);
        assert_eq!(o.status.code(), Some(3), "{zero:?}: {}", text(&o));
    }
    let huge = root.join("huge");
    std::fs::create_dir_all(huge.join("explore")).unwrap();
    std::fs::write(
        huge.join("explore/kept.json"),
        serde_json::json!([{
            "description": {"family": "attention/sdpa", "shape": {"dtype": "bfloat16", "batch": 4294967296u64,
                "n_heads": 4294967296u64, "n_kv_heads": 4294967296u64, "head_dim": 64, "kv_len": 8, "m": 1,
                "kv_view": "contiguous"}, "seed": 0},
            "backend": "cpu", "date": "2026-12-02", "seen": "crafted"
        }])
        .to_string(),
    )
    .unwrap();
    let listed = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--list", "--filter", "kept/"])
        .env("MLX_CONFORMANCE_FIXTURES", &huge)
        .output()
        .unwrap();
    assert!(
        text(&listed).contains("kept/unreadable") && !text(&listed).contains("panicked"),
        "{}",
        text(&listed)
    );

    for extra in [
        &["--samples", "3", "--budget", "18446744073709551615s"][..],
        &[
            "--samples",
            "3",
            "--budget",
            "5s",
            "--shard",
            "1/18446744073709551615",
        ],
    ] {
        let started = std::time::Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
            .args(["--family", "quantized/linear", "--out"])
            .arg(root.join("b"))
            .args(extra)
            .env("MLX_CONFORMANCE_FIXTURES", &fixtures)
            .env("MLX_CONFORMANCE_PLANT", PLANT)
            .output()
            .unwrap();
        assert!(started.elapsed().as_secs() < 120, "{extra:?}: no hang");
        // A split into more shards than samples is refused before any
        // sample (class 23: it spun the whole budget to draw one).
        let refused = extra.contains(&"--shard");
        assert!(
            o.status
                .code()
                .is_some_and(|c| if refused { c == 3 } else { c <= 2 }),
            "{extra:?}: {}",
            text(&o)
        );
        assert!(!text(&o).contains("panicked"), "{}", text(&o));
    }
}

/// Issue 40, class 4: a forged explore.json given to `--merge` put Python
/// code into `repro/<i>.py` (what the search "saw" was written into the
/// script's docstring), and running the reproducer ran it. Now what a
/// report says is data (`repro/<i>.json`), and running the reproducer of a
/// hostile report runs no code of it. Class 22: an older search's
/// reproducers do not survive a new report in the same `--out`.
#[test]
fn a_hostile_report_merged_runs_none_of_its_text_and_old_reproducers_go() {
    let root = scratch("inject");
    let fixtures = root.join("fixtures");
    let a = explore(
        &root.join("a"),
        &fixtures,
        &["--samples", "2", "--shrink-steps", "0", "--no-extent"],
        false,
    );
    assert!(a.status.code().is_some_and(|c| c <= 2), "{}", text(&a));
    let mut forged = json(&root.join("a/explore.json"));
    let description = forged["samples"][0]["description"].clone();
    let payload = "\"\"\"\nopen(\"PWNED\", \"w\").write(\"ran\")\n\"\"\" {i} {{ }}";
    forged["found"] = serde_json::json!([{
        "kind": "bits",
        "original": description,
        "minimal": description,
        "observation": {"bits_equal": false, "first_diff": payload, "time_ms": 0.0},
        "shrink_steps": 0,
        "preceded_by": [],
        "extent": []
    }]);
    std::fs::write(root.join("forged.json"), forged.to_string()).unwrap();
    let out = root.join("m");
    std::fs::create_dir_all(out.join("repro")).unwrap();
    let merge = || {
        Command::new(env!("CARGO_BIN_EXE_conformance-explore"))
            .arg("--merge")
            .arg(root.join("forged.json"))
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    // A directory the explorer did not make (it holds a user's repro/) is
    // refused and left as it is.
    let refused = merge();
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    assert!(text(&refused).contains("`repro`"), "{}", text(&refused));
    std::fs::remove_dir_all(&out).unwrap();
    let merged = merge();
    assert!(
        merged.status.code().is_some_and(|c| c <= 1),
        "{}",
        text(&merged)
    );
    let script = std::fs::read_to_string(out.join("repro/0.py")).unwrap();
    assert!(
        !script.contains("PWNED"),
        "the report's text is not in the script"
    );
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.reference/venv/bin/python");
    let ran = Command::new(&python)
        .arg(out.join("repro/0.py"))
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(ran.status.success(), "{}", text(&ran));
    assert!(
        text(&ran).contains("open(\"PWNED\""),
        "the text is printed as data: {}",
        text(&ran)
    );
    assert!(!root.join("PWNED").exists(), "no code of the report ran");
    // A new search into the same --out that finds nothing leaves no old
    // reproducer behind.
    std::fs::write(out.join("repro/7.py"), "stale").unwrap();
    let again = explore(
        &out,
        &fixtures,
        &["--samples", "1", "--shrink-steps", "0", "--no-extent"],
        false,
    );
    assert!(
        again.status.code().is_some_and(|c| c <= 2),
        "{}",
        text(&again)
    );
    if json(&out.join("explore.json"))["found"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(!out.join("repro/0.py").exists() && !out.join("repro/7.py").exists());
    }
}

/// Issue 40, class 18: a leftover `MLX_CONFORMANCE_PLANT` silently turned
/// passes into FAIL and no report said so. Now the run warns at its start
/// and every report (closing lines, report.md, report.json) names it.
#[test]
fn a_testing_hook_in_the_environment_is_named_in_every_report() {
    let root = scratch("hook");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args([
            "--device",
            "cpu",
            "--filter",
            "quantized/linear/affine-4b-gs64/bf16",
            "--out",
        ])
        .arg(&root)
        .env("MLX_CONFORMANCE_PLANT", PLANT)
        .env("CI", "true")
        .output()
        .unwrap();
    let all = text(&out);
    assert!(
        all.contains("warning: testing hook set: MLX_CONFORMANCE_PLANT="),
        "{all}"
    );
    assert!(
        all.contains("testing hook set: MLX_CONFORMANCE_PLANT="),
        "{all}"
    );
    let report = json(&root.join("report.json"));
    let hook = report["environment"]["testing_hook"]
        .as_str()
        .unwrap_or_default();
    assert!(
        hook.starts_with(&format!("MLX_CONFORMANCE_PLANT={PLANT} (port bits flipped")),
        "{hook:?}: {all}"
    );
    let md = std::fs::read_to_string(root.join("report.md")).unwrap();
    assert!(md.contains("testing hook set"), "{md}");
}
