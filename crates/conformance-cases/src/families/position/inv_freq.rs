//! `position/inv-freq`: check (c), "powf inverse-frequency rounding".
//!
//! Must-equal: the port's device `inv_freq` (`compute_inv_freq`) against
//! the reference's `compute_inv_freq` over every even rotary dim 2..=512,
//! one case per theta. Finding: the host emulations (`inv_freq_host_f32`,
//! `inv_freq_host_f64`) against the reference: where a host `powf` rounds
//! otherwise than MLX's `power`.

use layers::position::{compute_inv_freq, inv_freq_host_f32, inv_freq_host_f64};
use mlx_rs::ops::concatenate;
use oracle::{DType, HostTensor};
use serde_json::json;

use super::{host, port};
use crate::case::Expected;
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use crate::relation::Relation;

const FAMILY: &str = "position/inv-freq";
const REFERENCE: &str = "mlx_vlm.models.rope_utils.compute_inv_freq (mlx-vlm 0.7.6)";

/// `(tag, theta)`: Gemma vision, Llama, Qwen3-VL-like, Qwen3.5, and a theta
/// that is not an integer.
const THETAS: [(&str, f64); 5] = [
    ("100", 100.0),
    ("1e4", 1e4),
    ("1e6", 1e6),
    ("1e7", 1e7),
    ("5e5+0.5", 500_000.5),
];

/// Every even rotary dim from 2 to 512.
fn dims() -> Vec<usize> {
    (2..=512).step_by(2).collect()
}

/// A `position/inv-freq` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InvFreqCase {
    /// Must-equal: inv_freq on the device for rope_theta, every even dim
    /// 2 to 512.
    Device { rope_theta: f64 },
    /// Finding: the host emulation of the reference's float32 arithmetic.
    HostEmulation,
}

impl Params for InvFreqCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            InvFreqCase::Device { rope_theta } => {
                Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
                    if !(rope_theta.is_finite() && rope_theta > 0.0) {
                        return Err(CaseError::Harness(format!(
                            "rope_theta {rope_theta}: a finite positive base"
                        )));
                    }
                    run_device(ctx, rope_theta)
                })
            }
            InvFreqCase::HostEmulation => Case::finding(name, FAMILY, REFERENCE, run_host),
        }
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut cases: Vec<Described> = THETAS
        .into_iter()
        .map(|(tag, rope_theta)| {
            let name = format!("{FAMILY}/device/theta-{tag}/dims-2-to-512-even");
            described(name, &InvFreqCase::Device { rope_theta })
        })
        .collect();
    cases.push(described(
        format!("{FAMILY}/host-emulation/dims-2-to-512-even"),
        &InvFreqCase::HostEmulation,
    ));
    cases
}

/// The port's device `inv_freq` for each dim, concatenated.
pub(crate) fn port_inv_freq(dims: &[usize], theta: f64) -> Result<HostTensor, CaseError> {
    let parts = dims
        .iter()
        .map(|&d| compute_inv_freq(d, theta).map_err(port))
        .collect::<Result<Vec<_>, _>>()?;
    host(&concatenate(&parts, 0)?)
}

/// The reference's `compute_inv_freq` for each dim, concatenated.
pub(crate) fn reference_inv_freq(
    ctx: &Ctx,
    dims: &[usize],
    theta: f64,
) -> Result<Expected, CaseError> {
    reference::position::position_inv_freq(ctx, dims, theta)
}

fn run_device(ctx: &Ctx, theta: f64) -> Result<CaseOutput, CaseError> {
    let dims = dims();
    let port_values = port_inv_freq(&dims, theta)?;
    let reference = reference_inv_freq(ctx, &dims, theta)?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare("inv_freq", &port_values, &reference);
    Ok(out)
}

fn f32_tensor(values: &[f32]) -> HostTensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(DType::Float32, vec![values.len()], bytes).expect("one f32 each")
}

/// Where `host` differs from `reference` (both the concatenation over
/// `dims`): the [`Relation`], and the first few differing `(dim, index)`
/// pairs.
fn divergence(dims: &[usize], host: &HostTensor, reference: &HostTensor) -> serde_json::Value {
    let mut first = Vec::new();
    let mut at = 0usize;
    for &dim in dims {
        for index in 0..dim / 2 {
            let (a, b) = (host.bits(at), reference.bits(at));
            if a != b && first.len() < 6 {
                first.push(json!([dim, index]));
            }
            at += 1;
        }
    }
    let mut relation = Relation::of(host, reference).json();
    relation["first_dim_index"] = json!(first);
    relation
}

fn run_host(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let dims = dims();
    let mut out = CaseOutput::new("pure-mlx");
    let mut f32_rows = serde_json::Map::new();
    let mut f64_rows = serde_json::Map::new();
    for (tag, theta) in THETAS {
        let reference = reference_inv_freq(ctx, &dims, theta)?.into_tensor();
        let host_f32: Vec<f32> = dims
            .iter()
            .flat_map(|&d| inv_freq_host_f32(d, theta as f32))
            .collect();
        let host_f64: Vec<f32> = dims
            .iter()
            .flat_map(|&d| inv_freq_host_f64(d, theta))
            .collect();
        let (host_f32, host_f64) = (f32_tensor(&host_f32), f32_tensor(&host_f64));
        if host_f32.len() != reference.len() || host_f64.len() != reference.len() {
            return Err(CaseError::Harness(format!(
                "lengths: host {} / {}, reference {}",
                host_f32.len(),
                host_f64.len(),
                reference.len()
            )));
        }
        f32_rows.insert(tag.to_owned(), divergence(&dims, &host_f32, &reference));
        f64_rows.insert(tag.to_owned(), divergence(&dims, &host_f64, &reference));
        out.digest(&format!("host f32 {tag}"), &host_f32);
        out.digest(&format!("host f64 {tag}"), &host_f64);
    }
    Ok(out.with_finding(json!({
        "relation": "host emulation of inv_freq vs reference compute_inv_freq, every even dim 2..=512",
        "host_f32": f32_rows,
        "host_f64": f64_rows,
    })))
}
