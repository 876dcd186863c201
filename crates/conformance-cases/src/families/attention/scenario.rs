//! A decode scenario: seeded weights, a cache prefilled in one shot to
//! `start` tokens, the activations of the tokens that take it to `end`, and
//! the port's M = 1 trajectory over them. Chunked appends and boundary
//! probes are measured against that trajectory.
//!
//! Scenarios are memoised for the process (keyed by run seed, backend and
//! window): the M = 1 trajectory at 65k tokens costs seconds on CPU and is
//! deterministic, so the must-equal case, the findings and the boundary
//! finder of one window share it instead of recomputing it. The memo holds
//! host tensors only; [`reset_memo`] drops it (benches measure cold runs).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use oracle::{DType, HostTensor};

use super::step::{
    cache_layout, rows, stack_rows, AttentionShape, DecodeStep, HostWeights, KvCache,
};
use crate::case::{seed_of, Backend, CaseError};
use crate::inputs::Inputs;
use crate::relation::Relation;

/// The port's outputs over a scenario's tokens, token-major: `attn [W, H*D]`
/// (before `o_proj`), `y [W, hidden]`, roped `keys`/`values` `[W, H_kv*D]`.
#[derive(Debug, Clone)]
pub struct Trajectory {
    pub attn: HostTensor,
    pub y: HostTensor,
    pub keys: HostTensor,
    pub values: HostTensor,
}

/// Output names, in [`Trajectory::outputs`] order.
pub const OUTPUTS: [&str; 4] = ["attn", "y", "keys", "values"];

impl Trajectory {
    pub fn outputs(&self) -> [&HostTensor; 4] {
        [&self.attn, &self.y, &self.keys, &self.values]
    }

    /// Tokens `start..end` of every output.
    pub fn rows(&self, start: usize, end: usize) -> Trajectory {
        Trajectory {
            attn: rows(&self.attn, start, end),
            y: rows(&self.y, start, end),
            keys: rows(&self.keys, start, end),
            values: rows(&self.values, start, end),
        }
    }

    /// How `self` relates to `other` (same tokens), per output.
    pub fn diff(&self, other: &Trajectory) -> TrajectoryDiff {
        let tokens = self.attn.shape[0];
        let mut first_token = None;
        let relations = self
            .outputs()
            .into_iter()
            .zip(other.outputs())
            .map(|(a, b)| {
                let width = a.len() / tokens.max(1);
                let n = width * a.dtype.size();
                let differs =
                    |t: usize| a.bytes.get(t * n..(t + 1) * n) != b.bytes.get(t * n..(t + 1) * n);
                let rows = (0..tokens).filter(|&t| differs(t)).count();
                if let Some(r) = (0..tokens).find(|&t| differs(t)) {
                    first_token = Some(first_token.map_or(r, |f: usize| f.min(r)));
                }
                Relation::of(a, b).with_positions(rows)
            });
        let relations: Vec<Relation> = relations.collect();
        TrajectoryDiff {
            relations: relations.try_into().expect("four outputs"),
            first_token,
        }
    }
}

/// How each output ([`OUTPUTS`] order) relates, with `positions` counting
/// tokens, and the first token (index in the compared range) with any
/// difference.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryDiff {
    pub relations: [Relation; 4],
    pub first_token: Option<usize>,
}

impl TrajectoryDiff {
    pub fn equal(&self) -> bool {
        self.relations.iter().all(|r| r.equal)
    }

    /// `{"attn": relation, "y": …, "keys": …, "values": …}`.
    pub fn relations_json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = OUTPUTS
            .iter()
            .zip(&self.relations)
            .map(|(k, r)| ((*k).to_owned(), r.json()))
            .collect();
        serde_json::Value::Object(map)
    }
}

/// A chunk appended to the M = 1 cache state and compared with M = 1.
#[derive(Debug, Clone)]
pub struct ProbeOutcome {
    pub cache_len: usize,
    pub chunk: usize,
    pub diff: TrajectoryDiff,
    /// The chunk's outputs (digested by the cases that report the probe).
    pub outputs: Trajectory,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Scenario {
    pub shape: AttentionShape,
    /// Cache length after the one-shot prefill.
    pub start: usize,
    /// Cache length after the last token.
    pub end: usize,
    pub weights: Arc<HostWeights>,
    /// Token activations `[end - start, hidden]` bf16.
    pub x: HostTensor,
    /// Prefilled keys and values `[1, H_kv, start, D]` bf16.
    pub k0: HostTensor,
    pub v0: HostTensor,
    /// The port decoding the tokens one at a time.
    pub m1: Trajectory,
    probes: Mutex<BTreeMap<(usize, usize), Arc<ProbeOutcome>>>,
}

impl Scenario {
    /// Seeded inputs and the port's M = 1 trajectory. `weights` are shared
    /// by every scenario of a run; `seed` draws the token activations (host
    /// ChaCha, [`Inputs`]) and the key of the prefill K/V, which MLX's
    /// counter-based generator draws (`random.uniform` in f32, rounded to
    /// bf16): up to 2 × 16.8 M values at 65k tokens, far faster than the
    /// host generator. Both sides receive the same bits either way.
    pub fn generate(
        shape: AttentionShape,
        weights: Arc<HostWeights>,
        seed: u64,
        start: usize,
        end: usize,
    ) -> Result<Self, CaseError> {
        if end <= start {
            return Err(CaseError::Harness(format!(
                "empty decode window {start}..{end}"
            )));
        }
        let mut inputs = Inputs::new(seed);
        let x = inputs.uniform(DType::Bfloat16, &[end - start, shape.hidden], 1.0);
        let key_seed = inputs.integers(DType::Uint32, &[2], 0, 1 << 32).bytes;
        let key = mlx_rs::random::key(u64::from_le_bytes(
            key_seed[..8].try_into().expect("8 bytes"),
        ))?;
        let (k_key, v_key) = mlx_rs::random::split(&key, 2)?;
        let kv_shape = [
            1,
            shape.n_kv_heads as i32,
            start as i32,
            shape.head_dim as i32,
        ];
        let prefill = |key: &mlx_rs::Array| -> Result<HostTensor, CaseError> {
            let a = mlx_rs::random::uniform::<_, f32>(-1.0f32, 1.0f32, &kv_shape, key)?;
            Ok(HostTensor::from_array(
                &a.as_dtype(mlx_rs::Dtype::Bfloat16)?,
            )?)
        };
        let (k0, v0) = (prefill(&k_key)?, prefill(&v_key)?);
        let m1 = decode(&shape, &weights, &x, &k0, &v0, &vec![1; end - start])?;
        let scenario = Scenario {
            shape,
            start,
            end,
            weights,
            x,
            k0,
            v0,
            m1,
            probes: Mutex::new(BTreeMap::new()),
        };
        Ok(scenario)
    }

    /// Tokens decoded.
    pub fn tokens(&self) -> usize {
        self.end - self.start
    }

    fn step(&self) -> Result<DecodeStep, CaseError> {
        DecodeStep::new(self.shape, &self.weights)
    }

    /// Decodes every token, appending them in chunks of the sizes in
    /// `partition` (which must sum to [`Scenario::tokens`]); each chunk
    /// continues from the cache the previous chunks left.
    ///
    /// A chunk that starts from a cache bit-identical to M = 1's (every
    /// earlier token's keys and values equal M = 1's) is exactly the probe
    /// [`Scenario::probe`] would run (same cache bits, same inputs, same
    /// deterministic computation), so it is recorded as that probe.
    pub fn run_partition(&self, partition: &[usize]) -> Result<Trajectory, CaseError> {
        let run = decode(
            &self.shape,
            &self.weights,
            &self.x,
            &self.k0,
            &self.v0,
            partition,
        )?;
        let mut at = 0;
        let mut probes = self.probes.lock().expect("probe memo");
        for &size in partition {
            let before = run.rows(0, at);
            let m1_before = self.m1.rows(0, at);
            if before.keys != m1_before.keys || before.values != m1_before.values {
                break;
            }
            let outputs = run.rows(at, at + size);
            let diff = outputs.diff(&self.m1.rows(at, at + size));
            let cache_len = self.start + at;
            probes.entry((cache_len, size)).or_insert_with(|| {
                Arc::new(ProbeOutcome {
                    cache_len,
                    chunk: size,
                    diff,
                    outputs,
                })
            });
            at += size;
        }
        Ok(run)
    }

    /// Appends tokens `cache_len..cache_len + chunk` as one chunk to the
    /// cache the M = 1 trajectory had at `cache_len`, and compares the
    /// chunk's outputs with M = 1's. Memoised per `(cache_len, chunk)`.
    pub fn probe(&self, cache_len: usize, chunk: usize) -> Result<Arc<ProbeOutcome>, CaseError> {
        if cache_len < self.start || cache_len + chunk > self.end || chunk == 0 {
            return Err(CaseError::Harness(format!(
                "probe of {chunk} tokens at cache length {cache_len} is outside the scenario {}..{}",
                self.start, self.end
            )));
        }
        if let Some(done) = self
            .probes
            .lock()
            .expect("probe memo")
            .get(&(cache_len, chunk))
        {
            return Ok(done.clone());
        }
        let t0 = cache_len - self.start;
        let decoded = self.m1.rows(0, t0);
        let mut keys = Vec::new();
        let mut values = Vec::new();
        if self.start > 0 {
            keys.push(self.k0.to_array());
            values.push(self.v0.to_array());
        }
        if t0 > 0 {
            keys.push(cache_layout(&decoded.keys, &self.shape)?);
            values.push(cache_layout(&decoded.values, &self.shape)?);
        }
        let prefill = if keys.is_empty() {
            None
        } else {
            Some((
                mlx_rs::ops::concatenate(&keys, 2)?,
                mlx_rs::ops::concatenate(&values, 2)?,
            ))
        };
        let mut cache = KvCache::prefilled(prefill);
        let out = host(
            &self
                .step()?
                .forward(&rows(&self.x, t0, t0 + chunk).to_array(), &mut cache)?,
        )?;
        let diff = out.diff(&self.m1.rows(t0, t0 + chunk));
        let outcome = Arc::new(ProbeOutcome {
            cache_len,
            chunk,
            diff,
            outputs: out,
        });
        self.probes
            .lock()
            .expect("probe memo")
            .insert((cache_len, chunk), outcome.clone());
        Ok(outcome)
    }
}

/// Decodes the tokens `x` from a cache prefilled with `k0`/`v0`, appending
/// them in chunks of the sizes in `partition`.
fn decode(
    shape: &AttentionShape,
    weights: &HostWeights,
    x: &HostTensor,
    k0: &HostTensor,
    v0: &HostTensor,
    partition: &[usize],
) -> Result<Trajectory, CaseError> {
    if partition.iter().sum::<usize>() != x.shape[0] || partition.contains(&0) {
        return Err(CaseError::Harness(format!(
            "partition {partition:?} does not cover the {} tokens",
            x.shape[0]
        )));
    }
    let step = DecodeStep::new(*shape, weights)?;
    let prefill = (k0.shape[2] > 0).then(|| (k0.to_array(), v0.to_array()));
    let mut cache = KvCache::prefilled(prefill);
    let mut parts = Vec::with_capacity(partition.len());
    let mut at = 0;
    for &size in partition {
        let out = step.forward(&rows(x, at, at + size).to_array(), &mut cache)?;
        parts.push(host(&out)?);
        at += size;
    }
    let stack = |pick: fn(&Trajectory) -> &HostTensor| {
        stack_rows(&parts.iter().map(|p| pick(p).clone()).collect::<Vec<_>>())
    };
    Ok(Trajectory {
        attn: stack(|t| &t.attn),
        y: stack(|t| &t.y),
        keys: stack(|t| &t.keys),
        values: stack(|t| &t.values),
    })
}

fn host(out: &super::step::StepOutput) -> Result<Trajectory, CaseError> {
    Ok(Trajectory {
        attn: HostTensor::from_array(&out.attn)?,
        y: HostTensor::from_array(&out.y)?,
        keys: HostTensor::from_array(&out.keys)?,
        values: HostTensor::from_array(&out.values)?,
    })
}

type Slot<T> = Arc<OnceLock<Result<Arc<T>, String>>>;
type Key = (u64, &'static str, usize, usize);
type Memo<K, T> = Mutex<HashMap<K, Slot<T>>>;

fn memo() -> &'static Memo<Key, Scenario> {
    static MEMO: OnceLock<Memo<Key, Scenario>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

fn weights_memo() -> &'static Memo<(u64, &'static str), HostWeights> {
    static MEMO: OnceLock<Memo<(u64, &'static str), HostWeights>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The projections of run seed `run_seed`, shared by all its scenarios.
fn weights(
    shape: &AttentionShape,
    run_seed: u64,
    backend: Backend,
) -> Result<Arc<HostWeights>, CaseError> {
    let slot = weights_memo()
        .lock()
        .expect("weights memo")
        .entry((run_seed, backend.as_str()))
        .or_default()
        .clone();
    let seed = run_seed.wrapping_add(seed_of("attention/weights"));
    slot.get_or_init(|| {
        HostWeights::seeded(&mut Inputs::new(seed), shape)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(CaseError::Harness)
}

/// The scenario of window `start..end` for run seed `run_seed` on
/// `backend`: generated once per process, shared by every case.
pub fn scenario(
    shape: AttentionShape,
    run_seed: u64,
    backend: Backend,
    start: usize,
    end: usize,
) -> Result<Arc<Scenario>, CaseError> {
    let slot = memo()
        .lock()
        .expect("scenario memo")
        .entry((run_seed, backend.as_str(), start, end))
        .or_default()
        .clone();
    let seed = run_seed.wrapping_add(seed_of(&format!("attention/scenario/cache{start}-{end}")));
    slot.get_or_init(|| {
        let weights = weights(&shape, run_seed, backend).map_err(|e| e.to_string())?;
        Scenario::generate(shape, weights, seed, start, end)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(CaseError::Harness)
}

/// Drops every memoised scenario.
pub fn reset_memo() {
    memo().lock().expect("scenario memo").clear();
    weights_memo().lock().expect("weights memo").clear();
}
