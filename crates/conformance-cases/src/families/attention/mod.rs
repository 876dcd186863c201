//! Case family `attention`: check (a), M = 1 versus chunked append.
//!
//! One attention decode step built from the ported layers ([`step`]:
//! rows-independent 4-bit projections, partial RoPE with the cache offset,
//! KV-cache append, `fast::scaled_dot_product_attention`) on a
//! Qwen3.5-like graph ([`step::QWEN35_LIKE`]: GQA 6, head_dim 256, bf16).
//! For each window of cache lengths straddling a Metal regime boundary
//! ([`WINDOWS`]) the cache is prefilled in one shot with seeded K/V up to
//! the window's start, then the window's tokens are decoded:
//!
//! * `attention/decode/…/M1/cache<a>-<b>` (must-equal): the port decoding
//!   one token at a time versus the reference doing the same in Python
//!   (mlx-lm's own `glm4.Glm4Attention` with `nn.QuantizedLinear`
//!   projections on an `mlx_lm.models.cache.KVCache`, the mask of
//!   `mlx_lm.models.base.create_attention_mask`).
//! * `attention/append/…/policy-<table>/cache<a>-<b>` (finding): the port
//!   appending in the chunks [`RegimeTable::append_chunk_size`] chooses
//!   versus the port at M = 1. The CPU table (from the boundary finder) on
//!   CPU, the origin's Metal table (the TypeScript original's) on Metal.
//! * `attention/append/…/crossing/cache<a>-<b>` (finding, negative
//!   control): one chunk of 4 straddling each Metal boundary in the window,
//!   appended to the M = 1 cache, versus M = 1, on whatever backend runs.
//! * `attention/boundary-finder/…/chunk4` (finding): [`finder`] run on
//!   this backend, with the table the layers crate ships for it.

pub mod finder;
pub mod scenario;
pub mod sdpa;
pub mod step;

use std::sync::Arc;

use layers::position::{RegimeTable, MAX_APPEND_CHUNK};
use oracle::{DType, HostTensor};
use serde_json::json;

use crate::case::{Backend, Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;
use finder::{default_candidates, find_boundaries, AppendProbe};
use scenario::{reset_memo as reset_scenarios, scenario, Scenario, OUTPUTS};
use step::{AttentionShape, QWEN35_LIKE};

/// Cache-length windows `(start, end)`: the cache is prefilled to `start`
/// and decoded to `end`, so SDPA sees KV lengths `start+1 ..= end`. Each
/// straddles Metal boundaries (1023 and 1024; 8192; 32768; 65536).
pub const WINDOWS: [(usize, usize); 4] =
    [(1019, 1029), (8186, 8198), (32762, 32770), (65530, 65540)];

const SHAPE: AttentionShape = QWEN35_LIKE;
const GRAPH: &str = "qwen35-gqa6-d256-h512/affine-4b-gs64/bf16";

const REFERENCE_M1: &str = "mlx_lm.models.glm4.Glm4Attention.__call__ with mlx.nn.QuantizedLinear \
     projections, one token per call on an mlx_lm.models.cache.KVCache, mask from \
     mlx_lm.models.base.create_attention_mask (mlx-lm 0.32.2, mlx 0.32.2)";
const REFERENCE_APPEND: &str =
    "port chunked append vs port M=1 (mlx.core.fast.scaled_dot_product_attention, mlx 0.32.2)";
const REFERENCE_FINDER: &str =
    "port chunked append vs port M=1, boundary search (mlx.core.fast.scaled_dot_product_attention, mlx 0.32.2)";

/// An `attention/*` decode-graph case as data. The graph is the one
/// [`GRAPH`] names (Qwen3.5-like GQA attention, affine 4-bit projections,
/// bf16); a description gives the KV window `[start, end)` its tokens are
/// decoded over (the prefix prefilled in one update).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AttentionCase {
    /// Must-equal: the port decoding the window one token per call.
    DecodeM1 { start: usize, end: usize },
    /// Finding (on `backend` only): its shipped append regime table over
    /// the window.
    AppendPolicy {
        #[serde(with = "backend_name")]
        backend: Backend,
        start: usize,
        end: usize,
    },
    /// Finding: chunked append against M = 1 across the window.
    AppendCrossing { start: usize, end: usize },
    /// Finding: the append boundary search.
    BoundaryFinder,
}

/// `Backend` as its name (`cpu`, `metal`, `cuda`).
mod backend_name {
    use crate::case::Backend;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Backend, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(b.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Backend, D::Error> {
        let text = String::deserialize(d)?;
        [Backend::Cpu, Backend::Metal, Backend::Cuda]
            .into_iter()
            .find(|b| b.as_str() == text)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("backend `{text}`: cpu, metal or cuda"))
            })
    }
}

/// Why a window cannot run, if so: `start < end`, at most 64 decoded
/// tokens, the cache at most 2^17 tokens.
fn check_window(start: usize, end: usize) -> Result<(), CaseError> {
    if start == 0 || start >= end || end - start > 64 || end > 1 << 17 {
        return Err(CaseError::Harness(format!(
            "window cache{start}-{end}: needs 0 < start < end, end - start <= 64, end <= 2^17"
        )));
    }
    Ok(())
}

/// Every `attention/*` decode-graph case reads the memoised scenarios (the
/// port's M = 1 trajectory per window, seconds at 65k tokens on CPU): one
/// worker runs them all, so each scenario is computed once per run.
const SHARES: &str = "attention/scenarios";
/// Append findings over windows ending beyond this many positions run in
/// the deep tier (the must-equal decode steps over them run in every tier).
const LONG_WINDOW: usize = 32_768;

impl Params for AttentionCase {
    const BUILDER: &'static str = "attention";
    fn build(self, name: String) -> Case {
        self.case(name).sharing(SHARES)
    }
}

impl AttentionCase {
    fn case(self, name: String) -> Case {
        match self {
            AttentionCase::DecodeM1 { start, end } => {
                Case::must_equal(name, "attention/decode", REFERENCE_M1, move |ctx| {
                    check_window(start, end)?;
                    run_m1(ctx, start, end)
                })
                .glue_composed(&[
                    "mlx_lm.models.glm4.Glm4Attention.__call__ with nn.QuantizedLinear projections",
                    "mlx_lm.models.cache.KVCache, prefilled in one update",
                    "mlx_lm.models.base.create_attention_mask",
                    "one token per call, as a decode loop drives the layer",
                ])
            }
            // One policy case per backend: its shipped regime table, checked
            // only where that table applies.
            AttentionCase::AppendPolicy {
                backend,
                start,
                end,
            } => {
                let (backends, reason): (&'static [Backend], &'static str) = match backend {
                    Backend::Cpu => (
                        &[Backend::Cpu],
                        "the measured CPU regime table applies to the CPU backend only",
                    ),
                    Backend::Metal => (
                        &[Backend::Metal],
                        "the origin's Metal regime table applies to the Metal backend only",
                    ),
                    Backend::Cuda => (
                        &[Backend::Cuda],
                        "the measured CUDA regime table applies to the CUDA backend only",
                    ),
                };
                Case::finding(name, "attention/append", REFERENCE_APPEND, move |ctx| {
                    check_window(start, end)?;
                    run_policy(ctx, start, end, shipped_table(backend))
                })
                .only_on(backends, reason)
                .deep_beyond(end, LONG_WINDOW)
            }
            AttentionCase::AppendCrossing { start, end } => {
                Case::finding(name, "attention/append", REFERENCE_APPEND, move |ctx| {
                    check_window(start, end)?;
                    run_crossing(ctx, start, end)
                })
                .deep_beyond(end, LONG_WINDOW)
            }
            AttentionCase::BoundaryFinder => Case::finding(
                name,
                "attention/boundary-finder",
                REFERENCE_FINDER,
                run_finder,
            )
            .deep(),
        }
    }
}

pub fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for (start, end) in WINDOWS {
        let window = format!("cache{start}-{end}");
        cases.push(described(
            format!("attention/decode/{GRAPH}/M1/{window}"),
            &AttentionCase::DecodeM1 { start, end },
        ));
        for backend in [Backend::Cpu, Backend::Metal, Backend::Cuda] {
            cases.push(described(
                format!("attention/append/{GRAPH}/policy-{backend}/{window}"),
                &AttentionCase::AppendPolicy {
                    backend,
                    start,
                    end,
                },
            ));
        }
        cases.push(described(
            format!("attention/append/{GRAPH}/crossing/{window}"),
            &AttentionCase::AppendCrossing { start, end },
        ));
    }
    cases.push(described(
        format!("attention/boundary-finder/{GRAPH}/chunk{MAX_APPEND_CHUNK}"),
        &AttentionCase::BoundaryFinder,
    ));
    cases
}

/// Drops the memoised scenarios (the port's M = 1 trajectories), so the
/// next run computes them again (benches measure cold runs).
pub fn reset_memo() {
    reset_scenarios();
}

/// The run's base seed (every case adds its own offset to it; scenarios
/// shared between cases must not depend on the case).
fn run_seed(ctx: &Ctx) -> u64 {
    ctx.run_seed()
}

fn window_scenario(ctx: &Ctx, start: usize, end: usize) -> Result<Arc<Scenario>, CaseError> {
    scenario(SHAPE, run_seed(ctx), ctx.backend(), start, end)
}

/// The reference path that ran, per backend.
fn path(backend: Backend) -> &'static str {
    match backend {
        Backend::Cpu => "mlx.core (cpu: sdpa unfused fallback)",
        Backend::Metal => "mlx.core (metal: fused sdpa)",
        // MLX 0.32.2's CUDA `use_fallback`: the sdpa-vector kernel where it
        // supports the shape (decode rows), the unfused ops otherwise.
        Backend::Cuda => "mlx.core (cuda: sdpa vector or unfused fallback)",
    }
}

fn run_m1(ctx: &Ctx, start: usize, end: usize) -> Result<CaseOutput, CaseError> {
    let sc = window_scenario(ctx, start, end)?;
    let w = &sc.weights;
    fn projection(p: &step::HostProjection) -> reference::attention::Projection<'_> {
        reference::attention::Projection {
            weight: &p.weight,
            scales: &p.scales,
            biases: &p.biases,
        }
    }
    let graph = reference::attention::Graph {
        n_heads: SHAPE.n_heads,
        n_kv_heads: SHAPE.n_kv_heads,
        head_dim: SHAPE.head_dim,
        rotary_dims: SHAPE.rotary_dims,
        rope_base: f64::from(SHAPE.rope_base),
        group_size: SHAPE.spec.group_size,
        bits: SHAPE.spec.bits,
    };
    let rows = reference::attention::attention_decode_m1(
        ctx,
        &sc.x,
        [
            projection(&w.q),
            projection(&w.k),
            projection(&w.v),
            projection(&w.o),
        ],
        &sc.k0,
        &sc.v0,
        graph,
    )?;
    let reference = [rows.attn, rows.y, rows.keys, rows.values];
    let mut out = CaseOutput::new(path(ctx.backend()));
    for ((name, port), reference) in OUTPUTS.iter().zip(sc.m1.outputs()).zip(&reference) {
        out.compare(name, port, reference);
    }
    Ok(out)
}

/// Chunk sizes `table` chooses from cache length `start` to `end`.
pub fn policy_partition(table: &RegimeTable, start: usize, end: usize) -> Vec<usize> {
    let mut partition = Vec::new();
    let mut at = start;
    while at < end {
        let chunk = table.append_chunk_size(at).min(end - at);
        partition.push(chunk);
        at += chunk;
    }
    partition
}

fn backend_name(table: &RegimeTable) -> String {
    format!("{:?}", table.backend()).to_lowercase()
}

fn run_policy(
    ctx: &Ctx,
    start: usize,
    end: usize,
    table: RegimeTable,
) -> Result<CaseOutput, CaseError> {
    let sc = window_scenario(ctx, start, end)?;
    let partition = policy_partition(&table, start, end);
    let chunked = sc.run_partition(&partition)?;
    let diff = chunked.diff(&sc.m1);
    let mut out = CaseOutput::new(path(ctx.backend()));
    for (name, t) in OUTPUTS.iter().zip(chunked.outputs()) {
        out.digest(&format!("{name} (chunked)"), t);
    }
    Ok(out.with_finding(json!({
        "table": backend_name(&table),
        "table_boundaries": table.boundaries(),
        "cache": [start, end],
        "partition": partition,
        "equal": diff.equal(),
        "outputs": diff.relations_json(),
        "first_differing_token": diff.first_token.map(|t| json!({"index": t, "kv_len": start + t + 1})),
    })))
}

/// Metal boundaries `b` whose straddling chunk of 4 (KV lengths `b-1 ..=
/// b+2`) lies inside the window.
fn crossing_chunks(start: usize, end: usize) -> Vec<(usize, usize)> {
    let half = MAX_APPEND_CHUNK / 2;
    RegimeTable::metal()
        .boundaries()
        .iter()
        .filter(|&&b| b >= start + half && b - half + MAX_APPEND_CHUNK <= end)
        .map(|&b| (b, b - half))
        .collect()
}

fn run_crossing(ctx: &Ctx, start: usize, end: usize) -> Result<CaseOutput, CaseError> {
    let sc = window_scenario(ctx, start, end)?;
    let mut out = CaseOutput::new(path(ctx.backend()));
    let mut chunks = Vec::new();
    let mut all_equal = true;
    for (boundary, cache_len) in crossing_chunks(start, end) {
        let probe = sc.probe(cache_len, MAX_APPEND_CHUNK)?;
        for (name, t) in OUTPUTS.iter().zip(probe.outputs.outputs()) {
            out.digest(&format!("{name} (chunk at {cache_len})"), t);
        }
        all_equal &= probe.diff.equal();
        chunks.push(json!({
            "metal_boundary": boundary,
            "kv": [cache_len + 1, cache_len + MAX_APPEND_CHUNK],
            "equal": probe.diff.equal(),
            "outputs": probe.diff.relations_json(),
            "first_differing_token": probe.diff.first_token.map(|t| json!({"index": t, "kv_len": cache_len + t + 1})),
        }));
    }
    if chunks.is_empty() {
        return Err(CaseError::Harness(format!(
            "window {start}..{end} straddles no Metal boundary"
        )));
    }
    Ok(out.with_finding(json!({ "cache": [start, end], "equal": all_equal, "chunks": chunks })))
}

/// Probes on the memoised scenarios: inside a [`WINDOWS`] window when the
/// chunk fits one, else a scenario of exactly the chunk's tokens.
pub struct ScenarioProbe {
    pub run_seed: u64,
    pub backend: Backend,
}

impl AppendProbe for ScenarioProbe {
    type Error = CaseError;
    fn matches(&mut self, cache_len: usize, chunk: usize) -> Result<bool, CaseError> {
        let (start, end) = WINDOWS
            .iter()
            .copied()
            .find(|&(a, b)| a <= cache_len && cache_len + chunk <= b)
            .unwrap_or((cache_len, cache_len + chunk));
        let sc = scenario(SHAPE, self.run_seed, self.backend, start, end)?;
        Ok(sc.probe(cache_len, chunk)?.diff.equal())
    }
}

/// The boundary finder on this backend (see [`finder`]), for chunks of
/// [`MAX_APPEND_CHUNK`] around the default candidates.
pub fn find_on(run_seed: u64, backend: Backend) -> Result<finder::BoundarySearch, CaseError> {
    let mut probe = ScenarioProbe { run_seed, backend };
    find_boundaries(&mut probe, &candidates(backend), MAX_APPEND_CHUNK)
}

/// The finder's candidates: on the CPU (measured empty) the powers of two
/// and the Metal table; on GPU backends, dense ones.
fn candidates(backend: Backend) -> Vec<usize> {
    let metal = RegimeTable::metal();
    if backend.is_gpu() {
        finder::dense_candidates(metal.boundaries())
    } else {
        default_candidates(metal.boundaries())
    }
}

/// The regime table `layers` ships for a backend.
fn shipped_table(backend: Backend) -> RegimeTable {
    match backend {
        Backend::Cpu => RegimeTable::cpu(),
        Backend::Metal => RegimeTable::metal(),
        Backend::Cuda => RegimeTable::cuda(),
    }
}

fn run_finder(ctx: &Ctx) -> Result<CaseOutput, CaseError> {
    let search = find_on(run_seed(ctx), ctx.backend())?;
    let table = shipped_table(ctx.backend());
    let mut out = CaseOutput::new("port only");
    let bits: Vec<u8> = search
        .boundaries
        .iter()
        .flat_map(|&b| (b as i32).to_le_bytes())
        .collect();
    out.digest(
        "boundaries",
        &HostTensor::new(DType::Int32, vec![search.boundaries.len()], bits)?,
    );
    let probes: Vec<_> = search
        .probes
        .iter()
        .map(|p| json!([p.cache_len, p.chunk, p.matched]))
        .collect();
    Ok(out.with_finding(json!({
        "backend": ctx.backend().as_str(),
        "chunk": search.chunk,
        "candidates": candidates(ctx.backend()),
        "pattern": search.pattern(candidates(ctx.backend()).len()),
        "probe_budget_exhausted": search.probe_budget_exhausted,
        "probes": probes,
        "failing_runs": search.failing_runs,
        "boundaries": search.boundaries,
        "unresolved": search.unresolved,
        "never_matches": search.never_matches,
        "shipped_table": table.boundaries(),
        "shipped_max_chunk": table.max_chunk(),
        // A one-token table is right exactly when chunking is not exact.
        "shipped_table_agrees": if table.max_chunk() == 1 {
            search.pattern(candidates(ctx.backend()).len()) != "no boundaries"
        } else {
            search.boundaries == table.boundaries()
        },
    })))
}

#[cfg(test)]
mod exact_tests {
    use std::sync::Arc;

    use exact::attention::{decode_m1, DecodeInputs, Graph};
    use exact::{check, Exact, Float, Format, Model, QuantizedMatrix};

    use super::scenario::Scenario;
    use super::step::{HostProjection, HostWeights, QWEN35_LIKE};
    use oracle::HostTensor;
    use crate::exactness::values;
    use crate::inputs::Inputs;

    fn matrix<'a>(
        p: &HostProjection,
        codes: &'a [u8],
        s: &'a [f64],
        b: &'a [f64],
    ) -> QuantizedMatrix<'a> {
        let bits = QWEN35_LIKE.spec.bits as usize;
        QuantizedMatrix {
            format: Format::Affine,
            bits,
            group_size: QWEN35_LIKE.spec.group_size as usize,
            rows: p.weight.shape[0],
            cols: p.weight.shape[1] * 32 / bits,
            packed: codes,
            scales: s,
            scale_codes: &[],
            biases: b,
        }
    }

    /// The x86-64 CPU attention decode on enclosures (`exact::attention`'s
    /// module doc, "Emulated on enclosures"), over 6 seeds of the suite's
    /// graph (Qwen3.5-like, head_dim 256, bf16) at a short cache: every
    /// output MLX's CPU computes (through the port, bit-equal to the
    /// reference) is within its bound, and `attn` and `y` are informative
    /// (some value exceeds its bound), which the worst-case bound alone
    /// was not; `y` given the `attn` o_proj read is the emulated loop's
    /// value bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_cpu_attention_decode_stays_within_its_enclosure_over_many_seeds() {
        let shape = QWEN35_LIKE;
        let (start, end) = (61, 64);
        for seed in 0..6u64 {
            let weights =
                Arc::new(HostWeights::seeded(&mut Inputs::new(7000 + seed), &shape).unwrap());
            let sc = Scenario::generate(shape, weights.clone(), 9000 + seed, start, end).unwrap();
            let ps = [&weights.q, &weights.k, &weights.v, &weights.o];
            let sb: Vec<(Vec<f64>, Vec<f64>)> = ps
                .iter()
                .map(|p| (values(&p.scales), values(&p.biases)))
                .collect();
            let projections =
                std::array::from_fn(|i| matrix(ps[i], &ps[i].weight.bytes, &sb[i].0, &sb[i].1));
            let (x, k0, v0) = (values(&sc.x), values(&sc.k0), values(&sc.v0));
            let inp = DecodeInputs {
                x: &x,
                x_dtype: Float::Bfloat16,
                projections,
                scales_dtypes: [Float::Bfloat16; 4],
                k0: &k0,
                v0: &v0,
                l0: start,
                k0_dtype: Some(Float::Bfloat16),
                v0_dtype: Some(Float::Bfloat16),
                graph: Graph {
                    n_heads: shape.n_heads,
                    n_kv_heads: shape.n_kv_heads,
                    head_dim: shape.head_dim,
                    rotary_dims: shape.rotary_dims,
                    rope_base: f64::from(shape.rope_base),
                },
                attn_read: None,
                read: None,
            };
            let mut d = decode_m1(&inp, Model::Cpu).unwrap();
            // y given the attention output o_proj read (the port's, as
            // the glue records the reference's).
            let attn_read = values(&sc.m1.attn);
            let with_read = DecodeInputs {
                attn_read: Some(&attn_read),
                ..inp
            };
            let given = decode_m1(&with_read, Model::Cpu).unwrap();
            // Without the attention (the long windows' check; the prefill
            // unread): the same keys, values and y given attn.
            let cheap = exact::attention::decode_m1_without_attention(
                &DecodeInputs {
                    k0: &[],
                    v0: &[],
                    projections: with_read.projections.clone(),
                    ..with_read
                },
                Model::Cpu,
            )
            .unwrap();
            assert!(cheap.attn.is_empty(), "seed {seed}");
            assert_eq!(
                (&cheap.keys, &cheap.values, &cheap.y),
                (&given.keys, &given.values, &given.y),
                "seed {seed}"
            );
            let e = Exact::from_tracked("t", Model::Cpu, vec![given.y.len()], &given.y);
            let side = check(&values(&sc.m1.y), &e);
            assert!(side.within() && side.max_ratio == 0.0, "seed {seed} y given attn: {side:?}");
            // The Gpu model given what the attention read (the port's q_proj
            // on these rows, its cached keys and values): the CPU's `attn`
            // (its unfused fallback, one of the paths the enclosure hulls)
            // lies within it, and it is informative.
            let q_layer = weights.q.layer(shape.spec).unwrap();
            let xa = sc.x.to_array().reshape(&[1, (end - start) as i32, shape.hidden as i32]).unwrap();
            let q_read = values(&HostTensor::from_array(&q_layer.forward(&xa).unwrap()).unwrap());
            let (k_read, v_read) = (values(&sc.m1.keys), values(&sc.m1.values));
            let read = exact::attention::DecodeRead {
                queries: &q_read,
                keys: &k_read,
                values: &v_read,
            };
            let gpu = decode_m1(
                &DecodeInputs {
                    read: Some(read),
                    projections: with_read.projections.clone(),
                    ..with_read
                },
                Model::Gpu,
            )
            .unwrap();
            let e = Exact::from_tracked("t", Model::Gpu, vec![gpu.attn.len()], &gpu.attn);
            let side = check(&values(&sc.m1.attn), &e);
            assert!(side.within(), "seed {seed} Gpu attn given what it read: {side:?}");
            let informative = e.value.iter().zip(&e.bound).filter(|(v, b)| v.abs() > **b).count();
            assert!(
                informative * 2 > gpu.attn.len(),
                "seed {seed} Gpu attn: {informative} of {} informative",
                gpu.attn.len()
            );
            // A recorded query off its bound marks its head's attn outside.
            let mut q_bad = q_read.clone();
            q_bad[3] *= 1.5;
            q_bad[3] += 1.0;
            let bad = decode_m1(
                &DecodeInputs {
                    read: Some(exact::attention::DecodeRead { queries: &q_bad, ..read }),
                    projections: with_read.projections.clone(),
                    ..with_read
                },
                Model::Gpu,
            )
            .unwrap();
            let e = Exact::from_tracked("t", Model::Gpu, vec![bad.attn.len()], &bad.attn);
            let side = check(&values(&sc.m1.attn), &e);
            assert!(!side.within(), "seed {seed}: a wrong recorded query passed");
            d.attn = given.attn;
            let outs = [&d.attn, &d.y, &d.keys, &d.values];
            for ((name, port), tracked) in super::OUTPUTS.iter().zip(sc.m1.outputs()).zip(outs) {
                let e = Exact::from_tracked("t", Model::Cpu, vec![tracked.len()], tracked);
                let side = check(&values(port), &e);
                assert!(side.within(), "seed {seed} {name}: {side:?}");
                if *name == "attn" || *name == "y" {
                    let informative = e.value.iter().zip(&e.bound).any(|(v, b)| v.abs() > *b);
                    assert!(informative, "seed {seed} {name}: uninformative");
                }
            }
        }
    }

    /// Issue 41, item 5: a window above `EXACT_MAX_KV` (8192 + 2 keys) on
    /// x86-64 CPU. `attn` given what the attention read
    /// (`exact::attention::decode_m1_attn_given_read`, MLX's fallback
    /// emulated in its order: `exact::sdpa_cpu`) holds MLX's CPU output
    /// (the port's, bit-equal to the reference) as a point, bit for bit,
    /// over 2 seeds; planted faults are flagged: the last key dropped from
    /// the last token's attention, the last 32 value rows accumulated twice
    /// (both computed by the same emulation), a recorded query off q_proj's
    /// value, and the reference's output with one element moved by one bf16
    /// ulp.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_cpu_attn_above_exact_max_kv_is_the_emulated_fallback_and_faults_are_flagged() {
        use exact::interval::Iv;
        use exact::sdpa_cpu::{sdpa_heads, KvHead};
        let shape = QWEN35_LIKE;
        let (start, end) = (crate::reference::attention::EXACT_MAX_KV, crate::reference::attention::EXACT_MAX_KV + 2);
        let (h, hkv, d) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
        let graph = Graph {
            n_heads: h,
            n_kv_heads: hkv,
            head_dim: d,
            rotary_dims: shape.rotary_dims,
            rope_base: f64::from(shape.rope_base),
        };
        for seed in 0..2u64 {
            let weights =
                Arc::new(HostWeights::seeded(&mut Inputs::new(7100 + seed), &shape).unwrap());
            let sc = Scenario::generate(shape, weights.clone(), 9100 + seed, start, end).unwrap();
            let ps = [&weights.q, &weights.k, &weights.v, &weights.o];
            let sb: Vec<(Vec<f64>, Vec<f64>)> = ps
                .iter()
                .map(|p| (values(&p.scales), values(&p.biases)))
                .collect();
            let projections =
                std::array::from_fn(|i| matrix(ps[i], &ps[i].weight.bytes, &sb[i].0, &sb[i].1));
            let (x, k0, v0) = (values(&sc.x), values(&sc.k0), values(&sc.v0));
            let attn_read = values(&sc.m1.attn);
            let q_layer = weights.q.layer(shape.spec).unwrap();
            let xa = sc.x.to_array().reshape(&[1, (end - start) as i32, shape.hidden as i32]).unwrap();
            let q_read = values(&HostTensor::from_array(&q_layer.forward(&xa).unwrap()).unwrap());
            let (k_read, v_read) = (values(&sc.m1.keys), values(&sc.m1.values));
            let read = exact::attention::DecodeRead {
                queries: &q_read,
                keys: &k_read,
                values: &v_read,
            };
            let inp = DecodeInputs {
                x: &x,
                x_dtype: Float::Bfloat16,
                projections,
                scales_dtypes: [Float::Bfloat16; 4],
                k0: &k0,
                v0: &v0,
                l0: start,
                k0_dtype: Some(Float::Bfloat16),
                v0_dtype: Some(Float::Bfloat16),
                graph,
                attn_read: Some(&attn_read),
                read: Some(read),
            };
            let out = exact::attention::decode_m1_attn_given_read(&inp, Model::Cpu).unwrap();
            assert_eq!(out.attn.len(), attn_read.len());
            let e = Exact::from_tracked("t", Model::Cpu, vec![out.attn.len()], &out.attn);
            let side = check(&attn_read, &e);
            assert!(side.within() && side.max_ratio == 0.0, "seed {seed} attn: {side:?}");
            // Every element a point: the bound is float64's slack alone.
            let worst = e
                .value
                .iter()
                .zip(&e.bound)
                .map(|(v, b)| b / v.abs().max(1e-30))
                .fold(0.0, f64::max);
            assert!(out.attn.iter().all(|a| a.e == 0.0) && worst < 1e-9, "seed {seed}: {worst:e}");
            // One element one bf16 ulp off: outside.
            let mut moved = attn_read.clone();
            moved[7] = f64::from(half::bf16::from_bits(half::bf16::from_f64(moved[7]).to_bits() + 1));
            assert!(!check(&moved, &e).within(), "seed {seed}: one ulp passed");
            // The last token's heads: its key dropped, the last 32 value
            // rows twice.
            let tok = end - start - 1;
            let w = hkv * d;
            let rows = |vscale: &dyn Fn(usize) -> f64, upto: usize| {
                let owned: Vec<(Vec<f64>, Vec<f64>)> = (0..upto)
                    .map(|j| {
                        let (k, v) = if j < start {
                            (&k0[j * d..(j + 1) * d], &v0[j * d..(j + 1) * d])
                        } else {
                            let at = (j - start) * w;
                            (&k_read[at..at + d], &v_read[at..at + d])
                        };
                        (k.to_vec(), v.iter().map(|&x| x * vscale(j)).collect())
                    })
                    .collect();
                KvHead::new(d, owned.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
            };
            let qs: Vec<Vec<Iv>> = (0..h)
                .map(|hh| {
                    let at = (tok * h + hh) * d;
                    exact::attention::cpu_roped_query(&q_read[at..at + d], end - 1, graph, Float::Bfloat16)
                })
                .collect();
            let last = |heads: Vec<Vec<Iv>>| -> Vec<f64> {
                let mut a = attn_read.clone();
                for (hh, row) in heads.iter().enumerate() {
                    for (c, iv) in row.iter().enumerate() {
                        a[(tok * h + hh) * d + c] = iv.lo;
                    }
                }
                a
            };
            let kv = rows(&|_| 1.0, end);
            // The emulation at every key reproduces the checked value.
            let same = last(sdpa_heads(&qs, &kv, end, 0.0625, Float::Bfloat16).unwrap());
            assert!(check(&same, &e).within(), "seed {seed}");
            let dropped = last(sdpa_heads(&qs, &kv, end - 1, 0.0625, Float::Bfloat16).unwrap());
            let s = check(&dropped, &e);
            assert!(!s.within(), "seed {seed}: a dropped last key passed");
            let twice = rows(&|j| if j + 32 >= end { 2.0 } else { 1.0 }, end);
            let doubled = last(sdpa_heads(&qs, &twice, end, 0.0625, Float::Bfloat16).unwrap());
            assert!(!check(&doubled, &e).within(), "seed {seed}: a doubled tail passed");
            // A recorded query off q_proj's value marks its head.
            let mut q_bad = q_read.clone();
            q_bad[3] = f64::from(half::bf16::from_f64(q_bad[3] * 1.5 + 1.0));
            let bad = exact::attention::decode_m1_attn_given_read(
                &DecodeInputs {
                    read: Some(exact::attention::DecodeRead { queries: &q_bad, ..read }),
                    projections: inp.projections.clone(),
                    ..inp
                },
                Model::Cpu,
            )
            .unwrap();
            // Token 0, head 0 marked: bound 0 at q_proj's value, which the
            // kernel reading the wrong query does not compute.
            assert!(bad.attn[..d].iter().all(|a| a.e == 0.0), "seed {seed}");
            let e = Exact::from_tracked("t", Model::Cpu, vec![bad.attn.len()], &bad.attn);
            let q_wrong =
                exact::attention::cpu_roped_query(&q_bad[..d], start, graph, Float::Bfloat16);
            let kv0 = rows(&|_| 1.0, start + 1);
            let wrong = sdpa_heads(&[q_wrong], &kv0, start + 1, 0.0625, Float::Bfloat16).unwrap();
            let mut from_wrong = attn_read.clone();
            for (c, iv) in wrong[0].iter().enumerate() {
                from_wrong[c] = iv.lo;
            }
            assert!(!check(&from_wrong, &e).within(), "seed {seed}: a wrong query passed");
        }
    }

    /// The ports of MLX's CPU `simd::exp` and Cephes `sin` / `cos`
    /// (`exact::sdpa_cpu::{mlx_exp, mlx_sincos}`, what the emulated RoPE and
    /// softmax use) are MLX's CPU kernels bit for bit, on 60 000 arguments
    /// each: softmax arguments down to -90 (the flush below -88), angles up
    /// to 70 000 (the RoPE positions of the longest window) and around 0.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_ported_exp_sin_cos_are_mlx_cpu_kernels_bit_for_bit() {
        use exact::sdpa_cpu::{mlx_exp, mlx_sincos};
        use mlx_rs::{Array, Stream};
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let xs: Vec<f32> = (0..60_000)
            .map(|i| match i % 3 {
                0 => (-90.0 + 91.0 * next()) as f32,
                1 => (70_000.0 * next()) as f32,
                _ => (-20.0 + 40.0 * next()) as f32,
            })
            .collect();
        let a = Array::from_slice(&xs, &[xs.len() as i32]);
        let (c, s, e) = mlx_rs::with_stream(&Stream::cpu(), || {
            (a.cos().unwrap(), a.sin().unwrap(), a.exp().unwrap())
        });
        for t in [&c, &s, &e] {
            t.eval().unwrap();
        }
        let (c, s, e) = (c.as_slice::<f32>(), s.as_slice::<f32>(), e.as_slice::<f32>());
        let mut differ = [0usize; 3];
        for (i, &x) in xs.iter().enumerate() {
            differ[0] += usize::from(mlx_sincos(x, false).map(f32::to_bits) != Some(c[i].to_bits()));
            differ[1] += usize::from(mlx_sincos(x, true).map(f32::to_bits) != Some(s[i].to_bits()));
            differ[2] += usize::from(mlx_exp(x).to_bits() != e[i].to_bits());
        }
        assert_eq!(differ, [0, 0, 0], "cos, sin, exp arguments whose bits differ");
    }
}
