//! Signals through xtask: SIGTERM to `cargo xtask conformance` (what a job
//! supervisor or `kill` sends) and a terminal's Ctrl-C reach the child and
//! everything it started, xtask waits and exits with the child's code, and
//! nothing is left running. The child is a stand-in for cargo (xtask runs
//! `$CARGO`), a shell script that starts a grandchild and reports the
//! signal it got.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-signals-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fake cargo: records its pid and a grandchild's (perl, because a
/// non-interactive shell starts background jobs with SIGINT ignored), then waits; on
/// SIGTERM or SIGINT it writes which and exits 130, leaving the grandchild
/// to the process-group signal.
fn fake_cargo(dir: &Path) -> PathBuf {
    let script = dir.join("cargo");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         perl -e '$SIG{INT} = \"DEFAULT\"; sleep 300' &\n\
         echo $! > \"$FAKE_DIR/grandchild.pid\"\n\
         trap 'echo TERM > \"$FAKE_DIR/got\"; exit 130' TERM\n\
         trap 'echo INT > \"$FAKE_DIR/got\"; exit 130' INT\n\
         echo $$ > \"$FAKE_DIR/cargo.pid\"\n\
         while true; do sleep 1; done\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn start(dir: &Path, own_group: bool) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["conformance", "--filter", "smoke"])
        .env("CARGO", fake_cargo(dir))
        .env("FAKE_DIR", dir);
    if own_group {
        cmd.process_group(0); // as a terminal's foreground job
    }
    let child = cmd.spawn().unwrap();
    let started = Instant::now();
    while !dir.join("cargo.pid").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the fake cargo never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn alive(pid: i32) -> bool {
    // A zombie has ended; only a running or sleeping process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

fn wait(mut child: Child) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "xtask did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pid(dir: &Path, name: &str) -> i32 {
    std::fs::read_to_string(dir.join(name)).unwrap().trim().parse().unwrap()
}

#[test]
fn sigterm_to_xtask_reaches_the_child_and_its_group_and_xtask_exits_with_its_code() {
    let dir = scratch("term");
    let xtask = start(&dir, false);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(xtask.id() as i32, libc::SIGTERM) };
    assert_eq!(wait(xtask), Some(130), "xtask passes the child's code on");
    assert_eq!(std::fs::read_to_string(dir.join("got")).unwrap().trim(), "TERM");
    let grandchild = pid(&dir, "grandchild.pid");
    let started = Instant::now();
    while alive(grandchild) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(grandchild), "nothing is left running");
    assert!(!alive(pid(&dir, "cargo.pid")));
}

#[test]
fn ctrl_c_reaches_the_child_once_through_xtask() {
    let dir = scratch("int");
    let xtask = start(&dir, true);
    // The terminal sends SIGINT to the foreground group: xtask's.
    // SAFETY: signalling our own child's process group.
    unsafe { libc::kill(-(xtask.id() as i32), libc::SIGINT) };
    assert_eq!(wait(xtask), Some(130));
    assert_eq!(std::fs::read_to_string(dir.join("got")).unwrap().trim(), "INT");
    let grandchild = pid(&dir, "grandchild.pid");
    let started = Instant::now();
    while alive(grandchild) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(grandchild));
}
