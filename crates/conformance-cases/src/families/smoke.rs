//! The smoke case that proves the architecture: seeded bf16 inputs,
//! `quantized_matmul` through mlx-rs versus `mx.quantized_matmul` through
//! the reference, in one process on one libmlx.

use oracle::{DType, HostTensor};

use super::describe::{described, Described, Params};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::reference;

const REFERENCE: &str = "mlx.core.quantized_matmul (mlx 0.32.2)";

/// The smoke case's parameters: `x [M, K] @ W[N, K]^T`, affine 4-bit,
/// group 64, bf16.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmokeCase {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl Params for SmokeCase {
    const BUILDER: &'static str = "smoke";
    fn build(self, name: String) -> Case {
        Case::must_equal(name, "smoke", REFERENCE, move |ctx| {
            super::describe::dims(&[("m", self.m), ("k", self.k), ("n", self.n)], 1 << 30)?;
            if !self.k.is_multiple_of(64) {
                return Err(CaseError::Harness(format!(
                    "k {} is not a multiple of group_size 64",
                    self.k
                )));
            }
            run(ctx, self.m, self.k, self.n)
        })
    }
}

pub fn descriptions() -> Vec<Described> {
    vec![described(
        "smoke/quantized-matmul/affine-4b-gs64/bf16/M8",
        &SmokeCase {
            m: 8,
            k: 256,
            n: 128,
        },
    )]
}

fn run(ctx: &Ctx, m: usize, k: usize, n: usize) -> Result<CaseOutput, CaseError> {
    let (group_size, bits) = (64, 4);
    let mut inputs = ctx.inputs();
    let x = inputs.uniform(DType::Bfloat16, &[m, k], 1.0);
    let w = inputs.uniform(DType::Bfloat16, &[n, k], 0.5);
    // The port here is mlx-rs itself: its errors are the port's.
    let (wq, scales, biases) = mlx_rs::ops::quantize(w.to_array(), group_size, bits)
        .map_err(|e| CaseError::port("mlx_rs::ops::quantize", e))?;
    let port =
        mlx_rs::ops::quantized_matmul(x.to_array(), &wq, &scales, &biases, true, group_size, bits)
            .map_err(|e| CaseError::port("mlx_rs::ops::quantized_matmul", e))?;
    let port = HostTensor::from_array(&port)?;
    let [wq, scales, biases] = [&wq, &scales, &biases].map(HostTensor::from_array);
    let reference = reference::quantized::smoke_quantized_matmul(
        ctx, &x, &wq?, &scales?, &biases?, group_size, bits,
    )?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &port, &reference);
    Ok(out)
}
