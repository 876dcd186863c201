//! How run modes act on a case without the core naming them.
//!
//! The core calls two kinds of hooks, installed by whoever runs a case
//! (the tool) for the time of that case with [`scoped`]:
//!
//! - [`Interceptor`]: called at case start, before and after each
//!   reference call, on each port output a case marks, and at case end.
//!   Modes that watch or disturb a run (filling MLX's buffer cache with a
//!   sentinel, recording golden vectors, writing outputs out, an injected
//!   fault) are interceptors.
//! - [`Substitute`]: an implementation checked in place of the linked
//!   port. Every reference call it [`Substitute::sends`] also goes to it;
//!   each [`crate::case::Expected`] then carries its arrays from the same
//!   place, and the comparison takes them instead of the port's.
//!
//! Order within one reference call (the contract; `Ctx::call_sent`):
//! every interceptor's [`Interceptor::before_call`] in order, the
//! reference call, every interceptor's [`Interceptor::after_call`] in
//! order, then the substitute's call. At a case's start: the
//! substitute's, then every interceptor's in order; at its end every
//! interceptor's in order.
//!
//! What a case's context consults while it runs is [`crate::scope`], below
//! the case types; [`Hooks`] installs itself there.

use layers::Backend;
use oracle::HostTensor;

use crate::case::Case;
use crate::result::CaseResult;
pub use crate::scope::{
    Answer, CallHooks, Counterpart, ReferenceCall, Substitute, SubstituteError,
};

/// Watches (or disturbs) a case as it runs. Every method does nothing by
/// default.
pub trait Interceptor: Send + Sync {
    /// The case is about to run (its timer runs).
    fn case_start(&self, _case: &Case) {}
    /// Before a reference call, on the run's backend.
    fn before_call(&self, _backend: Backend) {}
    /// After a reference call returned.
    fn after_call(&self, _call: &ReferenceCall<'_>) {}
    /// A port output the case marked for faults (`Ctx::port_output`):
    /// `family` and two of its sizes.
    fn port_output(&self, _family: &str, _m: usize, _n: usize, _y: &mut HostTensor) {}
    /// Whether compared and digested tensors are kept in
    /// [`crate::case::CaseOutput`]'s `tensors` for [`Interceptor::case_end`].
    fn keeps_tensors(&self) -> bool {
        false
    }
    /// Whether every must-equal output with an exact value also gets
    /// each applicable fault of `exactness::faults` injected into a copy of
    /// its reference side and measured (never changing the verdict).
    fn injects_faults(&self) -> bool {
        false
    }
    /// The case ended with `result`; an interceptor may turn it into an
    /// error (a file it could not write).
    fn case_end(&self, _case: &Case, _result: &mut CaseResult) {}
}

/// The hooks of a run: interceptors in call order, and at most one
/// substitute.
#[derive(Default)]
pub struct Hooks {
    pub interceptors: Vec<Box<dyn Interceptor>>,
    pub substitute: Option<Box<dyn Substitute>>,
}

impl Hooks {
    /// At a case's start: the substitute, then every interceptor in order.
    pub fn case_start(&self, case: &Case) {
        if let Some(s) = &self.substitute {
            s.case_start();
        }
        for i in &self.interceptors {
            i.case_start(case);
        }
    }
    /// At a case's end: every interceptor in order.
    pub fn case_end(&self, case: &Case, result: &mut CaseResult) {
        for i in &self.interceptors {
            i.case_end(case, result);
        }
    }
}

impl CallHooks for Hooks {
    fn before_call(&self, backend: Backend) {
        for i in &self.interceptors {
            i.before_call(backend);
        }
    }
    fn after_call(&self, call: &ReferenceCall<'_>) {
        for i in &self.interceptors {
            i.after_call(call);
        }
    }
    fn port_output(&self, family: &str, m: usize, n: usize, y: &mut HostTensor) {
        for i in &self.interceptors {
            i.port_output(family, m, n, y);
        }
    }
    fn keeps_tensors(&self) -> bool {
        self.interceptors.iter().any(|i| i.keeps_tensors())
    }
    fn injects_faults(&self) -> bool {
        self.interceptors.iter().any(|i| i.injects_faults())
    }
    fn substitute(&self) -> Option<&dyn Substitute> {
        self.substitute.as_deref()
    }
}

/// Runs `f` (one case) with `hooks` installed on this thread.
pub fn scoped<R>(hooks: &Hooks, f: impl FnOnce() -> R) -> R {
    crate::scope::scoped(hooks, f)
}
