//! What a case's context and outputs consult while a case runs: the
//! hooks installed for it ([`CallHooks`], the per-call face of
//! [`crate::hooks::Hooks`]) and the [`Substitute`] trait. Below the case
//! types, which call it, and above nothing of this crate: the full hooks
//! (which see cases and results) install themselves here with [`scoped`].

use std::cell::Cell;

use layers::Backend;
use oracle::{Arg, HostTensor, OracleError, Value};

/// One reference call as the interceptors see it after it returned.
pub struct ReferenceCall<'a> {
    /// The glue function called.
    pub function: &'static str,
    /// The keyword arguments the reference received (perturbed in the
    /// proof mode).
    pub kwargs: &'a [(&'a str, Arg)],
    /// What it returned or raised.
    pub result: Result<&'a Value, &'a OracleError>,
}

/// What a substitute answered to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It computed a result (kept beside the reference's, see
    /// [`Substitute::counterparts_of`]).
    Computed,
    /// It raised, with its message.
    Raised(String),
    /// It raised as a refusal it declared beforehand (its policy): the
    /// policy and its message. Where the reference computed, the case is
    /// a finding row, not an error.
    RefusedByPolicy(String),
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
    /// The substitute's own message when it raised on the case's last
    /// call (`None`: it computed, or was not called). A refusal case's
    /// finding shows it in place of the linked port's message.
    fn last_refusal(&self) -> Option<String> {
        None
    }
    /// Where the reference node of digest `origin`
    /// ([`crate::case::node_digest`]) is in this case's results, for a
    /// report row: `op `x`, result `y`` (`None`: unknown).
    fn place_of(&self, _origin: &str) -> Option<String> {
        None
    }
    /// Where reference node `origin` is, when it is only at places the
    /// substitute may leave out (an op's internal intermediates) and left
    /// out: such an output is not compared, and the row says so.
    fn omitted_internal(&self, _origin: &str) -> Option<String> {
        None
    }
}

/// The hooks of the running case, as its context and outputs call them.
pub trait CallHooks {
    /// Before a reference call: every interceptor in order.
    fn before_call(&self, backend: Backend);
    /// After a reference call returned: every interceptor in order.
    fn after_call(&self, call: &ReferenceCall<'_>);
    /// A port output the case marked (`Ctx::port_output`).
    fn port_output(&self, family: &str, m: usize, n: usize, y: &mut HostTensor);
    /// Whether compared tensors are kept for the case's end.
    fn keeps_tensors(&self) -> bool;
    /// Whether faults are injected into reference outputs and measured
    /// against the exact oracle (`exactness::faults`).
    fn injects_faults(&self) -> bool {
        false
    }
    /// The substitute standing in for the linked port, if any.
    fn substitute(&self) -> Option<&dyn Substitute>;
}

/// No hooks: the linked port, nothing watched.
struct NoHooks;

impl CallHooks for NoHooks {
    fn before_call(&self, _backend: Backend) {}
    fn after_call(&self, _call: &ReferenceCall<'_>) {}
    fn port_output(&self, _family: &str, _m: usize, _n: usize, _y: &mut HostTensor) {}
    fn keeps_tensors(&self) -> bool {
        false
    }
    fn substitute(&self) -> Option<&dyn Substitute> {
        None
    }
}

type Installed = *const (dyn CallHooks + 'static);

thread_local! {
    /// The hooks of the case running on this thread (`None`: none).
    static CURRENT: Cell<Option<Installed>> = const { Cell::new(None) };
}

/// Runs `f` (one case) with `hooks` installed on this thread; the
/// previous hooks come back afterwards, on unwind too.
pub fn scoped<R>(hooks: &dyn CallHooks, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Installed>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    // SAFETY: only the pointer's lifetime bound is erased; it is read by
    // `current` only while `hooks` is borrowed here, and reset by
    // `Restore` before this function returns or unwinds.
    let ptr: Installed =
        unsafe { std::mem::transmute::<*const (dyn CallHooks + '_), Installed>(hooks as *const _) };
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(ptr))));
    f()
}

/// The hooks installed on this thread (none outside [`scoped`]).
pub fn current<R>(f: impl FnOnce(&dyn CallHooks) -> R) -> R {
    match CURRENT.with(Cell::get) {
        // SAFETY: set by `scoped` from a reference that outlives this
        // call, and reset before `scoped` returns.
        Some(ptr) => f(unsafe { &*ptr }),
        None => f(&NoHooks),
    }
}
