//! The hostile round (issue: nothing lost, nothing written outside, nothing
//! left running): each test is one fault class a user hit, run against the
//! real binary. Accept runs write into a scratch copy of `fixtures/`
//! (`MLX_CONFORMANCE_FIXTURES`), never into the checkout.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SMOKE: &str = "smoke/quantized-matmul";

fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("conformance-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The runner with `fixtures` as its fixtures directory, outside CI (accept
/// is allowed), reports under `fixtures/../out`.
fn runner(fixtures: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
    cmd.env("MLX_CONFORMANCE_FIXTURES", fixtures)
        .env_remove("CI")
        .env_remove("MLX_CONFORMANCE_DEVICE_FAMILY")
        .args(["--device", "cpu", "--out"])
        .arg(fixtures.parent().unwrap().join("out"));
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn accept(fixtures: &Path, extra: &[&str]) -> Output {
    accept_filtered(fixtures, SMOKE, extra)
}

fn accept_filtered(fixtures: &Path, filter: &str, extra: &[&str]) -> Output {
    runner(fixtures)
        .args(["--fixtures", "accept", "--filter", filter])
        .args(extra)
        .output()
        .unwrap()
}

/// Three fast cases.
const LINEAR: &str = "float/linear/bf16/";

/// The one set directory of a scratch fixtures tree.
fn set_dir(fixtures: &Path) -> PathBuf {
    let sets: Vec<PathBuf> = std::fs::read_dir(fixtures.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(sets.len(), 1, "{sets:?}");
    sets[0].clone()
}

fn no_panic(all: &str) {
    assert!(
        !all.contains("panicked") && !all.contains("RUST_BACKTRACE"),
        "{all}"
    );
}

/// A recorded scratch set: (fixtures, set directory, the smoke snapshot).
fn recorded(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let fixtures = scratch(tag).join("fixtures");
    let out = accept(&fixtures, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let set = set_dir(&fixtures);
    let snap = std::fs::read_dir(&set)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension() == Some(OsStr::new("snap")))
        .unwrap();
    (fixtures, set, snap)
}

#[test]
fn accept_says_what_it_wrote_changed_and_left() {
    let (fixtures, _, snap) = recorded("counts");
    let again = accept(&fixtures, &[]);
    let all = text(&again);
    assert_eq!(again.status.code(), Some(0), "{all}");
    assert!(
        all.contains("0 new, 0 changed, 1 unchanged, 0 removed"),
        "{all}"
    );
    // A body that differs (sealed, so not a hand edit) is rewritten: changed.
    let body = conformance::snapshots::read(&snap).unwrap().unwrap();
    let mut moved = body.clone();
    moved["path"] = "moved".into();
    let provenance: conformance::snapshots::Provenance =
        serde_json::from_value(serde_json::json!({
            "mlx_version": "0", "backend": "cpu", "device": "d", "lock_sha256": "l", "date": "d"
        }))
        .unwrap();
    std::fs::write(&snap, conformance::snapshots::render(&moved, &provenance)).unwrap();
    let changed = accept(&fixtures, &[]);
    assert!(
        text(&changed).contains("0 new, 1 changed, 0 unchanged, 0 removed"),
        "{}",
        text(&changed)
    );
    assert_eq!(conformance::snapshots::read(&snap).unwrap().unwrap(), body);
}

#[test]
fn accept_never_writes_through_a_link_and_names_it() {
    let (fixtures, _, snap) = recorded("link");
    let victim = fixtures.parent().unwrap().join("outside.txt");
    std::fs::write(&victim, "the maintainer's file").unwrap();
    std::fs::remove_file(&snap).unwrap();
    std::os::unix::fs::symlink(&victim, &snap).unwrap();
    for mode in ["accept", "check"] {
        let out = runner(&fixtures)
            .args(["--fixtures", mode, "--filter", SMOKE])
            .output()
            .unwrap();
        let all = text(&out);
        no_panic(&all);
        assert!(all.contains("symbolic link"), "{mode}: {all}");
        assert!(all.contains(&snap.display().to_string()), "{mode}: {all}");
        assert_ne!(out.status.code(), Some(0), "{mode}: {all}");
        if mode == "accept" {
            assert_eq!(out.status.code(), Some(3), "{all}");
            assert!(!all.contains("snapshots in "), "no success line: {all}");
        }
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "the maintainer's file"
        );
        assert!(std::fs::symlink_metadata(&snap)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}

#[test]
fn a_set_path_that_is_a_link_a_file_or_a_loop_is_refused_not_missing() {
    let (fixtures, set, _) = recorded("setpath");
    let elsewhere = fixtures.parent().unwrap().join("elsewhere");
    std::fs::rename(&set, &elsewhere).unwrap();
    type Make<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let cases: [Make; 3] = [
        (
            "symbolic link",
            Box::new(|| std::os::unix::fs::symlink(&elsewhere, &set).unwrap()),
        ),
        (
            "regular file",
            Box::new(|| std::fs::write(&set, "x").unwrap()),
        ),
        (
            "symbolic link",
            Box::new(|| std::os::unix::fs::symlink(&set, &set).unwrap()),
        ),
    ];
    for (expected, make) in cases {
        let _ = std::fs::remove_file(&set);
        make();
        for mode in ["check", "accept"] {
            let out = runner(&fixtures)
                .args(["--fixtures", mode, "--filter", SMOKE])
                .output()
                .unwrap();
            let all = text(&out);
            no_panic(&all);
            assert_eq!(out.status.code(), Some(3), "{expected} {mode}: {all}");
            assert!(all.contains(expected), "{expected} {mode}: {all}");
            assert!(!all.contains("is missing"), "{expected} {mode}: {all}");
            assert!(!all.contains("pass "), "refused before any case ran: {all}");
        }
    }
    assert!(elsewhere.is_dir(), "the link's target is untouched");
}

#[test]
fn accept_refuses_an_errored_case_and_runs_that_check_no_snapshots() {
    let (fixtures, set, snap) = recorded("refuse");
    let before = std::fs::read(&snap).unwrap();
    let crashed = runner(&fixtures)
        .args(["--fixtures", "accept", "--filter", SMOKE, "--jobs", "1"])
        .env("MLX_CONFORMANCE_FAULT", format!("SIGSEGV@{SMOKE}"))
        .output()
        .unwrap();
    let all = text(&crashed);
    assert_eq!(crashed.status.code(), Some(3), "{all}");
    assert!(all.contains("refusing to accept snapshots"), "{all}");
    assert!(all.contains("ERROR"), "{all}");
    assert!(all.contains(SMOKE), "names the case: {all}");
    for flags in [&["--seed", "5"][..], &["--no-snapshots"], &["--perturb"]] {
        let out = accept(&fixtures, flags);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{flags:?}: {all}");
        assert!(all.contains("refusing to accept"), "{flags:?}: {all}");
        assert!(all.contains(flags[0]), "says why: {all}");
        assert!(!all.contains("snapshots in "), "{all}");
    }
    assert_eq!(std::fs::read(&snap).unwrap(), before, "nothing was written");
    assert_eq!(std::fs::read_dir(&set).unwrap().count(), 1);
}

#[test]
fn a_failed_write_exits_3_in_one_line_and_leaves_the_old_snapshot_whole() {
    // A directory where the snapshot should be.
    let fixtures = scratch("blocked").join("fixtures");
    let first = accept_filtered(&fixtures, "float/linear/bf16/M1", &[]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let set = set_dir(&fixtures);
    let blocked = set.join("float__linear__bf16__M4.snap");
    std::fs::create_dir(&blocked).unwrap();
    let out = accept_filtered(&fixtures, LINEAR, &[]);
    let all = text(&out);
    no_panic(&all);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("is a directory, not a regular file"), "{all}");
    assert!(!all.contains("snapshots in "), "no success line: {all}");

    // A full disk (a file size limit: every write past 512 bytes fails):
    // the recorded snapshot keeps every byte, and no temporary file stays.
    let (fixtures, set, snap) = recorded("full");
    let before = std::fs::read(&snap).unwrap();
    let mut stale = conformance::snapshots::read(&snap).unwrap().unwrap();
    stale["path"] = "stale".into();
    let provenance: conformance::snapshots::Provenance =
        serde_json::from_value(serde_json::json!({
            "mlx_version": "0", "backend": "cpu", "device": "d", "lock_sha256": "l", "date": "d"
        }))
        .unwrap();
    let stale = conformance::snapshots::render(&stale, &provenance);
    std::fs::write(&snap, &stale).unwrap();
    let mut cmd = runner(&fixtures);
    cmd.args(["--fixtures", "accept", "--filter", SMOKE, "--in-process"]);
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit and signal are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 512,
                rlim_max: 512,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let all = text(&out);
    no_panic(&all);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("cannot write the snapshot of"), "{all}");
    assert!(!all.contains("snapshots in "), "{all}");
    assert_eq!(std::fs::read_to_string(&snap).unwrap(), stale, "unchanged");
    assert_ne!(before.len(), 0);
    let names: Vec<String> = std::fs::read_dir(&set)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
}

#[test]
fn leftover_temporary_files_are_named_by_check_and_removed_by_accept() {
    let (fixtures, set, _) = recorded("leftover");
    let leftovers = [
        set.join(".unfinished-1-0.snap-tmp"),
        set.join("x.snap.sealing-77"),
    ];
    for l in &leftovers {
        std::fs::write(l, "").unwrap();
    }
    let check = runner(&fixtures)
        .args(["--filter", SMOKE])
        .output()
        .unwrap();
    let all = text(&check);
    assert_eq!(check.status.code(), Some(0), "{all}");
    for l in &leftovers {
        assert!(all.contains(&l.display().to_string()), "{all}");
        assert!(l.exists(), "check writes nothing");
    }
    assert!(
        all.contains("temporary file of an unfinished snapshot write"),
        "{all}"
    );
    let out = accept(&fixtures, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(leftovers.iter().all(|l| !l.exists()));
}

#[test]
fn a_closed_stdout_ends_quietly_and_the_reports_are_still_written() {
    let out_dir = scratch("pipe");
    for args in [
        vec!["--list"],
        vec!["--device", "cpu", "--filter", SMOKE],
        vec!["--device", "cpu", "--filter", SMOKE, "--format", "json"],
    ] {
        let _ = std::fs::remove_dir_all(&out_dir);
        let mut child = Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(&args)
            .arg("--out")
            .arg(&out_dir)
            .env("CI", "true")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader went away (`| head -0`)
        let out = child.wait_with_output().unwrap();
        let all = text(&out);
        no_panic(&all);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {all}");
        if args.len() > 1 {
            assert!(out_dir.join("report.json").exists(), "{args:?}");
        }
    }
}

#[test]
fn a_hung_case_is_an_error_row_naming_the_timeout_and_the_run_goes_on() {
    let out_dir = scratch("hang");
    let hung = "float/linear/bf16/M4";
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--jobs", "1", "--case-timeout", "3"])
        .args(["--filter", LINEAR, "--no-snapshots", "--out"])
        .arg(&out_dir)
        .env("CI", "true")
        // The worker stops itself (SIGSTOP) as a deadlock or GPU hang would.
        .env("MLX_CONFORMANCE_FAULT", format!("SIGSTOP@{hung}"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(started.elapsed().as_secs() < 120, "no hang");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    let cases = json["cases"].as_array().unwrap();
    let row = cases.iter().find(|c| c["name"] == hung).unwrap();
    assert_eq!(row["verdict"], "error", "{row}");
    assert!(
        row["message"].as_str().unwrap().contains("--case-timeout"),
        "{row}"
    );
    assert!(
        cases
            .iter()
            .any(|c| c["name"] != hung && c["verdict"] == "pass"),
        "the run went on: {all}"
    );
    // The timeout belongs to workers: with --in-process it is a usage error.
    let usage = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--in-process", "--case-timeout", "3", "--filter", SMOKE])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(3), "{}", text(&usage));
}

/// A config folder named with a newline and non-ASCII text, and a
/// `--keep-outputs` directory whose name is not UTF-8: the same verdicts
/// and digests with and without workers.
#[test]
fn unusual_names_and_paths_give_the_same_verdicts_with_and_without_workers() {
    let root = scratch("names");
    let fixtures = root.join("fixtures");
    let model = fixtures.join("configs/qwen3_5/odd\nname é");
    std::fs::create_dir_all(&model).unwrap();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(
        workspace.join("fixtures/configs/qwen3_5/Qwen3.5-0.8B/config.json"),
        model.join("config.json"),
    )
    .unwrap();
    let kept = root.join(OsStr::from_bytes(b"kept-\xff"));
    let mut verdicts = Vec::new();
    for isolation in [&["--jobs", "1"][..], &["--in-process"]] {
        let _ = std::fs::remove_dir_all(&kept);
        let out = runner(&fixtures)
            .args(["--filter", "qwen3_5/odd", "--no-snapshots"])
            .args(isolation)
            .arg("--keep-outputs")
            .arg(&kept)
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{isolation:?}: {all}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join("out/report.json")).unwrap())
                .unwrap();
        let rows: Vec<(String, String, String)> = json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["verdict"].as_str().unwrap().to_owned(),
                    c["output"]["digests"].to_string(),
                )
            })
            .collect();
        assert!(rows.len() >= 3 && rows[0].0.contains('\n'), "{rows:?}");
        assert!(
            rows.iter().all(|r| r.1 == "pass" || r.1 == "finding"),
            "{isolation:?}: {rows:?}"
        );
        assert!(
            std::fs::read_dir(&kept).unwrap().count() >= 3,
            "{isolation:?}"
        );
        verdicts.push(rows);
    }
    assert_eq!(verdicts[0], verdicts[1]);
}

#[test]
fn a_relative_out_is_resolved_against_the_working_directory_and_printed_absolute() {
    let cwd = scratch("relative");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .current_dir(&cwd)
        .args([
            "--device",
            "cpu",
            "--filter",
            SMOKE,
            "--no-snapshots",
            "--out",
            "rel",
        ])
        .env("CI", "true")
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(cwd.join("rel/report.json").exists());
    assert!(
        all.contains(&format!("reports: {}", cwd.join("rel").display())),
        "{all}"
    );
}

// Second hostile round (a fresh subagent on a clean clone).

/// A FIFO or a link where the reports' lock file goes: a one-line error,
/// never a hang, never a file created at the link's target.
#[test]
fn a_fifo_or_link_at_the_reports_lock_is_an_error_not_a_hang() {
    let root = scratch("lock");
    let (fifo_dir, link_dir) = (root.join("fifo"), root.join("link"));
    for d in [&fifo_dir, &link_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let c = std::ffi::CString::new(
        fifo_dir
            .join(".conformance-reports.lock")
            .as_os_str()
            .as_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let target = root.join("created-outside");
    std::os::unix::fs::symlink(&target, link_dir.join(".conformance-reports.lock")).unwrap();
    for dir in [&fifo_dir, &link_dir] {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(["--device", "cpu", "--filter", SMOKE, "--out"])
            .arg(dir)
            .env("CI", "true")
            .output()
            .unwrap();
        let all = text(&out);
        assert!(started.elapsed().as_secs() < 120, "no hang");
        assert_eq!(out.status.code(), Some(3), "{all}");
        assert!(all.contains(".conformance-reports.lock"), "{all}");
        no_panic(&all);
    }
    assert!(!target.exists(), "nothing created at the link's target");
}

#[test]
fn a_huge_case_timeout_is_no_limit_not_a_panic() {
    let out_dir = scratch("huge-timeout");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--filter", SMOKE, "--no-snapshots"])
        .args(["--case-timeout", "18446744073709551615", "--out"])
        .arg(&out_dir)
        .env("CI", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_directory_in_a_report_files_place_or_an_empty_out_is_refused_before_any_case() {
    let dir = scratch("junit-dir");
    std::fs::create_dir_all(dir.join("junit.xml")).unwrap();
    for out in [dir.as_os_str(), OsStr::new("")] {
        let run = Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(["--device", "cpu", "--filter", SMOKE, "--out"])
            .arg(out)
            .env("CI", "true")
            .output()
            .unwrap();
        let all = text(&run);
        assert_eq!(run.status.code(), Some(3), "{all}");
        assert!(all.contains("--out"), "{all}");
        assert!(!all.contains("pass "), "refused before any case ran: {all}");
    }
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".partial")));
}

/// Issue 40, round 4b: `--out DIR` removed (at the start of the run) and
/// replaced a `report.md`, `report.json` or `junit.xml` that a user kept
/// in DIR, though no run of this tool had written there. A directory
/// holding one of those names without the reports' lock file (which every
/// run that writes reports leaves) is refused before any case, and the
/// file is left as it was; a directory an earlier run wrote is reused.
#[test]
fn report_files_no_run_wrote_are_never_removed_or_replaced() {
    let dir = scratch("users-report");
    let run = |out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(["--device", "cpu", "--filter", SMOKE, "--out"])
            .arg(out)
            .env("CI", "true")
            .output()
            .unwrap()
    };
    for name in ["report.md", "report.json", "junit.xml"] {
        let users = dir.join(name.replace('.', "-"));
        std::fs::create_dir_all(&users).unwrap();
        std::fs::write(users.join(name), "my own notes\n").unwrap();
        let out = run(&users);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{all}");
        assert!(all.contains(name) && all.contains("--out"), "{all}");
        assert!(!all.contains("pass "), "refused before any case ran: {all}");
        assert_eq!(
            std::fs::read_to_string(users.join(name)).unwrap(),
            "my own notes\n"
        );
    }
    // A directory this tool's run wrote is the tool's to replace.
    let ours = dir.join("ours");
    let first = run(&ours);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let again = run(&ours);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
}

/// Issue 40, round 4b: a runner of a `--cases` run killed with SIGKILL
/// left the workers' private copy (`$TMPDIR/conformance-cases-*`) for
/// good. Its name now records its owner, and the next `--cases` run
/// removes the copies of owners that are gone.
#[cfg(target_os = "linux")]
#[test]
fn a_cases_copy_left_by_a_killed_runner_is_reclaimed_by_the_next_run() {
    let root = scratch("cases-copy");
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let described = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--describe", "--filter", SMOKE])
        .output()
        .unwrap();
    assert_eq!(described.status.code(), Some(0), "{}", text(&described));
    let file = root.join("cases.jsonl");
    std::fs::write(&file, &described.stdout).unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_conformance"))
            .args(["--device", "cpu", "--no-snapshots", "--cases"])
            .arg(&file)
            .arg("--out")
            .arg(root.join("out"))
            .env("TMPDIR", &tmp)
            .env("CI", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let copies = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("conformance-cases-"))
            .collect()
    };
    let mut first = run();
    let started = std::time::Instant::now();
    while copies().is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no copy made"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let left = copies();
    assert!(!left.is_empty(), "the kill left no copy");
    let status = run().wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let now = copies();
    assert!(
        left.iter().all(|d| !now.contains(d)),
        "still there: {now:?} (left by the kill: {left:?})"
    );
}

/// Issue 40, round 4b: a leftover `MLX_CONFORMANCE_FAULT` (the testing
/// hook that crashes or stops the worker of the cases it names) made a
/// case an ERROR "killed by SIGSEGV" with no word of the hook anywhere:
/// a phantom crash of the port. Like `MLX_CONFORMANCE_PLANT` (class 18),
/// it is now warned about, named in every report, and in the row.
#[test]
fn a_leftover_fault_hook_is_named_in_the_row_and_every_report() {
    let dir = scratch("fault-hook");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--device", "cpu", "--filter", SMOKE, "--jobs", "1", "--out"])
        .arg(&dir)
        .env("CI", "true")
        .env("MLX_CONFORMANCE_FAULT", format!("SIGSEGV@{SMOKE}"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(
        all.contains("warning: testing hook set: MLX_CONFORMANCE_FAULT="),
        "{all}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let hook = report["environment"]["testing_hook"]
        .as_str()
        .unwrap_or_default();
    assert!(hook.contains("MLX_CONFORMANCE_FAULT=SIGSEGV@"), "{hook:?}");
    let rows = report["cases"].as_array().unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        let m = row["message"].as_str().unwrap();
        assert!(
            m.contains("SIGSEGV") && m.contains("MLX_CONFORMANCE_FAULT"),
            "{m}"
        );
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("MLX_CONFORMANCE_FAULT"), "{md}");
}

/// Workers die with their runner, even stopped ones after a SIGKILL of the
/// runner (before: they stayed, stopped, re-parented to init).
#[test]
fn workers_do_not_outlive_a_killed_runner() {
    let out_dir = scratch("orphan-workers");
    let mut child = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args([
            "--device",
            "cpu",
            "--jobs",
            "1",
            "--case-timeout",
            "0",
            "--no-snapshots",
        ])
        .args(["--filter", LINEAR, "--out"])
        .arg(&out_dir)
        .env("CI", "true")
        .env("MLX_CONFORMANCE_FAULT", "SIGSTOP@float/linear/bf16/M1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let runner = child.id();
    let workers = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    let after = s.rsplit(')').next().unwrap_or("");
                    let fields: Vec<&str> = after.split_whitespace().collect();
                    fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(runner)
                })
            })
            .collect()
    };
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    while seen.is_empty() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        seen = workers();
    }
    assert!(!seen.is_empty(), "a worker started");
    std::thread::sleep(std::time::Duration::from_secs(3)); // it stops itself
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let started = std::time::Instant::now();
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while seen.iter().any(|p| alive(*p)) && started.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        seen.iter().all(|p| !alive(*p)),
        "workers {seen:?} outlived the runner"
    );
}
