//! The runner's side of the protocol: one long-lived candidate process per
//! worker, started with `sh -c CMD` in its own process group, spoken to
//! in line-JSON on its stdin and stdout, arrays exchanged as safetensors
//! files in a private scratch directory.
//!
//! Every way a candidate can go wrong ends one call, never the run:
//! exiting, a signal, no answer within the timeout, a line that is not
//! the protocol's JSON, a reply for another call, a missing or unreadable
//! tensor file. The process is then killed (its whole group) and the next
//! call starts a fresh one.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oracle::{Arg, Value};
use serde_json::{json, Value as Json};

use super::ops::Op;
use super::wire;

/// The protocol version this runner speaks.
pub const PROTOCOL: u64 = 1;
/// How many of the candidate's last stderr lines an error quotes.
const STDERR_TAIL: usize = 8;

/// The directory the candidate command runs in, when set (else the
/// runner's own). `cargo xtask conformance` runs the runner in the
/// checkout's top level and sets this to the caller's directory, so a
/// relative path in `--candidate` resolves where the user ran it, as
/// `--cases`, `--out` and the other paths do.
pub const CWD_ENV: &str = "MLX_CONFORMANCE_CANDIDATE_CWD";

/// [`CWD_ENV`]'s directory, when set and not empty.
pub fn cwd() -> Option<std::path::PathBuf> {
    std::env::var_os(CWD_ENV)
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
}

/// What `--candidate` configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// The shell command that starts the candidate.
    pub command: String,
    /// How long one answer (the hello included) may take.
    pub timeout: Duration,
    /// `cpu`, `metal` or `cuda`: told to the candidate in the hello.
    pub backend: String,
}

/// How a candidate answered a call.
#[derive(Debug)]
pub enum Reply {
    /// It computed: the result tree.
    Value(Value),
    /// It raised (as the reference may): its message.
    Raised(String),
}

/// Why a call has no reply.
#[derive(Debug)]
pub enum CallError {
    /// The candidate does not implement the op (or this version of it).
    Unsupported(String),
    /// The candidate broke the protocol or died: the reason.
    Failed(String),
}

/// A live candidate.
pub struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    scratch: tempfile::TempDir,
    next_id: u64,
    /// What the candidate implements: op name -> version.
    ops: BTreeMap<String, u64>,
    /// The name it gave in its hello.
    pub name: String,
    /// The refusals its hello declared: `(op, condition)`, a raise on
    /// that op whose message contains the condition is one of them.
    refusals: Vec<(String, String)>,
    timeout: Duration,
    /// Killed and reaped: its pid may belong to another process now.
    dead: bool,
}

/// Why the libmlx file a candidate's hello names is not the one this
/// process (the reference) runs, compared by sha256; `Ok` when it is.
fn same_libmlx(candidate: &std::path::Path) -> Result<(), String> {
    let reference = oracle::guards::check_single_libmlx().map_err(|e| e.to_string())?;
    let digest = |path: &std::path::Path| -> Result<String, String> {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "cannot read the libmlx file {} to check it: {e}",
                clip(&path.display().to_string())
            )
        })?;
        Ok(format!("{:x}", Sha256::digest(&bytes)))
    };
    let theirs = digest(candidate)?;
    let ours = digest(std::path::Path::new(&reference))?;
    if theirs == ours {
        return Ok(());
    }
    Err(format!(
        "the candidate loaded libmlx {} (sha256 {theirs}), not the reference's build {reference} (sha256 {ours}); a candidate must load the pinned libmlx, the same file by sha256 (docs/src/guide/candidate.md, \"The same libmlx\")",
        clip(&candidate.display().to_string())
    ))
}

impl Client {
    /// Starts the candidate and exchanges hellos.
    pub fn start(config: &Config) -> Result<Client, String> {
        // What a worker and launcher killed together left (issue 40): the
        // candidate's processes and its scratch directory. Their owner is
        // gone, so nobody else will end or remove them.
        crate::scratch::reclaim_stale(&std::env::temp_dir());
        let scratch = tempfile::Builder::new()
            .prefix(&crate::scratch::own_prefix(crate::scratch::CANDIDATE))
            .tempdir()
            .map_err(|e| format!("cannot make the candidate's scratch directory: {e}"))?;
        let mut child = launch(&config.command, scratch.path())
            .env("MLX_CONFORMANCE_PROTOCOL", PROTOCOL.to_string())
            // Its own group, so a kill reaches what `sh` started too.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start `sh -c {:?}`: {e}", config.command))?;
        let stdin = child.stdin.take().expect("piped");
        let lines = crate::child::read_lines(child.stdout.take().expect("piped"));
        let stderr = child.stderr.take().expect("piped");
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr_tail);
        // Relayed in bounded, lossily decoded lines: never held whole,
        // never closed early (the candidate would die of SIGPIPE).
        std::thread::spawn(move || {
            crate::child::for_each_line(stderr, |line| {
                errln!("candidate: {}", crate::child::printable(&line));
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(crate::child::clip(&line, 1000));
            });
        });
        let mut client = Client {
            child,
            stdin,
            lines,
            stderr_tail,
            scratch,
            next_id: 0,
            ops: BTreeMap::new(),
            name: String::new(),
            refusals: Vec::new(),
            timeout: config.timeout,
            dead: false,
        };
        let hello = json!({
            "type": "hello",
            "protocol": PROTOCOL,
            "backend": config.backend,
            "scratch": client.scratch.path(),
        });
        let answer = client.exchange(&hello).map_err(|e| format!("hello: {e}"))?;
        if answer.get("type").and_then(Json::as_str) != Some("hello") {
            return Err(client.fail(&format!(
                "hello: expected a `hello` reply, got {}",
                clip(&answer.to_string())
            )));
        }
        if answer.get("protocol").and_then(Json::as_u64) != Some(PROTOCOL) {
            return Err(client.fail(&format!(
                "hello: the candidate speaks protocol {}, this runner {PROTOCOL}",
                answer
                    .get("protocol")
                    .map_or("(none)".into(), Json::to_string)
            )));
        }
        let Some(ops) = answer.get("ops").and_then(Json::as_object) else {
            return Err(client.fail("hello: `ops` must be an object of op name -> version"));
        };
        for (name, version) in ops {
            let Some(v) = version.as_u64() else {
                return Err(client.fail(&format!(
                    "hello: op `{}` has version {}, not an integer",
                    clip(name),
                    clip(&version.to_string())
                )));
            };
            client.ops.insert(name.clone(), v);
        }
        // Optional: refusals by design, `[{"op": ..., "condition": ...}]`.
        match answer.get("refusals") {
            None | Some(Json::Null) => {}
            Some(Json::Array(items)) => {
                for item in items {
                    let op = item.get("op").and_then(Json::as_str);
                    let condition = item.get("condition").and_then(Json::as_str);
                    match (op, condition) {
                        (Some(op), Some(c)) if super::ops::by_name(op).is_some() && !c.trim().is_empty() => {
                            client.refusals.push((op.to_owned(), clip(c)));
                        }
                        _ => {
                            return Err(client.fail(&format!(
                                "hello: each of `refusals` is {{\"op\": <an op of docs/ops.md>, \"condition\": <text, not blank, its message contains>}}, not {}",
                                clip(&item.to_string())
                            )))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(client.fail(&format!(
                    "hello: `refusals` must be a list, not {}",
                    clip(&other.to_string())
                )))
            }
        }
        // Optional: the libmlx file the candidate loaded, which must be the
        // reference's own build (the same file by sha256), or a difference
        // could come from two MLX builds rather than the candidate's maths.
        match answer.get("libmlx") {
            None | Some(Json::Null) => {}
            Some(Json::String(path)) => {
                if let Err(e) = same_libmlx(std::path::Path::new(path)) {
                    return Err(client.fail(&format!("hello: {e}")));
                }
            }
            Some(other) => {
                return Err(client.fail(&format!(
                    "hello: `libmlx` is the path of the libmlx file the candidate loaded, not {}",
                    clip(&other.to_string())
                )))
            }
        }
        // Clipped: the name goes into messages, and so into reports.
        client.name = clip(
            answer
                .get("name")
                .and_then(Json::as_str)
                .unwrap_or("candidate"),
        );
        Ok(client)
    }

    /// The refusal its hello declared that a raise on `op` with `message`
    /// is (the first whose condition the message contains).
    pub fn refusal(&self, op: &str, message: &str) -> Option<&str> {
        self.refusals
            .iter()
            .find(|(o, c)| o == op && message.contains(c.as_str()))
            .map(|(_, c)| c.as_str())
    }

    /// Whether the candidate said it implements `op` at its version.
    pub fn supports(&self, op: &Op) -> Result<(), String> {
        match self.ops.get(op.name) {
            Some(&v) if v == u64::from(op.version) => Ok(()),
            Some(&v) => Err(format!(
                "`{}` implements op `{}` version {v}; this suite calls version {}",
                self.name, op.name, op.version
            )),
            None => Err(format!(
                "`{}` does not implement op `{}`",
                self.name, op.name
            )),
        }
    }

    /// One call: the arguments the reference got, the candidate's reply.
    pub fn call(&mut self, case: &str, op: &Op, args: &[(&str, Arg)]) -> Result<Reply, CallError> {
        self.supports(op).map_err(CallError::Unsupported)?;
        self.next_id += 1;
        let id = self.next_id;
        let encoded = wire::encode_args(args);
        let inputs = self.scratch.path().join(format!("{id}.in.safetensors"));
        let outputs = self.scratch.path().join(format!("{id}.out.safetensors"));
        crate::kept::write_file(&inputs, &encoded.tensors, None)
            .map_err(|e| CallError::Failed(format!("writing the call's inputs: {e}")))?;
        let request = json!({
            "type": "call",
            "id": id,
            "case": case,
            "op": op.name,
            "version": op.version,
            "args": encoded.json,
            "inputs": inputs,
            "outputs": outputs,
        });
        let answer = self.exchange(&request);
        let _ = std::fs::remove_file(&inputs);
        let answer = answer.map_err(|e| CallError::Failed(format!("op `{}`: {e}", op.name)))?;
        let reply = self.read_reply(&answer, id, &outputs, op);
        let _ = std::fs::remove_file(&outputs);
        reply
    }

    fn read_reply(
        &mut self,
        answer: &Json,
        id: u64,
        outputs: &std::path::Path,
        op: &Op,
    ) -> Result<Reply, CallError> {
        let bad = |this: &mut Self, what: String| {
            CallError::Failed(this.fail(&format!("op `{}`: {what}", op.name)))
        };
        if answer.get("id").and_then(Json::as_u64) != Some(id) {
            return Err(bad(
                self,
                format!(
                    "the reply is for call {}, not {id}",
                    answer.get("id").map_or("(none)".into(), Json::to_string)
                ),
            ));
        }
        match answer.get("type").and_then(Json::as_str) {
            Some("result") => {
                let Some(value) = answer.get("value") else {
                    return Err(bad(self, "a `result` reply without `value`".into()));
                };
                let tensors = if std::fs::symlink_metadata(outputs).is_ok() {
                    wire::read_tensors(outputs)
                        .map_err(|e| bad(self, format!("its outputs file: {e}")))?
                } else {
                    BTreeMap::new()
                };
                wire::decode_value(value, &tensors)
                    .map(Reply::Value)
                    .map_err(|e| bad(self, format!("its result: {e}")))
            }
            Some("error") => {
                let message = answer
                    .get("message")
                    .and_then(Json::as_str)
                    .unwrap_or("(no message)");
                // Clipped: a message goes into every report of the case.
                let message = crate::child::clip(message, crate::child::MAX_REPORTED);
                match answer.get("kind").and_then(Json::as_str) {
                    Some("unsupported") => Err(CallError::Unsupported(format!(
                        "`{}` answered unsupported: {message}",
                        self.name
                    ))),
                    Some("raised") => Ok(Reply::Raised(message)),
                    other => Err(bad(
                        self,
                        format!("an `error` reply of kind {other:?} (`raised` or `unsupported`)"),
                    )),
                }
            }
            other => Err(bad(
                self,
                format!("a reply of type {other:?} (`result` or `error`)"),
            )),
        }
    }

    /// Sends one line and waits for one line (within the timeout).
    fn exchange(&mut self, message: &Json) -> Result<Json, String> {
        if let Err(e) = writeln!(self.stdin, "{message}").and_then(|()| self.stdin.flush()) {
            return Err(self.fail(&format!("cannot write to the candidate ({e})")));
        }
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => serde_json::from_str(line.trim_end()).map_err(|e| {
                self.fail(&format!(
                    "answered a line that is not JSON ({e}): {}",
                    clip(line.trim_end())
                ))
            }),
            Ok(Err(e)) => Err(self.fail(&format!("its stdout could not be read ({e})"))),
            Err(RecvTimeoutError::Timeout) => Err(self.fail(&format!(
                "no answer within {} s (--candidate-timeout)",
                self.timeout.as_secs_f64()
            ))),
            Err(RecvTimeoutError::Disconnected) => {
                // Its stdout ended: it exited, or closed stdout and runs on.
                // Either way no wait beyond --candidate-timeout.
                let Some(status) = self.wait_for(self.timeout) else {
                    return Err(self.fail(&format!(
                        "closed its stdout without answering and kept running; killed after {} s (--candidate-timeout)",
                        self.timeout.as_secs_f64()
                    )));
                };
                let status = status.to_string();
                // Reaped (its launcher has already ended what it started;
                // what escaped it, this worker adopted: ended too).
                self.dead = true;
                sweep_adopted();
                // The stderr thread may still be reading its last lines.
                std::thread::sleep(Duration::from_millis(50));
                Err(self.describe(&format!(
                    "the candidate exited ({status}) without answering"
                )))
            }
        }
    }

    /// Kills the candidate and says why, with its last stderr lines.
    fn fail(&mut self, why: &str) -> String {
        self.kill();
        self.describe(why)
    }

    fn describe(&self, why: &str) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.is_empty() {
            format!("candidate: {why}")
        } else {
            let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
            format!(
                "candidate: {why}; its stderr ended:\n  {}",
                lines.join("\n  ")
            )
        }
    }

    /// Whether the process was killed (the next call needs a new one).
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// The process's exit status once it has exited, waiting at most
    /// `limit` (`None`: still running).
    fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now().checked_add(limit);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => {}
                Err(_) => return None,
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ends the candidate and everything it started. On Linux the process
    /// is its launcher: SIGTERM makes it kill the candidate's group and
    /// every process it adopted, then exit (a bounded wait; SIGKILL to
    /// the launcher's group after it). Elsewhere the group is killed.
    fn kill(&mut self) {
        if self.dead {
            return;
        }
        self.dead = true;
        let pid = self.child.id() as i32;
        if cfg!(target_os = "linux") {
            // SAFETY: a signal to this client's own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            if self.wait_for(Duration::from_secs(10)).is_some() {
                sweep_adopted();
                return;
            }
        }
        // SAFETY: a signal to the child's own process group (not yet
        // reaped, so the group id is still its own).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
        sweep_adopted();
    }
}

impl Drop for Client {
    /// The candidate holds no state worth a polite end: its group is
    /// killed, so nothing it started outlives the worker's run.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills and reaps what this worker adopted (it is a child subreaper when
/// it serves a candidate, and its only children are the candidate's
/// launchers): what escaped a launcher that was killed. Called once the
/// launcher is reaped.
fn sweep_adopted() {
    #[cfg(target_os = "linux")]
    super::launcher::sweep(Duration::from_secs(5));
}

/// The command that starts the candidate: on Linux through its launcher
/// (this executable again, [`super::launcher`]), elsewhere `sh -c CMD`;
/// in [`cwd`] when set (the caller's directory under `cargo xtask`).
fn launch(command: &str, scratch: &std::path::Path) -> Command {
    let mut c = launch_here(command, scratch);
    if let Some(dir) = cwd() {
        c.current_dir(dir);
    }
    c
}

fn launch_here(command: &str, scratch: &std::path::Path) -> Command {
    #[cfg(target_os = "linux")]
    if let Ok(exe) = std::env::current_exe() {
        let mut c = Command::new(exe);
        c.arg(super::launcher::FLAG)
            .arg(scratch)
            .args(["--", "sh", "-c", command])
            .env(super::launcher::PARENT_ENV, std::process::id().to_string());
        return c;
    }
    let _ = scratch;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(command)
        .env(crate::scratch::OWNER_ENV, crate::scratch::own_owner());
    c
}

fn clip(s: &str) -> String {
    crate::child::clip(s, 200)
}
