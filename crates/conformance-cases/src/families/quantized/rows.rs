//! `quantized/rows`: the rows-independent forward.
//!
//! * must-equal: `QuantizedLinear::forward_as(x, Forward::RowsIndependent)`
//!   against the reference layer (`mlx.nn.QuantizedLinear`, wrapped in
//!   `LoRALinear` when adapters are attached) called once per row, M = 1
//!   each, rows concatenated;
//! * finding, per (spec, dtype, M): does the batched forward equal the
//!   rows-independent one on this backend? `{equal, differing, total,
//!   max_ulp}` of batched versus rows-independent port outputs (the
//!   linear and rows must-equal cases tie each of them to the reference).

use layers::quantized::{Forward, LoraAdapter, Mode, QuantSpec, QuantizedLinear};
use oracle::{DType, HostTensor};

use super::layer_tensors;
use super::{
    activation, affine, base_k, dtype_tag, host, mode_default, mode_specs, port, quantized_weight,
    relation,
};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use crate::reference::quantized::{Adapter, QuantizedTensors};

const FAMILY: &str = "quantized/rows";
const REFERENCE_ROWS: &str =
    "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2) [+ mlx_lm.tuner.lora.LoRALinear.__call__ (mlx-lm 0.32.2)], one call per row";
const REFERENCE_FINDING: &str =
    "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2): one batched call versus one call per row";
const N: usize = 64;

/// The layer and x of a `quantized/rows` case (N = 64, K = three groups).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    #[serde(with = "crate::families::describe::spec")]
    spec: QuantSpec,
    dtype: DType,
    batch: Vec<usize>,
    m: usize,
    /// One LoRA adapter (r = 8, scale 20) and a bias.
    lora: bool,
}

impl Shape {
    /// Why the description cannot run, if so (positive, bounded dims).
    fn check(&self) -> Result<(), CaseError> {
        let mut named: Vec<(&str, usize)> = vec![("m", self.m), ("K", base_k(self.spec)), ("N", N)];
        named.extend(self.batch.iter().map(|b| ("batch", *b)));
        crate::families::describe::dims(&named, 1 << 30)
    }

    fn new(spec: QuantSpec, dtype: DType, m: usize) -> Self {
        Shape {
            spec,
            dtype,
            batch: Vec::new(),
            m,
            lora: false,
        }
    }

    fn name(&self, what: &str) -> String {
        let mut name = format!("{FAMILY}/{}/{}", self.spec, dtype_tag(self.dtype));
        if !self.batch.is_empty() {
            let b: Vec<String> = self.batch.iter().map(usize::to_string).collect();
            name += &format!("/B{}", b.join("x"));
        }
        name += &format!("/M{}/{what}", self.m);
        if self.lora {
            name += "/lora-bias";
        }
        name
    }
}

/// A `quantized/rows` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RowsCase {
    /// Must-equal: the port's rows-independent forward against one
    /// reference call per row.
    RowsIndependent(Shape),
    /// Finding: the reference's batched call against its calls per row.
    BatchedVsRows(Shape),
}

impl Params for RowsCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            RowsCase::RowsIndependent(s) => Case::must_equal(name, FAMILY, REFERENCE_ROWS, move |ctx| {
                s.check()?;
                rows_vs_reference(ctx, &s)
            })
            .glue_composed(&[
                "mlx.nn.QuantizedLinear.__call__ (LoRA-wrapped by mlx_lm.tuner.lora.LoRALinear where the case has an adapter)",
                "one call per row of x (M = 1), rows concatenated: how a rows-independent engine calls the layer",
            ]),
            RowsCase::BatchedVsRows(s) => Case::finding(name, FAMILY, REFERENCE_FINDING, move |ctx| {
                s.check()?;
                batched_vs_rows(ctx, &s)
            }),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let bf16 = DType::Bfloat16;
    let mut cases = Vec::new();
    let mut must = Vec::new();
    for spec in mode_specs().into_iter().chain([affine(3, 32)]) {
        for m in [7, 33] {
            must.push(Shape::new(spec, bf16, m));
        }
    }
    must.push(Shape {
        lora: true,
        ..Shape::new(affine(4, 64), bf16, 16)
    });
    must.push(Shape {
        lora: true,
        ..Shape::new(mode_default(Mode::Nvfp4), DType::Float16, 5)
    });
    must.push(Shape {
        batch: vec![2, 3],
        ..Shape::new(affine(4, 64), DType::Float32, 2)
    });
    for s in must {
        cases.push(described(
            s.name("rows-independent"),
            &RowsCase::RowsIndependent(s),
        ));
    }
    let mut findings = Vec::new();
    for spec in mode_specs() {
        for m in [2, 3, 7, 8, 16, 33] {
            findings.push(Shape::new(spec, bf16, m));
        }
    }
    for m in [8, 33] {
        findings.push(Shape::new(affine(4, 64), DType::Float32, m));
    }
    findings.push(Shape {
        lora: true,
        ..Shape::new(affine(4, 64), bf16, 16)
    });
    for s in findings {
        cases.push(described(
            s.name("batched-vs-rows"),
            &RowsCase::BatchedVsRows(s),
        ));
    }
    cases
}

struct Setup {
    x: HostTensor,
    layer: QuantizedLinear,
    /// The reference layer's tensors and adapters.
    tensors: QuantizedTensors,
    adapters: Vec<Adapter>,
}

fn setup(ctx: &Ctx, s: &Shape) -> Result<Setup, CaseError> {
    let k = base_k(s.spec);
    let mut inputs = ctx.inputs();
    let mut x_shape = s.batch.clone();
    x_shape.extend([s.m, k]);
    let x = activation(&mut inputs, s.dtype, &x_shape);
    let payload = quantized_weight(&mut inputs, s.spec, s.dtype, &[N, k])?;
    let bias = s.lora.then(|| inputs.uniform(s.dtype, &[N], 0.5));
    let lora = s.lora.then(|| {
        let a = inputs.uniform(DType::Float32, &[k, 8], 1.0 / (k as f32).sqrt());
        let b = inputs.uniform(DType::Float32, &[8, N], 0.05);
        (a, b, 20.0)
    });
    let tensors = layer_tensors(&payload, bias.as_ref())?;
    let mut layer =
        QuantizedLinear::new(payload, bias.as_ref().map(HostTensor::to_array)).map_err(port)?;
    if let Some((a, b, scale)) = &lora {
        let adapter = LoraAdapter::new(a.to_array(), b.to_array(), *scale as f32).map_err(port)?;
        layer.attach_adapter("adapter0", adapter).map_err(port)?;
    }
    let adapters = lora
        .into_iter()
        .map(|(lora_a, lora_b, scale)| Adapter {
            lora_a,
            lora_b,
            scale,
        })
        .collect();
    Ok(Setup {
        x,
        layer,
        tensors,
        adapters,
    })
}

fn rows_vs_reference(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s)?;
    let reference = reference::quantized::quantized_linear_rows(
        ctx,
        &setup.x,
        &setup.tensors,
        &setup.adapters,
    )?;
    let y = setup
        .layer
        .forward_as(&setup.x.to_array(), Forward::RowsIndependent)
        .map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}

fn batched_vs_rows(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s)?;
    let x = setup.x.to_array();
    let batched = host(&setup.layer.forward_as(&x, Forward::Batched).map_err(port)?)?;
    let rows = host(
        &setup
            .layer
            .forward_as(&x, Forward::RowsIndependent)
            .map_err(port)?,
    )?;
    let mut out = CaseOutput::new("mlx.core");
    out.digest("batched", &batched);
    out.digest("rows", &rows);
    Ok(out.with_finding(relation(&batched, &rows)))
}
