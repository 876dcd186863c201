//! The Metal kernel the reference builds: its source text (captured from
//! the builder on any platform) and its launch geometry.

use layers::position::{mrope_kernel_launch, mrope_kernel_spec, Pairing};
use mlx_rs::Dtype;
use oracle::DType;

use super::super::{bytes_tensor, int32_tensor, mlx_dtype, port};
use crate::case::{CaseError, CaseOutput, Ctx};
use crate::reference;

pub(super) fn run_kernel_source(
    ctx: &Ctx,
    pairing: Pairing,
    rotary_dim: usize,
    position_ndim: usize,
) -> Result<CaseOutput, CaseError> {
    let spec = mrope_kernel_spec(rotary_dim, position_ndim, pairing);
    let reference = reference::position::position_mrope_kernel_source(
        ctx,
        rotary_dim,
        position_ndim,
        pairing.as_str(),
    )?;
    // Fixed by the kernel's signature, whatever rotary_dim is.
    const SIGNATURE: &str = "fixed by the kernel's signature (inputs, outputs, header, flags), independent of rotary_dim";
    let mut out = CaseOutput::new("metal-kernel");
    out.compare("name", &bytes_tensor(&spec.name), &reference.name);
    out.compare_derived(
        "input_names",
        &bytes_tensor(&spec.input_names.join("\0")),
        &reference.input_names,
        SIGNATURE,
    );
    out.compare_derived(
        "output_names",
        &bytes_tensor(&spec.output_names.join("\0")),
        &reference.output_names,
        SIGNATURE,
    );
    out.compare("source", &bytes_tensor(&spec.source), &reference.source);
    out.compare_derived(
        "header",
        &bytes_tensor(&spec.header),
        &reference.header,
        SIGNATURE,
    );
    out.compare_derived(
        "flags",
        // ensure_row_contiguous, atomic_outputs, compile options given (the
        // port's mlx-c call passes none, as Python's default None).
        &int32_tensor(
            &[
                i32::from(spec.ensure_row_contiguous),
                i32::from(spec.atomic_outputs),
                0,
            ],
            &[3],
        ),
        &reference.flags,
        SIGNATURE,
    );
    Ok(out)
}

pub(super) fn run_kernel_launch(
    ctx: &Ctx,
    dtype: DType,
    shape: [usize; 5],
    rotary_dim: usize,
    position_ndim: usize,
) -> Result<CaseOutput, CaseError> {
    let [b, hq, hk, l, d] = shape;
    let x_dtype = mlx_dtype(dtype)?;
    let half = rotary_dim / 2;
    let launches = [[b, hq, l, d], [b, hk, l, d]]
        .map(|s| mrope_kernel_launch(&s.map(|v| v as i32), x_dtype, half).map_err(port));
    let reference = reference::position::position_mrope_kernel_launch(
        ctx,
        reference::position::LaunchShape {
            batch: b,
            q_heads: hq,
            kv_heads: hk,
            length: l,
            head_dim: d,
        },
        dtype.name(),
        position_ndim,
        rotary_dim,
    )?;
    let mut out = CaseOutput::new("metal-kernel");
    for ((tensor, launch), row) in ["q", "k"].into_iter().zip(launches).zip(reference) {
        let launch = launch?;
        out.compare(
            &format!("{tensor}.grid"),
            &int32_tensor(&launch.grid, &[3]),
            &row.grid,
        );
        out.compare_derived(
            &format!("{tensor}.threadgroup"),
            &int32_tensor(&launch.threadgroup, &[3]),
            &row.threadgroup,
            "a constant of the reference's launch, (256, 1, 1) whatever the shape",
        );
        let template: Vec<String> = launch
            .template
            .iter()
            .map(|(name, t)| format!("{name}={}", dtype_name(*t)))
            .collect();
        out.compare(
            &format!("{tensor}.template"),
            &bytes_tensor(&template.join(",")),
            &row.template,
        );
        let shapes: Vec<i32> = launch.output_shapes.concat();
        out.compare(
            &format!("{tensor}.output_shapes"),
            &int32_tensor(&shapes, &[launch.output_shapes.len(), 4]),
            &row.output_shapes,
        );
        let port_dtypes: Vec<&str> = launch
            .output_dtypes
            .iter()
            .map(|t| dtype_name(*t))
            .collect();
        out.compare(
            &format!("{tensor}.output_dtypes"),
            &bytes_tensor(&port_dtypes.join(",")),
            &row.output_dtypes,
        );
        // The port always passes [x, position_ids, inv_freq, position_selector].
        out.compare_derived(
            &format!("{tensor}.inputs"),
            &int32_tensor(&[4], &[1]),
            &row.inputs,
            "the kernel always takes four inputs",
        );
    }
    Ok(out)
}

/// The `mlx.core` name of a dtype (`bfloat16`, ...).
fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Float16 => "float16",
        Dtype::Float32 => "float32",
        _ => "other",
    }
}
