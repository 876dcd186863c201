//! `float/linear`, `float/switch`, `float/checkpoint`: the unquantized
//! layers (`layers::dense`) against `mlx.nn.Linear.__call__` (mlx 0.32.2)
//! and `mlx_lm.models.switch_layers.SwitchLinear.__call__` (mlx-lm 0.32.2),
//! and the float modules of a quantized checkpoint (`lm_head: false`, a
//! 96-wide layer the group size does not divide) against the modules
//! `mlx_lm.utils.load_model` leaves unquantized. Inputs as the quantized
//! families make them (shared helpers); switch layers are driven as
//! `SwitchGLU.__call__` drives them, sorted or not.

use layers::checkpoint::Checkpoint;
use layers::dense::{Linear, SwitchLinear};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use oracle::DType;

use super::switch::{expert_indices, gather_sort, scatter_unsort};
use super::{activation, dtype_tag, fixture_dir, host, port};
use crate::case::{Backend, Case, CaseError, CaseOutput, Ctx, GPU_BACKENDS};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const SWITCH_REFERENCE: &str = "mlx_lm.models.switch_layers.SwitchLinear.__call__ (mlx-lm 0.32.2), driven as SwitchGLU.__call__";
const GATHER_MM_CPU: &str =
    "MLX 0.32.2's CPU GatherMM supports float32 only: the reference raises \
     `[GatherMM::eval] Currently only supports float32` (finding …/cpu-gather-mm)";

const IN: usize = 96;
const OUT: usize = 48;

/// A `float/*` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FloatCase {
    /// Must-equal: `nn.Linear` (K = 96, N = 64).
    Linear { dtype: DType, bias: bool, m: usize },
    /// Must-equal: the float `SwitchLinear` (E = 4, top 2, B = 2, L = 5).
    Switch {
        dtype: DType,
        bias: bool,
        sorted: bool,
    },
    /// Finding (CPU only): which dtypes the CPU `GatherMM` takes.
    CpuGatherMm,
    /// Must-equal: a checkpoint's module left an `nn.Linear`.
    Checkpoint { fixture: String, path: String },
}

impl Params for FloatCase {
    const BUILDER: &'static str = "float";
    fn build(self, name: String) -> Case {
        match self {
            FloatCase::Linear { dtype, bias, m } => Case::must_equal(
                name,
                "float/linear",
                "mlx.nn.Linear.__call__ (mlx 0.32.2)",
                move |ctx| {
                    crate::families::describe::dims(&[("m", m)], 1 << 20)?;
                    linear(ctx, dtype, bias, m)
                },
            ),
            FloatCase::Switch { dtype, bias, sorted } => {
                let case = Case::must_equal(name, "float/switch", SWITCH_REFERENCE, move |ctx| {
                    switch(ctx, dtype, bias, sorted)
                })
                .glue_composed(super::switch::SWITCH_GLU_STEP);
                // MLX's CPU GatherMM takes float32 only: neither side runs there.
                if dtype == DType::Float32 {
                    case
                } else {
                    case.only_on(GPU_BACKENDS, GATHER_MM_CPU)
                }
            }
            FloatCase::CpuGatherMm => Case::finding(name, "float/switch", SWITCH_REFERENCE, cpu_support)
                .only_on(&[Backend::Cpu], "a CPU-only measurement"),
            FloatCase::Checkpoint { fixture, path } => Case::must_equal(
                name,
                "float/checkpoint",
                "mlx_lm.utils.load_model (mlx-lm 0.32.2) leaving the module an nn.Linear, then its __call__",
                move |ctx| checkpoint(ctx, &fixture, &path),
            ),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for dtype in [DType::Bfloat16, DType::Float16, DType::Float32] {
        for bias in [false, true] {
            for m in [1usize, 4, 33] {
                let name = format!(
                    "float/linear/{}/M{m}{}",
                    dtype_tag(dtype),
                    if bias { "/bias" } else { "" }
                );
                cases.push(described(name, &FloatCase::Linear { dtype, bias, m }));
            }
        }
    }
    for (dtype, bias, sorted) in [
        (DType::Bfloat16, false, false),
        (DType::Bfloat16, true, false),
        (DType::Bfloat16, true, true),
        (DType::Float32, true, false),
    ] {
        let name = format!(
            "float/switch/{}/E4-top2/B2-L5/{}{}",
            dtype_tag(dtype),
            if sorted { "sorted" } else { "unsorted" },
            if bias { "/bias" } else { "" }
        );
        cases.push(described(
            name,
            &FloatCase::Switch {
                dtype,
                bias,
                sorted,
            },
        ));
    }
    cases.push(described(
        "float/switch/bf16/E4-top2/B2-L5/unsorted/bias/cpu-gather-mm",
        &FloatCase::CpuGatherMm,
    ));
    for path in ["lm_head", "model.layers.1.mlp.proj_96"] {
        cases.push(described(
            format!("float/checkpoint/tiny-mixed/{path}"),
            &FloatCase::Checkpoint {
                fixture: "tiny-mixed".into(),
                path: path.into(),
            },
        ));
    }
    cases
}

fn linear(ctx: &Ctx, dtype: DType, bias: bool, m: usize) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, dtype, &[m, IN]);
    let weight = inputs.uniform(dtype, &[OUT, IN], 0.1);
    let b = bias.then(|| inputs.uniform(dtype, &[OUT], 0.5));
    let reference = reference::quantized::float_linear(ctx, &x, &weight, b.as_ref())?;
    let layer = Linear::new(weight.to_array(), b.as_ref().map(|t| t.to_array())).map_err(port)?;
    let y = host(&layer.forward(&x.to_array()).map_err(port)?)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &reference);
    Ok(out)
}

fn switch(ctx: &Ctx, dtype: DType, bias: bool, sorted: bool) -> Result<CaseOutput, CaseError> {
    let (experts, top, batch, len) = (4, 2, 2, 5);
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, dtype, &[batch, len, IN]);
    let indices = expert_indices(&mut inputs, &[batch, len], top, experts);
    let weight = inputs.uniform(dtype, &[experts, OUT, IN], 0.1);
    let b = bias.then(|| inputs.uniform(dtype, &[experts, OUT], 0.5));
    let reference =
        reference::quantized::float_switch(ctx, &x, &indices, &weight, b.as_ref(), sorted)?;
    let layer =
        SwitchLinear::new(weight.to_array(), b.as_ref().map(|t| t.to_array())).map_err(port)?;
    // As SwitchGLU: x (B, L, D) → (B, L, 1, 1, D); sorted through
    // _gather_sort / _scatter_unsort; then squeeze(-2).
    let xa = x.to_array().expand_dims_axes(&[-2, -3])?;
    let ia = indices.to_array();
    let y = if sorted {
        let (xs, idx, inv_order) = gather_sort(&xa, &ia)?;
        let y = layer.forward(&xs, &idx, true).map_err(port)?;
        scatter_unsort(&y, &inv_order, ia.shape())?
    } else {
        layer.forward(&xa, &ia, false).map_err(port)?
    };
    let y = host(&y.squeeze_axes(&[-2])?)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &reference);
    Ok(out)
}

fn checkpoint(ctx: &Ctx, fixture: &str, path: &str) -> Result<CaseOutput, CaseError> {
    let dir = fixture_dir(fixture)?;
    let checkpoint = Checkpoint::open(&dir).map_err(port)?;
    let layer = Linear::from_checkpoint(&checkpoint, path).map_err(port)?;
    let width = layer.in_features() as usize;
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, DType::Bfloat16, &[5, width]);
    let loaded = reference::checkpoint::float_checkpoint(ctx, &x, &dir, path)?;
    if loaded.module != "Linear" {
        return Err(CaseError::Harness(format!(
            "the reference loaded `{path}` as {}, not a float Linear",
            loaded.module
        )));
    }
    // The exact oracle on the module's tensors as the port loaded them.
    let module = [
        ("weight", oracle::Arg::Tensor(host(layer.weight())?)),
        (
            "bias",
            layer
                .bias()
                .map(host)
                .transpose()?
                .map_or(oracle::Arg::None, oracle::Arg::Tensor),
        ),
    ];
    let exact = loaded.calls.exact_with(
        "float_checkpoint",
        &module,
        crate::exactness::quantized::float_linear,
    )?;
    let reference = loaded.y.with_exact(exact);
    let xa: Array = x.to_array();
    let y = host(
        &layer
            .forward(&xa.index((.., ..width as i32)))
            .map_err(port)?,
    )?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &y, &reference);
    Ok(out)
}

/// Finding (CPU): whether the reference's and the port's bf16 float
/// switch layer run on MLX's CPU backend, and what each raises.
fn cpu_support(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let reference = match switch(ctx, DType::Bfloat16, true, false) {
        Ok(out) => return Ok(out.with_finding(serde_json::json!({"runs": true}))),
        Err(e) => e.to_string(),
    };
    // The message without a machine's source path (" at /…/array.cpp:352").
    let first_error_line = |text: &str| {
        let line = text
            .lines()
            .rev()
            .find(|l| l.contains("Error") || l.contains("[GatherMM"))
            .unwrap_or("")
            .trim();
        line.split(" at /").next().unwrap_or(line).to_owned()
    };
    // The port alone (the reference raised first).
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, DType::Bfloat16, &[2, 5, IN]);
    let indices = expert_indices(&mut inputs, &[2, 5], 2, 4);
    let weight = inputs.uniform(DType::Bfloat16, &[4, OUT, IN], 0.1);
    let layer = SwitchLinear::new(weight.to_array(), None).map_err(port)?;
    let port_result = layer
        .forward(
            &x.to_array().expand_dims_axes(&[-2, -3])?,
            &indices.to_array(),
            false,
        )
        .and_then(|y| y.eval().map_err(layers::quantized::LayerError::from));
    Ok(CaseOutput::new("mlx.core").with_finding(serde_json::json!({
        "runs": false,
        "reference_raises": first_error_line(&reference),
        "port_raises": match port_result {
            Ok(()) => String::new(),
            Err(e) => first_error_line(&e.to_string()),
        },
    })))
}
