//! The shape explorer: samples case descriptions where kernels switch,
//! checks each three ways, shrinks every violation to its smallest
//! reproducing description, and keeps it (`cargo xtask explore`).
//!
//! Checks per sample:
//! - (a) port vs reference, bit for bit (a violation when they differ);
//! - (b) both against the exact-math oracle (a violation when either side
//!   is outside its derived bound);
//! - (c) invariances, recorded as findings for the regime map, never
//!   violations: the port's batched forward against the same rows alone;
//!   for `gather_qmm`, sorted against unsorted routing and the batch
//!   against each token alone; for SDPA, the batch against each request
//!   alone, a chunk against its rows alone (M = 1) and the cache-buffer
//!   view against the contiguous one.
//!
//! Samples run many to a process, in one interpreter, as serving does.
//! Deterministic: sample `i` of seed `s` is drawn from its own generator
//! (seeded by `s` and `i`), so shards (`i % n`) and reruns draw the same.
//!
//! Families so far: `quantized/linear` (`quantized_matmul`),
//! `quantized/switch` (`gather_qmm`), `attention/sdpa` (SDPA on a KV
//! cache: batch composition, chunk vs rows alone, cache layout) and
//! `position/mrope` (Qwen3.5 interleaved mRoPE: sections, rotary dims,
//! vision grids, decode offsets; a batch against each row alone). Each family's description is the
//! serde data its fixed cases are built from (`families::describe`).

pub mod plant;
pub mod rate;
pub mod report;
pub mod strategy;

use std::time::{Duration, Instant};

use oracle::Oracle;
use proptest::strategy::ValueTree;
use serde::{Deserialize, Serialize};

use crate::case::{Backend, Case};
use crate::exactness::ExactClass;
use crate::families::attention::sdpa::{KvView, SdpaShape};
use crate::families::describe::{self, Described};
use crate::families::position::mrope::shape::MropeShape;
use crate::families::position::mrope::MropeCase;
use crate::families::quantized::linear::LinearCase;
use crate::families::quantized::linear::LinearShape;
use crate::families::quantized::switch::SwitchCase;
use crate::families::quantized::switch::SwitchShape;
use crate::runner::{self, RunOptions, Verdict};

/// One sample as data: the family's description and the inputs' seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "family")]
pub enum Description {
    #[serde(rename = "quantized/linear")]
    QuantizedLinear { shape: LinearShape, seed: u64 },
    #[serde(rename = "quantized/switch")]
    QuantizedSwitch { shape: SwitchShape, seed: u64 },
    #[serde(rename = "attention/sdpa")]
    AttentionSdpa { shape: SdpaShape, seed: u64 },
    #[serde(rename = "position/mrope")]
    PositionMrope { shape: MropeShape, seed: u64 },
}

impl Description {
    pub fn family(&self) -> &'static str {
        match self {
            Description::QuantizedLinear { .. } => "quantized/linear",
            Description::QuantizedSwitch { .. } => "quantized/switch",
            Description::AttentionSdpa { .. } => "attention/sdpa",
            Description::PositionMrope { .. } => "position/mrope",
        }
    }

    pub fn seed(&self) -> u64 {
        match self {
            Description::QuantizedLinear { seed, .. }
            | Description::QuantizedSwitch { seed, .. }
            | Description::AttentionSdpa { seed, .. }
            | Description::PositionMrope { seed, .. } => *seed,
        }
    }

    /// `<prefix>/<the case name of the shape>/s<seed>`.
    pub fn name(&self, prefix: &str) -> String {
        match self {
            Description::QuantizedLinear { shape, seed } => {
                format!("{prefix}/{}/s{seed}", shape.name())
            }
            Description::QuantizedSwitch { shape, seed } => {
                format!("{prefix}/{}/s{seed}", shape.name())
            }
            Description::AttentionSdpa { shape, seed } => {
                format!("{prefix}/{}/s{seed}", shape.name())
            }
            Description::PositionMrope { shape, seed } => {
                format!("{prefix}/{}/s{seed}", shape.name())
            }
        }
    }

    /// What a kernel is compiled for (CUDA compiles at first use): samples
    /// of one class share their kernels.
    pub fn kernel_class(&self) -> String {
        match self {
            Description::QuantizedLinear { shape, .. } => {
                format!("{}/{}/{}", self.family(), shape.spec, shape.dtype.name())
            }
            Description::QuantizedSwitch { shape, .. } => format!(
                "{}/{}/{}/{}",
                self.family(),
                shape.spec,
                shape.dtype.name(),
                if shape.sorted { "sorted" } else { "unsorted" }
            ),
            // CUDA's SDPA picks cuDNN or its vector kernels from the dtype,
            // head_dim, M = 1 or not, and the keys' layout.
            Description::AttentionSdpa { shape, .. } => format!(
                "{}/{}/D{}/{}/{}",
                self.family(),
                shape.dtype.name(),
                shape.head_dim,
                if shape.m == 1 { "decode" } else { "chunk" },
                match shape.kv_view {
                    KvView::Contiguous => "contiguous",
                    KvView::CacheBuffer => "cache-buffer",
                }
            ),
            Description::PositionMrope { shape, .. } => format!(
                "{}/{}/rot{}/{}",
                self.family(),
                shape.dtype.name(),
                shape.rotary_dim,
                if shape.decode.is_some() {
                    "decode"
                } else {
                    "prefill"
                }
            ),
        }
    }

    /// Why the description cannot be run, if so (kept files are data).
    pub fn check(&self) -> Result<(), String> {
        match self {
            Description::QuantizedLinear { shape, .. } => shape.check(),
            Description::QuantizedSwitch { shape, .. } => shape.check(),
            Description::AttentionSdpa { shape, .. } => shape.check(),
            Description::PositionMrope { shape, .. } => shape.check(),
        }
    }

    /// The registry's description of this sample as a must-equal case
    /// named `<prefix>/…`, with the sample's own seed (not one derived
    /// from the name).
    pub fn described(&self, prefix: &str) -> Described {
        let mut d = match self {
            Description::QuantizedLinear { shape, .. } => {
                describe::described(self.name(prefix), &LinearCase::Shape(shape.clone()))
            }
            Description::QuantizedSwitch { shape, .. } => {
                describe::described(self.name(prefix), &SwitchCase::Shape(shape.clone()))
            }
            Description::AttentionSdpa { shape, .. } => {
                describe::described(self.name(prefix), shape)
            }
            Description::PositionMrope { shape, .. } => {
                describe::described(self.name(prefix), &MropeCase::Apply(shape.clone()))
            }
        };
        d.seed = self.seed();
        d
    }

    /// The description as a must-equal case named `<prefix>/…`, built
    /// from [`Description::described`] as the registry builds every case.
    pub fn case(&self, prefix: &str) -> Case {
        let d = self.described(prefix);
        describe::build_or_failing(&d)
    }

    /// The multiply-adds of one forward (saturating): M·K·N for the
    /// quantized families (switch: routed rows), B·H·L·M·D for SDPA (twice:
    /// scores and values), B·L·(Hq + Hk)·rotary_dim for mRoPE. What the
    /// explore bench calls a small shape.
    pub fn work(&self) -> usize {
        let product = |dims: &[usize]| dims.iter().fold(1usize, |a, d| a.saturating_mul(*d));
        match self {
            Description::AttentionSdpa { shape, .. } => product(&[
                2,
                shape.batch,
                shape.n_heads,
                shape.kv_len,
                shape.m,
                shape.head_dim,
            ]),
            Description::PositionMrope { shape, .. } => {
                let window = shape.decode.map_or(shape.prompt_len(), |(_, l)| l);
                product(&[
                    shape.rows.len(),
                    window,
                    shape.q_heads + shape.k_heads,
                    shape.rotary_dim,
                ])
            }
            _ => {
                let (m, k, n) = self.mkn();
                product(&[m, k, n])
            }
        }
    }

    /// The sample's point in the regime map: (M, K, N) for the quantized
    /// families (switch: M is the routed rows, tokens × top), (B, L, M)
    /// for `attention/sdpa` (requests, KV length, query rows), (B, L,
    /// rotary_dim) for `position/mrope` (rows, window tokens, rotated
    /// channels).
    pub fn mkn(&self) -> (usize, usize, usize) {
        match self {
            Description::QuantizedLinear { shape, .. } => (
                shape.batch.iter().product::<usize>() * shape.m,
                shape.k,
                shape.n,
            ),
            Description::QuantizedSwitch { shape, .. } => {
                (shape.batch * shape.len * shape.top, shape.k, shape.n)
            }
            Description::AttentionSdpa { shape, .. } => (shape.batch, shape.kv_len, shape.m),
            Description::PositionMrope { shape, .. } => (
                shape.rows.len(),
                shape.decode.map_or(shape.prompt_len(), |(_, len)| len),
                shape.rotary_dim,
            ),
        }
    }

    /// Simpler neighbours, simplest first: what the greedy pass after
    /// proptest's shrinking tries (proptest's binary search stalls on a
    /// region such as "N odd": every midpoint it tries is even).
    fn simpler(&self) -> Vec<Description> {
        let mut out = Vec::new();
        match self {
            Description::QuantizedLinear { shape, seed } => {
                let with = |f: &dyn Fn(&mut LinearShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::QuantizedLinear {
                        shape: s,
                        seed: *seed,
                    }
                };
                if shape.x_view != crate::families::quantized::linear::XView::Contiguous {
                    out.push(with(&|s| {
                        s.x_view = crate::families::quantized::linear::XView::Contiguous
                    }));
                }
                if !shape.batch.is_empty() {
                    out.push(with(&|s| s.batch.clear()));
                }
                if shape.bias != crate::families::quantized::linear::Bias::None {
                    out.push(with(&|s| {
                        s.bias = crate::families::quantized::linear::Bias::None
                    }));
                }
                if shape.scales_dtype.is_some() {
                    out.push(with(&|s| s.scales_dtype = None));
                }
                if shape.dtype != oracle::DType::Bfloat16 {
                    out.push(with(&|s| s.dtype = oracle::DType::Bfloat16));
                }
                for (spec, k) in simpler_specs(shape.spec, shape.k) {
                    out.push(with(&|s| {
                        s.spec = spec;
                        s.k = k;
                    }));
                }
                let g = shape.spec.group_size as usize;
                for k in (1..shape.k / g).map(|n| n * g) {
                    out.push(with(&|s| s.k = k));
                }
                for m in 1..shape.m {
                    out.push(with(&|s| s.m = m));
                }
                for n in 1..shape.n {
                    out.push(with(&|s| s.n = n));
                }
                if *seed != 0 {
                    out.push(Description::QuantizedLinear {
                        shape: shape.clone(),
                        seed: 0,
                    });
                }
            }
            Description::QuantizedSwitch { shape, seed } => {
                let with = |f: &dyn Fn(&mut SwitchShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::QuantizedSwitch {
                        shape: s,
                        seed: *seed,
                    }
                };
                if shape.bias {
                    out.push(with(&|s| s.bias = false));
                }
                if shape.sorted {
                    out.push(with(&|s| s.sorted = false));
                }
                if shape.dtype != oracle::DType::Bfloat16 {
                    out.push(with(&|s| s.dtype = oracle::DType::Bfloat16));
                }
                for (spec, k) in simpler_specs(shape.spec, shape.k) {
                    out.push(with(&|s| {
                        s.spec = spec;
                        s.k = k;
                    }));
                }
                for batch in 1..shape.batch {
                    out.push(with(&|s| s.batch = batch));
                }
                for len in 1..shape.len {
                    out.push(with(&|s| s.len = len));
                }
                for top in 1..shape.top {
                    out.push(with(&|s| s.top = top));
                }
                for experts in shape.top.max(1)..shape.experts {
                    out.push(with(&|s| s.experts = experts));
                }
                let g = shape.spec.group_size as usize;
                for k in (1..shape.k / g).map(|n| n * g) {
                    out.push(with(&|s| s.k = k));
                }
                for n in 1..shape.n {
                    out.push(with(&|s| s.n = n));
                }
                if *seed != 0 {
                    out.push(with(&|_| {}));
                    if let Some(Description::QuantizedSwitch { seed, .. }) = out.last_mut() {
                        *seed = 0;
                    }
                }
            }
            Description::AttentionSdpa { shape, seed } => {
                let with = |f: &dyn Fn(&mut SdpaShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::AttentionSdpa {
                        shape: s,
                        seed: *seed,
                    }
                };
                if shape.kv_view != KvView::Contiguous {
                    out.push(with(&|s| s.kv_view = KvView::Contiguous));
                }
                if shape.dtype != oracle::DType::Bfloat16 {
                    out.push(with(&|s| s.dtype = oracle::DType::Bfloat16));
                }
                for b in 1..shape.batch {
                    out.push(with(&|s| s.batch = b));
                }
                for m in 1..shape.m {
                    out.push(with(&|s| s.m = m));
                }
                // GQA ratio kept, heads fewer; then the ratio lowered.
                let ratio = shape.n_heads / shape.n_kv_heads.max(1);
                for kv in 1..shape.n_kv_heads {
                    out.push(with(&|s| {
                        s.n_kv_heads = kv;
                        s.n_heads = kv * ratio;
                    }));
                }
                for r in 1..ratio {
                    out.push(with(&|s| s.n_heads = s.n_kv_heads * r));
                }
                for d in [8, 16, 32, 64, 128]
                    .into_iter()
                    .filter(|&d| d < shape.head_dim)
                {
                    out.push(with(&|s| s.head_dim = d));
                }
                // KV lengths: halvings, then single steps down (a boundary
                // such as L = 256 is found by the greedy fixpoint).
                let mut l = shape.kv_len / 2;
                while l >= shape.m.max(1) && l > 0 {
                    out.push(with(&|s| s.kv_len = l));
                    l /= 2;
                }
                if shape.kv_len > shape.m {
                    out.push(with(&|s| s.kv_len -= 1));
                }
                if *seed != 0 {
                    out.push(Description::AttentionSdpa {
                        shape: shape.clone(),
                        seed: 0,
                    });
                }
            }
            Description::PositionMrope { shape, seed } => {
                use crate::families::position::mrope::shape::PromptPiece;
                let with = |f: &dyn Fn(&mut MropeShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::PositionMrope {
                        shape: s,
                        seed: *seed,
                    }
                };
                if shape.rows.len() > 1 {
                    out.push(with(&|s| s.rows.truncate(1)));
                }
                if shape.dtype != oracle::DType::Bfloat16 {
                    out.push(with(&|s| s.dtype = oracle::DType::Bfloat16));
                }
                if let Some((extra, len)) = shape.decode {
                    out.push(with(&|s| s.decode = None));
                    for e in [0, extra / 2].into_iter().filter(|&e| e < extra) {
                        out.push(with(&|s| s.decode = Some((e, len))));
                    }
                    for l in 1..len {
                        out.push(with(&|s| s.decode = Some((extra, l))));
                    }
                }
                if shape.rows.len() == 1 {
                    let row = &shape.rows[0];
                    for i in 0..row.len() {
                        if row.len() > 1 {
                            out.push(with(&|s| {
                                s.rows[0].remove(i);
                            }));
                        }
                        match row[i] {
                            PromptPiece::Text { tokens } if tokens > 1 => {
                                out.push(with(&|s| s.rows[0][i] = PromptPiece::Text { tokens: 1 }));
                                out.push(with(&|s| {
                                    s.rows[0][i] = PromptPiece::Text { tokens: tokens / 2 }
                                }));
                            }
                            PromptPiece::Text { .. } => {}
                            p => out.push(with(&|s| {
                                s.rows[0][i] = PromptPiece::Text { tokens: p.tokens() }
                            })),
                        }
                    }
                }
                if (shape.q_heads, shape.k_heads) != (1, 1) {
                    out.push(with(&|s| {
                        s.q_heads = 1;
                        s.k_heads = 1;
                    }));
                }
                if shape.head_dim > shape.rotary_dim {
                    out.push(with(&|s| s.head_dim = s.rotary_dim));
                }
                for r in [2, 4, 8, 16, 32, 64]
                    .into_iter()
                    .filter(|&r| r < shape.rotary_dim)
                {
                    out.push(with(&|s| {
                        s.rotary_dim = r;
                        s.head_dim = s.head_dim.max(r);
                    }));
                }
                for i in 0..3 {
                    let v = shape.mrope_section[i];
                    for lower in [0, v / 2, v.saturating_sub(1)]
                        .into_iter()
                        .filter(|&l| l < v)
                    {
                        out.push(with(&|s| s.mrope_section[i] = lower));
                    }
                }
                if shape.rope_theta != 10_000.0 {
                    out.push(with(&|s| s.rope_theta = 10_000.0));
                }
                if *seed != 0 {
                    out.push(Description::PositionMrope {
                        shape: shape.clone(),
                        seed: 0,
                    });
                }
            }
        }
        out
    }

    /// The sweeps that map a violation's extent: per axis, the description
    /// with that axis set to each value (the others as found).
    fn axes(&self) -> Vec<(&'static str, Vec<(usize, Description)>)> {
        const MS: [usize; 21] = [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65,
        ];
        const NS: [usize; 20] = [
            1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129,
        ];
        match self {
            Description::QuantizedLinear { shape, seed } => {
                let with = |f: &dyn Fn(&mut LinearShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::QuantizedLinear {
                        shape: s,
                        seed: *seed,
                    }
                };
                let g = shape.spec.group_size as usize;
                vec![
                    ("M", MS.iter().map(|&m| (m, with(&|s| s.m = m))).collect()),
                    ("N", NS.iter().map(|&n| (n, with(&|s| s.n = n))).collect()),
                    (
                        "K",
                        (1..=8)
                            .map(|groups| (groups * g, with(&|s| s.k = groups * g)))
                            .collect(),
                    ),
                ]
            }
            Description::QuantizedSwitch { shape, seed } => {
                let with = |f: &dyn Fn(&mut SwitchShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::QuantizedSwitch {
                        shape: s,
                        seed: *seed,
                    }
                };
                let g = shape.spec.group_size as usize;
                vec![
                    (
                        "tokens (L)",
                        MS.iter().map(|&l| (l, with(&|s| s.len = l))).collect(),
                    ),
                    ("N", NS.iter().map(|&n| (n, with(&|s| s.n = n))).collect()),
                    (
                        "K",
                        (1..=8)
                            .map(|groups| (groups * g, with(&|s| s.k = groups * g)))
                            .collect(),
                    ),
                    (
                        "experts",
                        (1..=16)
                            .map(|e| {
                                (
                                    e,
                                    with(&|s| {
                                        s.experts = e;
                                        s.top = s.top.min(e);
                                    }),
                                )
                            })
                            .collect(),
                    ),
                ]
            }
            Description::AttentionSdpa { shape, seed } => {
                let with = |f: &dyn Fn(&mut SdpaShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::AttentionSdpa {
                        shape: s,
                        seed: *seed,
                    }
                };
                const LS: [usize; 20] = [
                    1, 2, 8, 31, 32, 33, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024,
                    1025, 4096, 4097,
                ];
                vec![
                    (
                        "L (KV length)",
                        LS.iter().map(|&l| (l, with(&|s| s.kv_len = l))).collect(),
                    ),
                    (
                        "B (requests)",
                        (1..=8).map(|b| (b, with(&|s| s.batch = b))).collect(),
                    ),
                    (
                        "M (query rows)",
                        [1, 2, 3, 4, 7, 8, 9, 16]
                            .iter()
                            .map(|&m| (m, with(&|s| s.m = m)))
                            .collect(),
                    ),
                ]
            }
            Description::PositionMrope { shape, seed } => {
                let with = |f: &dyn Fn(&mut MropeShape)| {
                    let mut s = shape.clone();
                    f(&mut s);
                    Description::PositionMrope {
                        shape: s,
                        seed: *seed,
                    }
                };
                let len = shape.decode.map_or(1, |(_, l)| l);
                const OFFSETS: [usize; 9] = [0, 1, 255, 256, 4095, 4096, 65_535, 65_536, 1 << 20];
                let half = shape.rotary_dim / 2;
                vec![
                    (
                        "decode offset beyond the prompt",
                        OFFSETS
                            .iter()
                            .map(|&e| (e, with(&|s| s.decode = Some((e, len)))))
                            .collect(),
                    ),
                    (
                        "rotary_dim (head_dim at least it)",
                        [8, 16, 32, 64, 128, 256]
                            .iter()
                            .map(|&r| {
                                (
                                    r,
                                    with(&|s| {
                                        s.rotary_dim = r;
                                        s.head_dim = s.head_dim.max(r);
                                    }),
                                )
                            })
                            .collect(),
                    ),
                    (
                        "mrope_section sum beyond rotary_dim / 2",
                        (0..=4usize)
                            .map(|extra| {
                                (
                                    extra,
                                    with(&|s| {
                                        let [a, b, _] = s.mrope_section;
                                        s.mrope_section[2] = (half + extra).saturating_sub(a + b);
                                    }),
                                )
                            })
                            .collect(),
                    ),
                ]
            }
        }
    }

    /// Invariances (c) of the port alone, by name: whether each holds.
    fn invariances(&self) -> Result<Vec<(String, bool)>, String> {
        match self {
            Description::QuantizedLinear { shape, seed } => shape
                .rows_match_batched(*seed)
                .map(|same| vec![("batched = rows alone".to_owned(), same)])
                .map_err(|e| e.to_string()),
            Description::QuantizedSwitch { shape, seed } => {
                shape.invariances(*seed).map_err(|e| e.to_string())
            }
            Description::AttentionSdpa { shape, seed } => {
                shape.invariances(*seed).map_err(|e| e.to_string())
            }
            Description::PositionMrope { shape, seed } => {
                shape.invariances(*seed).map_err(|e| e.to_string())
            }
        }
    }
}

/// The specs simpler than `spec` (earlier in [`strategy::specs`]), each
/// with K holding the same number of groups.
fn simpler_specs(
    spec: layers::quantized::QuantSpec,
    k: usize,
) -> Vec<(layers::quantized::QuantSpec, usize)> {
    let specs = strategy::specs();
    let groups = k / spec.group_size as usize;
    let at = specs.iter().position(|s| *s == spec).unwrap_or(0);
    specs[..at]
        .iter()
        .map(|s| (*s, groups * s.group_size as usize))
        .collect()
}

/// What one sample showed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Observation {
    pub bits_equal: bool,
    /// The first differing element, as the report's comparison line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_diff: Option<String>,
    /// The exact oracle's class of the output (absent: not in its scope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<ExactClass>,
    /// Invariances of the port (c), by name: whether each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invariances: Vec<(String, bool)>,
    /// The case could not run (a harness or port error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub time_ms: f64,
}

/// The kinds of violation the explorer shrinks and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// Port and reference bits differ.
    Bits,
    /// A side is outside the exact oracle's bound.
    Exact,
    /// The port raised where the reference computed (a port that refuses
    /// what the reference accepts is a conformance failure).
    PortError,
    /// The case errored otherwise (the reference refused the description,
    /// or the harness).
    Error,
}

impl Observation {
    pub fn violation(&self) -> Option<Violation> {
        if let Some(e) = &self.error {
            Some(if crate::case::is_port_error(e) {
                Violation::PortError
            } else {
                Violation::Error
            })
        } else if !self.bits_equal {
            Some(Violation::Bits)
        } else if self.exact.is_some_and(|c| c != ExactClass::Within) {
            Some(Violation::Exact)
        } else {
            None
        }
    }
}

/// Runs one description in this process and observes it.
pub fn observe(oracle: &Oracle, backend: Backend, d: &Description) -> Observation {
    let started = Instant::now();
    let case = d.case("explore");
    let options = RunOptions {
        backend,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let result = runner::run_case(&case, oracle, &options);
    let mut o = Observation {
        bits_equal: result.verdict == Verdict::Pass,
        first_diff: None,
        exact: None,
        invariances: Vec::new(),
        error: None,
        time_ms: 0.0,
    };
    match (&result.verdict, &result.output) {
        (Verdict::Pass | Verdict::Fail, Some(out)) => {
            o.first_diff = out
                .outputs
                .iter()
                .find(|x| !x.comparison.is_equal())
                .map(|x| format!("{}: {}", x.name, x.comparison.summary()));
            o.exact = out
                .exact_checks()
                .map(|(_, e)| e.class)
                .max_by_key(|c| *c as u8);
            match d.invariances() {
                Ok(v) => o.invariances = v,
                Err(e) => o.error = Some(format!("invariance: {e}")),
            }
        }
        _ => o.error = Some(result.message.unwrap_or_else(|| "no output".into())),
    }
    o.time_ms = started.elapsed().as_secs_f64() * 1e3;
    o
}

/// How a search runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub budget: Duration,
    /// At most this many samples (of this shard).
    pub max_samples: Option<usize>,
    /// Families to sample (empty: all).
    pub families: Vec<String>,
    /// `(i, n)`: this process takes samples `j` with `j % n == i`.
    pub shard: (usize, usize),
    pub backend: Backend,
    /// Shrink steps per violation, at most (the budget bounds shrinking and
    /// extent sweeps too: on a GPU every new shape compiles kernels).
    pub max_shrink_steps: usize,
    /// Sweep each shrunk violation along its axes (M, N, K).
    pub extent: bool,
}

/// Samples drawn at a time and run grouped by kernel class.
const BLOCK: usize = 32;

/// One sample's record for the regime map.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sampled {
    pub index: usize,
    /// When it ran in this process (0 first).
    #[serde(default)]
    pub order: usize,
    pub description: Description,
    pub observation: Observation,
}

/// A violation, shrunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Found {
    pub kind: Violation,
    /// The sample as first drawn.
    pub original: Description,
    /// The smallest description that still shows `kind`.
    pub minimal: Description,
    pub observation: Observation,
    pub shrink_steps: usize,
    /// The samples this process ran just before the first sighting (a
    /// violation that depends on what ran before shows here).
    pub preceded_by: Vec<String>,
    /// Where the violation extends: the minimal description swept along
    /// each axis, and whether each value still shows it.
    pub extent: Vec<Extent>,
    /// The first sighting rerun alone in a fresh process: whether it shows
    /// there too (false: it misbehaves only after `preceded_by`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone: Option<Alone>,
}

/// A sample rerun alone, in a fresh process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Alone {
    /// It shows the same kind of violation alone.
    pub shows: bool,
    pub observation: Observation,
}

impl Found {
    /// What was seen, in one line: the first differing element, the
    /// error, or (a bound violation with equal bits) that.
    pub fn seen(&self) -> &str {
        self.observation
            .first_diff
            .as_deref()
            .or(self.observation.error.as_deref())
            .unwrap_or("bits equal; outside the exact bound")
    }
}

/// One axis of a violation's extent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Extent {
    pub axis: String,
    /// The values that show the violation.
    pub shows: Vec<usize>,
    /// The values that do not.
    pub clean: Vec<usize>,
}

/// Sweeps `minimal` along its axes.
fn extent(
    oracle: &Oracle,
    config: &Config,
    deadline: Instant,
    minimal: &Description,
    kind: Violation,
) -> Vec<Extent> {
    minimal
        .axes()
        .into_iter()
        .map(|(axis, points)| {
            let mut e = Extent {
                axis: axis.into(),
                shows: Vec::new(),
                clean: Vec::new(),
            };
            for (value, d) in points {
                if d.check().is_err() || Instant::now() >= deadline {
                    continue;
                }
                match observe(oracle, config.backend, &d).violation() == Some(kind) {
                    true => e.shows.push(value),
                    false => e.clean.push(value),
                }
            }
            e
        })
        .collect()
}

/// A whole search's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Search {
    pub seed: u64,
    pub shard: (usize, usize),
    pub backend: String,
    pub families: Vec<String>,
    pub samples: Vec<Sampled>,
    pub found: Vec<Found>,
    pub wall_s: f64,
}

/// Runs a search: draws samples until the budget or the sample cap, and
/// shrinks the first violation of each kind in each kernel class (later
/// ones are in the samples and the regime map).
pub fn search(
    oracle: &Oracle,
    config: &Config,
    progress: &dyn Fn(usize, usize),
    alone: &dyn Fn(&Description) -> Option<Observation>,
) -> Result<Search, String> {
    let strategies = strategy::for_families(&config.families)?;
    let started = Instant::now();
    // A budget too large to add to now is a century (never a panic).
    let budget = config.budget.min(Duration::from_secs(100 * 365 * 86_400));
    let out_of_time = || started.elapsed() >= budget || runner::interrupted();
    let (shard, shards) = config.shard;
    let mut samples = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let mut index = 0usize;
    // Samples are drawn in blocks and run grouped by kernel class, so a
    // GPU compiles each class's kernels once per block (the first sample of
    // a class in this process carries its compilation; `explore.md`
    // reports that time apart). Which samples a seed draws never depends
    // on the order they run in.
    let mut block: std::collections::VecDeque<(usize, Box<dyn ValueTree<Value = Description>>)> =
        Default::default();
    loop {
        if out_of_time() || config.max_samples.is_some_and(|m| samples.len() >= m) {
            break;
        }
        if block.is_empty() {
            // A sample cap draws exactly the capped samples (the first by
            // index), so shards of a capped search merge into the whole.
            let want = config
                .max_samples
                .map_or(BLOCK, |m| BLOCK.min(m - samples.len()));
            let mut drawn = Vec::new();
            // The budget and an interrupt stop the drawing too (a shard of
            // a huge `n` matches rarely).
            while drawn.len() < want && !out_of_time() {
                let j = index;
                let Some(next) = index.checked_add(1) else {
                    break;
                };
                index = next;
                if j % shards != shard {
                    continue;
                }
                let (family, strategy) = &strategies[j % strategies.len()];
                drawn.push((j, strategy::draw(strategy, config.seed, j, family)?));
            }
            drawn.sort_by_cached_key(|(j, t)| (t.current().kernel_class(), *j));
            if drawn.is_empty() {
                break;
            }
            block.extend(drawn);
        }
        let (j, mut tree) = block.pop_front().expect("a block was just drawn");
        let description = tree.current();
        let observation = observe(oracle, config.backend, &description);
        // One shrink per kind of violation and kernel class: the next
        // sighting in a class already shrunk is recorded, not shrunk again.
        let known = |kind| {
            found.iter().any(|f: &Found| {
                f.kind == kind && f.original.kernel_class() == description.kernel_class()
            })
        };
        if let Some(kind) = observation.violation().filter(|k| !known(*k)) {
            let preceded_by = samples
                .iter()
                .rev()
                .take(3)
                .map(|s: &Sampled| s.description.name("explore"))
                .collect();
            let deadline = started + budget;
            // Before shrinking: does the first sighting show alone, in a
            // fresh process (nothing run before it)?
            let rerun = alone(&description).map(|o| Alone {
                shows: o.violation() == Some(kind),
                observation: o,
            });
            let (minimal, minimal_observation, steps) = shrink(
                oracle,
                config,
                deadline,
                &mut *tree,
                kind,
                description.clone(),
                observation.clone(),
            );
            if !found.iter().any(|f| f.minimal == minimal) {
                let extent = if config.extent {
                    extent(oracle, config, deadline, &minimal, kind)
                } else {
                    Vec::new()
                };
                found.push(Found {
                    kind,
                    original: description.clone(),
                    minimal,
                    observation: minimal_observation,
                    shrink_steps: steps,
                    preceded_by,
                    extent,
                    alone: rerun,
                });
            }
        }
        if let Some(f) = found.last().filter(|_| observation.violation().is_some()) {
            if f.original == description {
                crate::errln!(
                    "explore: {:?} at {} (shrunk from {} in {} steps)",
                    f.kind,
                    f.minimal.name("explore"),
                    f.original.name("explore"),
                    f.shrink_steps
                );
            }
        }
        samples.push(Sampled {
            index: j,
            order: samples.len(),
            description,
            observation,
        });
        progress(samples.len(), found.len());
    }
    // By index (each keeps its run order in `order`).
    samples.sort_by_key(|s| s.index);
    Ok(Search {
        seed: config.seed,
        shard: config.shard,
        backend: config.backend.as_str().into(),
        families: strategies.iter().map(|(f, _)| f.clone()).collect(),
        samples,
        found,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// proptest's shrinking (simplify while it still fails, complicate when
/// it passes) with this sample's violation as the failure, then a greedy
/// pass over [`Description::simpler`] to a fixpoint: the result is a
/// description none of whose simpler neighbours shows the violation.
fn shrink(
    oracle: &Oracle,
    config: &Config,
    deadline: Instant,
    tree: &mut dyn ValueTree<Value = Description>,
    kind: Violation,
    mut best: Description,
    mut best_observation: Observation,
) -> (Description, Observation, usize) {
    let mut steps = 0;
    let mut simplified = tree.simplify();
    let open = |steps: usize| steps < config.max_shrink_steps && Instant::now() < deadline;
    while simplified && open(steps) {
        steps += 1;
        let candidate = tree.current();
        let o = observe(oracle, config.backend, &candidate);
        if o.violation() == Some(kind) {
            best = candidate;
            best_observation = o;
            simplified = tree.simplify();
        } else {
            simplified = tree.complicate();
        }
    }
    'greedy: while open(steps) {
        for candidate in best.simpler() {
            if !open(steps) {
                break 'greedy;
            }
            steps += 1;
            let o = observe(oracle, config.backend, &candidate);
            if o.violation() == Some(kind) {
                best = candidate;
                best_observation = o;
                continue 'greedy;
            }
        }
        break;
    }
    (best, best_observation, steps)
}

/// The first `n` samples of `seed` over every family, by index: what a
/// search of `--seed seed --samples n` draws (before any shrinking). The
/// release gate runs them as cases on both sides (`conformance
/// --explore-samples n --explore-seed seed`).
pub fn samples(seed: u64, n: usize) -> Result<Vec<Description>, String> {
    let strategies = strategy::for_families(&[])?;
    (0..n)
        .map(|j| {
            let (family, strategy) = &strategies[j % strategies.len()];
            strategy::draw(strategy, seed, j, family).map(|t| t.current())
        })
        .collect()
}

/// Merges shard searches of one seed into one (samples in index order).
pub fn merge(mut shards: Vec<Search>) -> Result<Search, String> {
    let first = shards.first().ok_or("no shard reports to merge")?.clone();
    if shards
        .iter()
        .any(|s| s.seed != first.seed || s.backend != first.backend)
    {
        return Err("shard reports of different seeds or backends cannot be merged".into());
    }
    if shards.iter().any(|s| s.families != first.families) {
        return Err("shard reports of different --family sets cannot be merged: run every shard with the same families".into());
    }
    // Every shard of one split, once each: a partial merge would read as
    // the whole search.
    let n = first.shard.1;
    let mut have: Vec<usize> = shards.iter().map(|s| s.shard.0).collect();
    have.sort_unstable();
    if shards.iter().any(|s| s.shard.1 != n) || have != (0..n).collect::<Vec<_>>() {
        let missing: Vec<String> = (0..n)
            .filter(|i| !have.contains(i))
            .map(|i| format!("{i}/{n}"))
            .collect();
        return Err(format!(
            "these reports are not every shard of one {n}-way split (shards given: {}; missing: {}); merge all n shards of one search",
            shards.iter().map(|s| format!("{}/{}", s.shard.0, s.shard.1)).collect::<Vec<_>>().join(", "),
            if missing.is_empty() { "none, but the reports overlap: a shard appears twice".to_owned() } else { missing.join(", ") }
        ));
    }
    // Reports are data: every description must be one the suite can run.
    for s in &shards {
        for d in s
            .samples
            .iter()
            .map(|x| &x.description)
            .chain(s.found.iter().flat_map(|f| [&f.original, &f.minimal]))
        {
            d.check().map_err(|e| {
                format!(
                    "a report holds a description that cannot run ({}): {e}",
                    d.name("explore")
                )
            })?;
        }
    }
    let mut merged = Search {
        shard: (0, 1),
        samples: Vec::new(),
        found: Vec::new(),
        wall_s: 0.0,
        ..first
    };
    let mut seen = std::collections::BTreeSet::new();
    for s in shards.drain(..) {
        if let Some(dup) = s.samples.iter().find(|x| !seen.insert(x.index)) {
            return Err(format!(
                "shard reports overlap (sample {} is in two of them): merge each shard once",
                dup.index
            ));
        }
        merged.wall_s = merged.wall_s.max(s.wall_s);
        merged.samples.extend(s.samples);
        for f in s.found {
            if !merged.found.iter().any(|g| g.minimal == f.minimal) {
                merged.found.push(f);
            }
        }
    }
    merged.samples.sort_by_key(|s| s.index);
    Ok(merged)
}
