//! The candidate's launcher (Linux): a small process between a worker and
//! its candidate, so nothing a candidate starts outlives the worker.
//!
//! The worker cannot set a parent-death signal on the candidate itself:
//! that needs `pre_exec`, which makes std `fork()` instead of
//! `posix_spawn`, and `fork()` in a process with CUDA initialised crashed
//! on the H200 (see `runner::worker`). So the worker starts this
//! executable again as `conformance --candidate-launcher SCRATCH -- sh -c
//! CMD`, a fresh process with no MLX initialised, which
//!
//! - gets SIGTERM when the worker dies (a case timeout, Ctrl-C, a crash),
//! - is a child subreaper: whatever the candidate starts and leaves
//!   (a child in its group, a grandchild in a session of its own) becomes
//!   the launcher's when its parent dies,
//! - starts `sh -c CMD` in a process group of its own, with SIGKILL as
//!   its parent-death signal,
//! - and when the candidate exits, or the launcher is told to stop
//!   (SIGTERM, SIGINT, SIGHUP, or its parent dying), kills the candidate's
//!   group, then kills and reaps every process it adopted until none is
//!   left (bounded), removes the scratch directory, and exits as the
//!   candidate did.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The flag that makes the `conformance` executable a launcher.
pub const FLAG: &str = "--candidate-launcher";
/// The worker's pid, as the launcher is told it (it exits at once when its
/// parent is already another process).
pub const PARENT_ENV: &str = "MLX_CONFORMANCE_LAUNCHER_PARENT";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// The pids whose parent is `parent` (from `/proc/<pid>/stat`: the field
/// after the command name, which may hold spaces and parentheses).
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Kills and reaps every child of this process until none is left for
/// two looks in a row (or `limit` passes).
pub fn sweep(limit: Duration) {
    // SAFETY: getpid on this process.
    let me = unsafe { libc::getpid() };
    let deadline = Instant::now() + limit;
    let mut quiet = 0;
    while quiet < 2 && Instant::now() < deadline {
        let mut status = 0;
        // SAFETY: reaping this process's own children.
        while unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } > 0 {}
        let children = children_of(me);
        if children.is_empty() {
            quiet += 1;
        } else {
            quiet = 0;
            for pid in children {
                // SAFETY: a signal to a child of this process (its group
                // too: what it started goes with it).
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The launcher's whole life; returns only on a usage error (exit code).
pub fn main(args: &[OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    let [scratch, dashes, program, rest @ ..] = args else {
        eprintln!("error: {FLAG} SCRATCH -- PROGRAM ARGS...");
        return 3;
    };
    if dashes != "--" {
        eprintln!("error: {FLAG} SCRATCH -- PROGRAM ARGS...");
        return 3;
    }
    // SAFETY: signal dispositions and prctl of this process, set before
    // any other thread exists.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
        // No SA_RESTART: a stop interrupts the wait below.
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    let parent = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    // SAFETY: getppid on this process.
    if parent.is_some_and(|p| p != unsafe { libc::getppid() }) {
        let _ = std::fs::remove_dir_all(scratch);
        return 3;
    }
    // SAFETY: getpid on this process.
    let launcher = unsafe { libc::getpid() };
    // The candidate's owner is the worker (this launcher's parent): what
    // the candidate starts inherits it, so the next run finds what a
    // SIGKILL of worker and launcher left (scratch.rs). Not set on the
    // launcher itself, which ends its own candidate.
    // SAFETY: getppid on this process.
    let worker = unsafe { libc::getppid() } as u32;
    let owner = format!(
        "{worker}-{}",
        crate::scratch::start_time(worker).unwrap_or(0)
    );
    let mut command = std::process::Command::new(program);
    command
        .args(rest)
        .env_remove(PARENT_ENV)
        .env(crate::scratch::OWNER_ENV, owner)
        .process_group(0);
    // SAFETY: prctl and getppid are async-signal-safe; this process has
    // one thread and no MLX initialised, so fork() is safe here.
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != launcher {
                libc::_exit(3);
            }
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot start {program:?}: {e}");
            let _ = std::fs::remove_dir_all(scratch);
            return 127;
        }
    };
    let pid = child.id() as i32;
    // The protocol's stdout belongs to the candidate alone: the worker
    // must see its end when the candidate closes it, not when this
    // launcher exits. stdin likewise (stderr is kept for messages).
    // SAFETY: dup2 onto this process's own standard descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
    let mut status = 0;
    let mut ended = None;
    while ended.is_none() && !STOP.load(Ordering::SeqCst) {
        // SAFETY: waiting for this process's own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            ended = Some(status);
        } else if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    // SAFETY: the candidate's own group (its leader is this process's
    // child, reaped or not: the group id is not reused while this
    // launcher's adopted members may still hold it).
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    sweep(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(scratch);
    match ended {
        Some(s) if libc::WIFEXITED(s) => libc::WEXITSTATUS(s),
        Some(s) if libc::WIFSIGNALED(s) => {
            let signal = libc::WTERMSIG(s);
            // SAFETY: ending this process by the candidate's signal, so the
            // worker reads the same status.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
            128 + signal
        }
        _ => 143,
    }
}
