//! The explorer's data: what one sample is ([`Description`], each
//! family's serde parameters and seed), the strategies that draw them
//! ([`strategy`]), and the kept violations (`fixtures/explore/kept.json`).
//! The search, shrinking and reports are the tool's (the `explore` module of the `conformance` crate).

pub mod strategy;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::families::attention::sdpa::{KvView, SdpaShape};
use crate::families::describe::{self, Described};
use crate::families::position::mrope::shape::MropeShape;
use crate::families::position::mrope::MropeCase;
use crate::families::quantized::linear::LinearCase;
use crate::families::quantized::linear::LinearShape;
use crate::families::quantized::switch::SwitchCase;
use crate::families::quantized::switch::SwitchShape;
use conformance_core::case::Case;

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
        crate::families::build_or_failing(&d)
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
    pub fn simpler(&self) -> Vec<Description> {
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
    pub fn axes(&self) -> Vec<(&'static str, Vec<(usize, Description)>)> {
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
    pub fn invariances(&self) -> Result<Vec<(String, bool)>, String> {
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

/// One kept case in `fixtures/explore/kept.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub description: Description,
    pub backend: String,
    pub date: String,
    /// What the explorer saw (kind and first difference).
    pub seen: String,
}

/// `fixtures/explore/kept.json`.
pub fn kept_file(fixtures: &Path) -> PathBuf {
    fixtures.join("explore/kept.json")
}

/// The kept cases (none when the file does not exist); a file that is
/// not a list of kept descriptions is an error naming it.
pub fn read_kept(fixtures: &Path) -> Result<Vec<Kept>, String> {
    let path = kept_file(fixtures);
    // As a snapshot is read: no link followed, no FIFO blocked on, no
    // file larger than 16 MiB read.
    let bytes = match crate::store::read(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(format!("kept explorer cases: {e}")),
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: not UTF-8 text; restore it from git", path.display()))?;
    let kept: Vec<Kept> = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a list of kept explorer cases ({e}); restore it from git",
            path.display()
        )
    })?;
    let mut names = std::collections::BTreeSet::new();
    for k in &kept {
        let name = k.description.name("kept");
        k.description
            .check()
            .map_err(|e| format!("{}: {name}: {e}", path.display()))?;
        if !names.insert(name.clone()) {
            return Err(format!(
                "{}: {name} is kept twice; remove one",
                path.display()
            ));
        }
    }
    Ok(kept)
}
