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
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the fake cargo never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Kills the stand-in cargo and its grandchild when a test ends, passed
/// or failed (a failing run must not leave them running either).
struct Reaper(PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        for name in ["cargo.pid", "grandchild.pid"] {
            if let Ok(text) = std::fs::read_to_string(self.0.join(name)) {
                if let Ok(pid) = text.trim().parse::<i32>() {
                    // SAFETY: signalling a process this test started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

fn alive(pid: i32) -> bool {
    // A zombie has ended; only a running or sleeping process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait(mut child: Child) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "xtask did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pid(dir: &Path, name: &str) -> i32 {
    std::fs::read_to_string(dir.join(name))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn sigterm_to_xtask_reaches_the_child_and_its_group_and_xtask_exits_with_its_code() {
    let dir = scratch("term");
    let _reaper = Reaper(dir.clone());
    let xtask = start(&dir, false);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(xtask.id() as i32, libc::SIGTERM) };
    assert_eq!(wait(xtask), Some(130), "xtask passes the child's code on");
    assert_eq!(
        std::fs::read_to_string(dir.join("got")).unwrap().trim(),
        "TERM"
    );
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
    let _reaper = Reaper(dir.clone());
    let xtask = start(&dir, true);
    // The terminal sends SIGINT to the foreground group: xtask's.
    // SAFETY: signalling our own child's process group.
    unsafe { libc::kill(-(xtask.id() as i32), libc::SIGINT) };
    assert_eq!(wait(xtask), Some(130));
    assert_eq!(
        std::fs::read_to_string(dir.join("got")).unwrap().trim(),
        "INT"
    );
    let grandchild = pid(&dir, "grandchild.pid");
    let started = Instant::now();
    while alive(grandchild) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(grandchild));
}

/// A closed stderr (`cargo xtask … 2>&1 | head -1`): xtask keeps draining
/// the child's stderr, so the child runs to its end and its code is
/// xtask's (before: cargo failed its status line, exit 101, no reports).
#[test]
fn a_closed_stderr_does_not_end_the_child() {
    let dir = scratch("stderr");
    let script = dir.join("cargo");
    std::fs::write(
        &script,
        "#!/bin/sh\nset -e\nyes 'a status line' | head -n 100000 >&2\necho ran > \"$FAKE_DIR/ran\"\nexit 7\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["conformance", "--filter", "smoke"])
        .env("CARGO", &script)
        .env("FAKE_DIR", &dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take()); // the reader went away
    assert_eq!(wait(child), Some(7));
    assert!(dir.join("ran").exists(), "the child ran to its end");
}
