//! `quantized/linear`: `QuantizedLinear::forward` (batched) against
//! `mlx.nn.QuantizedLinear.__call__`.
//!
//! Coverage without the full cross product:
//! * every spec `mx.quantize` accepts once (bf16, M = 8, K = three groups,
//!   so K = 96 for group 32 and 48 for nvfp4, never a multiple of 64 there);
//! * the additive `bias` on one spec per mode and a few affine ones, and a
//!   float32 bias on bf16 activations (promotion to f32);
//! * M in {1, 2, 3, 4, 7, 8, 16, 33} x {bf16, f16, f32} on affine 4-bit/64
//!   and mxfp4;
//! * leading batch dimensions (B in 1..6, and two of them) on a few specs;
//! * float16 scales under bf16 activations (affine output promotes to f32);
//! * findings `single-group/*`: rows of one group (`in_features ==
//!   group_size`), where MLX 0.32.2's CUDA kernel was seen not to write its
//!   output (see `single_group_cases`).

use layers::quantized::{Mode, QuantSpec, QuantizedLinear};
use oracle::{DType, HostTensor};

use super::layer_tensors;
use super::{
    activation, affine, all_specs, base_k, dtype_tag, host, mode_default, port, quantized_weight,
    FLOAT_DTYPES, QUANTIZED_LINEAR,
};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::reference;

const FAMILY: &str = "quantized/linear";
/// Output features of every linear case.
const N: usize = 64;
const MS: [usize; 8] = [1, 2, 3, 4, 7, 8, 16, 33];

/// The additive bias of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bias {
    None,
    /// In the activation dtype.
    Same,
    /// float32 (as `nn.QuantizedLinear.__init__` creates it).
    F32,
}

/// One linear case.
#[derive(Debug, Clone)]
struct Shape {
    spec: QuantSpec,
    /// Activation dtype (also the dtype the weight is quantized from, so
    /// affine scales have it) unless `scales_dtype` says otherwise.
    dtype: DType,
    scales_dtype: Option<DType>,
    /// Leading dimensions of x before M.
    batch: Vec<usize>,
    m: usize,
    bias: Bias,
}

impl Shape {
    fn new(spec: QuantSpec, dtype: DType, m: usize) -> Self {
        Shape {
            spec,
            dtype,
            scales_dtype: None,
            batch: Vec::new(),
            m,
            bias: Bias::None,
        }
    }

    fn name(&self) -> String {
        let mut name = format!("{FAMILY}/{}/{}", self.spec, dtype_tag(self.dtype));
        if !self.batch.is_empty() {
            let b: Vec<String> = self.batch.iter().map(usize::to_string).collect();
            name += &format!("/B{}", b.join("x"));
        }
        name += &format!("/M{}", self.m);
        match self.bias {
            Bias::None => {}
            Bias::Same => name += "/bias",
            Bias::F32 => name += "/bias-f32",
        }
        if let Some(s) = self.scales_dtype {
            name += &format!("/{}-scales", dtype_tag(s));
        }
        name
    }

    fn case(self) -> Case {
        Case::must_equal(self.name(), FAMILY, QUANTIZED_LINEAR, move |ctx| {
            run(ctx, &self)
        })
    }
}

pub(super) fn cases() -> Vec<Case> {
    let bf16 = DType::Bfloat16;
    let mut shapes = Vec::new();
    // Every spec once.
    for spec in all_specs() {
        shapes.push(Shape::new(spec, bf16, 8));
    }
    // The additive bias.
    let biased = [
        affine(4, 64),
        affine(3, 32),
        affine(8, 128),
        mode_default(Mode::Mxfp4),
        mode_default(Mode::Mxfp8),
        mode_default(Mode::Nvfp4),
    ];
    for spec in biased {
        shapes.push(Shape {
            bias: Bias::Same,
            ..Shape::new(spec, bf16, 8)
        });
    }
    for spec in [affine(4, 64), mode_default(Mode::Nvfp4)] {
        shapes.push(Shape {
            bias: Bias::F32,
            ..Shape::new(spec, bf16, 8)
        });
    }
    // M x dtype on two specs (bf16/M8 is already above).
    for spec in [affine(4, 64), mode_default(Mode::Mxfp4)] {
        for dtype in FLOAT_DTYPES {
            for m in MS {
                if (dtype, m) != (bf16, 8) {
                    shapes.push(Shape::new(spec, dtype, m));
                }
            }
        }
    }
    // Leading batch dimensions.
    let batched: [(QuantSpec, DType, &[usize], usize, Bias); 7] = [
        (affine(4, 64), bf16, &[1], 3, Bias::None),
        (affine(4, 64), bf16, &[2], 4, Bias::Same),
        (affine(4, 64), DType::Float32, &[5], 1, Bias::None),
        (affine(4, 64), bf16, &[6], 7, Bias::None),
        (mode_default(Mode::Mxfp8), bf16, &[3], 2, Bias::None),
        (affine(5, 32), DType::Float16, &[2, 3], 2, Bias::Same),
        (mode_default(Mode::Nvfp4), bf16, &[4, 1], 3, Bias::None),
    ];
    for (spec, dtype, batch, m, bias) in batched {
        shapes.push(Shape {
            batch: batch.to_vec(),
            bias,
            ..Shape::new(spec, dtype, m)
        });
    }
    // Scales in another dtype than the activation.
    shapes.push(Shape {
        scales_dtype: Some(DType::Float16),
        ..Shape::new(affine(4, 64), bf16, 8)
    });
    shapes.push(Shape {
        scales_dtype: Some(DType::Float32),
        ..Shape::new(affine(6, 32), bf16, 4)
    });
    let mut cases: Vec<Case> = shapes.into_iter().map(Shape::case).collect();
    cases.extend(single_group_cases());
    cases
}

/// Rows of one group (`in_features == group_size`), which the cases above
/// (three groups) never have, and two-group controls: (group_size, K, M).
/// M 5 is the AutoRound checkpoint fixture's token count, where the CUDA
/// fault was first seen; M 1 takes the matrix-vector kernels.
const SINGLE_GROUP: [(i32, usize, usize); 9] = [
    (32, 32, 5),
    (64, 64, 5),
    (128, 128, 5),
    (128, 256, 5),
    (32, 32, 1),
    (64, 64, 1),
    (128, 128, 1),
    (64, 128, 5),
    (32, 64, 5),
];

/// Findings: does the quantized matmul compute its definition for these
/// shapes? MLX 0.32.2's CUDA `quantized_matmul` (affine 4-bit, group 128,
/// K 128, M 5, N 64, bf16) was seen to return a buffer it never wrote: in
/// the port and in the reference alike, so a must-equal comparison there
/// passes on zeros or fails on stale bytes. Measured, not bit-compared:
/// each side is classified by the exact oracle (float64 definition and its
/// derived bound, see `exact::matmul`); with the buffer cache poisoned, an
/// unwritten output holds NaN and is always outside.
fn single_group_cases() -> Vec<Case> {
    SINGLE_GROUP
        .into_iter()
        .map(|(group_size, k, m)| {
            Case::finding(
                format!(
                    "{FAMILY}/single-group/{}/bf16/M{m}-K{k}",
                    affine(4, group_size)
                ),
                FAMILY,
                "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2) against the exact oracle",
                move |ctx| single_group(ctx, affine(4, group_size), m, k),
            )
        })
        .collect()
}

fn single_group(ctx: &Ctx, spec: QuantSpec, m: usize, k: usize) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, DType::Bfloat16, &[m, k]);
    let payload = quantized_weight(&mut inputs, spec, DType::Bfloat16, &[N, k])?;
    let tensors = layer_tensors(&payload, None)?;
    let layer = QuantizedLinear::new(payload, None).map_err(port)?;
    let y = host(&layer.forward(&x.to_array()).map_err(port)?)?;
    let reference = reference::quantized::quantized_linear(ctx, &x, &tensors)?;
    let mut out = CaseOutput::new("mlx.core");
    // Reported like any output's exact check (a reference outside its
    // bound shows in every report), and pinned by the finding.
    let check = out.measure_exact("y", &y, &reference)?;
    Ok(out.with_finding(serde_json::json!({
        "in_features": k,
        "groups_per_row": k / spec.group_size as usize,
        "reference_within_bound": check.reference.within(),
        "port_within_bound": check.port.within(),
    })))
}

fn run(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let k = base_k(s.spec);
    let mut inputs = ctx.inputs();
    let mut x_shape = s.batch.clone();
    x_shape.extend([s.m, k]);
    let x = activation(&mut inputs, s.dtype, &x_shape);
    let payload = quantized_weight(
        &mut inputs,
        s.spec,
        s.scales_dtype.unwrap_or(s.dtype),
        &[N, k],
    )?;
    let bias: Option<HostTensor> = match s.bias {
        Bias::None => None,
        Bias::Same => Some(inputs.uniform(s.dtype, &[N], 0.5)),
        Bias::F32 => Some(inputs.uniform(DType::Float32, &[N], 0.5)),
    };

    let reference =
        reference::quantized::quantized_linear(ctx, &x, &layer_tensors(&payload, bias.as_ref())?)?;

    let layer =
        QuantizedLinear::new(payload, bias.as_ref().map(HostTensor::to_array)).map_err(port)?;
    let y = layer.forward(&x.to_array()).map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}
