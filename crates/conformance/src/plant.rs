//! Testing hook: a planted port fault, so tests and CI can prove the
//! explorer finds, shrinks and keeps a violation end to end.
//! `MLX_CONFORMANCE_PLANT=quantized/linear:m>=M,n%2==1` flips the lowest
//! bit of the port's first output element of a `quantized/linear` case
//! whose M is at least `M` and whose N is odd (no other form is read; an
//! unset or unreadable variable plants nothing). For `attention/sdpa`,
//! "M" and "N" are the batch B and the KV length L. A trailing
//! `,after=K` plants only from the process's K+1-th planted-family case on:
//! a fault that shows in sequence and not alone in a fresh process.

use std::sync::atomic::{AtomicUsize, Ordering};

use oracle::HostTensor;

/// The variable of the hook.
pub const PLANT_ENV: &str = "MLX_CONFORMANCE_PLANT";

/// The planted fault as an interceptor on the port outputs cases mark
/// (`Ctx::port_output`).
pub struct Plant {
    family: String,
    min_m: usize,
    after: usize,
    /// Cases of the planted family this process has run.
    seen: AtomicUsize,
}

impl Plant {
    /// The plant [`PLANT_ENV`] asks for, if any.
    pub fn from_env() -> Option<Self> {
        let (family, min_m, after) = planted()?;
        Some(Self {
            family,
            min_m,
            after,
            seen: AtomicUsize::new(0),
        })
    }
}

/// The planted region: `(family, minimum M, after)`, odd N.
fn planted() -> Option<(String, usize, usize)> {
    let spec = std::env::var(PLANT_ENV).ok()?;
    let (family, rule) = spec.split_once(':')?;
    let rule = rule.strip_prefix("m>=")?;
    let (m, after) = match rule.split_once(",n%2==1") {
        Some((m, "")) => (m, 0),
        Some((m, rest)) => (m, rest.strip_prefix(",after=")?.parse().ok()?),
        None => return None,
    };
    Some((family.to_owned(), m.parse().ok()?, after))
}

impl crate::hooks::Interceptor for Plant {
    /// Flips the lowest bit of `y`'s first element when the plant covers
    /// this family, M and N (and enough cases of the family ran before).
    fn port_output(&self, family: &str, m: usize, n: usize, y: &mut HostTensor) {
        if self.family != family {
            return;
        }
        let seen = self.seen.fetch_add(1, Ordering::Relaxed);
        if seen >= self.after && m >= self.min_m && n % 2 == 1 && !y.bytes.is_empty() {
            y.bytes[0] ^= 1;
        }
    }
}
