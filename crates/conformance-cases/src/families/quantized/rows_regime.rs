//! `quantized/rows-regime`: the rows regime table `layers` ships
//! ([`layers::quantized::RowsRegime`]) against the reference, per spec and
//! dtype, at K = 512, N = 256 (a shape every CUDA kernel class accepts).
//!
//! * must-equal, `…/linear/K512-N256/M{8,24}`: the port's chunked
//!   rows-independent `QuantizedLinear` forward against the reference layer
//!   called once per row (M = 1 each). M = 8 and 24 lie beyond CUDA's
//!   limit of 7, so a shipped limit that is too large fails here, loudly,
//!   with the first differing element;
//! * must-equal, `…/switch-E8-top{2,8}/K512-N256/T{12,5}`: the port's
//!   chunked `QuantizedSwitchLinear::forward_rows_independent` against the
//!   reference projection called once per token;
//! * finding, `…/linear/finder`, `…/switch-E8-top{2,8}/finder`: the limit
//!   re-measured from the reference alone (its batched call of M rows, or
//!   T tokens, against its calls per row, over M up to 24, T up to 12),
//!   and the shipped limit checked against it both ways: one that is too
//!   large is an ERROR (and its must-equal cases fail), one that is too
//!   small is reported (`"shipped": "too small"`). Every count is
//!   probed (the kernel classes change where MLX's dispatch says: on CUDA
//!   at 2 and 8 rows, or 8 routed rows; on Metal at the qmv batch limit;
//!   never on CPU — but a count between is measured, not assumed), so the
//!   finders run in the deep tier ([`Case::deep`]).

use layers::quantized::{
    ExpertIndices, Forward, QuantSpec, QuantizedLinear, QuantizedSwitchLinear, RowsCall, RowsLimit,
    RowsRegime,
};
use oracle::{DType, HostTensor};
use serde_json::json;

use super::switch::expert_indices;
use super::{activation, dtype_tag, host, layer_tensors, port, quantized_weight};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const FAMILY: &str = "quantized/rows-regime";
const REFERENCE_LINEAR: &str = "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2), one call per row";
const REFERENCE_SWITCH: &str =
    "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2), one call per token";
const REFERENCE_FINDER: &str =
    "mlx.nn.QuantizedLinear.__call__ / mlx_lm QuantizedSwitchLinear.__call__: batched call versus calls per row";
const K: usize = 512;
const N: usize = 256;
const EXPERTS: usize = 8;
/// Rows the linear finder measures: M = 1 ..= this.
pub const FINDER_ROWS: usize = 24;
/// Tokens the switch finder measures: T = 1 ..= this.
pub const FINDER_TOKENS: usize = 12;

/// A `quantized/rows-regime` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RowsRegimeCase {
    /// Must-equal: the chunked rows-independent linear forward of `m` rows.
    Linear {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        dtype: DType,
        m: usize,
    },
    /// Must-equal: the chunked rows-independent switch forward of `tokens`.
    Switch {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        dtype: DType,
        top_k: usize,
        tokens: usize,
    },
    /// Finding: the linear limit measured from the reference.
    LinearFinder {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        dtype: DType,
    },
    /// Finding: the switch limit (in tokens) measured from the reference.
    SwitchFinder {
        #[serde(with = "crate::families::describe::spec")]
        spec: QuantSpec,
        dtype: DType,
        top_k: usize,
    },
}

fn check(dims: &[(&str, usize)]) -> Result<(), CaseError> {
    crate::families::describe::dims(dims, 1 << 16)
}

fn check_top_k(top_k: usize) -> Result<(), CaseError> {
    if top_k > EXPERTS {
        return Err(CaseError::Harness(format!(
            "top_k {top_k}: at most {EXPERTS} experts"
        )));
    }
    check(&[("top_k", top_k)])
}

impl Params for RowsRegimeCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            RowsRegimeCase::Linear { spec, dtype, m } => {
                Case::must_equal(name, FAMILY, REFERENCE_LINEAR, move |ctx| {
                    check(&[("m", m)])?;
                    linear(ctx, spec, dtype, m)
                })
                .glue_composed(&[
                    "mlx.nn.QuantizedLinear.__call__",
                    "one call per row of x (M = 1), rows concatenated",
                ])
            }
            RowsRegimeCase::Switch {
                spec,
                dtype,
                top_k,
                tokens,
            } => Case::must_equal(name, FAMILY, REFERENCE_SWITCH, move |ctx| {
                check_top_k(top_k)?;
                check(&[("tokens", tokens)])?;
                switch(ctx, spec, dtype, top_k, tokens)
            })
            .glue_composed(&[
                "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ as SwitchGLU drives it (unsorted)",
                "one call per token, tokens concatenated",
            ]),
            RowsRegimeCase::LinearFinder { spec, dtype } => {
                Case::finding(name, FAMILY, REFERENCE_FINDER, move |ctx| {
                    linear_finder(ctx, spec, dtype)
                })
                .deep()
            }
            RowsRegimeCase::SwitchFinder { spec, dtype, top_k } => {
                Case::finding(name, FAMILY, REFERENCE_FINDER, move |ctx| {
                    check_top_k(top_k)?;
                    switch_finder(ctx, spec, dtype, top_k)
                })
                .deep()
            }
        }
    }
}

fn prefix(spec: QuantSpec, dtype: DType) -> String {
    format!("{FAMILY}/{spec}/{}", dtype_tag(dtype))
}

/// The specs and dtypes the table measures, as the conformance vocabulary.
fn measured() -> Vec<(QuantSpec, DType)> {
    let mut out = Vec::new();
    for (mode, bits, group_size) in layers::quantized::rows_regime::MEASURED_SPECS {
        for dtype in [DType::Bfloat16, DType::Float16, DType::Float32] {
            out.push((
                QuantSpec {
                    mode,
                    bits,
                    group_size,
                },
                dtype,
            ));
        }
    }
    out
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for (spec, dtype) in measured() {
        let p = prefix(spec, dtype);
        for m in [8, 24] {
            cases.push(described(
                format!("{p}/linear/K{K}-N{N}/M{m}"),
                &RowsRegimeCase::Linear { spec, dtype, m },
            ));
        }
        cases.push(described(
            format!("{p}/linear/finder"),
            &RowsRegimeCase::LinearFinder { spec, dtype },
        ));
        for (top_k, tokens) in [(2, 12), (8, 5)] {
            cases.push(described(
                format!("{p}/switch-E{EXPERTS}-top{top_k}/K{K}-N{N}/T{tokens}"),
                &RowsRegimeCase::Switch {
                    spec,
                    dtype,
                    top_k,
                    tokens,
                },
            ));
            cases.push(described(
                format!("{p}/switch-E{EXPERTS}-top{top_k}/finder"),
                &RowsRegimeCase::SwitchFinder { spec, dtype, top_k },
            ));
        }
    }
    cases
}

/// The first `n` entries of `t` along axis 0.
fn leading(t: &HostTensor, n: usize) -> Result<HostTensor, CaseError> {
    let per: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
    let mut shape = t.shape.clone();
    shape[0] = n;
    Ok(HostTensor::new(
        t.dtype,
        shape,
        t.bytes[..n * per].to_vec(),
    )?)
}

struct Linear {
    x: HostTensor,
    layer: QuantizedLinear,
    tensors: reference::quantized::QuantizedTensors,
}

fn linear_setup(ctx: &Ctx, spec: QuantSpec, dtype: DType, m: usize) -> Result<Linear, CaseError> {
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, dtype, &[m, K]);
    let payload = quantized_weight(&mut inputs, spec, dtype, &[N, K])?;
    let tensors = layer_tensors(&payload, None)?;
    let layer = QuantizedLinear::new(payload, None)
        .map_err(port)?
        .with_forward_mode(Forward::RowsIndependent);
    Ok(Linear { x, layer, tensors })
}

fn linear(ctx: &Ctx, spec: QuantSpec, dtype: DType, m: usize) -> Result<CaseOutput, CaseError> {
    let s = linear_setup(ctx, spec, dtype, m)?;
    let reference = reference::quantized::quantized_linear_rows(ctx, &s.x, &s.tensors, &[])?;
    let y = s.layer.forward(&s.x.to_array()).map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}

struct Switch {
    x: HostTensor,
    indices: HostTensor,
    layer: QuantizedSwitchLinear,
    tensors: reference::quantized::QuantizedTensors,
}

fn switch_setup(
    ctx: &Ctx,
    spec: QuantSpec,
    dtype: DType,
    top_k: usize,
    tokens: usize,
) -> Result<Switch, CaseError> {
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, dtype, &[tokens, K]);
    let indices = expert_indices(&mut inputs, &[tokens], top_k, EXPERTS);
    let payload = quantized_weight(&mut inputs, spec, dtype, &[EXPERTS, N, K])?;
    let tensors = layer_tensors(&payload, None)?;
    let layer = QuantizedSwitchLinear::new(payload, None).map_err(port)?;
    Ok(Switch {
        x,
        indices,
        layer,
        tensors,
    })
}

fn switch(
    ctx: &Ctx,
    spec: QuantSpec,
    dtype: DType,
    top_k: usize,
    tokens: usize,
) -> Result<CaseOutput, CaseError> {
    let s = switch_setup(ctx, spec, dtype, top_k, tokens)?;
    let reference = reference::quantized::quantized_switch_rows(ctx, &s.x, &s.indices, &s.tensors)?;
    let indices = ExpertIndices::checked(s.indices.to_array(), EXPERTS as i32).map_err(port)?;
    let x = s.x.to_array().expand_dims_axes(&[-2, -3])?;
    let regime = RowsRegime::for_backend(ctx.backend());
    let y = s
        .layer
        .forward_rows_independent(&x, &indices, &regime)
        .map_err(port)?
        .squeeze_axes(&[-2])?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}

/// The measured limit (largest count `c` with every count `<= c` equal)
/// and the shipped one, both in the finder's units, as a finding; an
/// ERROR when the shipped one is larger than measured.
fn verdict(
    ctx: &Ctx,
    call: RowsCall,
    matches: &[bool],
    shipped: RowsLimit,
    shipped_units: usize,
    unit: &str,
    extra: serde_json::Value,
) -> Result<CaseOutput, CaseError> {
    let probed = matches.len();
    let measured = matches.iter().position(|m| !m).unwrap_or(probed);
    let differing: Vec<usize> = (1..=probed).filter(|&c| !matches[c - 1]).collect();
    let agreement = if shipped_units > measured {
        return Err(CaseError::Port(format!(
            "the shipped rows regime ({} {call:?} limit {shipped:?}: {shipped_units} {unit} per call) is larger than measured here ({measured} {unit}; counts that differ from M = 1: {differing:?}): the rows-independent forward would not be exact; lower the table in layers::quantized::rows_regime",
            ctx.backend()
        )));
    } else if shipped_units < measured {
        "too small"
    } else {
        "agrees"
    };
    let bits: Vec<u8> = matches
        .iter()
        .flat_map(|&m| i32::from(m).to_le_bytes())
        .collect();
    let mut out = CaseOutput::new("mlx.core");
    out.digest(
        "matches",
        &HostTensor::new(DType::Int32, vec![probed], bits)?,
    );
    let mut finding = json!({
        "backend": ctx.backend().as_str(),
        "unit": unit,
        "probed": probed,
        "measured_limit": measured,
        "differing": differing,
        "shipped_limit": shipped.as_option(),
        "shipped_per_call": shipped_units,
        "shipped": agreement,
    });
    if let (Some(f), Some(e)) = (finding.as_object_mut(), extra.as_object()) {
        f.extend(e.clone());
    }
    Ok(out.with_finding(finding))
}

fn linear_finder(ctx: &Ctx, spec: QuantSpec, dtype: DType) -> Result<CaseOutput, CaseError> {
    let s = linear_setup(ctx, spec, dtype, FINDER_ROWS)?;
    // The finding compares the reference with itself: no output of it is
    // exact-checked (the must-equal cases check the calls per row).
    let rows =
        reference::quantized::quantized_linear_rows_unchecked(ctx, &s.x, &s.tensors)?.into_tensor();
    let matches = (1..=FINDER_ROWS)
        .map(|m| {
            let batched = reference::quantized::quantized_linear_unchecked(
                ctx,
                &leading(&s.x, m)?,
                &s.tensors,
            )?
            .into_tensor();
            Ok::<_, CaseError>(batched == leading(&rows, m)?)
        })
        .collect::<Result<Vec<bool>, _>>()?;
    let shipped = RowsRegime::for_backend(ctx.backend()).limit(
        RowsCall::QuantizedMatmul,
        spec,
        dtype.to_mlx(),
        K as i32,
    );
    let units = shipped.chunk(FINDER_ROWS);
    verdict(
        ctx,
        RowsCall::QuantizedMatmul,
        &matches,
        shipped,
        units,
        "rows",
        json!({ "K": K, "N": N }),
    )
}

fn switch_finder(
    ctx: &Ctx,
    spec: QuantSpec,
    dtype: DType,
    top_k: usize,
) -> Result<CaseOutput, CaseError> {
    let s = switch_setup(ctx, spec, dtype, top_k, FINDER_TOKENS)?;
    let per_token =
        reference::quantized::quantized_switch_rows_unchecked(ctx, &s.x, &s.indices, &s.tensors)?
            .into_tensor();
    let matches = (1..=FINDER_TOKENS)
        .map(|t| {
            let batched = reference::quantized::quantized_switch_unchecked(
                ctx,
                &leading(&s.x, t)?,
                &leading(&s.indices, t)?,
                &s.tensors,
            )?
            .into_tensor();
            Ok::<_, CaseError>(batched == leading(&per_token, t)?)
        })
        .collect::<Result<Vec<bool>, _>>()?;
    let shipped = RowsRegime::for_backend(ctx.backend()).limit(
        RowsCall::GatherQmm,
        spec,
        dtype.to_mlx(),
        K as i32,
    );
    let units = shipped.units(top_k, FINDER_TOKENS);
    verdict(
        ctx,
        RowsCall::GatherQmm,
        &matches,
        shipped,
        units,
        "tokens",
        json!({ "K": K, "N": N, "experts": EXPERTS, "top_k": top_k }),
    )
}
