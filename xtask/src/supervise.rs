//! Every child xtask starts (cargo, the conformance runner, uv, …) runs in
//! its own process group, and xtask forwards SIGINT, SIGTERM and SIGHUP to
//! that whole group, then waits for it and exits with its code. So
//! `kill <pid of cargo xtask …>` (what a job supervisor sends) stops the
//! runner and its workers, or cargo and its test binaries, exactly as a
//! Ctrl-C does, and nothing is left running. After a signal no further
//! child is started. On Linux a child is also sent SIGTERM if xtask itself
//! dies (SIGKILL included).
//!
//! The child's group is not the terminal's foreground group: Ctrl-C
//! reaches xtask, which forwards it once.

use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};

use anyhow::{Context, Result};

/// The first stop signal received (0: none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);
/// The process group of the child now running, if any.
static CHILD_GROUP: Mutex<Option<i32>> = Mutex::new(None);

const FORWARDED: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn install() -> Result<()> {
    static INSTALL: Once = Once::new();
    let mut failed = None;
    INSTALL.call_once(|| match signal_hook::iterator::Signals::new(FORWARDED) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for signal in signals.forever() {
                    let _ =
                        SIGNALLED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
                    forward(signal);
                }
            });
        }
        Err(e) => failed = Some(e),
    });
    match failed {
        Some(e) => Err(e).context("cannot install the signal forwarding"),
        None => Ok(()),
    }
}

fn forward(signal: i32) {
    if let Some(group) = *CHILD_GROUP.lock().unwrap_or_else(|e| e.into_inner()) {
        // SAFETY: sending a signal to a process group we created.
        unsafe {
            libc::killpg(group, signal);
        }
    }
}

/// The stop signal received so far, if any.
pub fn signalled() -> Option<i32> {
    match SIGNALLED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Runs `cmd` in its own process group with signals forwarded; `collect`
/// reads from the started child (its pipes) before it is waited for. After
/// a stop signal nothing is started: `Err(128 + signal)`, the code a shell
/// gives.
pub fn run<T>(
    cmd: &mut Command,
    what: &str,
    collect: impl FnOnce(&mut Child) -> T,
) -> Result<Result<(ExitStatus, T), i32>> {
    use std::os::unix::process::CommandExt;
    install()?;
    if let Some(signal) = signalled() {
        return Ok(Err(128 + signal));
    }
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; it runs in the forked child
    // before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not run {what} ({:?})", cmd.get_program()))?;
    *CHILD_GROUP.lock().unwrap_or_else(|e| e.into_inner()) = Some(child.id() as i32);
    // A signal that arrived while the child was being started.
    if let Some(signal) = signalled() {
        forward(signal);
    }
    let collected = collect(&mut child);
    let status = child.wait();
    *CHILD_GROUP.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(Ok((
        status.with_context(|| format!("waiting for {what}"))?,
        collected,
    )))
}
