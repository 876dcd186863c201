//! The smoke case that proves the architecture: seeded bf16 inputs,
//! `quantized_matmul` through mlx-rs versus `mx.quantized_matmul` through
//! the reference, in one process on one libmlx.

use oracle::{Arg, DType, HostTensor};

use crate::case::{Case, CaseError, CaseOutput, Ctx};

const REFERENCE: &str = "mlx.core.quantized_matmul (mlx 0.32.2)";

pub fn cases() -> Vec<Case> {
    vec![Case::must_equal(
        "smoke/quantized-matmul/affine-4b-gs64/bf16/M8",
        "smoke",
        REFERENCE,
        |ctx| run(ctx, 8, 256, 128),
    )]
}

fn run(ctx: &Ctx, m: usize, k: usize, n: usize) -> Result<CaseOutput, CaseError> {
    let (group_size, bits) = (64, 4);
    let mut inputs = ctx.inputs();
    let x = inputs.uniform(DType::Bfloat16, &[m, k], 1.0);
    let w = inputs.uniform(DType::Bfloat16, &[n, k], 0.5);
    let (wq, scales, biases) = mlx_rs::ops::quantize(w.to_array(), group_size, bits)?;
    let port =
        mlx_rs::ops::quantized_matmul(x.to_array(), &wq, &scales, &biases, true, group_size, bits)?;
    let port = HostTensor::from_array(&port)?;
    let [wq, scales, biases] = [&wq, &scales, &biases].map(HostTensor::from_array);
    let reference = ctx.reference_tensor(
        "smoke_quantized_matmul",
        &[
            Arg::from(x),
            Arg::from(wq?),
            Arg::from(scales?),
            Arg::from(biases?),
            Arg::from(group_size),
            Arg::from(bits),
        ],
        &[],
    )?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &port, &reference);
    Ok(out)
}
