//! `quantized/global-scale`: nvfp4's two-level scaling, a float32
//! per-tensor (per-expert) global scale next to the per-group scales.
//!
//! * `linear/<dtype>`: `QuantizedPayload::quantize_with_global_scale` and
//!   its `dequantize` against `mx.quantize(..., global_scale=)` and
//!   `mx.dequantize(..., global_scale=)` (mlx 0.32.2), the global scale
//!   being `max(|w|)` in float32 as mlx-lm takes it.
//! * `switch/<dtype>`: `QuantizedPayload::quantize_experts_with_global_scale`
//!   against mlx-lm's `SwitchLinear.to_quantized(..., global_scale=True)`
//!   (`_quantize_experts`, mlx-lm 0.32.2).
//! * `…/forward-refused` (findings): the pinned MLX has no `global_scale`
//!   in `quantized_matmul` or `gather_qmm`, so the reference's forward
//!   raises; the port refuses the same forwards with
//!   `LayerError::GlobalScaleRefused`. Both messages are recorded.
//!
//! The proof flips the top mantissa bit of every weight element: a
//! one-ulp change would leave most fp4 codes and e4m3 scales as they are.

use layers::quantized::{
    LayerError, Mode, QuantSpec, QuantizedLinear, QuantizedPayload, QuantizedSwitchLinear,
};
use mlx_rs::{ops, Array, Dtype};
use oracle::{DType, HostTensor};

use super::{activation, dtype_tag, host, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::inputs::Inputs;
use crate::reference;

const FAMILY: &str = "quantized/global-scale";
const LINEAR_REFERENCE: &str =
    "mlx.core.quantize / dequantize with global_scale, mode nvfp4 (mlx 0.32.2)";
const SWITCH_REFERENCE: &str = "mlx_lm.models.switch_layers.SwitchLinear.to_quantized(global_scale=True) → _quantize_experts (mlx-lm 0.32.2)";
const OUT: usize = 64;
const IN: usize = 96;
const EXPERTS: usize = 4;

fn nvfp4() -> QuantSpec {
    QuantSpec::defaults(Mode::Nvfp4)
}

/// A `quantized/global-scale` case as data (nvfp4, out 64, in 96, 4
/// experts).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GlobalScaleCase {
    /// Must-equal: a linear weight quantized and dequantized with a global scale.
    Linear { dtype: DType },
    /// Must-equal: a switch stack's per-expert global scales.
    Switch { dtype: DType },
    /// Finding: the reference refuses the linear forward.
    LinearForwardRefused,
    /// Finding: the reference refuses the switch forward.
    SwitchForwardRefused,
}

impl Params for GlobalScaleCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            GlobalScaleCase::Linear { dtype } => {
                Case::must_equal(name, FAMILY, LINEAR_REFERENCE, move |ctx| linear(ctx, dtype))
            }
            GlobalScaleCase::Switch { dtype } => {
                Case::must_equal(name, FAMILY, SWITCH_REFERENCE, move |ctx| switch(ctx, dtype))
            }
            GlobalScaleCase::LinearForwardRefused => Case::finding(
                name,
                FAMILY,
                "mlx.core.quantized_matmul (mlx 0.32.2: no global_scale)",
                linear_forward,
            ),
            GlobalScaleCase::SwitchForwardRefused => Case::finding(
                name,
                FAMILY,
                "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ → mlx.core.gather_qmm (mlx 0.32.2: no global_scale)",
                switch_forward,
            ),
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for dtype in [DType::Bfloat16, DType::Float32] {
        let tag = dtype_tag(dtype);
        cases.push(described(
            format!("{FAMILY}/linear/{tag}/out{OUT}-in{IN}"),
            &GlobalScaleCase::Linear { dtype },
        ));
        cases.push(described(
            format!("{FAMILY}/switch/{tag}/E{EXPERTS}-out{OUT}-in{IN}"),
            &GlobalScaleCase::Switch { dtype },
        ));
    }
    cases.push(described(
        format!("{FAMILY}/linear/forward-refused"),
        &GlobalScaleCase::LinearForwardRefused,
    ));
    cases.push(described(
        format!("{FAMILY}/switch/forward-refused"),
        &GlobalScaleCase::SwitchForwardRefused,
    ));
    cases
}

/// `mx.max(mx.abs(w)).astype(mx.float32)`.
fn max_abs(w: &Array) -> Result<Array, CaseError> {
    ops::max(&ops::abs(w).map_err(port)?, None)
        .map_err(port)?
        .as_dtype(Dtype::Float32)
        .map_err(port)
}

struct Linear {
    w: HostTensor,
    x: HostTensor,
    payload: QuantizedPayload,
    global_scale: Array,
}

fn linear_setup(inputs: &mut Inputs, dtype: DType) -> Result<Linear, CaseError> {
    let w = inputs.uniform(dtype, &[OUT, IN], 1.0);
    let x = activation(inputs, dtype, &[3, IN]);
    let global_scale = max_abs(&w.to_array())?;
    let payload =
        QuantizedPayload::quantize_with_global_scale(&w.to_array(), nvfp4(), &global_scale)
            .map_err(port)?;
    Ok(Linear {
        w,
        x,
        payload,
        global_scale,
    })
}

/// The port's codes (global scale, weight, scales) on the host, and the
/// reference's quantize / dequantize / forward attempt on the same weight
/// (the port's codes give the exact oracle the port's own dequantization).
fn port_and_reference(
    ctx: &Ctx,
    s: &Linear,
) -> Result<([HostTensor; 3], reference::quantized::GlobalScaleOut), CaseError> {
    let (gs, w, sc) = (
        host(&s.global_scale)?,
        host(s.payload.weight())?,
        host(s.payload.scales())?,
    );
    let r = reference::quantized::quantized_global_scale(
        ctx,
        &s.w,
        &s.x,
        nvfp4().group_size,
        [&w, &sc, &gs],
    )?;
    Ok(([gs, w, sc], r))
}

fn linear(ctx: &Ctx, dtype: DType) -> Result<CaseOutput, CaseError> {
    let s = linear_setup(&mut ctx.inputs(), dtype)?;
    let dequantized = s.payload.dequantize(None).map_err(port)?;
    let ([gs, w, sc], r) = port_and_reference(ctx, &s)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("global_scale", &gs, &r.global_scale);
    out.compare("weight", &w, &r.weight);
    out.compare("scales", &sc, &r.scales);
    out.compare("dequantized", &host(&dequantized)?, &r.dequantized);
    Ok(out)
}

/// The finding of a forward both sides must refuse: the port's
/// `GlobalScaleRefused` and the reference's message ("" if it ran).
fn refused(
    port_result: Result<Array, LayerError>,
    reference: String,
) -> Result<CaseOutput, CaseError> {
    let port_refused = match port_result {
        Ok(_) => {
            return Err(CaseError::Port(
                "the port ran a forward the pinned MLX cannot".into(),
            ))
        }
        Err(e @ LayerError::GlobalScaleRefused { .. }) => e.to_string(),
        Err(other) => return Err(port(other)),
    };
    let finding = serde_json::json!({
        "reference_refuses": !reference.is_empty(),
        "reference": reference,
        "port": port_refused,
    });
    Ok(CaseOutput::new("mlx.core").with_finding(finding))
}

fn linear_forward(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let s = linear_setup(&mut ctx.inputs(), DType::Bfloat16)?;
    let (_, r) = port_and_reference(ctx, &s)?;
    let layer = QuantizedLinear::new(s.payload, None).map_err(port)?;
    refused(layer.forward(&s.x.to_array()), r.matmul_refused)
}

struct Switch {
    w: HostTensor,
    x: HostTensor,
    indices: HostTensor,
    payload: QuantizedPayload,
}

fn switch_setup(inputs: &mut Inputs, dtype: DType) -> Result<Switch, CaseError> {
    let w = inputs.uniform(dtype, &[EXPERTS, OUT, IN], 1.0);
    let x = activation(inputs, dtype, &[3, 1, 1, IN]);
    let indices = inputs.integers(DType::Int32, &[3, 2], 0, EXPERTS as i64);
    let payload = QuantizedPayload::quantize_experts_with_global_scale(&w.to_array(), nvfp4())
        .map_err(port)?;
    Ok(Switch {
        w,
        x,
        indices,
        payload,
    })
}

fn switch(ctx: &Ctx, dtype: DType) -> Result<CaseOutput, CaseError> {
    let s = switch_setup(&mut ctx.inputs(), dtype)?;
    let r = reference::quantized::quantized_switch_global_scale(
        ctx,
        &s.w,
        &s.x,
        &s.indices,
        nvfp4().group_size,
    )?;
    let gs = s
        .payload
        .global_scale()
        .ok_or_else(|| CaseError::Port("no global scale".into()))?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("weight", &host(s.payload.weight())?, &r.weight);
    out.compare("scales", &host(s.payload.scales())?, &r.scales);
    out.compare("global_scale", &host(gs)?, &r.global_scale);
    Ok(out)
}

fn switch_forward(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let s = switch_setup(&mut ctx.inputs(), DType::Bfloat16)?;
    let group_size = nvfp4().group_size;
    let r = reference::quantized::quantized_switch_global_scale(
        ctx, &s.w, &s.x, &s.indices, group_size,
    )?;
    let layer = QuantizedSwitchLinear::new(s.payload, None).map_err(port)?;
    refused(
        layer.forward(&s.x.to_array(), &s.indices.to_array(), false),
        r.call_refused,
    )
}
