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
use crate::families::describe::{described, Described, Params};
use crate::reference;

const FAMILY: &str = "quantized/linear";
/// Output features of every linear case.
const N: usize = 64;
const MS: [usize; 8] = [1, 2, 3, 4, 7, 8, 16, 33];

/// The additive bias of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bias {
    None,
    /// In the activation dtype.
    Same,
    /// float32 (as `nn.QuantizedLinear.__init__` creates it).
    F32,
}

/// One linear case as data: `x [*batch, M, K] @ W[N, K]^T (+ bias)`, the
/// weight quantized by the port with `spec`. The registry's fixed cases
/// have `K = 3 * group_size` and `N = 64`; the explorer samples any
/// `K` (a multiple of the group size) and `N`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinearShape {
    #[serde(with = "crate::families::describe::spec")]
    pub spec: QuantSpec,
    /// Activation dtype (also the dtype the weight is quantized from, so
    /// affine scales have it) unless `scales_dtype` says otherwise.
    pub dtype: DType,
    #[serde(default)]
    pub scales_dtype: Option<DType>,
    /// Leading dimensions of x before M.
    #[serde(default)]
    pub batch: Vec<usize>,
    pub m: usize,
    /// Input features (a multiple of the spec's group size).
    pub k: usize,
    /// Output features.
    pub n: usize,
    #[serde(default = "no_bias")]
    pub bias: Bias,
    /// How the port's x reaches the layer (the reference always gets the
    /// same values contiguous).
    #[serde(default)]
    pub x_view: XView,
}

fn no_bias() -> Bias {
    Bias::None
}

/// The memory layout of the port's activation: kernels that read strides
/// wrong show here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XView {
    #[default]
    Contiguous,
    /// The first K columns of a `[…, M, K + 64]` array (row stride K + 64).
    Sliced,
    /// Row 0 broadcast over M (stride 0 along M); the values are row 0's,
    /// repeated, on both sides.
    Broadcast,
}

impl LinearShape {
    /// A fixed-list shape: `K` three groups, `N` 64.
    pub fn new(spec: QuantSpec, dtype: DType, m: usize) -> Self {
        LinearShape {
            spec,
            dtype,
            scales_dtype: None,
            x_view: XView::Contiguous,
            batch: Vec::new(),
            m,
            k: base_k(spec),
            n: N,
            bias: Bias::None,
        }
    }

    /// Why `mx.quantize` or the layer cannot take this shape, if so.
    pub fn check(&self) -> Result<(), String> {
        let g = self.spec.group_size as usize;
        if self.k == 0 || !self.k.is_multiple_of(g) {
            return Err(format!(
                "k {} is not a positive multiple of group_size {g}",
                self.k
            ));
        }
        if self.m == 0 || self.n == 0 || self.batch.contains(&0) {
            return Err("m, n and batch dimensions must be positive".into());
        }
        if !matches!(
            self.dtype,
            oracle::DType::Bfloat16 | oracle::DType::Float16 | oracle::DType::Float32
        ) {
            return Err(format!("dtype {} is not a float dtype", self.dtype.name()));
        }
        let rows = self.batch.iter().try_fold(self.m, |a, &b| a.checked_mul(b));
        if rows
            .and_then(|r| r.checked_add(self.n))
            .and_then(|r| r.checked_mul(self.k))
            .is_none_or(|e| e > 1 << 28)
        {
            return Err("x and the weight hold more than 2^28 elements".into());
        }
        Ok(())
    }

    /// The case name; `K` and `N` appear only when they differ from the
    /// fixed list's, so the registry's names are unchanged.
    pub fn name(&self) -> String {
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
        match self.x_view {
            XView::Contiguous => {}
            XView::Sliced => name += "/x-sliced",
            XView::Broadcast => name += "/x-broadcast",
        }
        if (self.k, self.n) != (base_k(self.spec), N) {
            name += &format!("/K{}-N{}", self.k, self.n);
        }
        name
    }

    /// The must-equal case of this shape, under its own name.
    pub fn case(self) -> Case {
        let name = self.name();
        self.case_named(name)
    }

    /// The must-equal case of this shape under `name` (kept explorer cases).
    pub fn case_named(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, QUANTIZED_LINEAR, move |ctx| run(ctx, &self))
    }
}

/// A `quantized/linear` case as data.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinearCase {
    /// Must-equal: port and reference on one shape.
    Shape(LinearShape),
    /// Finding: rows of one group against the exact oracle (affine, bf16,
    /// N = 64).
    SingleGroup {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        m: usize,
        k: usize,
    },
}

impl Params for LinearCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            LinearCase::Shape(shape) => shape.case_named(name),
            LinearCase::SingleGroup { spec, m, k } => Case::finding(
                name,
                FAMILY,
                "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2) against the exact oracle",
                move |ctx| {
                    crate::families::describe::dims(&[("m", m), ("k", k), ("N", N)], 1 << 30)?;
                    if k % spec.group_size as usize != 0 {
                        return Err(CaseError::Harness(format!(
                            "k {k} is not a multiple of group_size {}",
                            spec.group_size
                        )));
                    }
                    single_group(ctx, spec, m, k)
                },
            ),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let bf16 = DType::Bfloat16;
    let mut shapes = Vec::new();
    // Every spec once.
    for spec in all_specs() {
        shapes.push(LinearShape::new(spec, bf16, 8));
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
        shapes.push(LinearShape {
            bias: Bias::Same,
            ..LinearShape::new(spec, bf16, 8)
        });
    }
    for spec in [affine(4, 64), mode_default(Mode::Nvfp4)] {
        shapes.push(LinearShape {
            bias: Bias::F32,
            ..LinearShape::new(spec, bf16, 8)
        });
    }
    // M x dtype on two specs (bf16/M8 is already above).
    for spec in [affine(4, 64), mode_default(Mode::Mxfp4)] {
        for dtype in FLOAT_DTYPES {
            for m in MS {
                if (dtype, m) != (bf16, 8) {
                    shapes.push(LinearShape::new(spec, dtype, m));
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
        shapes.push(LinearShape {
            batch: batch.to_vec(),
            bias,
            ..LinearShape::new(spec, dtype, m)
        });
    }
    // Scales in another dtype than the activation.
    shapes.push(LinearShape {
        scales_dtype: Some(DType::Float16),
        ..LinearShape::new(affine(4, 64), bf16, 8)
    });
    shapes.push(LinearShape {
        scales_dtype: Some(DType::Float32),
        ..LinearShape::new(affine(6, 32), bf16, 4)
    });
    let mut cases: Vec<Described> = shapes
        .into_iter()
        .map(|s| described(s.name(), &LinearCase::Shape(s)))
        .collect();
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
fn single_group_cases() -> Vec<Described> {
    SINGLE_GROUP
        .into_iter()
        .map(|(group_size, k, m)| {
            let spec = affine(4, group_size);
            described(
                format!("{FAMILY}/single-group/{spec}/bf16/M{m}-K{k}"),
                &LinearCase::SingleGroup { spec, m, k },
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

/// A shape's seeded inputs: the activation, the float weight the port
/// quantizes, and the bias (one generator, in this order, so the case, the
/// explorer's invariance and its reproducer see the same tensors).
pub struct LinearInputs {
    pub x: HostTensor,
    pub weight: HostTensor,
    pub bias: Option<HostTensor>,
}

impl LinearShape {
    pub fn inputs(&self, seed: u64) -> LinearInputs {
        let mut inputs = crate::inputs::Inputs::new(seed);
        let mut x_shape = self.batch.clone();
        x_shape.extend([self.m, self.k]);
        let mut x = activation(&mut inputs, self.dtype, &x_shape);
        if self.x_view == XView::Broadcast {
            // Every row is row 0 (the reference and the exact oracle get
            // these values; the port a stride-0 view of row 0).
            let row = self.k * self.dtype.size();
            let first = x.bytes[..row].to_vec();
            for r in x.bytes.chunks_mut(row) {
                r.copy_from_slice(&first);
            }
        }
        let weight = inputs.uniform(
            self.scales_dtype.unwrap_or(self.dtype),
            &[self.n, self.k],
            1.0,
        );
        let bias = match self.bias {
            Bias::None => None,
            Bias::Same => Some(inputs.uniform(self.dtype, &[self.n], 0.5)),
            Bias::F32 => Some(inputs.uniform(DType::Float32, &[self.n], 0.5)),
        };
        LinearInputs { x, weight, bias }
    }

    /// The port's x: `x` laid out as [`XView`] says (same values).
    pub fn port_x(&self, x: &HostTensor) -> Result<mlx_rs::Array, CaseError> {
        use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
        let a = x.to_array();
        let mut shape: Vec<i32> = x.shape.iter().map(|&d| d as i32).collect();
        let last = shape.len() - 1;
        Ok(match self.x_view {
            XView::Contiguous => a,
            XView::Sliced => {
                let mut pad = shape.clone();
                pad[last] = 64;
                let zeros = mlx_rs::ops::zeros_dtype(&pad, a.dtype())?;
                let wide = mlx_rs::ops::concatenate(&[&a, &zeros], last as i32)?;
                wide.try_index((Ellipsis, ..shape[last]))?
            }
            XView::Broadcast => {
                let row = a.try_index((Ellipsis, ..1, ..))?;
                shape[last - 1] = self.m as i32;
                mlx_rs::ops::broadcast_to(&row, &shape)?
            }
        })
    }

    /// The port's layer for these inputs.
    fn layer(
        &self,
        inputs: &LinearInputs,
    ) -> Result<(QuantizedLinear, QuantizedPayloadTensors), CaseError> {
        let payload = super::quantize(&inputs.weight.to_array(), self.spec)?;
        let tensors = layer_tensors(&payload, inputs.bias.as_ref())?;
        let layer = QuantizedLinear::new(payload, inputs.bias.as_ref().map(HostTensor::to_array))
            .map_err(port)?;
        Ok((layer, tensors))
    }

    /// Invariance (a finding, never a verdict): whether the port's batched
    /// forward has the bits of the same rows computed one at a time.
    pub fn rows_match_batched(&self, seed: u64) -> Result<bool, CaseError> {
        self.check().map_err(|e| CaseError::harness("shape", e))?;
        let inputs = self.inputs(seed);
        let (layer, _) = self.layer(&inputs)?;
        let batched = host(&layer.forward(&self.port_x(&inputs.x)?).map_err(port)?)?;
        let rows = self.batch.iter().product::<usize>() * self.m;
        let (row_in, row_out) = (inputs.x.bytes.len() / rows, batched.bytes.len() / rows);
        for r in 0..rows {
            let row = HostTensor::new(
                inputs.x.dtype,
                vec![1, self.k],
                inputs.x.bytes[r * row_in..(r + 1) * row_in].to_vec(),
            )
            .map_err(|e| CaseError::harness("x row", e))?;
            let alone = host(&layer.forward(&row.to_array()).map_err(port)?)?;
            if alone.bytes[..] != batched.bytes[r * row_out..(r + 1) * row_out] {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

type QuantizedPayloadTensors = crate::reference::quantized::QuantizedTensors;

fn run(ctx: &Ctx, s: &LinearShape) -> Result<CaseOutput, CaseError> {
    s.check().map_err(|e| CaseError::harness("shape", e))?;
    let inputs = s.inputs(ctx.seed());
    let (layer, tensors) = s.layer(&inputs)?;
    let reference = reference::quantized::quantized_linear(ctx, &inputs.x, &tensors)?;
    let y = layer.forward(&s.port_x(&inputs.x)?).map_err(port)?;
    let mut y = host(&y)?;
    ctx.port_output("quantized/linear", s.m, s.n, &mut y);
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &reference);
    Ok(out)
}
