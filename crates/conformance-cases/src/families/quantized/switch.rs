//! `quantized/switch`: `QuantizedSwitchLinear::forward` against
//! `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__`.
//!
//! **As pinned, the reference cannot run**: its `__call__` passes
//! `global_scale=self.global_scale` to `mx.gather_qmm`, which mlx 0.32.2 does
//! not take. The `as-pinned` finding records what it raises. The must-equal
//! cases compare the port with the same `__call__` under a glue shim that
//! drops `global_scale=None` from `mx.gather_qmm` for the duration of that
//! one glue call (then restores it).
//!
//! Each projection is driven as `SwitchGLU.__call__` drives it: x `(B, L,
//! D)` expanded to `(B, L, 1, 1, D)`, indices `(B, L, K)`; `sorted` cases go
//! through the reference's `_gather_sort` / `sorted_indices=True` /
//! `_scatter_unsort` (SwitchGLU sorts when `indices.size >= 64`; the L40
//! cases are that size), which the port side mirrors op for op; the result
//! is squeezed to `(B, L, K, out)`.
//!
//! Also: stride-0 (broadcast) expert tensors against their meaning
//! materialised, and the reference's own stride-0 call as a finding (on
//! CUDA its `gather_qmm` ignores the expert stride),
//! expert weights served from a page-aligned memory map (`ExpertOffload`)
//! against resident ones, and two findings: one call versus row chunks, and
//! sorted versus unsorted.

use std::sync::atomic::{AtomicU64, Ordering};

use layers::checkpoint::{Checkpoint, ExpertOffload};
use layers::quantized::{Mode, QuantSpec, QuantizedPayload, QuantizedSwitchLinear};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use oracle::{DType, HostTensor};

use super::layer_tensors;
use super::modules::{layer_infos, LayerInfo};
use super::{
    activation, affine, base_k, dtype_tag, fixture_dir, host, mode_default, port, quantized_weight,
    relation,
};
use crate::case::Expected;
use crate::case::{Backend, Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::inputs::Inputs;
use crate::reference;
use crate::reference::quantized::AsPinned;

const FAMILY: &str = "quantized/switch";
const REFERENCE: &str =
    "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2; \
     mx.gather_qmm shim drops global_scale=None), driven as SwitchGLU.__call__";
const REFERENCE_AS_PINNED: &str =
    "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2) as pinned, on mlx 0.32.2";
const REFERENCE_LOAD: &str =
    "mlx_lm.utils.load_model (mlx-lm 0.32.2) then QuantizedSwitchLinear.__call__ \
     (gather_qmm shim), driven as SwitchGLU.__call__";
const OUT: usize = 64;

/// Why the empty-batch cases do not run on CUDA (measured on the H200,
/// fixtures/gpu-runs/h200-2026-12-01/README.md).
const EMPTY_ON_CUDA: &str =
    "on CUDA the reference cannot run an empty batch: MLX 0.32.2 launches a \
     zero-size gather_qmm (cudaGraphAddKernelNode: invalid argument), and the error stays set \
     for every later CUDA call in the process (measured on an H200)";

/// One switch projection as data: x `(batch, len, k)` routed to `top` of
/// `experts` experts, each `W[e]` `(n, k)` quantized with `spec`. The
/// registry's fixed cases have `k = 3 * group_size` and `n = 64`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SwitchShape {
    #[serde(with = "crate::families::describe::spec")]
    pub spec: QuantSpec,
    pub dtype: DType,
    pub experts: usize,
    pub top: usize,
    pub batch: usize,
    pub len: usize,
    /// Through `_gather_sort` / `sorted_indices=True` / `_scatter_unsort`.
    pub sorted: bool,
    pub bias: bool,
    pub k: usize,
    pub n: usize,
}

type Shape = SwitchShape;

impl SwitchShape {
    pub fn new(spec: QuantSpec, experts: usize, sorted: bool) -> Self {
        SwitchShape {
            spec,
            dtype: DType::Bfloat16,
            experts,
            top: experts.min(2),
            batch: 2,
            len: 5,
            sorted,
            bias: false,
            k: base_k(spec),
            n: OUT,
        }
    }

    /// Why the layer cannot take this shape, if so.
    pub fn check(&self) -> Result<(), String> {
        let g = self.spec.group_size as usize;
        if self.k == 0 || !self.k.is_multiple_of(g) {
            return Err(format!(
                "k {} is not a positive multiple of group_size {g}",
                self.k
            ));
        }
        if self.experts == 0
            || self.top == 0
            || self.top > self.experts
            || self.n == 0
            || self.len == 0
        {
            // batch 0 is the empty batch (a fixed case: the reference returns
            // an empty array of the broadcast shape).
            return Err("experts, top (at most experts), n and len must be positive".into());
        }
        if !matches!(
            self.dtype,
            DType::Bfloat16 | DType::Float16 | DType::Float32
        ) {
            return Err(format!("dtype {} is not a float dtype", self.dtype.name()));
        }
        let elements = self
            .batch
            .checked_mul(self.len)
            .and_then(|t| t.checked_mul(self.k))
            .zip(
                self.experts
                    .checked_mul(self.n)
                    .and_then(|e| e.checked_mul(self.k)),
            );
        if elements.is_none_or(|(x, w)| x > 1 << 28 || w > 1 << 28) {
            return Err("x or the experts' weights hold more than 2^28 elements".into());
        }
        Ok(())
    }

    /// The must-equal case of this shape under `name` (kept explorer cases).
    pub fn case_named(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
            self.check().map_err(|e| CaseError::harness("shape", e))?;
            port_vs_reference(ctx, &self)
        })
        .glue_composed(SWITCH_GLU_STEP)
    }

    /// The seeded inputs as the case draws them (same generator, same
    /// order): `x`, `indices`, the float `weight` the port quantizes, and
    /// `bias` when the shape has one (for reproducers).
    pub fn host_inputs(&self, seed: u64) -> Vec<(String, HostTensor)> {
        let mut inputs = Inputs::new(seed);
        let x = activation(&mut inputs, self.dtype, &[self.batch, self.len, self.k]);
        let indices = expert_indices(&mut inputs, &[self.batch, self.len], self.top, self.experts);
        let weight = inputs.uniform(self.dtype, &[self.experts, self.n, self.k], 1.0);
        let mut out = vec![
            ("x".into(), x),
            ("indices".into(), indices),
            ("weight".into(), weight),
        ];
        if self.bias {
            out.push((
                "bias".into(),
                inputs.uniform(self.dtype, &[self.experts, self.n], 0.5),
            ));
        }
        out
    }

    /// Invariances of the port alone (findings, never verdicts): sorted
    /// against unsorted routing, and the batch against each token alone.
    pub fn invariances(&self, seed: u64) -> Result<Vec<(String, bool)>, CaseError> {
        self.check().map_err(|e| CaseError::harness("shape", e))?;
        let setup = setup_seeded(seed, self, self.experts)?;
        let layer = port_layer(setup.payload.clone(), &setup.bias)?;
        let (x, idx) = (setup.x.to_array(), setup.indices.to_array());
        let batched = host(&port_apply(&layer, &x, &idx, self.sorted)?)?;
        let other = host(&port_apply(&layer, &x, &idx, !self.sorted)?)?;
        let tokens = self.batch * self.len;
        let (xw, iw, yw) = (
            setup.x.bytes.len() / tokens,
            setup.indices.bytes.len() / tokens,
            batched.bytes.len() / tokens,
        );
        let mut alone_same = true;
        for t in 0..tokens {
            let xt = HostTensor::new(
                setup.x.dtype,
                vec![1, 1, self.k],
                setup.x.bytes[t * xw..(t + 1) * xw].to_vec(),
            )
            .map_err(|e| CaseError::harness("x", e))?;
            let it = HostTensor::new(
                DType::Int32,
                vec![1, 1, self.top],
                setup.indices.bytes[t * iw..(t + 1) * iw].to_vec(),
            )
            .map_err(|e| CaseError::harness("indices", e))?;
            let yt = host(&port_apply(&layer, &xt.to_array(), &it.to_array(), false)?)?;
            if yt.bytes[..] != batched.bytes[t * yw..(t + 1) * yw] {
                alone_same = false;
                break;
            }
        }
        Ok(vec![
            ("sorted = unsorted".into(), batched.bytes == other.bytes),
            ("batched = tokens alone".into(), alone_same),
        ])
    }

    fn stem(&self) -> String {
        format!(
            "{FAMILY}/{}/{}/E{}-top{}/B{}-L{}",
            self.spec,
            dtype_tag(self.dtype),
            self.experts,
            self.top,
            self.batch,
            self.len
        )
    }

    /// The case name; `K` and `N` appear only when they differ from the
    /// fixed list's, so the registry's names are unchanged.
    pub fn name(&self) -> String {
        let mut name = format!(
            "{}/{}",
            self.stem(),
            if self.sorted { "sorted" } else { "unsorted" }
        );
        if self.bias {
            name += "/bias";
        }
        if (self.k, self.n) != (base_k(self.spec), OUT) {
            name += &format!("/K{}-N{}", self.k, self.n);
        }
        name
    }
}

/// A `quantized/switch` case as data.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SwitchCase {
    /// Must-equal: port and reference on one shape (the SwitchGLU step).
    Shape(SwitchShape),
    /// Finding: the reference as the pinned mlx-lm runs it.
    AsPinned(SwitchShape),
    /// Must-equal: the port on a broadcast (stride-0) expert stack.
    BroadcastWeight(SwitchShape),
    /// Finding: the reference on a broadcast stack against a contiguous one.
    BroadcastReferenceVsContiguous(SwitchShape),
    /// Finding: one call against the tokens in chunks of `chunk`.
    OneShotVsChunks { shape: SwitchShape, chunk: usize },
    /// Finding: sorted against unsorted routing.
    SortedVsUnsorted(SwitchShape),
    /// Must-equal: a checkpoint's switch projection with its experts
    /// offloaded (memory-mapped) against resident.
    OffloadedVsResident { checkpoint: String, path: String },
}

impl Params for SwitchCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        match self {
            SwitchCase::Shape(s) => {
                let empty = s.batch == 0;
                let case = s.case_named(name);
                if empty {
                    case.only_on(&[Backend::Cpu, Backend::Metal], EMPTY_ON_CUDA)
                } else {
                    case
                }
            }
            SwitchCase::AsPinned(s) => {
                Case::finding(name, FAMILY, REFERENCE_AS_PINNED, move |ctx| {
                    s.check().map_err(|e| CaseError::harness("shape", e))?;
                    as_pinned(ctx, &s)
                })
                .glue_composed(SWITCH_GLU_STEP)
            }
            SwitchCase::BroadcastWeight(s) => {
                Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
                    s.check().map_err(|e| CaseError::harness("shape", e))?;
                    broadcast(ctx, &s)
                })
                .glue_composed(SWITCH_GLU_STEP)
            }
            SwitchCase::BroadcastReferenceVsContiguous(s) => {
                Case::finding(name, FAMILY, REFERENCE, move |ctx| {
                    s.check().map_err(|e| CaseError::harness("shape", e))?;
                    broadcast_reference(ctx, &s)
                })
                .glue_composed(SWITCH_GLU_STEP)
            }
            SwitchCase::OneShotVsChunks { shape, chunk } => {
                Case::finding(name, FAMILY, REFERENCE, move |ctx| {
                    shape.check().map_err(|e| CaseError::harness("shape", e))?;
                    crate::families::describe::dims(&[("chunk", chunk)], 1 << 20)?;
                    chunks(ctx, &shape, chunk)
                })
            }
            SwitchCase::SortedVsUnsorted(s) => Case::finding(name, FAMILY, REFERENCE, move |ctx| {
                s.check().map_err(|e| CaseError::harness("shape", e))?;
                sorted_vs_unsorted(ctx, &s)
            }),
            SwitchCase::OffloadedVsResident { checkpoint, path } => {
                Case::must_equal(name, FAMILY, REFERENCE_LOAD, move |ctx| {
                    offload(ctx, &checkpoint, &path)
                })
                .glue_composed(SWITCH_GLU_STEP)
            }
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let a4 = affine(4, 64);
    let (mxfp4, mxfp8, nvfp4) = (
        mode_default(Mode::Mxfp4),
        mode_default(Mode::Mxfp8),
        mode_default(Mode::Nvfp4),
    );
    let mut shapes = Vec::new();
    for experts in [1, 2, 4, 8] {
        for sorted in [false, true] {
            shapes.push(Shape::new(a4, experts, sorted));
        }
    }
    for sorted in [false, true] {
        shapes.push(Shape::new(mxfp4, 4, sorted));
        shapes.push(Shape::new(nvfp4, 8, sorted));
        shapes.push(Shape {
            bias: true,
            ..Shape::new(a4, 4, sorted)
        });
        shapes.push(Shape {
            batch: 1,
            len: 40,
            ..Shape::new(a4, 8, sorted)
        });
    }
    // An empty batch: the reference returns an empty array of the broadcast
    // shape; the port must give the same shape and dtype (and no crash).
    for spec in [a4, mxfp4] {
        shapes.push(Shape {
            batch: 0,
            bias: true,
            ..Shape::new(spec, 4, false)
        });
    }
    shapes.push(Shape {
        top: 1,
        ..Shape::new(mxfp8, 2, false)
    });
    shapes.push(Shape::new(affine(3, 32), 4, true));
    shapes.push(Shape::new(affine(8, 128), 3, false));
    shapes.push(Shape {
        bias: true,
        ..Shape::new(mxfp4, 8, true)
    });
    shapes.push(Shape {
        bias: true,
        ..Shape::new(nvfp4, 2, false)
    });
    shapes.push(Shape {
        batch: 1,
        len: 40,
        bias: true,
        ..Shape::new(mxfp8, 6, true)
    });
    for dtype in [DType::Float16, DType::Float32] {
        shapes.push(Shape {
            dtype,
            ..Shape::new(a4, 4, false)
        });
    }
    shapes.push(Shape {
        dtype: DType::Float32,
        bias: true,
        ..Shape::new(a4, 5, true)
    });

    let mut cases: Vec<Described> = shapes
        .into_iter()
        .map(|s| described(s.name(), &SwitchCase::Shape(s)))
        .collect();

    let pinned = Shape {
        bias: true,
        ..Shape::new(a4, 4, false)
    };
    cases.push(described(
        format!("{}/as-pinned", pinned.stem()),
        &SwitchCase::AsPinned(pinned),
    ));

    for spec in [a4, mxfp4] {
        let s = Shape {
            bias: true,
            ..Shape::new(spec, 4, false)
        };
        cases.push(described(
            format!("{}/broadcast-weight", s.stem()),
            &SwitchCase::BroadcastWeight(s.clone()),
        ));
        cases.push(described(
            format!("{}/broadcast-reference-vs-contiguous", s.stem()),
            &SwitchCase::BroadcastReferenceVsContiguous(s),
        ));
    }

    for (spec, sorted) in [(a4, false), (a4, true), (mxfp4, false), (nvfp4, false)] {
        let s = Shape {
            len: 12,
            ..Shape::new(spec, 8, sorted)
        };
        let name = format!("{}/one-shot-vs-chunks-of-5", s.name());
        cases.push(described(
            name,
            &SwitchCase::OneShotVsChunks { shape: s, chunk: 5 },
        ));
    }
    for spec in [a4, nvfp4] {
        let s = Shape {
            batch: 1,
            len: 40,
            ..Shape::new(spec, 8, false)
        };
        cases.push(described(
            format!("{}/sorted-vs-unsorted", s.stem()),
            &SwitchCase::SortedVsUnsorted(s),
        ));
    }

    for path in [
        "model.layers.1.mlp.switch_mlp.up_proj",
        "model.layers.1.mlp.switch_mlp.down_proj",
    ] {
        let name = format!("{FAMILY}/checkpoint/tiny-mixed/{path}/offloaded-vs-resident");
        cases.push(described(
            name,
            &SwitchCase::OffloadedVsResident {
                checkpoint: "tiny-mixed".into(),
                path: path.into(),
            },
        ));
    }
    cases
}

/// No reference function drives one switch projection: `SwitchGLU.__call__`
/// runs three. The glue composes the reference pieces it uses for one.
pub(super) const SWITCH_GLU_STEP: &[&str] = &[
    "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (or SwitchLinear)",
    "mlx_lm.models.switch_layers._gather_sort and _scatter_unsort (sorted calls)",
    "SwitchGLU.__call__'s expand_dims / squeeze around one projection",
];

/// Seeded inputs of a switch case.
struct Setup {
    x: HostTensor,
    indices: HostTensor,
    payload: QuantizedPayload,
    bias: Option<HostTensor>,
}

fn setup(ctx: &Ctx, s: &Shape, experts: usize) -> Result<Setup, CaseError> {
    setup_seeded(ctx.seed(), s, experts)
}

fn setup_seeded(seed: u64, s: &Shape, experts: usize) -> Result<Setup, CaseError> {
    let k = s.k;
    let mut inputs = Inputs::new(seed);
    let x = activation(&mut inputs, s.dtype, &[s.batch, s.len, k]);
    let indices = expert_indices(&mut inputs, &[s.batch, s.len], s.top, s.experts);
    let payload = quantized_weight(&mut inputs, s.spec, s.dtype, &[experts, s.n, k])?;
    let bias = s
        .bias
        .then(|| inputs.uniform(s.dtype, &[experts, s.n], 0.5));
    Ok(Setup {
        x,
        indices,
        payload,
        bias,
    })
}

/// `top` distinct experts per token (as a router's top-k picks them), in
/// random order: int32 `tokens + [top]`.
pub(super) fn expert_indices(
    inputs: &mut Inputs,
    tokens: &[usize],
    top: usize,
    experts: usize,
) -> HostTensor {
    let n: usize = tokens.iter().product();
    let draws = inputs.integers(DType::Int32, &[n * experts], 0, 1 << 30);
    let mut values = Vec::with_capacity(n * top);
    for t in 0..n {
        // A seeded shuffle of 0..experts (Fisher-Yates), first `top` taken.
        let mut ids: Vec<i32> = (0..experts as i32).collect();
        for i in (1..experts).rev() {
            let j = draws.bits(t * experts + i) as usize % (i + 1);
            ids.swap(i, j);
        }
        values.extend_from_slice(&ids[..top]);
    }
    let mut shape = tokens.to_vec();
    shape.push(top);
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(DType::Int32, shape, bytes).expect("sized above")
}

/// `mlx_lm.models.switch_layers._gather_sort`, op for op:
/// `order = argsort(indices.flatten())`, `inv_order = argsort(order)`,
/// `x.flatten(0, -3)[order // M]`, `indices[order]`.
pub fn gather_sort(x: &Array, indices: &Array) -> Result<(Array, Array, Array), CaseError> {
    let m = *indices.shape().last().expect("indices have a last axis");
    let flat = indices.flatten(None, None)?;
    let order = ops::argsort_axis(&flat, -1)?;
    let inv_order = ops::argsort_axis(&order, -1)?;
    let rows = ops::floor_divide(&order, Array::from_int(m).as_dtype(order.dtype())?)?;
    let xs = x.flatten(0, -3)?.take_axis(&rows, 0)?;
    let idx = flat.take_axis(&order, 0)?;
    Ok((xs, idx, inv_order))
}

/// `mlx_lm.models.switch_layers._scatter_unsort`: `x[inv_order]`, then
/// axis 0 unflattened to `shape`.
pub fn scatter_unsort(x: &Array, inv_order: &Array, shape: &[i32]) -> Result<Array, CaseError> {
    Ok(ops::unflatten(x.take_axis(inv_order, 0)?, 0, shape)?)
}

/// The port driven as `SwitchGLU.__call__` drives one projection.
pub(super) fn port_apply(
    layer: &QuantizedSwitchLinear,
    x: &Array,
    indices: &Array,
    sorted: bool,
) -> Result<Array, CaseError> {
    let x = x.expand_dims_axes(&[-2, -3])?;
    let y = if sorted {
        let (xs, idx, inv_order) = gather_sort(&x, indices)?;
        let y = layer.forward(&xs, &idx, true).map_err(port)?;
        scatter_unsort(&y, &inv_order, indices.shape())?
    } else {
        layer.forward(&x, indices, false).map_err(port)?
    };
    Ok(y.squeeze_axes(&[-2])?)
}

fn port_layer(
    payload: QuantizedPayload,
    bias: &Option<HostTensor>,
) -> Result<QuantizedSwitchLinear, CaseError> {
    QuantizedSwitchLinear::new(payload, bias.as_ref().map(HostTensor::to_array)).map_err(port)
}

fn port_vs_reference(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s, s.experts)?;
    let reference = reference::quantized::quantized_switch(
        ctx,
        &setup.x,
        &setup.indices,
        &layer_tensors(&setup.payload, setup.bias.as_ref())?,
        s.sorted,
        false,
    )?;
    let layer = port_layer(setup.payload.clone(), &setup.bias)?;
    let y = port_apply(
        &layer,
        &setup.x.to_array(),
        &setup.indices.to_array(),
        s.sorted,
    )?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}

fn as_pinned(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s, s.experts)?;
    let pinned = reference::quantized::quantized_switch_as_pinned(
        ctx,
        &setup.x,
        &setup.indices,
        &layer_tensors(&setup.payload, setup.bias.as_ref())?,
    )?;
    let mut out = CaseOutput::new("mlx.core");
    let finding = match pinned {
        AsPinned::Raised { kind, message } => {
            serde_json::json!({ "reference_raises": true, "type": kind, "message": message })
        }
        AsPinned::Returned(reference) => {
            // The pinned call ran (a future MLX): record whether it equals the port.
            let layer = port_layer(setup.payload.clone(), &setup.bias)?;
            let y = host(&port_apply(
                &layer,
                &setup.x.to_array(),
                &setup.indices.to_array(),
                false,
            )?)?;
            out.digest("y", &y);
            serde_json::json!({ "reference_raises": false, "port_vs_reference": super::relation(&y, reference.tensor()) })
        }
    };
    Ok(out.with_finding(finding))
}

/// Stride-0 expert tensors, as a model with one shared expert might build
/// them: every tensor of the layer is `broadcast_to(t[:1], t.shape)`, a
/// view of expert 0 over a buffer that holds all E (different) experts.
struct Broadcast {
    setup: Setup,
    /// The broadcast's meaning, materialised: expert 0 copied E times.
    meaning: QuantizedPayload,
    meaning_bias: Option<HostTensor>,
}

fn broadcast_setup(ctx: &Ctx, s: &Shape) -> Result<Broadcast, CaseError> {
    let setup = setup(ctx, s, s.experts)?;
    let p = &setup.payload;
    let copy = |a: &Array| -> Result<Array, CaseError> { Ok(expert0_view(a)?.contiguous()?) };
    let meaning = QuantizedPayload::new(
        copy(p.weight())?,
        copy(p.scales())?,
        p.biases().map(copy).transpose()?,
        p.spec(),
    )
    .map_err(port)?;
    let meaning_bias = setup
        .bias
        .as_ref()
        .map(|b| host(&copy(&b.to_array())?))
        .transpose()?;
    Ok(Broadcast {
        setup,
        meaning,
        meaning_bias,
    })
}

/// `broadcast_to(a[:1], a.shape)`: a stride-0 view of expert 0 that shares
/// `a`'s buffer (the glue's `expert0_views` builds the same).
fn expert0_view(a: &Array) -> Result<Array, CaseError> {
    Ok(ops::broadcast_to(a.index(..1), a.shape())?)
}

/// The reference's `quantized_switch` on the case's x and indices with
/// this payload and bias.
fn reference_with(
    ctx: &Ctx,
    b: &Broadcast,
    s: &Shape,
    payload: &QuantizedPayload,
    bias: &Option<HostTensor>,
    expert0_views: bool,
) -> Result<Expected, CaseError> {
    reference::quantized::quantized_switch(
        ctx,
        &b.setup.x,
        &b.setup.indices,
        &layer_tensors(payload, bias.as_ref())?,
        s.sorted,
        expert0_views,
    )
}

/// Must-equal: the port's layer over the stride-0 views, and over their
/// contiguous copies, against the reference layer holding the broadcast's
/// meaning (expert 0 copied E times). The port copies such views when the
/// layer is built (see `QuantizedSwitchLinear::new`); without that copy its
/// CUDA `gather_qmm` reads the buffer's other experts and this case fails.
fn broadcast(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let b = broadcast_setup(ctx, s)?;
    let p = &b.setup.payload;
    let view = QuantizedSwitchLinear::from_arrays(
        expert0_view(p.weight())?,
        expert0_view(p.scales())?,
        p.biases().map(expert0_view).transpose()?,
        p.spec(),
        b.setup
            .bias
            .as_ref()
            .map(|t| expert0_view(&t.to_array()))
            .transpose()?,
    )
    .map_err(port)?;
    let copied = port_layer(b.meaning.clone(), &b.meaning_bias)?;
    let (x, indices) = (b.setup.x.to_array(), b.setup.indices.to_array());
    let y_view = host(&port_apply(&view, &x, &indices, s.sorted)?)?;
    let y_copy = host(&port_apply(&copied, &x, &indices, s.sorted)?)?;
    let reference = reference_with(ctx, &b, s, &b.meaning, &b.meaning_bias, false)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y (stride-0 experts)", &y_view, &reference);
    out.compare("y (contiguous experts)", &y_copy, &reference);
    Ok(out)
}

/// Finding, the reference against itself: its layer over the stride-0
/// views against (a) the broadcast's meaning and (b) what a kernel that
/// indexes experts as if row-contiguous reads: the underlying buffer's own
/// experts for `gather_qmm` (weight, scales, biases) and the broadcast bias
/// (`bias[indices]` is a gather, which honours strides). The memory (b)
/// reads is the case's own buffer, so the finding is deterministic.
fn broadcast_reference(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let b = broadcast_setup(ctx, s)?;
    let views = reference_with(ctx, &b, s, &b.setup.payload, &b.setup.bias, true)?.into_tensor();
    let meaning = reference_with(ctx, &b, s, &b.meaning, &b.meaning_bias, false)?.into_tensor();
    let buffer =
        reference_with(ctx, &b, s, &b.setup.payload, &b.meaning_bias, false)?.into_tensor();
    let reads = match (views == meaning, views == buffer) {
        (true, _) => "the broadcast (strides honoured)",
        (false, true) => "past expert 0 into the buffer (strides ignored)",
        (false, false) => "neither the broadcast nor the buffer",
    };
    let mut out = CaseOutput::new("mlx.core");
    out.digest("reference y (stride-0 experts)", &views);
    Ok(out.with_finding(serde_json::json!({
        "gather_qmm_over_stride0_experts_reads": reads,
        "vs_broadcast_meaning": relation(&views, &meaning),
        "vs_underlying_buffer": relation(&views, &buffer),
    })))
}

/// One call over all tokens against calls over chunks of `chunk` tokens
/// (along L), concatenated.
fn chunks(ctx: &Ctx, s: &Shape, chunk: usize) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s, s.experts)?;
    let layer = port_layer(setup.payload.clone(), &setup.bias)?;
    let (x, indices) = (setup.x.to_array(), setup.indices.to_array());
    let whole = host(&port_apply(&layer, &x, &indices, s.sorted)?)?;
    let mut parts = Vec::new();
    let mut start = 0;
    while start < s.len {
        let end = (start + chunk).min(s.len);
        let range = Array::from_slice(
            &(start as i32..end as i32).collect::<Vec<_>>(),
            &[(end - start) as i32],
        );
        let xc = x.take_axis(&range, 1)?;
        let ic = indices.take_axis(&range, 1)?;
        parts.push(port_apply(&layer, &xc, &ic, s.sorted)?);
        start = end;
    }
    let chunked = host(&ops::concatenate(&parts, 1)?)?;
    let mut out = CaseOutput::new("mlx.core");
    out.digest("whole", &whole);
    out.digest("chunked", &chunked);
    Ok(out.with_finding(relation(&whole, &chunked)))
}

fn sorted_vs_unsorted(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    let setup = setup(ctx, s, s.experts)?;
    let layer = port_layer(setup.payload.clone(), &setup.bias)?;
    let (x, indices) = (setup.x.to_array(), setup.indices.to_array());
    let sorted = host(&port_apply(&layer, &x, &indices, true)?)?;
    let unsorted = host(&port_apply(&layer, &x, &indices, false)?)?;
    let mut out = CaseOutput::new("mlx.core");
    out.digest("sorted", &sorted);
    out.digest("unsorted", &unsorted);
    Ok(out.with_finding(relation(&sorted, &unsorted)))
}

/// A temporary file path, unique in the process (cases may run
/// concurrently, and one process may run a case twice at once, as the
/// suite test does), removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(what: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempFile(
            std::env::temp_dir().join(format!("conformance-{what}-{}-{n}.bin", std::process::id())),
        )
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The fixture's switch layer loaded resident and with its expert weight
/// served from a page-aligned map; both against the reference's
/// `load_model` of the same directory.
fn offload(ctx: &Ctx, fixture: &str, path: &str) -> Result<CaseOutput, CaseError> {
    let dir = fixture_dir(fixture)?;
    let checkpoint = Checkpoint::open(&dir).map_err(port)?;
    let info: LayerInfo = layer_infos(&checkpoint)?.remove(path).ok_or_else(|| {
        CaseError::Harness(format!("{path} is not in the fixture's conformance_layers"))
    })?;
    let (tokens, top) = (7, 2);
    let mut inputs = ctx.inputs();
    let x = activation(&mut inputs, DType::Bfloat16, &[tokens, info.in_features]);
    let indices = expert_indices(&mut inputs, &[tokens], top, info.experts);

    let temp = TempFile::new("offload");
    let weight_name = format!("{path}.weight");
    let offloaded =
        ExpertOffload::create(&temp.0, &checkpoint, &[weight_name.as_str()]).map_err(port)?;
    let resident =
        QuantizedSwitchLinear::from_checkpoint(&checkpoint, path, info.in_features as i32)
            .map_err(port)?;
    let mapped = QuantizedSwitchLinear::from_checkpoint_offloaded(
        &checkpoint,
        path,
        info.in_features as i32,
        &offloaded,
    )
    .map_err(port)?;

    let loaded = reference::checkpoint::quantized_checkpoint(ctx, &x, &indices, &dir, &[path])?;
    let reference = loaded.outputs.into_iter().next().flatten().ok_or_else(|| {
        CaseError::Harness(format!(
            "the reference loaded no quantized switch module at {path}"
        ))
    })?;
    // The exact oracle on the module as the port loaded it (resident).
    let module = super::modules::module_args(
        resident.payload(),
        resident.bias(),
        "switch",
        info.in_features,
    )?;
    let exact = loaded.calls.exact_with(
        "quantized_checkpoint",
        &module,
        super::modules::module_exact,
    )?;
    let reference = reference.with_exact(exact);
    // (1, tokens, in) as the glue's x[None]; indices (1, tokens, top).
    let (xa, ia) = (
        x.to_array().expand_dims(0)?,
        indices.to_array().expand_dims(0)?,
    );
    let y_resident = host(&port_apply(&resident, &xa, &ia, false)?)?;
    let y_mapped = host(&port_apply(&mapped, &xa, &ia, false)?)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y (resident experts)", &y_resident, &reference);
    out.compare("y (offloaded experts)", &y_mapped, &reference);
    drop(offloaded);
    Ok(out)
}
