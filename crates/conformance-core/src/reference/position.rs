//! Positions: mlx-vlm's mRoPE (`rope_utils`), Qwen3.5's `get_rope_index`
//! and decode positions (`LanguageModel.__call__`), mlx-optiq's Gemma
//! vision 2-D RoPE. Tensors (q, k, positions, masks), `rope_theta`,
//! `mrope_section` and cache offsets are perturbable; shapes, paths and
//! token layouts are constants.

use exact::rope::{self, Mrope, Path};
use exact::{Exact, ExactError, Model};
use layers::position::GridThw;
use oracle::{Arg, HostTensor, Value};

use super::{fixed, int32, ints, list, one_array, tensor, text, varied, Fields, Param, Perturb};
use crate::case::{CaseError, Ctx, Expected};
use crate::exactness::{float_of, values, Calls, Sent};

/// The rotary configuration, as `MRoPERotaryEmbedding` is built from a
/// text config.
#[derive(Debug, Clone, Copy)]
pub struct Rotary<'a> {
    pub head_dim: usize,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub mrope_section: &'a [usize],
}

impl Rotary<'_> {
    fn params(&self) -> [Param; 4] {
        [
            fixed("head_dim", self.head_dim),
            fixed("partial_rotary_factor", self.partial_rotary_factor),
            varied("rope_theta", self.rope_theta, Perturb::NextUp),
            varied("mrope_section", ints(self.mrope_section), Perturb::MoveOne),
        ]
    }
}

/// A prompt as `get_rope_index` receives it: token ids [B, L] int32 and
/// the vision grids in row order (`None` when the prompt has none of that
/// kind).
#[derive(Debug, Clone, Copy)]
pub struct Prompt<'a> {
    pub input_ids: &'a HostTensor,
    pub image_grid_thw: Option<&'a [GridThw]>,
    pub video_grid_thw: Option<&'a [GridThw]>,
}

fn grids(g: Option<&[GridThw]>) -> Arg {
    g.map_or(Arg::None, |g| {
        Arg::List(g.iter().map(|g| ints(&[g.t, g.h, g.w])).collect())
    })
}

impl Prompt<'_> {
    pub(crate) fn params(&self) -> [Param; 3] {
        [
            fixed("input_ids", self.input_ids.clone()),
            fixed("image_grid_thw", grids(self.image_grid_thw)),
            fixed("video_grid_thw", grids(self.video_grid_thw)),
        ]
    }
}

/// `MRoPERotaryEmbedding.apply_rotary(q, k, position_ids)` and the rotary's
/// own tensors, after the rope index of a prompt.
#[derive(Debug)]
pub struct MropeApplied {
    /// The path the reference took (`pure-mlx`, `metal-kernel`).
    pub path: String,
    pub q: Expected,
    pub k: Expected,
    pub inv_freq: Expected,
    pub position_selector: Expected,
    /// The prompt's positions ([B, L] text, [3, B, L] with vision).
    pub position_ids: Expected,
    pub rope_deltas: Expected,
    /// The decode positions (decode calls only).
    pub decode_position_ids: Option<Expected>,
}

fn applied(
    function: &'static str,
    (value, calls): (oracle::Value, Calls),
    decode: bool,
) -> Result<MropeApplied, CaseError> {
    let mut r = Fields::of(function, value)?;
    let path = r.string("path")?;
    let position_ids = r.tensor("position_ids")?;
    let decode_position_ids = r.opt_tensor("decode_position_ids")?;
    // The positions the reference rotated by: its own rope-index output
    // (integers, bit-compared on their own), the decode ones for a decode.
    let positions = match (decode, &decode_position_ids) {
        (false, _) => position_ids.tensor().clone(),
        (true, Some(p)) => p.tensor().clone(),
        (true, None) => {
            return Err(CaseError::Harness(format!(
                "`{function}` returned no decode positions"
            )))
        }
    };
    let exact = MropeExact::new(function, &calls, &path, positions, decode)?;
    Ok(MropeApplied {
        q: r.tensor("q")?.with_exact(exact.rotated(&calls, "q")?),
        k: r.tensor("k")?.with_exact(exact.rotated(&calls, "k")?),
        inv_freq: r
            .tensor("inv_freq")?
            .with_exact(calls.exact(function, |sent, model| {
                let rotary = sent_rotary(sent)?;
                inv_freq_exact(&[rotary.rotary_dim], rotary.rope_theta, model)
            })?),
        path,
        position_selector: r.tensor("position_selector")?,
        position_ids,
        rope_deltas: r.tensor("rope_deltas")?,
        decode_position_ids,
    })
}

/// The rotary of an mRoPE apply, as the reference built it.
#[derive(Debug, Clone)]
pub(crate) struct RotaryArgs {
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub mrope_section: Vec<usize>,
}

/// [`RotaryArgs`] from a `position_mrope_*` call's arguments:
/// `int(head_dim * partial_rotary_factor)` as the Qwen3.5 attention
/// computes the rotary's dims.
fn sent_rotary(sent: &Sent) -> Result<RotaryArgs, ExactError> {
    let head_dim = sent.int("head_dim")? as f64;
    let rotary_dim = (head_dim * sent.float("partial_rotary_factor")?).trunc() as usize;
    let mrope_section = sent
        .ints("mrope_section")?
        .into_iter()
        .map(|s| usize::try_from(s).map_err(|_| ExactError(format!("mrope_section holds {s}"))))
        .collect::<Result<_, _>>()?;
    Ok(RotaryArgs {
        rotary_dim,
        rope_theta: sent.float("rope_theta")?,
        mrope_section,
    })
}

/// The exact rotated q / k of an mRoPE apply (see [`exact::rope`]).
pub(crate) struct MropeExact {
    function: &'static str,
    path: Path,
    positions: HostTensor,
    /// The reference's `cache_offset` (decode calls): a side computed at
    /// another offset (the port, under `--perturb`) rotates by positions
    /// moved by the difference, as `LanguageModel.__call__` computes decode
    /// positions (`cache_offset + t + rope_delta`, every stream).
    reference_offset: Option<i64>,
    /// The rotary from a side's arguments (None: `sent_rotary`).
    rotary: Option<RotaryArgs>,
}

impl MropeExact {
    pub(crate) fn new(
        function: &'static str,
        calls: &Calls,
        path: &str,
        positions: HostTensor,
        decode: bool,
    ) -> Result<Self, CaseError> {
        let harness = |e: ExactError| CaseError::Harness(format!("`{function}`: {e}"));
        Ok(MropeExact {
            function,
            path: Path::from_name(path).map_err(harness)?,
            positions,
            reference_offset: if decode {
                Some(calls.reference.int("cache_offset").map_err(harness)?)
            } else {
                None
            },
            rotary: None,
        })
    }
    /// With a rotary read elsewhere (a config), the same on both sides.
    pub(crate) fn with_rotary(mut self, rotary: RotaryArgs) -> Self {
        self.rotary = Some(rotary);
        self
    }
    /// The exact value of output `which` (`q` or `k`) on each side.
    pub(crate) fn rotated(
        &self,
        calls: &Calls,
        which: &'static str,
    ) -> Result<crate::exactness::ExactPair, CaseError> {
        calls.exact(self.function, |sent, model| self.one(sent, model, which))
    }
    fn one(&self, sent: &Sent, model: Model, which: &str) -> Result<Exact, ExactError> {
        let rotary = match &self.rotary {
            Some(r) => r.clone(),
            None => sent_rotary(sent)?,
        };
        let shift = match self.reference_offset {
            Some(offset) => (sent.int("cache_offset")? - offset) as f64,
            None => 0.0,
        };
        let x = sent.tensor(which)?;
        let k = sent.tensor("k")?;
        let positions: Vec<f64> = values(&self.positions).iter().map(|p| p + shift).collect();
        rope::mrope_apply(
            &values(x),
            &x.shape,
            float_of(x)?,
            // cos / sin are cast to k's dtype (`self(k, position_ids)`).
            float_of(k)?,
            &positions,
            &self.positions.shape,
            Mrope {
                rotary_dim: rotary.rotary_dim,
                rope_theta: rotary.rope_theta,
                mrope_section: &rotary.mrope_section,
            },
            self.path,
            model,
        )
    }
}

/// `compute_inv_freq(d, base)` for each of `dims`, concatenated.
pub fn inv_freq_exact(dims: &[usize], base: f64, model: Model) -> Result<Exact, ExactError> {
    let mut all = Vec::new();
    for &d in dims {
        all.extend(rope::inv_freq(d, base, model)?);
    }
    Ok(Exact::from_tracked(
        "inv_freq",
        model,
        vec![all.len()],
        &all,
    ))
}

/// `MRoPERotaryEmbedding.apply_rotary(q, k, position_ids)` on given
/// positions, with the rotary's own tensors.
#[derive(Debug)]
pub struct MropeDirect {
    /// The path the reference took (`pure-mlx`, `metal-kernel`).
    pub path: String,
    pub q: Expected,
    pub k: Expected,
    pub inv_freq: Expected,
    pub position_selector: Expected,
}

/// `MRoPERotaryEmbedding.apply_rotary(q, k, position_ids)` (built as the
/// Qwen3.5 attention builds it) on `position_ids` as given: the inputs the
/// rope index never produces (broadcast positions, extra streams, q of
/// five axes, head dims that differ, odd rotary dims, a base beyond f32).
/// The exact q / k / inv_freq are attached by [`mrope_broadcast_exact`]
/// (the 4-D model per leading index, positions broadcast as the reference
/// broadcasts them); an odd rotary dim rotates `rotary_dim + 1` channels
/// and a theta beyond f32 is the formula at the f32 base `+inf`, as the
/// reference computes them ([`exact::rope`]).
pub fn position_mrope_apply(
    ctx: &Ctx,
    q: &HostTensor,
    k: &HostTensor,
    position_ids: &HostTensor,
    rotary: Rotary,
    path: &str,
) -> Result<MropeDirect, CaseError> {
    const F: &str = "position_mrope_apply";
    let mut params = vec![
        tensor("q", q),
        tensor("k", k),
        tensor("position_ids", position_ids),
    ];
    params.extend(rotary.params());
    params.push(fixed("path", path));
    let (value, calls) = ctx.call_sent(F, params)?;
    let mut r = Fields::of(F, value)?;
    let path = r.string("path")?;
    let rope_path =
        Path::from_name(&path).map_err(|e| CaseError::Harness(format!("`{F}`: {e}")))?;
    let rotated = |which: &'static str| {
        calls.exact_if_defined(F, |s, m| mrope_broadcast_exact(s, m, which, rope_path))
    };
    let (q_exact, k_exact) = (rotated("q")?, rotated("k")?);
    let inv_exact = calls.exact_if_defined(F, |s, m| {
        let rotary = sent_rotary(s)?;
        inv_freq_exact(&[rotary.rotary_dim], rotary.rope_theta, m)
    })?;
    let attach = |e: Expected, x: Option<crate::exactness::ExactPair>| match x {
        Some(x) => e.with_exact(x),
        None => e,
    };
    Ok(MropeDirect {
        path,
        q: attach(r.tensor("q")?, q_exact),
        k: attach(r.tensor("k")?, k_exact),
        inv_freq: attach(r.tensor("inv_freq")?, inv_exact),
        position_selector: r.tensor("position_selector")?,
    })
}

/// The exact rotated `which` (`q` or `k`: `[.., B, H, L, D]`, any rank of
/// at least 3) of `MRoPERotaryEmbedding.apply_rotary` on `position_ids`
/// `[S, Bp, Lp]` as the reference broadcasts them: cos / sin `[Bp, 1, Lp,
/// D]` against x, so `Bp` is 1 or x's `B`, `Lp` 1 or `L`, and every
/// leading index of x reads the same positions; the selector reads
/// streams 0 to 2 only (a fourth is never read). Each leading index is the
/// 4-D model ([`rope::mrope_apply`]) on positions expanded to `[3, B, L]`.
pub fn mrope_broadcast_exact(
    sent: &Sent,
    model: Model,
    which: &str,
    path: Path,
) -> Result<Exact, ExactError> {
    let rotary = sent_rotary(sent)?;
    let x = sent.tensor(which)?;
    let k = sent.tensor("k")?;
    let p = sent.tensor("position_ids")?;
    let r = x.shape.len();
    if r < 3 {
        return Err(ExactError::undefined(format!(
            "{which} of shape {:?}",
            x.shape
        )));
    }
    let (h, l, d) = (x.shape[r - 3], x.shape[r - 2], x.shape[r - 1]);
    let b = if r >= 4 { x.shape[r - 4] } else { 1 };
    let block = b * h * l * d;
    let &[s, pb, pl] = p.shape.as_slice() else {
        return Err(ExactError::undefined(format!(
            "position_ids of shape {:?}",
            p.shape
        )));
    };
    if s < 3 || !(pb == 1 || pb == b) || !(pl == 1 || pl == l) || block == 0 {
        return Err(ExactError::undefined(format!(
            "position_ids {:?} against {which} {:?}",
            p.shape, x.shape
        )));
    }
    let pv = values(p);
    let mut positions = Vec::with_capacity(3 * b * l);
    for si in 0..3 {
        for bi in 0..b {
            for t in 0..l {
                let (bj, tj) = (if pb == 1 { 0 } else { bi }, if pl == 1 { 0 } else { t });
                positions.push(pv[(si * pb + bj) * pl + tj]);
            }
        }
    }
    let xv = values(x);
    let (mut value, mut bound) = (Vec::with_capacity(xv.len()), Vec::with_capacity(xv.len()));
    for chunk in xv.chunks(block) {
        let e = rope::mrope_apply(
            chunk,
            &[b, h, l, d],
            float_of(x)?,
            float_of(k)?,
            &positions,
            &[3, b, l],
            Mrope {
                rotary_dim: rotary.rotary_dim,
                rope_theta: rotary.rope_theta,
                mrope_section: &rotary.mrope_section,
            },
            path,
            model,
        )?;
        value.extend(e.value);
        bound.extend(e.bound);
    }
    Ok(Exact {
        op: "rope",
        model,
        shape: x.shape.clone(),
        value,
        bound,
    })
}

/// Prefill: the rope index of `prompt`, then the apply with its positions
/// on `path`.
pub fn position_mrope_prompt(
    ctx: &Ctx,
    q: &HostTensor,
    k: &HostTensor,
    prompt: Prompt,
    rotary: Rotary,
    path: &str,
) -> Result<MropeApplied, CaseError> {
    const F: &str = "position_mrope_prompt";
    let mut params = vec![tensor("q", q), tensor("k", k)];
    params.extend(prompt.params());
    params.extend(rotary.params());
    params.push(fixed("path", path));
    applied(F, ctx.call_sent(F, params)?, false)
}

/// Decode: the rope index of `prompt`, the decode positions of q's tokens
/// at `cache_offset` (as `LanguageModel.__call__` computes them), then the
/// apply.
pub fn position_mrope_decode(
    ctx: &Ctx,
    q: &HostTensor,
    k: &HostTensor,
    prompt: Prompt,
    cache_offset: usize,
    rotary: Rotary,
    path: &str,
) -> Result<MropeApplied, CaseError> {
    const F: &str = "position_mrope_decode";
    let mut params = vec![tensor("q", q), tensor("k", k)];
    params.extend(prompt.params());
    params.push(varied("cache_offset", cache_offset, Perturb::Add(1)));
    params.extend(rotary.params());
    params.push(fixed("path", path));
    applied(F, ctx.call_sent(F, params)?, true)
}

/// `rope_utils.compute_inv_freq(dim, base)` for each of `dims`,
/// concatenated.
pub fn position_inv_freq(ctx: &Ctx, dims: &[usize], base: f64) -> Result<Expected, CaseError> {
    const F: &str = "position_inv_freq";
    let params = vec![
        fixed("dims", ints(dims)),
        varied("base", base, Perturb::NextUp),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let exact = calls.exact(F, |sent, model| {
        let dims = sent
            .ints("dims")?
            .into_iter()
            .map(|d| usize::try_from(d).map_err(|_| ExactError(format!("dim {d}"))))
            .collect::<Result<Vec<_>, _>>()?;
        inv_freq_exact(&dims, sent.float("base")?, model)
    })?;
    Ok(one_array(F, value)?.with_exact(exact))
}

/// `rope_utils._interleaved_position_selector(section, freq_dim)` for each
/// `(freq_dim, section)`, concatenated.
pub fn position_selectors(ctx: &Ctx, rows: &[(usize, [usize; 3])]) -> Result<Expected, CaseError> {
    const F: &str = "position_selectors";
    let freq_dims: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let sections = Arg::List(rows.iter().map(|r| ints(&r.1)).collect());
    let params = vec![
        fixed("freq_dims", ints(&freq_dims)),
        varied("sections", sections, Perturb::MoveOne),
    ];
    one_array(F, ctx.call(F, params)?)
}

/// What `rope_utils._mrope_apply_kernel(rotary_dim, position_ndim,
/// pairing)` hands to `mx.fast.metal_kernel`. Texts come back as UTF-8
/// bytes (uint8 arrays), names joined by NUL.
#[derive(Debug)]
pub struct KernelSource {
    pub name: Expected,
    pub input_names: Expected,
    pub output_names: Expected,
    pub source: Expected,
    pub header: Expected,
    /// int32 [3]: ensure_row_contiguous, atomic_outputs, compile options given.
    pub flags: Expected,
}

/// [`KernelSource`] of the reference's kernel builder.
pub fn position_mrope_kernel_source(
    ctx: &Ctx,
    rotary_dim: usize,
    position_ndim: usize,
    pairing: &str,
) -> Result<KernelSource, CaseError> {
    const F: &str = "position_mrope_kernel_source";
    let params = vec![
        varied("rotary_dim", rotary_dim, Perturb::Add(2)),
        fixed("position_ndim", position_ndim),
        fixed("pairing", pairing),
    ];
    let mut r = Fields::of(F, ctx.call(F, params)?)?;
    Ok(KernelSource {
        name: r.tensor("name")?,
        input_names: r.tensor("input_names")?,
        output_names: r.tensor("output_names")?,
        source: r.tensor("source")?,
        header: r.tensor("header")?,
        flags: r.tensor("flags")?,
    })
}

/// One kernel launch of `_fast_mrope_apply`.
#[derive(Debug)]
pub struct KernelLaunch {
    pub grid: Expected,
    pub threadgroup: Expected,
    /// `name=dtype` pairs, comma-separated, as UTF-8 bytes.
    pub template: Expected,
    /// int32 [outputs, 4].
    pub output_shapes: Expected,
    /// The `mlx.core` dtype names, comma-separated, as UTF-8 bytes.
    pub output_dtypes: Expected,
    /// How many inputs the kernel was given, int32 [1].
    pub inputs: Expected,
}

/// The q [B, Hq, L, D] and k [B, Hk, L, D] launches `_fast_mrope_apply`
/// makes, with the kernel recorded instead of run.
#[derive(Debug, Clone, Copy)]
pub struct LaunchShape {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub length: usize,
    pub head_dim: usize,
}

/// `[q launch, k launch]` of the reference's kernel apply.
pub fn position_mrope_kernel_launch(
    ctx: &Ctx,
    shape: LaunchShape,
    dtype_name: &str,
    position_ndim: usize,
    rotary_dim: usize,
) -> Result<[KernelLaunch; 2], CaseError> {
    const F: &str = "position_mrope_kernel_launch";
    let params = vec![
        varied("batch", shape.batch, Perturb::Add(1)),
        fixed("q_heads", shape.q_heads),
        varied("kv_heads", shape.kv_heads, Perturb::Add(1)),
        varied("length", shape.length, Perturb::Add(1)),
        fixed("head_dim", shape.head_dim),
        varied("dtype_name", dtype_name, Perturb::OtherDtype),
        fixed("position_ndim", position_ndim),
        fixed("rotary_dim", rotary_dim),
    ];
    let rows = list(F, ctx.call(F, params)?)?;
    let launches = rows
        .into_iter()
        .map(|row| {
            let mut r = Fields::of(F, row)?;
            // Strings and an int, turned into arrays here (a substitute's
            // values at the same places are turned the same way).
            let derive = |v: Value, f: fn(&Value) -> Option<Expected>| {
                Expected::derived(&v, |v| {
                    f(v).map(Expected::into_tensor)
                        .ok_or_else(|| format!("`{F}` returned {v:?} there"))
                })
                .map_err(CaseError::Harness)
            };
            Ok(KernelLaunch {
                grid: r.tensor("grid")?,
                threadgroup: r.tensor("threadgroup")?,
                template: derive(r.value("template")?, |v| match v {
                    Value::Str(s) => Some(text(s)),
                    _ => None,
                })?,
                output_shapes: r.tensor("output_shapes")?,
                output_dtypes: derive(r.value("output_dtypes")?, |v| match v {
                    Value::List(items) => items
                        .iter()
                        .map(|i| match i {
                            Value::Str(s) => Some(s.as_str()),
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()
                        .map(|names| text(&names.join(","))),
                    _ => None,
                })?,
                inputs: derive(r.value("inputs")?, |v| match v {
                    Value::Int(i) => Some(int32(&[i32::try_from(*i).unwrap_or(-1)])),
                    _ => None,
                })?,
            })
        })
        .collect::<Result<Vec<_>, CaseError>>()?;
    launches.try_into().map_err(|v: Vec<_>| {
        CaseError::Harness(format!("`{F}` made {} launches, not 2 (q, k)", v.len()))
    })
}

/// The rope index of a prompt, and the decode positions after it.
#[derive(Debug)]
pub struct RopeIndex {
    pub position_ids: Expected,
    pub rope_deltas: Expected,
    /// `length` decode tokens at `cache_offset` (decode calls only).
    pub decode_position_ids: Option<Expected>,
}

/// `LanguageModel.get_rope_index(input_ids, image_grid_thw,
/// video_grid_thw, attention_mask)`; `attention_mask` [B, L] int32 (all
/// ones stands for no mask).
pub fn position_rope_index(
    ctx: &Ctx,
    attention_mask: &HostTensor,
    prompt: Prompt,
) -> Result<RopeIndex, CaseError> {
    const F: &str = "position_rope_index";
    let mut params = vec![varied(
        "attention_mask",
        attention_mask.clone(),
        Perturb::FirstElement,
    )];
    params.extend(prompt.params());
    let mut r = Fields::of(F, ctx.call(F, params)?)?;
    Ok(RopeIndex {
        position_ids: r.tensor("position_ids")?,
        rope_deltas: r.tensor("rope_deltas")?,
        decode_position_ids: None,
    })
}

/// The rope index, then `LanguageModel.__call__`'s decode positions of
/// `length` tokens at `cache_offset`.
pub fn position_rope_decode(
    ctx: &Ctx,
    attention_mask: &HostTensor,
    prompt: Prompt,
    cache_offset: usize,
    length: usize,
) -> Result<RopeIndex, CaseError> {
    const F: &str = "position_rope_decode";
    let mut params = vec![varied(
        "attention_mask",
        attention_mask.clone(),
        Perturb::FirstElement,
    )];
    params.extend(prompt.params());
    params.push(varied("cache_offset", cache_offset, Perturb::Add(1)));
    params.push(fixed("length", length));
    let mut r = Fields::of(F, ctx.call(F, params)?)?;
    Ok(RopeIndex {
        position_ids: r.tensor("position_ids")?,
        rope_deltas: r.tensor("rope_deltas")?,
        decode_position_ids: Some(r.tensor("decode_position_ids")?),
    })
}

/// The reference mRoPE with three equal position streams, and
/// `mx.fast.rope` on the same q (the `vs-rope` finding).
#[derive(Debug)]
pub struct MropeVsRope {
    pub path: String,
    pub mrope: Expected,
    pub rope: Expected,
}

/// [`MropeVsRope`] on q [B, H, L, D] at `position_ids` [3, B, L].
pub fn position_mrope_vs_rope(
    ctx: &Ctx,
    q: &HostTensor,
    position_ids: &HostTensor,
    rotary: Rotary,
    path: &str,
) -> Result<MropeVsRope, CaseError> {
    const F: &str = "position_mrope_vs_rope";
    let mut params = vec![tensor("q", q), tensor("position_ids", position_ids)];
    params.extend(rotary.params());
    params.push(fixed("path", path));
    let mut r = Fields::of(F, ctx.call(F, params)?)?;
    Ok(MropeVsRope {
        path: r.string("path")?,
        mrope: r.tensor("mrope")?,
        rope: r.tensor("rope")?,
    })
}

/// `optiq.vlm.gemma4.vision.apply_multidimensional_rope(inputs, positions,
/// base_frequency)`.
pub fn position_rope2d(
    ctx: &Ctx,
    inputs: &HostTensor,
    positions: &HostTensor,
    base_frequency: f64,
) -> Result<Expected, CaseError> {
    let (value, calls) = rope2d_call(ctx, inputs, positions, base_frequency)?;
    let exact = calls.exact(ROPE2D, |sent, model| {
        rope2d_exact(sent, sent.float("base_frequency")?, model)
    })?;
    Ok(one_array(ROPE2D, value)?.with_exact(exact))
}

/// [`position_rope2d`] for inputs the reference broadcasts (ranks other
/// than 4, a base beyond f32): the exact value from the `[B, L, N, H]`
/// model per leading index ([`rope2d_broadcast_exact`]); a base beyond
/// float32 is the formula at the f32 base `+inf` (timescale `[1, inf,
/// ...]`, [`exact::rope`]).
pub fn position_rope2d_broadcast(
    ctx: &Ctx,
    inputs: &HostTensor,
    positions: &HostTensor,
    base_frequency: f64,
) -> Result<Expected, CaseError> {
    let (value, calls) = rope2d_call(ctx, inputs, positions, base_frequency)?;
    let exact = calls.exact_if_defined(ROPE2D, |sent, model| {
        rope2d_broadcast_exact(sent, sent.float("base_frequency")?, model)
    })?;
    let expected = one_array(ROPE2D, value)?;
    Ok(match exact {
        Some(e) => expected.with_exact(e),
        None => expected,
    })
}

/// `apply_multidimensional_rope` on `inputs` `[.., L, N, H]` (rank 3 or
/// more) against `positions` `[Pb, L, A]`: the reference's cos / sin
/// `[Pb, L, 1, H]` broadcast against the inputs, so `Pb` is 1 or the
/// inputs' `B` (axis −4, 1 for rank 3) and every leading index reads the
/// same positions. Each leading index is the 4-D model on positions
/// expanded to `[B, L, A]`.
pub fn rope2d_broadcast_exact(sent: &Sent, base: f64, model: Model) -> Result<Exact, ExactError> {
    let inputs = sent.tensor("inputs")?;
    let positions = sent.tensor("positions")?;
    let r = inputs.shape.len();
    if r < 3 {
        return Err(ExactError::undefined(format!(
            "inputs of shape {:?}",
            inputs.shape
        )));
    }
    let (l, n, hd) = (
        inputs.shape[r - 3],
        inputs.shape[r - 2],
        inputs.shape[r - 1],
    );
    let b = if r >= 4 { inputs.shape[r - 4] } else { 1 };
    let block = b * l * n * hd;
    let &[pb, pl, axes] = positions.shape.as_slice() else {
        return Err(ExactError::undefined(format!(
            "positions of shape {:?}",
            positions.shape
        )));
    };
    if !(pb == 1 || pb == b) || pl != l || block == 0 {
        return Err(ExactError::undefined(format!(
            "positions {:?} against inputs {:?}",
            positions.shape, inputs.shape
        )));
    }
    let pv = values(positions);
    let expanded: Vec<f64> = (0..b)
        .flat_map(|bi| {
            let bj = if pb == 1 { 0 } else { bi };
            pv[bj * l * axes..(bj + 1) * l * axes].to_vec()
        })
        .collect();
    let xv = values(inputs);
    let (mut value, mut bound) = (Vec::with_capacity(xv.len()), Vec::with_capacity(xv.len()));
    let mut shape = Vec::new();
    for chunk in xv.chunks(block) {
        let e = rope::rope2d(
            chunk,
            &[b, l, n, hd],
            float_of(inputs)?,
            &expanded,
            &[b, l, axes],
            base,
            model,
        )?;
        shape = e.shape.clone();
        value.extend(e.value);
        bound.extend(e.bound);
    }
    let lead = xv.len() / block;
    Ok(Exact {
        op: "rope2d",
        model,
        shape: if r == 3 {
            shape
        } else {
            let mut s = inputs.shape[..r - 1].to_vec();
            s.push(shape.last().copied().unwrap_or(0));
            debug_assert_eq!(
                s.iter().product::<usize>(),
                lead * shape.iter().product::<usize>()
            );
            s
        },
        value,
        bound,
    })
}

const ROPE2D: &str = "position_rope2d";

fn rope2d_call(
    ctx: &Ctx,
    inputs: &HostTensor,
    positions: &HostTensor,
    base_frequency: f64,
) -> Result<(oracle::Value, Calls), CaseError> {
    let params = vec![
        tensor("inputs", inputs),
        tensor("positions", positions),
        varied("base_frequency", base_frequency, Perturb::NextUp),
    ];
    ctx.call_sent(ROPE2D, params)
}

/// The exact `apply_multidimensional_rope(inputs, positions, base)` of a
/// call's `inputs` and `positions` (see [`exact::rope::rope2d`]).
pub(crate) fn rope2d_exact(sent: &Sent, base: f64, model: Model) -> Result<Exact, ExactError> {
    let inputs = sent.tensor("inputs")?;
    let positions = sent.tensor("positions")?;
    rope::rope2d(
        &values(inputs),
        &inputs.shape,
        float_of(inputs)?,
        &values(positions),
        &positions.shape,
        base,
        model,
    )
}

#[cfg(test)]
mod broadcast_tests {
    use exact::Model;
    use oracle::{Arg, DType, HostTensor};

    use super::*;

    fn tensor_of(dtype: DType, shape: &[usize], v: impl Fn(usize) -> f64) -> HostTensor {
        let n: usize = shape.iter().product();
        let bytes = (0..n)
            .flat_map(|i| match dtype {
                DType::Int32 => (v(i) as i32).to_le_bytes(),
                _ => (v(i) as f32).to_le_bytes(),
            })
            .collect();
        HostTensor::new(dtype, shape.to_vec(), bytes).unwrap()
    }

    fn mrope_sent(q: &[usize], positions: HostTensor) -> Sent {
        let x = tensor_of(DType::Float32, q, |i| ((i * 7 % 13) as f64 - 6.0) / 4.0);
        Sent::new(vec![
            ("q", Arg::Tensor(x.clone())),
            ("k", Arg::Tensor(x)),
            ("position_ids", Arg::Tensor(positions)),
            ("head_dim", Arg::Int(8)),
            ("partial_rotary_factor", Arg::Float(1.0)),
            ("rope_theta", Arg::Float(10_000.0)),
            ("mrope_section", ints(&[2, 1, 1])),
        ])
    }

    /// Issue 41: the accepted mRoPE and 2-D RoPE inputs are exact-checked
    /// through the 4-D models: positions broadcast over tokens equal the
    /// same positions written out per token, a fourth stream is never
    /// read, a leading axis repeats the 4-D value, rank-3 2-D RoPE inputs
    /// are a batch of one. An odd rotary dim (7 of head 8) rotates all 8
    /// channels at `compute_inv_freq(7)`'s four frequencies: frequency 0
    /// (inv_freq 1) as rotary 8 does, frequency 1 not; 9 of head 8 (10
    /// channels) is an error, as the reference's broadcast is.
    #[test]
    fn broadcast_inputs_reduce_to_the_4d_models() {
        let m = Model::Cpu;
        let pos = |shape: &[usize], f: &dyn Fn(usize) -> f64| tensor_of(DType::Int32, shape, f);
        let one = mrope_sent(&[2, 2, 4, 8], pos(&[3, 2, 1], &|i| (5 + 3 * i) as f64));
        let each = mrope_sent(
            &[2, 2, 4, 8],
            pos(&[3, 2, 4], &|i| (5 + 3 * (i / 4)) as f64),
        );
        let (a, b) = (
            mrope_broadcast_exact(&one, m, "q", Path::PureMlx).unwrap(),
            mrope_broadcast_exact(&each, m, "q", Path::PureMlx).unwrap(),
        );
        assert_eq!((a.value.clone(), a.bound.clone()), (b.value, b.bound));
        let four = mrope_sent(&[2, 2, 4, 8], pos(&[4, 2, 1], &|i| (5 + 3 * i) as f64));
        assert_eq!(
            mrope_broadcast_exact(&four, m, "q", Path::PureMlx)
                .unwrap()
                .value,
            a.value
        );
        let p = pos(&[3, 1, 4], &|i| i as f64);
        let five = mrope_broadcast_exact(
            &mrope_sent(&[2, 1, 2, 4, 8], p.clone()),
            m,
            "q",
            Path::PureMlx,
        )
        .unwrap();
        let four_d =
            mrope_broadcast_exact(&mrope_sent(&[1, 2, 4, 8], p.clone()), m, "q", Path::PureMlx)
                .unwrap();
        assert_eq!(five.value.len(), 2 * four_d.value.len());
        assert_eq!(five.value[..four_d.value.len()], four_d.value[..]);
        let odd =
            mrope_sent(&[1, 2, 4, 8], p.clone()).with("partial_rotary_factor", Arg::Float(0.875));
        let odd = mrope_broadcast_exact(&odd, m, "q", Path::PureMlx).unwrap();
        assert_eq!(odd.value.len(), four_d.value.len());
        // Row 1 (position 1), channel 0 (frequency 0) and channel 1.
        assert_eq!(odd.value[8], four_d.value[8]);
        assert_ne!(odd.value[9], four_d.value[9]);
        let wide = mrope_sent(&[1, 2, 4, 8], p).with("partial_rotary_factor", Arg::Float(1.125));
        assert!(mrope_broadcast_exact(&wide, m, "q", Path::PureMlx).is_err());
        let rope2d = |shape: &[usize]| {
            let s = Sent::new(vec![
                (
                    "inputs",
                    Arg::Tensor(tensor_of(DType::Float32, shape, |i| (i % 5) as f64 - 2.0)),
                ),
                ("positions", Arg::Tensor(pos(&[1, 4, 2], &|i| i as f64))),
            ]);
            rope2d_broadcast_exact(&s, 100.0, m).unwrap().value
        };
        assert_eq!(rope2d(&[4, 2, 16]), rope2d(&[1, 4, 2, 16]));
    }
}
