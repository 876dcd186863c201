//! The glue's self-test functions (transfer round trip, a Python error).

use oracle::HostTensor;

use super::{fixed, one_array, tensor};
use crate::case::{CaseError, Ctx, Expected};

/// The tensor back from Python unchanged (perturbable: the proof mode must
/// see it change).
pub fn echo(ctx: &Ctx, value: &HostTensor) -> Result<Expected, CaseError> {
    const F: &str = "echo";
    one_array(F, ctx.call(F, vec![tensor("value", value)])?)
}

/// Raises `ValueError(message)` in Python: the error must surface with its
/// traceback and the case name.
pub fn raise_value_error(ctx: &Ctx, message: &str) -> Result<(), CaseError> {
    const F: &str = "raise_value_error";
    ctx.call(F, vec![fixed("message", message)]).map(drop)
}
