//! The tool's private temporary directories (a candidate's scratch
//! directory, the workers' copy of `--cases`), and the reclaiming of those
//! whose owner died without removing them.
//!
//! Each is removed by its owner when it ends (the candidate's launcher and
//! its worker's `TempDir`; the runner's registry). When the owner is killed
//! with SIGKILL (the OOM killer, `kill -9` of a process tree) nobody removes
//! it. So its name carries its owner: `<kind><pid>-<start>-<random>`, where
//! `<start>` is the owner's start time (`/proc/<pid>/stat` field 22, so a
//! reused pid is not taken for the owner). Every new candidate and every
//! `--cases` run first removes the directories of owners that are gone: in
//! the same temporary directory, owned by this user, real directories (a
//! link is never followed nor removed). A candidate's processes that such
//! a kill left running are ended too ([`kill_orphans`]).

use std::path::{Path, PathBuf};

/// The name a candidate's scratch directory starts with.
pub const CANDIDATE: &str = "conformance-candidate-";
/// The name the workers' copy of `--cases` starts with.
pub const CASES: &str = "conformance-cases-";
/// Every kind of directory [`reclaim_stale`] reclaims.
const KINDS: [&str; 2] = [CANDIDATE, CASES];

/// A process's start time since boot, in clock ticks (`/proc/<pid>/stat`
/// field 22; the command name before it may hold spaces and parentheses).
/// `None` when there is no such process (or no `/proc`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state): field 22 is its 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The environment variable every candidate is started with: its owner
/// (the worker) as `<pid>-<start>`. Whatever the candidate starts inherits
/// it, so the processes of a candidate whose worker and launcher were
/// killed with SIGKILL (re-parented to init, nobody left to end them) are
/// found and ended by the next candidate run ([`reclaim_stale`], when it
/// finds that owner's scratch directory left too).
pub const OWNER_ENV: &str = "MLX_CONFORMANCE_CANDIDATE_OWNER";

/// This process as an owner: `<pid>-<start>`.
pub fn own_owner() -> String {
    let pid = std::process::id();
    format!("{pid}-{}", start_time(pid).unwrap_or(0))
}

/// The prefix of this process's directories of `kind` ([`CANDIDATE`],
/// [`CASES`]): its pid and start time, then the random part `tempfile`
/// adds.
pub fn own_prefix(kind: &str) -> String {
    format!("{kind}{}-", own_owner())
}

/// The owner `(pid, start time)` an [`OWNER_ENV`] value records.
fn parse_owner(value: &str) -> Option<(u32, u64)> {
    let (pid, start) = value.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The owner `(pid, start time)` a scratch directory's name records, if it
/// is one of ours.
fn owner(name: &str) -> Option<(u32, u64)> {
    let rest = KINDS.iter().find_map(|k| name.strip_prefix(k))?;
    let mut parts = rest.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((pid, start))
}

/// Whether the process that made a directory of this owner is still
/// running (a zombie counts as gone: it removes nothing any more).
fn alive((pid, start): (u32, u64)) -> bool {
    if cfg!(target_os = "linux") {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = &s[s.rfind(')')? + 1..];
                rest.split_whitespace().next().map(str::to_owned)
            });
        match state.as_deref() {
            None | Some("Z") | Some("X") => false,
            // Start time 0: a system without it recorded; the pid decides.
            Some(_) => start == 0 || start_time(pid) == Some(start),
        }
    } else {
        let Ok(pid) = i32::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let exists = unsafe { libc::kill(pid, 0) == 0 };
        exists || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

/// Reclaims what owners that are gone left in `tmp`: first ends the
/// processes their candidates left running ([`kill_orphans`], only for the
/// owners of a candidate directory found here), then removes the
/// directories of every kind; returns the directories removed. Never
/// follows a link, never touches another user's directory or process,
/// never fails (a directory it cannot remove stays for a later run).
pub fn reclaim_stale(tmp: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut stale = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(owner) else {
            continue;
        };
        let path = entry.path();
        // symlink_metadata: a link named like ours is not ours.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() && meta.uid() == me && !alive(owner) {
            let candidate = name.to_str().is_some_and(|n| n.starts_with(CANDIDATE));
            stale.push((path, owner, candidate));
        }
    }
    let owners: Vec<(u32, u64)> = stale.iter().filter(|s| s.2).map(|s| s.1).collect();
    // Passes until one kills nothing (bounded): what an orphan started
    // while it was being killed is found by the next pass.
    for _ in 0..5 {
        if owners.is_empty() || kill_orphans(&owners).is_empty() {
            break;
        }
    }
    stale
        .into_iter()
        .filter(|(path, _, _)| std::fs::remove_dir_all(path).is_ok())
        .map(|(path, _, _)| path)
        .collect()
}

/// Kills (SIGKILL) this user's processes whose environment names one of
/// `owners` (candidate owners that are gone and left their scratch
/// directory): what a candidate started, left running when its worker and
/// launcher were killed with SIGKILL. Only those owners: a stray
/// [`OWNER_ENV`] in a user's shell names no such directory. Returns their
/// pids. A process that cleared its environment is not found (only a pid
/// namespace would hold such a one). Linux only (`/proc`).
fn kill_orphans(owners: &[(u32, u64)]) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let mut killed = Vec::new();
    if !cfg!(target_os = "linux") {
        return killed;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return killed;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let own = std::process::id();
    let needle = format!("{OWNER_ENV}=");
    for entry in dir.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own || !entry.metadata().is_ok_and(|m| m.uid() == me) {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let owner = environ
            .split(|b| *b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok()?.strip_prefix(needle.as_str()))
            .find_map(parse_owner);
        if owner.is_some_and(|o| owners.contains(&o)) {
            // SAFETY: a signal to a process of this user that a candidate
            // of a dead owner started.
            if unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0 {
                killed.push(pid as i32);
            }
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_values_parse() {
        assert_eq!(parse_owner("12-345"), Some((12, 345)));
        assert_eq!(parse_owner("12"), None);
        assert_eq!(parse_owner("x-1"), None);
        assert_eq!(
            parse_owner(&own_owner()).map(|o| o.0),
            Some(std::process::id())
        );
    }

    #[test]
    fn names_record_their_owner() {
        assert_eq!(owner("conformance-candidate-12-345-abc"), Some((12, 345)));
        assert_eq!(owner("conformance-candidate-12-345-a-b"), Some((12, 345)));
        // The old, ownerless names and other files are not ours.
        assert_eq!(owner("conformance-candidate-abc123"), None);
        assert_eq!(owner("conformance-candidate-12-345"), None);
        assert_eq!(owner("conformance-cases-12-345-x"), Some((12, 345)));
        assert_eq!(owner("conformance-cases-AbC123"), None);
        assert_eq!(owner("conformance-other-12-345-x"), None);
        let own = own_prefix(CANDIDATE);
        let (pid, start) = owner(&format!("{own}xyz")).unwrap();
        assert_eq!(pid, std::process::id());
        assert!(alive((pid, start)));
    }

    /// Only the processes of an owner whose scratch directory was left are
    /// ended: a stray owner variable (a user's shell) names none.
    #[cfg(target_os = "linux")]
    #[test]
    fn orphans_are_ended_only_for_an_owner_that_left_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = |tag: u64| {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            (pid, 1_000_000 + tag)
        };
        let (left, stray) = (gone(1), gone(2));
        std::fs::create_dir(
            tmp.path()
                .join(format!("{CANDIDATE}{}-{}-x", left.0, left.1)),
        )
        .unwrap();
        let start = |owner: (u32, u64)| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(OWNER_ENV, format!("{}-{}", owner.0, owner.1))
                .spawn()
                .unwrap()
        };
        let (mut orphan, mut bystander) = (start(left), start(stray));
        // A process just started may not show its environment yet (the
        // kernel sets it up after its parent returns from the spawn).
        for pid in [orphan.id(), bystander.id()] {
            let started = std::time::Instant::now();
            while !std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| {
                e.windows(OWNER_ENV.len())
                    .any(|w| w == OWNER_ENV.as_bytes())
            }) {
                assert!(started.elapsed() < std::time::Duration::from_secs(10));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        reclaim_stale(tmp.path());
        let status = orphan.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "{status:?}"
        );
        assert!(
            bystander.try_wait().unwrap().is_none(),
            "a bystander killed"
        );
        bystander.kill().unwrap();
        bystander.wait().unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_dead_owners_directories_are_removed_never_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        // A process that has ended (reaped): its pid is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        let dead_start = start_time(dead).unwrap_or(1);
        child.wait().unwrap();
        let me = std::process::id();
        let my_start = start_time(me).unwrap();
        let stale = tmp
            .path()
            .join(format!("{CANDIDATE}{dead}-{dead_start}-aaa"));
        let stale_cases = tmp.path().join(format!("{CASES}{dead}-{dead_start}-eee"));
        // This process's pid with another start time: a reused pid.
        let reused = tmp
            .path()
            .join(format!("{CANDIDATE}{me}-{}-bbb", my_start + 1));
        let live = tmp.path().join(format!("{CASES}{me}-{my_start}-ccc"));
        for d in [&stale, &stale_cases, &reused, &live] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("0.in.safetensors"), "x").unwrap();
        }
        let link = tmp
            .path()
            .join(format!("{CANDIDATE}{dead}-{dead_start}-ddd"));
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let mut removed = reclaim_stale(tmp.path());
        removed.sort();
        let mut expected = vec![stale.clone(), stale_cases.clone(), reused.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(!stale.exists() && !stale_cases.exists() && !reused.exists());
        assert!(live.join("0.in.safetensors").exists());
        assert!(std::fs::symlink_metadata(&link).is_ok());
        assert!(outside.path().join("keep").exists());
    }
}
