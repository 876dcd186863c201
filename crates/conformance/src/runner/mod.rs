//! Runs cases: applicability, timing, panics as harness errors, verdicts;
//! in worker processes by default ([`worker`]: a crash ends one case, not
//! the run), or in this process.

pub mod worker;

/// Set by SIGINT or SIGTERM once [`catch_interrupts`] is in place: no
/// further case starts, and the run ends with exit 130 and no report.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT, SIGTERM and SIGHUP to [`interrupted`] (replacing the embedded
/// interpreter's handler, which would only act when Python code runs).
pub fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGHUP, handler);
    }
}

/// Whether the run was interrupted (Ctrl-C, SIGTERM).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use oracle::Oracle;

use crate::case::{Backend, Case, Ctx, Expect};
use crate::hooks::Hooks;

/// How a run is configured.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub backend: Backend,
    pub seed: u64,
    pub jobs: usize,
    /// Proof mode: the reference receives perturbed inputs (see [`Ctx`]).
    pub perturb: bool,
}

pub use conformance_core::result::{CaseResult, ErrorKind, Verdict};

/// Selects cases whose name contains `filter` (all when `None`). An unknown
/// filter is an error listing the closest case names.
/// An empty filter is no filter: every case, and the run counts as complete
/// (orphan detection on), as [`is_complete_selection`] says.
pub fn select<'a>(cases: &'a [Case], filter: Option<&str>) -> Result<Vec<&'a Case>, String> {
    let Some(filter) = filter.filter(|f| !f.is_empty()) else {
        return Ok(cases.iter().collect());
    };
    let chosen: Vec<&Case> = cases.iter().filter(|c| c.name.contains(filter)).collect();
    if !chosen.is_empty() {
        return Ok(chosen);
    }
    // A filter is usually a piece of a name: score each case by its best
    // matching '/'-separated segment (then the whole name, to break ties).
    let score = |name: &str| {
        let best = name
            .split('/')
            .map(|part| strsim::jaro_winkler(filter, part))
            .fold(0.0, f64::max);
        best + 1e-3 * strsim::jaro_winkler(filter, name)
    };
    let mut scored: Vec<(f64, &str)> = cases
        .iter()
        .map(|c| (score(&c.name), c.name.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let closest: Vec<&str> = scored.iter().take(5).map(|s| s.1).collect();
    Err(format!(
        "--filter `{filter}` matches no case. Closest names:\n  {}\n(`--list` prints every case)",
        closest.join("\n  ")
    ))
}

/// Whether a `--filter` value selects the whole registry (absent or empty),
/// so that snapshots no case recorded are judged orphans.
pub fn is_complete_selection(filter: Option<&str>) -> bool {
    filter.is_none_or(str::is_empty)
}

/// Runs `cases` in this process with the environment's hooks
/// ([`default_hooks`]), calling `progress` after each. Results keep the
/// input order.
pub fn run(
    cases: &[&Case],
    oracle: &Oracle,
    options: &RunOptions,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    run_hooked(cases, oracle, options, default_hooks(), progress)
}

/// [`run`] with the run's own `hooks` (`--in-process` runs).
pub fn run_hooked(
    cases: &[&Case],
    oracle: &Oracle,
    options: &RunOptions,
    hooks: &Hooks,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; cases.len()]);
    let worker = || loop {
        if interrupted() {
            break;
        }
        let i = next.fetch_add(1, Ordering::SeqCst);
        let Some(case) = cases.get(i) else { break };
        let result = run_one(case, oracle, options, hooks);
        progress(&result);
        results
            .lock()
            .expect("no worker panics while holding the lock")[i] = Some(result);
    };
    let jobs = options.jobs.clamp(1, cases.len().max(1));
    if jobs == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 0..jobs {
                s.spawn(|| {
                    set_device(options.backend);
                    worker()
                });
            }
        });
    }
    // An interrupted run leaves cases unrun; the caller exits 130.
    results
        .into_inner()
        .expect("workers done")
        .into_iter()
        .flatten()
        .collect()
}

/// Routes MLX (Rust side) to `backend`'s device on this thread.
pub fn set_device(backend: Backend) {
    mlx_rs::Device::set_default(&backend.device());
}

/// A result for `case` with no verdict yet (a skip until run).
fn blank(case: &Case) -> CaseResult {
    CaseResult {
        glue_composed: case.glue_composed.iter().map(|p| (*p).to_owned()).collect(),
        ..CaseResult::new(&case.name, case.family, case.reference, case.expect)
    }
}

/// The skip result when `case` does not apply on `backend`.
fn skipped(case: &Case, backend: Backend) -> Option<CaseResult> {
    let reason = case.applies.on(backend).err()?;
    let mut result = blank(case);
    result.message = Some(reason.to_owned());
    Some(result)
}

/// The hooks the environment asks for, whatever the command line says:
/// poisoning (on unless `MLX_CONFORMANCE_POISON` turns it off) and the
/// explorer's planted fault (`MLX_CONFORMANCE_PLANT`, a testing hook).
pub fn environment_interceptors() -> Vec<Box<dyn crate::hooks::Interceptor>> {
    let mut interceptors: Vec<Box<dyn crate::hooks::Interceptor>> = Vec::new();
    if crate::poison::enabled() {
        interceptors.push(Box::new(crate::poison::Poison));
    }
    if let Some(plant) = crate::plant::Plant::from_env() {
        interceptors.push(Box::new(plant));
    }
    interceptors
}

/// The hooks of a run that names none (tests, benches, the explorer):
/// what the environment asks for ([`environment_interceptors`]),
/// built once per process (a planted fault counts the cases it saw).
pub fn default_hooks() -> &'static Hooks {
    static DEFAULT: std::sync::OnceLock<Hooks> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| Hooks {
        interceptors: environment_interceptors(),
        substitute: None,
    })
}

/// A FAIL row's message: its first differing output, where it is (with
/// a candidate: which op's result, at which place), its first differing
/// element, and how many other outputs differ.
fn fail_message(output: &crate::case::CaseOutput, hooks: &Hooks) -> Option<String> {
    let mut differing = output.outputs.iter().filter(|o| !o.comparison.is_equal());
    let first = differing.next()?;
    let others: Vec<&str> = differing.map(|o| o.name.as_str()).collect();
    let who = if hooks.substitute.is_some() {
        "candidate"
    } else {
        "port"
    };
    let place = hooks
        .substitute
        .as_ref()
        .and_then(|s| {
            let origin = output
                .origins
                .iter()
                .find(|(n, _)| *n == first.name)?
                .1
                .as_deref()?;
            s.place_of(origin)
        })
        .map(|p| format!(" ({p})"))
        .unwrap_or_default();
    let what = match &first.comparison {
        oracle::Comparison::Differs(d) => {
            let line = d.line("elements differ", &format!("{who} "), "vs reference");
            match d.max_ulp_at_scale {
                Some(u) => format!("{line} ({u:.3} ulp at the output's scale)"),
                None => line,
            }
        }
        other => format!("{who}'s {}", other.summary()),
    };
    let more = if others.is_empty() {
        String::new()
    } else {
        format!(
            "; {} more output(s) differ: {}",
            others.len(),
            others.join(", ")
        )
    };
    Some(format!("output `{}`{place}: {what}{more}", first.name))
}

/// How a candidate's own refusal message starts its row's message
/// (report.md's "Refusals" section reads it back).
pub const CANDIDATE_REFUSED: &str = "the candidate refused too: ";

/// A refusal case in a candidate run: the finding (`port`, `reference`)
/// is the snapshot's and keeps the linked port's message, so the
/// candidate's own message goes in the row's message, where a reader
/// looks (docs/src/guide/candidate.md).
fn candidate_refusal(result: &mut CaseResult, output: &crate::case::CaseOutput, hooks: &Hooks) {
    let Some(substitute) = hooks.substitute.as_ref() else {
        return;
    };
    let is_refusal = output
        .finding
        .as_ref()
        .is_some_and(|f| f.get("port").is_some() && f.get("reference").is_some());
    if let (true, None, Some(said)) = (is_refusal, &result.message, substitute.last_refusal()) {
        result.message = Some(format!("{CANDIDATE_REFUSED}{said}"));
    }
}

/// Runs one case in this process (applicability, timing, panics as
/// harness errors, the verdict); the explorer's entry point.
pub fn run_case(case: &Case, oracle: &Oracle, options: &RunOptions) -> CaseResult {
    run_one(case, oracle, options, default_hooks())
}

fn run_one(case: &Case, oracle: &Oracle, options: &RunOptions, hooks: &Hooks) -> CaseResult {
    if let Some(skip) = skipped(case, options.backend) {
        return skip;
    }
    let mut result = blank(case);
    if hooks.substitute.is_some() && case.expect == Expect::Finding {
        result.message = Some(
            "a finding: it measures the reference (and this repository's port), not a candidate"
                .to_owned(),
        );
        return result;
    }
    let ctx = Ctx::new(
        oracle,
        options.backend,
        options.seed.wrapping_add(case.seed),
        &case.name,
        options.perturb,
    )
    .with_run_seed(options.seed);
    let start = Instant::now();
    // Poisoning: a case's first port call must not get an earlier case's
    // freed result.
    hooks.case_start(case);
    let outcome = crate::hooks::scoped(hooks, || {
        catch_unwind(AssertUnwindSafe(|| (case.run)(&ctx)))
    });
    result.time_ms = start.elapsed().as_secs_f64() * 1e3;
    match outcome {
        // The candidate's recorded reason first: a wrong kind of value
        // leaves nothing to compare, and that reason is the row's, not
        // "compared no output".
        Ok(Ok(output)) if !output.substitute_errors.is_empty() => {
            result.verdict = Verdict::Error;
            result.message = Some(output.substitute_errors.join("; "));
            result.error_kind = Some(ErrorKind::Substitute);
        }
        // A must-equal case that compared nothing cannot fail: a harness
        // error, not a pass.
        Ok(Ok(output)) if case.expect == Expect::MustEqual && output.outputs.is_empty() => {
            result.verdict = Verdict::Error;
            result.message = Some(
                "harness error: this must-equal case compared no output (a case that cannot fail)"
                    .to_owned(),
            );
            result.error_kind = Some(ErrorKind::Harness);
        }
        Ok(Ok(output)) if output.duplicate_name().is_some() => {
            result.verdict = Verdict::Error;
            result.message = Some(format!(
                "harness error: output `{}` is recorded twice",
                output.duplicate_name().unwrap_or_default()
            ));
            result.error_kind = Some(ErrorKind::Harness);
        }
        Ok(Ok(output)) => {
            result.verdict = match case.expect {
                Expect::MustEqual if output.all_equal() => Verdict::Pass,
                Expect::MustEqual => Verdict::Fail,
                Expect::Finding => Verdict::Finding,
            };
            if result.verdict == Verdict::Fail {
                result.message = fail_message(&output, hooks);
            }
            candidate_refusal(&mut result, &output, hooks);
            result.output = Some(output);
        }
        // A refusal the candidate declared: a finding row, listed.
        Ok(Err(e @ crate::case::CaseError::Refused(_))) => {
            result.verdict = Verdict::Finding;
            result.message = Some(e.to_string());
            result.error_kind = Some(e.kind());
        }
        Ok(Err(e @ crate::case::CaseError::Unsupported(_))) => {
            result.verdict = Verdict::Skip;
            result.message = Some(e.to_string());
            result.error_kind = Some(e.kind());
        }
        Ok(Err(e)) => {
            result.verdict = Verdict::Error;
            result.message = Some(e.to_string());
            result.error_kind = Some(e.kind());
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic payload".into());
            result.verdict = Verdict::Error;
            result.message = Some(format!("harness error: the case panicked: {text}"));
            result.error_kind = Some(ErrorKind::Harness);
        }
    }
    // Kept outputs, then the export (which keeps only verdicts).
    hooks.case_end(case, &mut result);
    // A message goes into every report (and over the worker protocol):
    // clipped, saying how much was dropped (a candidate's 100 MB message
    // was copied into each report).
    if let Some(m) = &mut result.message {
        if m.len() > MAX_MESSAGE {
            *m = crate::child::clip(m, MAX_MESSAGE);
        }
    }
    result
}

/// The longest row message kept (a long Python traceback fits).
pub const MAX_MESSAGE: usize = 64 << 10;

#[cfg(test)]
mod selection_tests {
    use super::is_complete_selection;

    #[test]
    fn an_empty_filter_is_a_complete_selection() {
        // Before: `--filter ""` selected every case but turned orphan
        // detection off (complete was `filter.is_none()`).
        assert!(is_complete_selection(None));
        assert!(is_complete_selection(Some("")));
        assert!(!is_complete_selection(Some("smoke")));
    }
}
