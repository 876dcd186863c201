//! Per-case crash isolation: cases run in worker processes (this binary
//! re-executed with [`WORKER_FLAG`]), so a segfault, abort, SIGFPE or SIGBUS
//! inside native code (libmlx, CPython, the port) ends one case as an ERROR
//! row naming the signal, and the run goes on in a fresh worker.
//!
//! Protocol, one worker = one process = one interpreter: the parent writes
//! one case name per line on the worker's stdin, as a JSON string (so a
//! newline or any other character in a name survives); the worker answers
//! each with one line, [`RESULT_PREFIX`] then the `CaseResult` as JSON, on a
//! private copy of its stdout. Paths reach the worker as raw OS strings on
//! its command line (a non-UTF-8 `--keep-outputs` directory included). The worker points its own fd 1 at stderr
//! first, so whatever Python or MLX print cannot corrupt the protocol; its
//! stderr is passed through to the parent's, and the last lines of it are
//! kept for the crash message. Each worker starts its own [`Oracle`], whose
//! start runs the one-libmlx and version guards. A worker whose case ended
//! in ERROR is replaced too, so one broken case cannot poison the next
//! (measured on CUDA: a failed kernel launch fails every later CUDA call in
//! the process).
//!
//!
//! A case that does not answer within the run's case timeout
//! (`--case-timeout`) is an ERROR row naming the timeout; its worker is
//! killed (SIGKILL: a stopped or deadlocked process included) and the run
//! goes on. Ctrl-C or SIGTERM to the runner kills the workers' cases in
//! flight instead of waiting for them.
//!
//! Testing hook: `MLX_CONFORMANCE_FAULT=<signal>@<text>` makes a worker
//! raise `<signal>` (`SIGSEGV`, `SIGABRT`, `SIGFPE`, `SIGBUS`, or
//! `SIGSTOP`, which stops it as a hang would) just before running a case
//! whose name contains `<text>`, as a crash in native code would (used by
//! `tests/cli.rs`; ignored outside workers).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oracle::Oracle;

use super::{blank, interrupted, run_one, skipped, CaseResult, RunOptions, Verdict};
use crate::case::{Backend, Case};
use crate::hooks::Hooks;

/// The hidden flag that makes the binary a worker.
pub const WORKER_FLAG: &str = "--worker";
/// Starts each result line on the worker's protocol channel.
const RESULT_PREFIX: &str = "@@conformance-result ";
/// The variable of the fault-injection hook (see the module docs).
pub const FAULT_ENV: &str = "MLX_CONFORMANCE_FAULT";
/// How many of a worker's last stderr lines a crash message quotes.
const STDERR_TAIL: usize = 12;

/// The runner's pid, as a worker is told it.
pub const RUNNER_PID_ENV: &str = "MLX_CONFORMANCE_RUNNER_PID";

/// The worker's first step: it is sent SIGKILL when its runner dies (even
/// a runner killed by SIGKILL while this worker is stopped), and exits at
/// once if the runner is already gone (Linux; elsewhere the closed stdin
/// ends it).
pub fn die_with_runner() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl and getppid on this process.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let runner = std::env::var(RUNNER_PID_ENV)
            .ok()
            .and_then(|p| p.parse::<i32>().ok());
        if runner.is_some_and(|pid| pid != unsafe { libc::getppid() }) {
            std::process::exit(3);
        }
    }
}

/// The worker's side: answers case names read on stdin until EOF. Returns
/// the process exit code (0; 3 when the protocol channel cannot be set up).
pub fn serve(cases: &[Case], oracle: &Oracle, options: &RunOptions, hooks: &Hooks) -> i32 {
    // The protocol gets a private copy of fd 1; fd 1 itself then goes to
    // stderr, so stray prints from Python or MLX land there.
    let channel = match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            errln!("error: worker: cannot duplicate stdout: {e}");
            return 3;
        }
    };
    // SAFETY: dup2 on the process's own standard descriptors; nothing else
    // in this process holds fd 1 open as a Rust object at this point.
    if unsafe { libc::dup2(2, 1) } < 0 {
        errln!("error: worker: cannot point stdout at stderr");
        return 3;
    }
    let mut channel = std::io::BufWriter::new(channel);
    let fault = std::env::var(FAULT_ENV).ok();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(name) = serde_json::from_str::<String>(&line) else {
            errln!("error: worker: a request that is not a JSON string: {line:?}");
            return 3;
        };
        let result = match cases.iter().find(|c| c.name == name) {
            Some(case) => {
                if let Some(fault) = &fault {
                    inject_fault(fault, &name);
                }
                run_one(case, oracle, options, hooks)
            }
            None => unknown_case(&name),
        };
        let json = serde_json::to_string(&result).expect("a case result serialises");
        if writeln!(channel, "{RESULT_PREFIX}{json}")
            .and_then(|()| channel.flush())
            .is_err()
        {
            break; // the parent is gone
        }
    }
    0
}

fn unknown_case(name: &str) -> CaseResult {
    CaseResult {
        verdict: Verdict::Error,
        message: Some(format!(
            "harness error: the worker has no case named `{name}` (parent and worker binaries differ?)"
        )),
        error_kind: Some(super::ErrorKind::Harness),
        ..CaseResult::new(name, "", "", crate::case::Expect::MustEqual)
    }
}

/// `MLX_CONFORMANCE_FAULT=<signal>@<text>`: raise the signal if `name`
/// contains `<text>`.
fn inject_fault(spec: &str, name: &str) {
    let Some((signal, text)) = spec.split_once('@') else {
        return;
    };
    if text.is_empty() || !name.contains(text) {
        return;
    }
    let number = match signal {
        "SIGSEGV" => libc::SIGSEGV,
        "SIGABRT" => libc::SIGABRT,
        "SIGFPE" => libc::SIGFPE,
        "SIGBUS" => libc::SIGBUS,
        "SIGSTOP" => libc::SIGSTOP,
        _ => return,
    };
    // SAFETY: raising a signal in this process; with the default action it
    // terminates the worker, which is what the hook is for.
    unsafe {
        libc::signal(number, libc::SIG_DFL);
        libc::raise(number);
    }
}

/// How the parent starts a worker: the current executable with
/// [`WORKER_FLAG`] and the run's options.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: std::path::PathBuf,
    pub args: Vec<OsString>,
    /// How long one case may take before it is an ERROR and its worker is
    /// killed (`None`: no limit).
    pub case_timeout: Option<Duration>,
}

/// One live worker process, seen from the parent.
struct Worker {
    child: Child,
    /// `None` once closed (dropping it ends the worker's loop).
    stdin: Option<ChildStdin>,
    /// The worker's stdout, line by line, from a reader thread (so the
    /// parent can wait with a deadline and notice an interrupt).
    stdout: Receiver<std::io::Result<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    passthrough: Option<std::thread::JoinHandle<()>>,
}

/// How a worker ended while running a case.
struct Crash {
    status: Option<ExitStatus>,
    stderr_tail: Vec<String>,
    detail: String,
    /// The worker was still running: the runner ended it (after an answer
    /// it could not read), so its signal says nothing about the case.
    ended_by_runner: bool,
    /// The case ran past the case timeout (this long) and the runner
    /// killed its worker.
    timed_out: Option<Duration>,
}

impl Worker {
    fn spawn(command: &WorkerCommand) -> std::io::Result<Worker> {
        // No `pre_exec` here: it makes std fork() instead of posix_spawn,
        // and fork() in a runner with CUDA initialised crashed the runner
        // on the H200 (SIGSEGV after a few dozen worker starts). The worker
        // sets its own parent-death signal instead (`die_with_runner`).
        let mut child = Command::new(&command.program)
            .env(RUNNER_PID_ENV, std::process::id().to_string())
            .args(&command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout_rx = crate::child::read_lines(child.stdout.take().expect("piped"));
        let stderr = child.stderr.take().expect("piped");
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr_tail);
        // Passes the worker's stderr through, keeping its last lines.
        // In bounded, lossily decoded lines (a worker's stderr carries the
        // candidate's and Python's): never held whole, never closed early.
        let passthrough = std::thread::spawn(move || {
            crate::child::for_each_line(stderr, |line| {
                errln!("{line}");
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(crate::child::clip(&line, 1000));
            });
        });
        Ok(Worker {
            child,
            stdin: Some(stdin),
            stdout: stdout_rx,
            stderr_tail,
            passthrough: Some(passthrough),
        })
    }

    /// Runs one case; `Err` when the worker ended without answering, ran
    /// past `timeout`, or the run was interrupted.
    fn run(&mut self, name: &str, timeout: Option<Duration>) -> Result<CaseResult, Crash> {
        let request = serde_json::to_string(name).expect("a name serialises");
        let sent = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{request}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin already closed")),
        };
        let mut detail = match sent {
            Ok(()) => String::new(),
            Err(e) => format!("could not send the case to the worker ({e})"),
        };
        let mut unreadable = false;
        let mut timed_out = None;
        // A limit too large to add to now is no limit (never a panic).
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // Short waits, so an interrupt is noticed within a tenth of a second.
        let tick = Duration::from_millis(100);
        while detail.is_empty() {
            if interrupted() {
                detail = "the run was interrupted".into();
                break;
            }
            let wait = deadline.map_or(tick, |d| {
                d.saturating_duration_since(Instant::now()).min(tick)
            });
            match self.stdout.recv_timeout(wait) {
                Ok(Ok(line)) => {
                    if let Some(json) = line.trim_end().strip_prefix(RESULT_PREFIX) {
                        match serde_json::from_str::<CaseResult>(json) {
                            Ok(result) => return Ok(result),
                            Err(e) => {
                                detail = format!("unreadable answer from the worker ({e})");
                                unreadable = true;
                            }
                        }
                    }
                }
                Ok(Err(e)) => detail = format!("reading from the worker failed ({e})"),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        timed_out = timeout;
                        detail = "timed out".into();
                    }
                }
            }
        }
        // Only an answer that could not be read leaves a live worker the
        // runner must end (a crashing worker closes its stdout first).
        let ended_by_runner = unreadable && matches!(self.child.try_wait(), Ok(None));
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        if let Some(t) = self.passthrough.take() {
            let _ = t.join();
        }
        let stderr_tail = self
            .stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        Err(Crash {
            status,
            stderr_tail,
            detail,
            ended_by_runner,
            timed_out,
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing stdin ends the worker's loop; reap it. An interrupted
        // run does not wait for a case in flight.
        if interrupted() {
            let _ = self.child.kill();
        }
        drop(self.stdin.take());
        let _ = self.child.wait();
        if let Some(t) = self.passthrough.take() {
            let _ = t.join();
        }
    }
}

/// The signal's conventional name.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGSEGV => "SIGSEGV (segmentation fault)",
        libc::SIGABRT => "SIGABRT (abort)",
        libc::SIGFPE => "SIGFPE (arithmetic exception)",
        libc::SIGBUS => "SIGBUS (bus error)",
        libc::SIGILL => "SIGILL (illegal instruction)",
        libc::SIGKILL => "SIGKILL (killed, e.g. out of memory)",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT (interrupt)",
        _ => return format!("signal {signal}"),
    };
    format!("{name}, signal {signal}")
}

fn crash_result(case: &Case, crash: Crash, time_ms: f64) -> CaseResult {
    use std::os::unix::process::ExitStatusExt;
    // A crash the fault hook asked for says so (a leftover hook is no
    // crash of the port).
    let hook = std::env::var_os(FAULT_ENV)
        .map(|v| {
            format!(
                " ({FAULT_ENV}={} is set: a testing hook that sends it on purpose)",
                v.to_string_lossy()
            )
        })
        .unwrap_or_default();
    if let Some(limit) = crash.timed_out {
        let mut result = blank(case);
        result.verdict = Verdict::Error;
        result.message = Some(format!(
            "timed out: no answer within the case timeout of {} s (--case-timeout){hook}; the runner killed its worker and the run continued in a new worker{}",
            limit.as_secs_f64(),
            if crash.stderr_tail.is_empty() {
                String::new()
            } else {
                format!(
                    "\nlast lines of the worker's stderr:\n  {}",
                    crash.stderr_tail.join("\n  ")
                )
            }
        ));
        result.time_ms = time_ms;
        result.error_kind = Some(super::ErrorKind::Timeout);
        return result;
    }
    let how = match crash.status {
        _ if crash.ended_by_runner => {
            "gave an answer the runner could not read, and the runner ended it".to_owned()
        }
        Some(status) => match status.signal() {
            Some(signal) => format!("was killed by {}", signal_name(signal)),
            None => format!(
                "exited with status {} before answering",
                status.code().unwrap_or(-1)
            ),
        },
        None => "ended before answering".to_owned(),
    };
    let mut message = format!(
        "crashed: the worker process running this case {how}{hook}{}; the run continued in a new worker",
        if crash.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", crash.detail)
        }
    );
    if !crash.stderr_tail.is_empty() {
        message.push_str("\nlast lines of the worker's stderr:\n  ");
        message.push_str(&crash.stderr_tail.join("\n  "));
    }
    let mut result = blank(case);
    result.verdict = Verdict::Error;
    result.message = Some(message);
    result.error_kind = Some(super::ErrorKind::Crash);
    result.time_ms = time_ms;
    result
}

/// Runs `cases` in `options.jobs` worker processes, calling `progress`
/// after each; results keep the input order. A worker that crashes is
/// replaced; a worker that cannot be started makes every case it was given
/// an ERROR saying why.
pub fn run(
    cases: &[&Case],
    command: &WorkerCommand,
    options: &RunOptions,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; cases.len()]);
    let units = units(cases);
    let jobs = options.jobs.clamp(1, units.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                let mut worker: Option<Worker> = None;
                'units: loop {
                    let u = next.fetch_add(1, Ordering::SeqCst);
                    let Some(unit) = units.get(u) else { break };
                    for &i in unit {
                        if interrupted() {
                            break 'units;
                        }
                        let case = cases[i];
                        let result = match skipped(case, options.backend) {
                            Some(skip) => skip,
                            None => run_in_worker(case, command, &mut worker),
                        };
                        // A worker killed by the same Ctrl-C is no case's crash.
                        if interrupted() {
                            break 'units;
                        }
                        progress(&result);
                        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                    }
                }
            });
        }
    });
    // An interrupted run leaves cases unrun; the caller exits 130.
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// The units of work handed to one worker each, as indices into `cases`:
/// the cases of one [`Case::shares`] key together (in their order, so the
/// work they share is done once, in one process), then every other case
/// alone, in order. Shared units go first: they hold the run's longest
/// work, which would otherwise end the run on one worker alone.
fn units(cases: &[&Case]) -> Vec<Vec<usize>> {
    let mut shared: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut alone = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        match case.shares {
            Some(key) => match shared.iter_mut().find(|(k, _)| *k == key) {
                Some((_, unit)) => unit.push(i),
                None => shared.push((key, vec![i])),
            },
            None => alone.push(vec![i]),
        }
    }
    shared
        .into_iter()
        .map(|(_, unit)| unit)
        .chain(alone)
        .collect()
}

fn run_in_worker(case: &Case, command: &WorkerCommand, worker: &mut Option<Worker>) -> CaseResult {
    let start = Instant::now();
    if worker.is_none() {
        match Worker::spawn(command) {
            Ok(w) => *worker = Some(w),
            Err(e) => {
                let mut result = blank(case);
                result.verdict = Verdict::Error;
                result.message = Some(format!(
                    "harness error: cannot start a worker process ({}): {e}",
                    command.program.display()
                ));
                result.error_kind = Some(super::ErrorKind::Harness);
                return result;
            }
        }
    }
    let w = worker.as_mut().expect("just started");
    match w.run(&case.name, command.case_timeout) {
        Ok(result) => {
            // A case that errored may have left native state broken (MLX's
            // CUDA backend keeps a failed launch's error set, and every
            // later CUDA call in the process fails): the next case gets a
            // fresh worker. Not after a candidate's error: that is the
            // candidate's process, and the worker keeps what it knows of
            // it (a candidate that never starts is not started for every
            // case, candidate/mod.rs).
            if result.verdict == Verdict::Error
                && result.error_kind != Some(super::ErrorKind::Substitute)
            {
                *worker = None;
            }
            result
        }
        Err(crash) => {
            *worker = None;
            crash_result(case, crash, start.elapsed().as_secs_f64() * 1e3)
        }
    }
}

/// The backend named on a worker's command line.
pub fn parse_backend(name: &str) -> Option<Backend> {
    name.parse().ok()
}
