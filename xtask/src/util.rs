//! Small helpers shared by the subcommands.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of a file's bytes.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(sha256_bytes(&bytes))
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        write!(hex, "{byte:02x}").expect("writing to a String");
    }
    hex
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), else `cargo` on PATH.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// A child's exit code as a shell would report it (128 + signal if killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    1
}

/// Runs a command with captured output; an error only if it could not
/// start (or a stop signal came first). Supervised: see `supervise`.
pub fn output(cmd: &mut Command, what: &str) -> Result<Output> {
    use std::io::Read;
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ran = crate::supervise::run(cmd, what, |child| {
        let mut stderr = child.stderr.take().expect("piped");
        let drain = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes);
            bytes
        });
        let mut stdout = Vec::new();
        let _ = child.stdout.take().expect("piped").read_to_end(&mut stdout);
        (stdout, drain.join().unwrap_or_default())
    })?;
    match ran {
        Ok((status, (stdout, stderr))) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        Err(code) => anyhow::bail!("stopped (exit {code}) before {what} started"),
    }
}

/// Runs a command with inherited stdio and returns its exit code (after a
/// stop signal: 128 + signal, without starting it). Supervised: see
/// `supervise`.
///
/// Off a terminal, the child's stderr is relayed through xtask, which
/// keeps draining it when its own stderr is closed or full (`2>&1 | head`,
/// `2>/dev/full`): cargo would otherwise fail printing its status line
/// (exit 101) before the runner starts, and no report would be written.
pub fn status(cmd: &mut Command, what: &str) -> Result<i32> {
    use std::io::{IsTerminal, Read, Write};
    let relay = !std::io::stderr().is_terminal();
    if relay {
        cmd.stderr(std::process::Stdio::piped());
    }
    let ran = crate::supervise::run(cmd, what, |child| {
        let mut from = child.stderr.take()?;
        Some(std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            let mut open = true;
            while let Ok(n) = from.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                if open {
                    let mut to = std::io::stderr().lock();
                    open = to.write_all(&buffer[..n]).and_then(|()| to.flush()).is_ok();
                }
            }
        }))
    })?;
    Ok(match ran {
        Ok((status, relay)) => {
            if let Some(relay) = relay {
                let _ = relay.join();
            }
            // Killed by a signal xtask did not forward (SIGKILL, the OOM
            // killer): say so rather than exit 128+N silently.
            #[cfg(unix)]
            if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
                if crate::supervise::signalled().is_none() {
                    eprintln!(
                        "xtask: {what} was killed by signal {signal}; exit {}",
                        128 + signal
                    );
                }
            }
            exit_code(status)
        }
        Err(code) => code,
    })
}

/// The last `max_lines` lines of a child's stderr (or stdout if stderr is
/// empty), indented, for an error message.
pub fn tail(output: &Output, max_lines: usize) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&output.stdout)
    } else {
        stderr
    };
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines[start..]
        .iter()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a failed download looks like a network problem.
pub fn looks_like_network_failure(output: &Output) -> bool {
    let text = String::from_utf8_lossy(&output.stderr).to_lowercase();
    [
        "failed to fetch",
        "error sending request",
        "dns",
        "connect",
        "timed out",
        "timeout",
        "network",
        "unreachable",
        "failed to download",
        "offline",
        "resolve host",
        "tls",
        "certificate",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// `path` relative to `root` when it is inside it (for messages).
pub fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The runner's and the explorer's path arguments (`--out`,
/// `--keep-outputs`, `--export`, `--cases`, `--verify-export`,
/// `--verify-against`, `--same-verdicts-as`, as `--flag X` or `--flag=X`;
/// every value of `--merge A B ...`) made absolute against the directory
/// the user ran xtask in: the runner itself runs in the workspace root, so
/// a relative path would otherwise land there.
pub fn absolute_path_args(args: &[OsString]) -> Vec<OsString> {
    const PATH_FLAGS: [&str; 7] = [
        "--out",
        "--keep-outputs",
        "--export",
        "--cases",
        "--verify-export",
        "--verify-against",
        "--same-verdicts-as",
    ];
    let cwd = std::env::current_dir().unwrap_or_default();
    let absolute = |value: &std::ffi::OsStr| -> OsString {
        std::path::absolute(cwd.join(value))
            .unwrap_or_else(|_| cwd.join(value))
            .into_os_string()
    };
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        out.push(arg.clone());
        // After a bare `--` nothing is a flag (the runner refuses the run).
        if arg.as_os_str() == "--" {
            out.extend(it.cloned());
            break;
        }
        let text = arg.to_string_lossy();
        if text == "--merge" {
            // Every value up to the next flag.
            while let Some(value) = it.as_slice().first() {
                if value.to_string_lossy().starts_with("--") {
                    break;
                }
                it.next();
                out.push(if value.is_empty() {
                    value.clone()
                } else {
                    absolute(value)
                });
            }
        } else if PATH_FLAGS.contains(&text.as_ref()) {
            // An empty value stays empty: the runner refuses it (made
            // absolute it would name the working directory).
            if let Some(value) = it.next() {
                out.push(if value.is_empty() {
                    value.clone()
                } else {
                    absolute(value)
                });
            }
        } else if let Some((flag, rest)) = text.split_once('=') {
            if PATH_FLAGS.contains(&flag) && !rest.is_empty() {
                use std::os::unix::ffi::{OsStrExt, OsStringExt};
                let value = std::ffi::OsStr::from_bytes(&arg.as_bytes()[flag.len() + 1..]);
                let mut joined = format!("{flag}=").into_bytes();
                joined.extend_from_slice(absolute(value).as_bytes());
                *out.last_mut().expect("just pushed") = OsString::from_vec(joined);
            }
        }
    }
    out
}

/// `result`, clearing the reports this run would have written when it is
/// an error (xtask refused the run before the runner could).
pub fn or_clear_reports<T>(root: &Path, args: &[OsString], result: Result<T>) -> Result<T> {
    if result.is_err() {
        clear_reports(root, args);
    }
    result
}

/// Removes the conformance reports of a previous run from the directory
/// this run would write (its `--out`, relative to `root`, the runner's
/// working directory; else `target/conformance`), and from no other: runs
/// with different `--out` directories in one job keep each other's reports.
pub fn clear_reports(root: &Path, args: &[OsString]) {
    // `--list` and `--help` write no report: the last run's stay (a CI job
    // that lists cases after running them keeps its reports).
    if args
        .iter()
        .any(|a| matches!(a.to_str(), Some("--list" | "--help" | "-h")))
    {
        return;
    }
    let dir = reports_dir(root, args);
    // Only where a run wrote reports (each leaves this lock file): a
    // user's own report.md in the --out they gave is not the last run's.
    if std::fs::symlink_metadata(dir.join(".conformance-reports.lock")).is_err() {
        return;
    }
    for f in ["report.json", "junit.xml", "report.md"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
}

/// The reports directory a runner invocation with `args` writes.
pub fn reports_dir(root: &Path, args: &[OsString]) -> std::path::PathBuf {
    let mut out = None;
    // After a bare `--` nothing is a flag (the runner refuses such a run).
    let mut it = args.iter().take_while(|a| a.as_os_str() != "--");
    while let Some(arg) = it.next() {
        let text = arg.to_string_lossy();
        if text == "--out" {
            out = it.next().map(std::path::PathBuf::from);
        } else if let Some(value) = text.strip_prefix("--out=") {
            out = Some(value.into());
        }
    }
    match out {
        Some(dir) if dir.is_absolute() => dir,
        // The runner runs in `root`, so a relative `--out` is under it.
        Some(dir) => root.join(dir),
        None => root.join("target/conformance"),
    }
}

#[cfg(test)]
mod reports_dir_tests {
    use super::*;

    #[test]
    fn only_the_runs_own_out_directory_is_cleared() {
        let root = std::env::temp_dir().join(format!("xtask-out-{}", std::process::id()));
        let (metal, cpu) = (root.join("a"), root.join("b"));
        let users = root.join("c");
        for d in [&metal, &cpu, &users] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("report.md"), "x").unwrap();
        }
        // Runs wrote a and b (each leaves the reports' lock file).
        for d in [&metal, &cpu] {
            std::fs::write(d.join(".conformance-reports.lock"), "").unwrap();
        }
        let args: Vec<OsString> = vec!["--out".into(), cpu.clone().into_os_string()];
        assert_eq!(reports_dir(&root, &args), cpu);
        clear_reports(&root, &args);
        assert!(!cpu.join("report.md").exists());
        // A user's own report.md where no run wrote reports is not ours
        // (before: removed when the run's setup failed).
        clear_reports(&root, &["--out".into(), users.clone().into_os_string()]);
        assert!(users.join("report.md").exists(), "a user's file survives");
        assert!(
            metal.join("report.md").exists(),
            "another run's report survives"
        );
        let eq: Vec<OsString> = vec![format!("--out={}", metal.display()).into()];
        assert_eq!(reports_dir(&root, &eq), metal);
        assert_eq!(reports_dir(&root, &[]), root.join("target/conformance"));
        // A relative --out names the user's directory, not the root the
        // runner runs in (before: `root/rel` while the runner said `rel`).
        let cwd = std::env::current_dir().unwrap();
        for args in [
            vec![OsString::from("--out"), "rel".into()],
            vec!["--out=rel".into()],
        ] {
            assert_eq!(
                reports_dir(&root, &absolute_path_args(&args)),
                cwd.join("rel")
            );
        }
        // An empty path stays empty (the runner refuses it), and nothing
        // after `--` is rewritten.
        for empty in [
            vec![OsString::from("--out"), "".into()],
            vec!["--out=".into()],
        ] {
            assert_eq!(absolute_path_args(&empty), empty);
        }
        let after = vec![OsString::from("--"), "--out".into(), "rel".into()];
        assert_eq!(absolute_path_args(&after), after);
        let kept = absolute_path_args(&[
            "--keep-outputs".into(),
            "k".into(),
            "--filter".into(),
            "x".into(),
        ]);
        assert_eq!(kept[1], cwd.join("k").into_os_string());
        assert_eq!(kept[3], OsString::from("x"));
        // Issue 40, class 21: --export, --cases and --verify-export (and
        // the other path flags) resolved against the workspace root.
        for flag in [
            "--export",
            "--cases",
            "--verify-export",
            "--verify-against",
            "--same-verdicts-as",
        ] {
            let a = absolute_path_args(&[flag.into(), "rel".into()]);
            assert_eq!(a[1], cwd.join("rel").into_os_string(), "{flag}");
            let b = absolute_path_args(&[format!("{flag}=rel").into()]);
            assert_eq!(
                b[0],
                OsString::from(format!("{flag}={}", cwd.join("rel").display())),
                "{flag}="
            );
        }
        let merged = absolute_path_args(&[
            "--merge".into(),
            "a.json".into(),
            "b.json".into(),
            "--keep".into(),
        ]);
        assert_eq!(merged[1], cwd.join("a.json").into_os_string());
        assert_eq!(merged[2], cwd.join("b.json").into_os_string());
        assert_eq!(merged[3], OsString::from("--keep"));
        // Listing writes no report, so it clears none.
        let list: Vec<OsString> = vec![
            "--out".into(),
            metal.clone().into_os_string(),
            "--list".into(),
        ];
        clear_reports(&root, &list);
        assert!(metal.join("report.md").exists(), "--list keeps the reports");
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// The dynamic-linking entries of an ELF shared library.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ElfDynamic {
    /// `DT_NEEDED` sonames, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH`, if any.
    pub rpath: Option<String>,
    /// `DT_RUNPATH`, if any.
    pub runpath: Option<String>,
}

/// Reads `DT_NEEDED`, `DT_RPATH` and `DT_RUNPATH` of a 64-bit little-endian
/// ELF file (what `readelf -d` prints), reading only the section headers,
/// `.dynamic` and its string table (not the whole, possibly huge, file).
pub fn elf_dynamic(path: &Path) -> Result<ElfDynamic> {
    use std::io::{Read, Seek, SeekFrom};
    let shown = path.display();
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {shown}"))?;
    let mut read_at = |offset: u64, len: usize| -> Result<Vec<u8>> {
        let mut buffer = vec![0; len];
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(&mut buffer)
            .with_context(|| format!("reading {len} bytes at {offset} of {shown}"))?;
        Ok(buffer)
    };
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());

    let header = read_at(0, 64)?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        anyhow::bail!("{shown} is not a 64-bit little-endian ELF file");
    }
    let (shoff, shentsize, shnum) = (
        u64_at(&header, 0x28),
        u16_at(&header, 0x3a) as usize,
        u16_at(&header, 0x3c) as usize,
    );
    if shentsize < 64 || shnum == 0 {
        anyhow::bail!("{shown} has no section headers");
    }
    let sections = read_at(shoff, shentsize * shnum)?;
    let section = |i: usize| &sections[i * shentsize..(i + 1) * shentsize];
    const SHT_DYNAMIC: u32 = 6;
    let Some(dynamic) = (0..shnum).find(|&i| u32_at(section(i), 4) == SHT_DYNAMIC) else {
        anyhow::bail!("{shown} has no .dynamic section (not dynamically linked)");
    };
    let dynamic = section(dynamic);
    let strtab_index = u32_at(dynamic, 40) as usize;
    if strtab_index >= shnum {
        anyhow::bail!("{shown}: .dynamic links to a missing string table");
    }
    let entries = read_at(u64_at(dynamic, 24), u64_at(dynamic, 32) as usize)?;
    let strtab = section(strtab_index);
    let strings = read_at(u64_at(strtab, 24), u64_at(strtab, 32) as usize)?;
    let string = |offset: u64| -> Result<String> {
        let rest = strings
            .get(offset as usize..)
            .with_context(|| format!("{shown}: string offset {offset} out of range"))?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    const DT_RPATH: u64 = 15;
    const DT_RUNPATH: u64 = 29;
    let mut out = ElfDynamic::default();
    for entry in entries.chunks_exact(16) {
        let (tag, value) = (u64_at(entry, 0), u64_at(entry, 8));
        match tag {
            DT_NULL => break,
            DT_NEEDED => out.needed.push(string(value)?),
            DT_RPATH => out.rpath = Some(string(value)?),
            DT_RUNPATH => out.runpath = Some(string(value)?),
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself is a dynamically linked ELF on Linux.
    #[test]
    #[cfg(all(
        target_os = "linux",
        target_pointer_width = "64",
        target_endian = "little"
    ))]
    fn reads_own_dynamic_section() {
        let exe = std::env::current_exe().unwrap();
        let dynamic = elf_dynamic(&exe).unwrap();
        assert!(
            dynamic.needed.iter().any(|n| n.starts_with("libc.so")),
            "{dynamic:?}"
        );
    }
}
