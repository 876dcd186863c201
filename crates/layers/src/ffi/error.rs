//! MLX's error message for every raw mlx-c call.
//!
//! mlx-c reports a failed call through a process-global error handler; its
//! default handler prints and calls `exit(-1)`. mlx-rs installs its own handler
//! lazily (on its first op) and keeps the message in a private thread-local.
//! Before the first raw call, [`install_error_handler`] therefore:
//!
//! 1. runs one mlx-rs op, so mlx-rs's one-time registration has happened and
//!    cannot later overwrite ours;
//! 2. registers `capture_handler`, which stores the message in this
//!    module's thread-local and then chains to mlx-rs's exported
//!    `default_mlx_error_handler`, so mlx-rs keeps working exactly as before.
//!
//! Every wrapper clears the thread-local before the call and takes the message
//! after a non-zero status, so an [`MlxError`] always holds the text MLX
//! raised for *that* call (e.g. `[quantize] The requested group size 16 is not
//! supported. ...`, followed by mlx-c's ` at <file>:<line>` suffix).
//! Nothing in [`crate::ffi`] panics, and the default mlx-c handler never
//! runs once [`install_error_handler`] has returned.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

use mlx_rs::Array;
use mlx_sys::mlx_array;

/// A failed MLX call: the operation and MLX's own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct MlxError {
    /// The mlx-c function (or mlx-rs op) that failed, e.g. `mlx_quantize`.
    pub op: &'static str,
    /// The text MLX raised, verbatim (mlx-c appends ` at <file>:<line>`).
    pub message: String,
}

impl From<mlx_rs::error::Exception> for MlxError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        MlxError {
            op: "mlx-rs",
            message: e.what().to_owned(),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" {
    /// mlx-rs 0.33's handler (`#[no_mangle]` in `mlx_rs::error`): stores the
    /// message in mlx-rs's thread-local stash, from which mlx-rs builds its
    /// `Exception`s.
    fn default_mlx_error_handler(msg: *const c_char, data: *mut c_void);
}

/// The handler [`install_error_handler`] registers: keep the message for the
/// wrappers of [`crate::ffi`], then hand it to mlx-rs so its own error
/// reporting is intact.
extern "C" fn capture_handler(msg: *const c_char, data: *mut c_void) {
    if !msg.is_null() {
        // SAFETY: mlx-c passes a NUL-terminated buffer that outlives the call.
        let text = unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned();
        // `try_with`/`try_borrow_mut`: never panic inside a C callback (the
        // thread-local may be gone during thread teardown).
        let _ = LAST_ERROR.try_with(|slot| {
            if let Ok(mut slot) = slot.try_borrow_mut() {
                *slot = Some(text);
            }
        });
    }
    // SAFETY: same contract as the handler mlx-rs registers itself.
    unsafe { default_mlx_error_handler(msg, data) };
}

static INSTALL: Once = Once::new();

/// Registers `capture_handler` once per process (idempotent, thread-safe).
///
/// Called by every wrapper of [`crate::ffi`]; call it yourself before any
/// other raw `mlx_sys` call whose failure must not reach mlx-c's exiting
/// default handler.
pub fn install_error_handler() {
    INSTALL.call_once(|| {
        // Any op that goes through mlx-rs's `Guarded::try_from_op` runs
        // mlx-rs's `INIT_ERR_HANDLER.call_once`; after that mlx-rs never
        // registers again, so ours stays in place.
        let _ = mlx_rs::ops::abs(Array::from_int(0));
        // SAFETY: a plain function pointer and no user data.
        unsafe {
            mlx_sys::mlx_set_error_handler(Some(capture_handler), std::ptr::null_mut(), None)
        };
    });
}

pub(super) fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = None;
        }
    });
}

pub(super) fn take_last_error() -> Option<String> {
    LAST_ERROR
        .try_with(|slot| slot.try_borrow_mut().ok().and_then(|mut s| s.take()))
        .ok()
        .flatten()
}

/// Turns an mlx-c status into a `Result`, with the message MLX raised.
pub(super) fn check(op: &'static str, status: c_int) -> Result<(), MlxError> {
    if status == 0 {
        return Ok(());
    }
    let message = take_last_error()
        .unwrap_or_else(|| format!("failed with status {status} and no message from MLX"));
    Err(MlxError { op, message })
}

/// Runs one mlx-c call that writes a single array, and wraps the result.
///
/// `f` receives a fresh (empty) `mlx_array` to write into and returns the
/// mlx-c status. On failure the partially written array is freed and the
/// error carries MLX's message. This is the one place other modules should
/// use for raw calls (it installs the error handler first).
pub fn try_array(
    op: &'static str,
    f: impl FnOnce(*mut mlx_array) -> c_int,
) -> Result<Array, MlxError> {
    install_error_handler();
    clear_last_error();
    // SAFETY: `mlx_array_new` returns an empty handle; ownership passes to
    // `Array` on success, and it is freed here on failure.
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    let status = f(&mut res);
    match check(op, status) {
        Ok(()) => Ok(unsafe { Array::from_ptr(res) }),
        Err(e) => {
            unsafe { mlx_sys::mlx_array_free(res) };
            Err(e)
        }
    }
}
