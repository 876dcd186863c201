//! How run modes act on a case without the core naming them.
//!
//! The core calls two kinds of hooks, installed by whoever runs a case
//! (the tool) for the time of that case with [`scoped`]:
//!
//! - [`Interceptor`]: called at case start, before and after each
//!   reference call, on each port output a case marks, when a compared
//!   tensor is recorded, and at case end. Modes that watch or disturb a
//!   run (filling MLX's buffer cache with a sentinel, recording golden
//!   vectors, writing outputs out, an injected fault) are interceptors.
//! - [`Substitute`]: an implementation checked in place of the linked
//!   port. Every reference call it [`Substitute::sends`] also goes to it;
//!   each [`crate::case::Expected`] then carries its arrays from the same
//!   place, and the comparison takes them instead of the port's.
//!
//! Order within one reference call (the contract; `Ctx::call_sent`):
//! every interceptor's [`Interceptor::before_call`] in order, the
//! reference call, every interceptor's [`Interceptor::after_call`] in
//! order, then the substitute's call.

use std::cell::Cell;

use oracle::{Arg, HostTensor, OracleError, Value};

use crate::case::{Backend, Case};
use crate::result::CaseResult;

/// One reference call as the interceptors see it after it returned.
pub struct ReferenceCall<'a> {
    /// The glue function called.
    pub function: &'static str,
    /// The keyword arguments the reference received (perturbed under
    /// `--perturb`).
    pub kwargs: &'a [(&'a str, Arg)],
    /// What it returned or raised.
    pub result: Result<&'a Value, &'a OracleError>,
}

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
    /// The case ended with `result`; an interceptor may turn it into an
    /// error (a file it could not write).
    fn case_end(&self, _case: &Case, _result: &mut CaseResult) {}
}

/// What a substitute answered to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It computed a result (kept beside the reference's, see
    /// [`Substitute::counterparts_of`]).
    Computed,
    /// It raised, with its message.
    Raised(String),
}

/// Why a substitute gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubstituteError {
    /// It does not implement the op (a skip, not a verdict).
    Unsupported(String),
    /// It crashed, hung, or broke its protocol.
    Failed(String),
}

/// An array the substitute gave at a reference array's place, or why
/// there is none.
pub type Counterpart = Result<HostTensor, String>;

/// An implementation checked in place of the linked port.
pub trait Substitute: Send + Sync {
    /// A case starts: nothing of the previous case's results is kept.
    fn case_start(&self) {}
    /// Whether reference call `function` also goes to the substitute.
    fn sends(&self, function: &str) -> bool;
    /// Sends the call with the arguments the port gets; the substitute
    /// keeps its result beside `reference` (the reference's result, when
    /// it computed one) for the readers below.
    fn call(
        &self,
        case: &str,
        function: &'static str,
        args: &[(&str, Arg)],
        reference: Option<&Value>,
    ) -> Result<Answer, SubstituteError>;
    /// The substitute's arrays at reference array `t`'s place in this
    /// case's results (`None`: `t` is in no result).
    fn counterparts_of(&self, t: &HostTensor) -> Option<Vec<Counterpart>>;
    /// The substitute's values at reference value `v`'s place.
    fn values_beside(&self, v: &Value) -> Option<Vec<Result<Value, String>>>;
    /// Whether the substitute raised on the case's last call (`None`: it
    /// was not called).
    fn last_raised(&self) -> Option<bool>;
}

/// The hooks of a run: interceptors in call order, and at most one
/// substitute.
#[derive(Default)]
pub struct Hooks {
    pub interceptors: Vec<Box<dyn Interceptor>>,
    pub substitute: Option<Box<dyn Substitute>>,
}

impl Hooks {
    /// No hooks: the linked port, nothing watched.
    pub fn none() -> &'static Hooks {
        static NONE: Hooks = Hooks {
            interceptors: Vec::new(),
            substitute: None,
        };
        &NONE
    }
    pub fn keeps_tensors(&self) -> bool {
        self.interceptors.iter().any(|i| i.keeps_tensors())
    }
    /// At a case's start: the substitute, then every interceptor in order.
    pub fn case_start(&self, case: &Case) {
        if let Some(s) = &self.substitute {
            s.case_start();
        }
        for i in &self.interceptors {
            i.case_start(case);
        }
    }
    pub fn case_end(&self, case: &Case, result: &mut CaseResult) {
        for i in &self.interceptors {
            i.case_end(case, result);
        }
    }
}

thread_local! {
    /// The hooks of the case running on this thread (null: none).
    static CURRENT: Cell<*const Hooks> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` (one case) with `hooks` installed on this thread; the
/// previous hooks come back afterwards, on unwind too.
pub fn scoped<R>(hooks: &Hooks, f: impl FnOnce() -> R) -> R {
    struct Restore(*const Hooks);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(hooks)));
    f()
}

/// The hooks installed on this thread ([`Hooks::none`] outside [`scoped`]).
pub fn current<R>(f: impl FnOnce(&Hooks) -> R) -> R {
    let ptr = CURRENT.with(Cell::get);
    // SAFETY: a non-null pointer was set by `scoped` from a reference that
    // outlives the call of `f` there, and is reset before `scoped` returns.
    let hooks = if ptr.is_null() {
        Hooks::none()
    } else {
        unsafe { &*ptr }
    };
    f(hooks)
}
