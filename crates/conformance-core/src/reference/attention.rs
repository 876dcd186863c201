//! The attention decode step: mlx-lm's own attention module
//! (`mlx_lm.models.glm4.Glm4Attention`: q/k/v/o projections, partial RoPE
//! with the cache offset, `KVCache`, `base.scaled_dot_product_attention`).
//! Activations, every projection tensor and the prefilled K/V are
//! perturbable; the graph's shape is constant.

use exact::attention::{
    decode_m1, decode_m1_attn_given_read, decode_m1_without_attention, DecodeExact, DecodeInputs,
    Graph as ExactGraph,
};
use exact::{Exact, ExactError, Format, Model, QuantizedMatrix, Tracked};
use oracle::{DType, HostTensor};

use super::{fixed, list, one_array, tensor, Param};
use crate::case::{CaseError, Ctx, Expected};
use crate::exactness::{float_of, values, Sent};

/// One affine quantized projection (no additive bias).
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    pub weight: &'a HostTensor,
    pub scales: &'a HostTensor,
    pub biases: &'a HostTensor,
}

/// The attention graph's constants.
#[derive(Debug, Clone, Copy)]
pub struct Graph {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dims: usize,
    pub rope_base: f64,
    pub group_size: i32,
    pub bits: i32,
}

/// Per decoded token (rows): the attention output before `o_proj`
/// [T, H*D], the layer output [T, hidden], the token's cached keys and
/// values [T, H_kv*D].
#[derive(Debug)]
pub struct DecodeRows {
    pub attn: Expected,
    pub y: Expected,
    pub keys: Expected,
    pub values: Expected,
}

/// The longest KV window (prefill plus decoded rows) whose attention
/// output the exact oracle checks with the float64 definition and its
/// worst-case bound (intersected with the enclosures); longer windows get
/// `keys`, `values` and `y` given `attn` checked
/// ([`decode_m1_without_attention`]), and on x86-64 CPU `attn` given what
/// the attention read, MLX's fallback emulated in its order
/// ([`decode_m1_attn_given_read`], `exact::sdpa_cpu`); a GPU's `attn`
/// above it stays unchecked.
pub const EXACT_MAX_KV: usize = 8192;

/// Decodes the rows of `x` [T, hidden] one token at a time (M = 1) after a
/// cache prefilled with `k0`, `v0` [1, H_kv, L0, D].
pub fn attention_decode_m1(
    ctx: &Ctx,
    x: &HostTensor,
    projections: [Projection; 4],
    k0: &HostTensor,
    v0: &HostTensor,
    graph: Graph,
) -> Result<DecodeRows, CaseError> {
    const F: &str = "attention_decode_m1";
    let names = [
        ["q_w", "q_s", "q_b"],
        ["k_w", "k_s", "k_b"],
        ["v_w", "v_s", "v_b"],
        ["o_w", "o_s", "o_b"],
    ];
    let mut params: Vec<Param> = vec![tensor("x", x)];
    for (p, [w, s, b]) in projections.iter().zip(names) {
        params.extend([
            tensor(w, p.weight),
            tensor(s, p.scales),
            tensor(b, p.biases),
        ]);
    }
    params.extend([
        tensor("k0", k0),
        tensor("v0", v0),
        fixed("n_heads", graph.n_heads),
        fixed("n_kv_heads", graph.n_kv_heads),
        fixed("head_dim", graph.head_dim),
        fixed("rotary_dims", graph.rotary_dims),
        fixed("rope_base", graph.rope_base),
        fixed("group_size", graph.group_size),
        fixed("bits", graph.bits),
    ]);
    let (value, calls) = ctx.call_sent(F, params)?;
    let rows = list(F, value)?;
    let [attn, y, keys, values, queries]: [oracle::Value; 5] =
        rows.try_into().map_err(|v: Vec<_>| {
            CaseError::Harness(format!("`{F}` returned {} arrays, not 5", v.len()))
        })?;
    // One exact decode per side gives all four outputs; windows longer
    // than EXACT_MAX_KV skip the float64 SDPA over every cached key of
    // every step (seconds per thousand keys): see the branches below.
    let (h, hkv, dd) = (graph.n_heads, graph.n_kv_heads, graph.head_dim);
    let hidden = x.shape.last().copied().unwrap_or(0);
    let window = k0.shape.get(2).copied().unwrap_or(0) + x.len() / hidden.max(1);
    let attn = one_array(F, attn)?;
    let read = |v: oracle::Value, what: &str| match v {
        oracle::Value::Tensor(t) => Ok(oracle::Arg::Tensor(t)),
        other => Err(CaseError::Harness(format!(
            "`{F}` returned {other:?} as its {what}, not an array"
        ))),
    };
    let (keys_read, values_read) = (keys.clone(), values.clone());
    // `y` is checked given the attention output o_proj read (the glue
    // records o_proj's input: `attn`, the reference's own): the reference
    // side's arguments carry it ([`ATTN_READ`]; `exact::attention`'s
    // module doc, "y given attn"). The port's side under `--perturb` has
    // no such record and keeps the whole step's bound.
    let calls = crate::exactness::Calls {
        reference: calls
            .reference
            .with(ATTN_READ, oracle::Arg::Tensor(attn.tensor().clone()))
            .with(QUERIES_READ, read(queries, "queries")?)
            .with(KEYS_READ, read(keys_read, "keys")?)
            .with(VALUES_READ, read(values_read, "values")?),
        ..calls
    };
    let exact = if window <= EXACT_MAX_KV {
        let pairs = calls.exact_all(F, |s, m| {
            let d = exact_decode(s, m)?;
            let rows = s.tensor("x")?.len() / hidden.max(1);
            Ok(vec![
                Exact::from_tracked("attention_sdpa", m, vec![rows, h * dd], &d.attn),
                Exact::from_tracked("attention_o_proj", m, vec![rows, hidden], &d.y),
                Exact::from_tracked("attention_keys", m, vec![rows, hkv * dd], &d.keys),
                Exact::from_tracked("attention_values", m, vec![rows, hkv * dd], &d.values),
            ])
        })?;
        pairs.into_iter().map(Some).collect()
    } else if calls.port.is_none() {
        // A longer window: the float64 SDPA over every cached key of
        // every step is not evaluated (host cost: +12 s to +65 s on CPU
        // per window); the cached keys and values and y given attn cost
        // the projections alone. On x86-64 CPU `attn` is checked given
        // what the attention read, MLX's fallback emulated in its own
        // order (`exact::sdpa_cpu`: seconds); a GPU's stays unchecked
        // here. (Under --perturb the port's side has no records: not
        // checked.)
        let pairs = calls.exact_all(F, |s, m| {
            let d = exact_decode_long(s, m)?;
            let rows = s.tensor("x")?.len() / hidden.max(1);
            let mut out = Vec::with_capacity(4);
            if !d.attn.is_empty() {
                out.push(Exact::from_tracked(
                    "attention_sdpa",
                    m,
                    vec![rows, h * dd],
                    &d.attn,
                ));
            }
            out.extend([
                Exact::from_tracked("attention_o_proj", m, vec![rows, hidden], &d.y),
                Exact::from_tracked("attention_keys", m, vec![rows, hkv * dd], &d.keys),
                Exact::from_tracked("attention_values", m, vec![rows, hkv * dd], &d.values),
            ]);
            Ok(out)
        })?;
        let pairs: Vec<_> = pairs.into_iter().map(Some).collect();
        if pairs.len() == 4 {
            pairs
        } else {
            std::iter::once(None).chain(pairs).collect()
        }
    } else {
        vec![None; 4]
    };
    let attach = |e: Expected, x: &Option<crate::exactness::ExactPair>| match x {
        Some(x) => e.with_exact(x.clone()),
        None => e,
    };
    Ok(DecodeRows {
        attn: attach(attn, &exact[0]),
        y: attach(one_array(F, y)?, &exact[1]),
        keys: attach(one_array(F, keys)?, &exact[2]),
        values: attach(one_array(F, values)?, &exact[3]),
    })
}

/// The argument the exact decode reads as the attention output o_proj
/// read (never a glue argument: added to the reference's side after the
/// call).
pub const ATTN_READ: &str = "attn_read_by_o_proj";

/// The arguments the exact decode reads as what the attention itself
/// read: q_proj's outputs (the glue's record), the keys and values the
/// step cached (its outputs). Added to the reference's side after the
/// call, like [`ATTN_READ`] (`exact::attention`'s module doc, "attn given
/// what it read").
pub const QUERIES_READ: &str = "queries_read_by_attention";
pub const KEYS_READ: &str = "keys_read_by_attention";
pub const VALUES_READ: &str = "values_read_by_attention";

fn usize_arg(s: &Sent, name: &str) -> Result<usize, ExactError> {
    let v = s.int(name)?;
    usize::try_from(v).map_err(|_| ExactError(format!("`{name}` is {v}")))
}

/// One affine projection's tensors, owned (scales and biases as values).
struct OwnedProjection {
    packed: Vec<u8>,
    scales: Vec<f64>,
    biases: Vec<f64>,
    rows: usize,
    cols: usize,
    scales_dtype: exact::Float,
}

impl OwnedProjection {
    fn from_sent(s: &Sent, [w, sc, b]: [&str; 3], bits: usize) -> Result<Self, ExactError> {
        let wt = s.tensor(w)?;
        if wt.dtype != DType::Uint32 || wt.shape.len() != 2 || bits == 0 {
            return Err(ExactError(format!(
                "`{w}` is {} {:?}, not packed uint32 [N, K * bits / 32]",
                wt.dtype.name(),
                wt.shape
            )));
        }
        let scales = s.tensor(sc)?;
        Ok(Self {
            packed: wt.bytes.clone(),
            scales: values(scales),
            biases: values(s.tensor(b)?),
            rows: wt.shape[0],
            cols: wt.shape[1] * 32 / bits,
            scales_dtype: float_of(scales)?,
        })
    }
    fn view(&self, bits: usize, group_size: usize) -> QuantizedMatrix<'_> {
        QuantizedMatrix {
            format: Format::Affine,
            bits,
            group_size,
            rows: self.rows,
            cols: self.cols,
            packed: &self.packed,
            scales: &self.scales,
            scale_codes: &[],
            biases: &self.biases,
        }
    }
}

/// The exact decode from the arguments one side computed from (names as
/// the glue's parameters).
fn exact_decode(s: &Sent, model: Model) -> Result<DecodeExact, ExactError> {
    with_decode_inputs(s, true, |inputs| decode_m1(inputs, model))
}

/// A window longer than [`EXACT_MAX_KV`]: on x86-64 CPU `attn` given
/// what the attention read ([`decode_m1_attn_given_read`]: the prefill
/// and the records are read), elsewhere without the attention
/// ([`decode_m1_without_attention`]: the prefill is not read).
fn exact_decode_long(s: &Sent, model: Model) -> Result<DecodeExact, ExactError> {
    if model == Model::Cpu && cfg!(target_arch = "x86_64") {
        with_decode_inputs(s, true, |inputs| decode_m1_attn_given_read(inputs, model))
    } else {
        with_decode_inputs(s, false, |inputs| {
            decode_m1_without_attention(inputs, model)
        })
    }
}

/// The exact decode's inputs from the arguments one side computed from.
fn with_decode_inputs(
    s: &Sent,
    prefill: bool,
    f: impl FnOnce(&DecodeInputs) -> Result<DecodeExact, ExactError>,
) -> Result<DecodeExact, ExactError> {
    let bits = usize_arg(s, "bits")?;
    let group_size = usize_arg(s, "group_size")?;
    let names = [
        ["q_w", "q_s", "q_b"],
        ["k_w", "k_s", "k_b"],
        ["v_w", "v_s", "v_b"],
        ["o_w", "o_s", "o_b"],
    ];
    let owned = names
        .iter()
        .map(|n| OwnedProjection::from_sent(s, *n, bits))
        .collect::<Result<Vec<_>, _>>()?;
    let x = s.tensor("x")?;
    let (k0, v0) = (s.tensor("k0")?, s.tensor("v0")?);
    if k0.shape.len() != 4 || k0.shape[0] != 1 || k0.shape != v0.shape {
        return Err(ExactError(format!(
            "prefill k0 {:?} / v0 {:?}, not [1, H_kv, L0, D]",
            k0.shape, v0.shape
        )));
    }
    let l0 = k0.shape[2];
    let graph = ExactGraph {
        n_heads: usize_arg(s, "n_heads")?,
        n_kv_heads: usize_arg(s, "n_kv_heads")?,
        head_dim: usize_arg(s, "head_dim")?,
        rotary_dims: usize_arg(s, "rotary_dims")?,
        rope_base: s.float("rope_base")?,
    };
    // The prefill only where the attention reads it (tens of millions of
    // values at the longest windows).
    let (xv, k0v, v0v) = if prefill {
        (values(x), values(k0), values(v0))
    } else {
        (values(x), Vec::new(), Vec::new())
    };
    let attn_read = s.opt_tensor(ATTN_READ)?.map(values);
    let read = match (
        s.opt_tensor(QUERIES_READ)?,
        s.opt_tensor(KEYS_READ)?,
        s.opt_tensor(VALUES_READ)?,
    ) {
        (Some(q), Some(k), Some(v)) if prefill => Some((values(q), values(k), values(v))),
        _ => None,
    };
    let inputs = DecodeInputs {
        x: &xv,
        x_dtype: float_of(x)?,
        projections: std::array::from_fn(|i| owned[i].view(bits, group_size)),
        scales_dtypes: std::array::from_fn(|i| owned[i].scales_dtype),
        k0: &k0v,
        v0: &v0v,
        l0,
        k0_dtype: if l0 > 0 { Some(float_of(k0)?) } else { None },
        v0_dtype: if l0 > 0 { Some(float_of(v0)?) } else { None },
        graph,
        attn_read: attn_read.as_deref(),
        read: read.as_ref().map(|(q, k, v)| exact::attention::DecodeRead {
            queries: q,
            keys: k,
            values: v,
        }),
    };
    f(&inputs)
}

/// The most multiply-adds (B·H·M·L·D) the exact oracle spends on one SDPA
/// output; larger outputs are bit-compared only (float64 over every key of
/// every row costs tenths of a second per 10^7).
pub const EXACT_MAX_SDPA_WORK: usize = 1 << 25;

/// mlx-lm's attention core on a `KVCache` (glue `sdpa_kv_cache`):
/// `queries` [B, H, M, D] over the request's `keys`/`values`
/// [B, H_kv, L, D] (the first L − M prefilled, the last M appended; causal
/// within the chunk when M > 1), `scale` the softmax scale. Returns
/// [B, H, M, D] in the queries' dtype, with its exact value attached when
/// the work is at most [`EXACT_MAX_SDPA_WORK`].
pub fn sdpa_kv_cache(
    ctx: &Ctx,
    queries: &HostTensor,
    keys: &HostTensor,
    values: &HostTensor,
    scale: f32,
) -> Result<Expected, CaseError> {
    const F: &str = "sdpa_kv_cache";
    let params = vec![
        tensor("queries", queries),
        tensor("keys", keys),
        tensor("values", values),
        fixed("scale", f64::from(scale)),
    ];
    let (value, calls) = ctx.call_sent(F, params)?;
    let work = queries.len() * keys.shape.get(2).copied().unwrap_or(0);
    let expected = one_array(F, value)?;
    if work > EXACT_MAX_SDPA_WORK {
        return Ok(expected);
    }
    let exact = calls.exact(F, exact_sdpa)?;
    Ok(expected.with_exact(exact))
}

/// The exact SDPA of one side's arguments: per batch row, head and query
/// row `i`, [`exact::attention::sdpa_row`] over the first `L − M + i + 1`
/// keys of KV head `h / (H / H_kv)` (the causal mask aligned to the end, as
/// `"causal"` is for M < L).
fn exact_sdpa(s: &Sent, model: Model) -> Result<Exact, ExactError> {
    let (q, k, v) = (s.tensor("queries")?, s.tensor("keys")?, s.tensor("values")?);
    let bad = || {
        ExactError(format!(
            "SDPA of queries {:?} over keys {:?} / values {:?}: not [B, H, M, D] over [B, H_kv, L, D] with H a multiple of H_kv and M <= L",
            q.shape, k.shape, v.shape
        ))
    };
    let ([b, h, m, d], [kb, hkv, l, kd]) = (
        <[usize; 4]>::try_from(q.shape.as_slice()).map_err(|_| bad())?,
        <[usize; 4]>::try_from(k.shape.as_slice()).map_err(|_| bad())?,
    );
    if kb != b
        || kd != d
        || k.shape != v.shape
        || hkv == 0
        || h % hkv != 0
        || m > l
        || m == 0
        || d == 0
    {
        return Err(bad());
    }
    let t = float_of(q)?;
    let track = |t: &HostTensor| {
        values(t)
            .into_iter()
            .map(Tracked::exact)
            .collect::<Vec<_>>()
    };
    let (qv, kv, vv) = (track(q), track(k), track(v));
    let scale = s.float("scale")?;
    // A injected fault's causal window one key short (`exactness::faults`;
    // no glue call has this argument).
    let short = usize::from(s.int(crate::exactness::faults::MASK_SHIFT).is_ok());
    let no_max = s.int(crate::exactness::faults::NO_MAX).is_ok();
    let mut out = Vec::with_capacity(q.len());
    for bi in 0..b {
        for hi in 0..h {
            let g = hi / (h / hkv);
            let head = (bi * hkv + g) * l * d;
            for i in 0..m {
                let row = ((bi * h + hi) * m + i) * d;
                let n = (l - m + i + 1 - short).max(1);
                let mut o = exact::attention::sdpa_row(
                    &qv[row..row + d],
                    &kv[head..head + n * d],
                    &vv[head..head + n * d],
                    scale,
                    t,
                    model,
                )?;
                if model == Model::Gpu {
                    // Every GPU path's enclosure (`exact::attention`,
                    // "attn given what it read"): the inputs are exact.
                    let pts = |x: &[Tracked]| x.iter().map(|t| t.v).collect::<Vec<_>>();
                    exact::attention::tighten_gpu_sdpa_row(
                        &mut o,
                        &pts(&qv[row..row + d]),
                        &pts(&kv[head..head + n * d]),
                        &pts(&vv[head..head + n * d]),
                        scale,
                        t,
                        exact::attention::gpu_may_run_unfused(d, m, h / hkv, false),
                    );
                }
                if no_max {
                    let scores: Vec<f64> = (0..n)
                        .map(|j| {
                            let k = &kv[head + j * d..head + (j + 1) * d];
                            scale
                                * qv[row..row + d]
                                    .iter()
                                    .zip(k)
                                    .map(|(a, b)| a.v * b.v)
                                    .sum::<f64>()
                        })
                        .collect();
                    if let Some(v) = crate::exactness::faults::softmax_without_max(&scores) {
                        o.iter_mut().for_each(|x| x.v = v);
                    }
                }
                out.extend(o);
            }
        }
    }
    Ok(Exact::from_tracked("sdpa", model, q.shape.clone(), &out))
}

#[cfg(test)]
mod fault_tests {
    use std::sync::Arc;

    use exact::Model;
    use oracle::{Arg, DType, HostTensor};

    use super::exact_sdpa;
    use crate::exactness::faults::{inject_all, FaultKind, Variant};
    use crate::exactness::{ExactPair, Sent};

    fn f32s(shape: &[usize], f: impl Fn(usize) -> f32) -> HostTensor {
        let n: usize = shape.iter().product();
        let bytes = (0..n).flat_map(|i| f(i).to_le_bytes()).collect();
        HostTensor::new(DType::Float32, shape.to_vec(), bytes).unwrap()
    }

    /// A float32 SDPA step of two requests with distinct KV, queries
    /// scaled by `q_scale`, and its reference output: the exact value
    /// itself (the kinds are injected into it).
    fn step(q_scale: f32) -> (Sent, HostTensor, ExactPair) {
        let wave = |i: usize, k: f32| ((i as f32 * k).sin() * 0.9).clamp(-1.0, 1.0);
        let sent = Sent::new(vec![
            (
                "queries",
                Arg::Tensor(f32s(&[2, 1, 1, 8], |i| q_scale * wave(i, 0.7).abs())),
            ),
            (
                "keys",
                Arg::Tensor(f32s(&[2, 1, 5, 8], |i| 4.0 * wave(i, 1.3).abs())),
            ),
            ("values", Arg::Tensor(f32s(&[2, 1, 5, 8], |i| wave(i, 2.1)))),
            ("scale", Arg::Float(8f64.powf(-0.5))),
        ]);
        let e = exact_sdpa(&sent, Model::Cpu).unwrap();
        let y = f32s(&[2, 1, 1, 8], |i| e.value[i] as f32);
        (sent, y, ExactPair::same(Arc::new(e)))
    }

    fn injected(kind: FaultKind, sent: &Sent, y: &HostTensor, mut pair: ExactPair) -> Option<bool> {
        let faulty = kind.mutate(sent)?;
        pair.variants.push(Variant {
            kind,
            value: exact_sdpa(&faulty, Model::Cpu).unwrap().value,
        });
        inject_all("y", y, &pair)
            .into_iter()
            .find(|c| c.kind == kind)
            .map(|c| c.flagged)
    }

    /// Issue 41: `kv-row-from-another-row` applies to a batch of two
    /// requests with distinct KV (none is exact-checked in the default
    /// suite: the decode step and the kept SDPA case have one) and is
    /// flagged; `softmax-without-max` applies only where float32's exp
    /// overflows (scores above ~88.7: the row NaN), and is flagged there.
    #[test]
    fn kv_row_and_softmax_without_max_apply_where_they_change_the_output() {
        let (sent, y, pair) = step(1.0);
        assert_eq!(
            injected(FaultKind::KvRowFromAnotherRow, &sent, &y, pair.clone()),
            Some(true)
        );
        // Small scores: float32 roundings only, not injected.
        assert_eq!(
            injected(FaultKind::SoftmaxWithoutMax, &sent, &y, pair),
            None
        );
        let (sent, y, pair) = step(100.0);
        assert_eq!(
            injected(FaultKind::SoftmaxWithoutMax, &sent, &y, pair),
            Some(true)
        );
    }
}
