//! Testing hook: a planted port fault, so tests and CI can prove the
//! explorer finds, shrinks and keeps a violation end to end.
//! `MLX_CONFORMANCE_PLANT=quantized/linear:m>=M,n%2==1` flips the lowest
//! bit of the port's first output element of a `quantized/linear` case
//! whose M is at least `M` and whose N is odd (no other form is read; an
//! unset or unreadable variable plants nothing). For `attention/sdpa`,
//! "M" and "N" are the batch B and the KV length L.

use oracle::HostTensor;

/// The variable of the hook.
pub const PLANT_ENV: &str = "MLX_CONFORMANCE_PLANT";

/// The planted region: `(family, minimum M)`, odd N.
fn planted() -> Option<(String, usize)> {
    let spec = std::env::var(PLANT_ENV).ok()?;
    let (family, rule) = spec.split_once(':')?;
    let m = rule.strip_prefix("m>=")?.strip_suffix(",n%2==1")?.parse().ok()?;
    Some((family.to_owned(), m))
}

/// Flips the lowest bit of `y`'s first element when the plant covers this
/// family, M and N.
pub fn apply(family: &str, m: usize, n: usize, y: &mut HostTensor) {
    let Some((planted, min_m)) = planted() else {
        return;
    };
    if planted == family && m >= min_m && n % 2 == 1 && !y.bytes.is_empty() {
        y.bytes[0] ^= 1;
    }
}
