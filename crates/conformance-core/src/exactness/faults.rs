//! The catalogue of realistic kernel faults, for measuring the exact
//! oracle's power (its mutation score).
//!
//! A fault is injected into the **reference's** output: it stands for a
//! kernel bug that port and reference share, which no bit comparison can
//! see. Each kind is a pure function of the real reference output and the
//! inputs the reference received ([`Sent`]):
//!
//! - an *input* fault ([`FaultKind::mutate`]) changes what the kernel
//!   effectively read (a K tail dropped or doubled, a group's scale from
//!   its neighbour, a batch row's KV from another row, a position off by
//!   one, two experts' rows swapped, the causal window one key short);
//!   the exact definition is evaluated on the faulty inputs, and the
//!   injected output is the reference's own output plus the difference
//!   `exact(faulty) − exact(true)`, rounded to the output's dtype (so the
//!   kernel's own legitimate rounding stays in it);
//! - an *output* fault ([`FaultKind::inject_output`]) changes the written
//!   output (the last N tile zero or stale, a block zero, rows swapped, a
//!   stride ignored, an intermediate kept in bf16, inv_freq in bf16).
//!
//! A kind applies where its inputs exist and it changes the output's bits;
//! elsewhere it is not counted. The oracle *flags* a injected output when
//! the reference is outside its bound ([`super::ExactCheck::measure`]).

use oracle::{Arg, DType, HostTensor};
use serde::{Deserialize, Serialize};

use super::{values, ExactCheck, ExactClass, ExactPair, Sent};

/// Width of a K tail or an N tile: the 32 of a SIMD group / a tile.
const TILE: usize = 32;

/// One kind of kernel fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The last 32 of K (the last partial group when K is not a multiple
    /// of 32) never accumulated: a K loop bound off by one tile.
    KTailDropped,
    /// The last 32 of K accumulated twice.
    KTailDoubled,
    /// The last quantization group's scale read from its neighbour group.
    GroupScaleFromNeighbour,
    /// The last quantization group's bias read from its neighbour group.
    GroupBiasFromNeighbour,
    /// Experts 0 and 1 swapped: each one's rows (weights, scales, biases)
    /// read at the other's offset.
    ExpertRowsSwapped,
    /// The last batch row's KV (cache keys and values) read from batch
    /// row 0: another request's cache.
    KvRowFromAnotherRow,
    /// The causal mask one key short: each query row misses its newest
    /// key.
    CausalMaskOffByOne,
    /// The softmax computed without subtracting the row's maximum score
    /// (in float32, as every MLX softmax accumulates): `exp` of a score
    /// above `ln(f32::MAX)` overflows and the row is NaN, as it is when
    /// every score underflows; elsewhere the result moves by float32
    /// roundings only, below the output's own rounding, and the kind does
    /// not apply (SDPA outputs).
    SoftmaxWithoutMax,
    /// Every position one further (a RoPE offset off by one).
    RopePositionOffByOne,
    /// inv_freq computed and stored in bf16 instead of float32.
    InvFreqInBf16,
    /// The output kept in bf16 somewhere inside (an accumulator or
    /// intermediate narrower than the claim): every element rounded to
    /// bf16 (outputs wider than bf16 only).
    Bf16Intermediate,
    /// The last N tile (the partial one, or the last 32 columns) never
    /// written: zeros.
    LastNTileZero,
    /// The last N tile holding the tile before it (written twice, the
    /// last tile never).
    LastNTileStale,
    /// One block of 16 elements never written: zeros.
    OneBlockZero,
    /// Every row computed from row 0: a row stride read as 0 (a
    /// contiguous operand read as a broadcast view, or back).
    StrideIgnored,
    /// Rows 0 and 1 written at each other's place.
    RowsSwapped,
}

impl FaultKind {
    pub const ALL: [FaultKind; 16] = [
        FaultKind::KTailDropped,
        FaultKind::KTailDoubled,
        FaultKind::GroupScaleFromNeighbour,
        FaultKind::GroupBiasFromNeighbour,
        FaultKind::ExpertRowsSwapped,
        FaultKind::KvRowFromAnotherRow,
        FaultKind::CausalMaskOffByOne,
        FaultKind::SoftmaxWithoutMax,
        FaultKind::RopePositionOffByOne,
        FaultKind::InvFreqInBf16,
        FaultKind::Bf16Intermediate,
        FaultKind::LastNTileZero,
        FaultKind::LastNTileStale,
        FaultKind::OneBlockZero,
        FaultKind::StrideIgnored,
        FaultKind::RowsSwapped,
    ];

    /// The kind's name (as in report.json).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KTailDropped => "k-tail-dropped",
            FaultKind::KTailDoubled => "k-tail-doubled",
            FaultKind::GroupScaleFromNeighbour => "group-scale-from-neighbour",
            FaultKind::GroupBiasFromNeighbour => "group-bias-from-neighbour",
            FaultKind::ExpertRowsSwapped => "expert-rows-swapped",
            FaultKind::KvRowFromAnotherRow => "kv-row-from-another-row",
            FaultKind::CausalMaskOffByOne => "causal-mask-off-by-one",
            FaultKind::SoftmaxWithoutMax => "softmax-without-max",
            FaultKind::RopePositionOffByOne => "rope-position-off-by-one",
            FaultKind::InvFreqInBf16 => "inv-freq-in-bf16",
            FaultKind::Bf16Intermediate => "bf16-intermediate",
            FaultKind::LastNTileZero => "last-n-tile-zero",
            FaultKind::LastNTileStale => "last-n-tile-stale",
            FaultKind::OneBlockZero => "one-block-zero",
            FaultKind::StrideIgnored => "stride-ignored",
            FaultKind::RowsSwapped => "rows-swapped",
        }
    }

    /// The inputs a kernel with this fault effectively reads, if the kind
    /// is an input fault that applies to these inputs.
    pub fn mutate(self, sent: &Sent) -> Option<Sent> {
        match self {
            FaultKind::KTailDropped => k_tail(sent, 0.0),
            FaultKind::KTailDoubled => k_tail(sent, 2.0),
            FaultKind::GroupScaleFromNeighbour => neighbour_group(sent, "scales"),
            FaultKind::GroupBiasFromNeighbour => neighbour_group(sent, "biases"),
            FaultKind::ExpertRowsSwapped => experts_swapped(sent),
            FaultKind::KvRowFromAnotherRow => kv_from_row0(sent),
            FaultKind::CausalMaskOffByOne => {
                // Read by the SDPA definition only (no glue sees it).
                sent.tensor("keys").ok()?;
                Some(sent.with(MASK_SHIFT, Arg::Int(1)))
            }
            FaultKind::SoftmaxWithoutMax => {
                // Read by the SDPA definition only (no glue sees it).
                sent.tensor("queries").ok()?;
                Some(sent.with(NO_MAX, Arg::Int(1)))
            }
            FaultKind::RopePositionOffByOne => positions_plus_one(sent),
            _ => None,
        }
    }

    /// The output a kernel with this fault writes, if the kind is an
    /// output fault that applies to `y` (the output of op `op`).
    pub fn inject_output(self, op: &str, y: &HostTensor) -> Option<HostTensor> {
        let float = matches!(y.dtype, DType::Float32 | DType::Float16 | DType::Bfloat16);
        if !float || y.is_empty() {
            return None;
        }
        let v = values(y);
        let n = *y.shape.last()?;
        let rows = v.len() / n.max(1);
        let mut out = v.clone();
        match self {
            FaultKind::InvFreqInBf16 if op == "inv_freq" && y.dtype != DType::Bfloat16 => {
                out.iter_mut().for_each(|x| *x = bf16(*x));
            }
            FaultKind::Bf16Intermediate if op != "inv_freq" && y.dtype != DType::Bfloat16 => {
                out.iter_mut().for_each(|x| *x = bf16(*x));
            }
            FaultKind::LastNTileZero | FaultKind::LastNTileStale => {
                let t = if n % TILE != 0 { n % TILE } else { TILE.min(n) };
                let stale = self == FaultKind::LastNTileStale;
                if stale && n < 2 * t {
                    return None;
                }
                for r in 0..rows {
                    for c in n - t..n {
                        out[r * n + c] = if stale { v[r * n + c - t] } else { 0.0 };
                    }
                }
            }
            FaultKind::OneBlockZero => {
                let start = (v.len() / 2).saturating_sub(8);
                let end = (start + 16).min(v.len());
                out[start..end].iter_mut().for_each(|x| *x = 0.0);
            }
            FaultKind::StrideIgnored | FaultKind::RowsSwapped if rows >= 2 => {
                for c in 0..n {
                    out[n + c] = v[c];
                    if self == FaultKind::RowsSwapped {
                        out[c] = v[n + c];
                    } else {
                        for r in 2..rows {
                            out[r * n + c] = v[c];
                        }
                    }
                }
            }
            _ => return None,
        }
        encode(&out, y)
    }
}

/// The argument the SDPA definition reads as a causal window one key
/// short (a fault only the exact definition is given).
pub const MASK_SHIFT: &str = "fault_mask_shift";

/// The argument the SDPA definition reads as a softmax without the max
/// subtraction ([`FaultKind::SoftmaxWithoutMax`]).
pub const NO_MAX: &str = "fault_softmax_without_max";

/// What [`FaultKind::SoftmaxWithoutMax`] makes of one row of scores (the
/// exact `scale * q . k_j`): NaN where float32's `exp` of the largest
/// overflows (above `ln(f32::MAX)`: inf / inf) or of every one underflows
/// (below `ln` of the smallest subnormal: 0 / 0); `None` where the row
/// keeps its value.
pub fn softmax_without_max(scores: &[f64]) -> Option<f64> {
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let overflow = f64::from(f32::MAX).ln();
    let underflow = (f64::from(f32::from_bits(1))).ln();
    (max > overflow || max < underflow).then_some(f64::NAN)
}

fn bf16(x: f64) -> f64 {
    half::bf16::from_f64(x).to_f64()
}

/// `values` in `like`'s dtype and shape (each rounded to nearest).
fn encode(values: &[f64], like: &HostTensor) -> Option<HostTensor> {
    let bytes: Vec<u8> = match like.dtype {
        DType::Float32 => values
            .iter()
            .flat_map(|v| (*v as f32).to_le_bytes())
            .collect(),
        DType::Float16 => values
            .iter()
            .flat_map(|v| half::f16::from_f64(*v).to_bits().to_le_bytes())
            .collect(),
        DType::Bfloat16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f64(*v).to_bits().to_le_bytes())
            .collect(),
        _ => return None,
    };
    HostTensor::new(like.dtype, like.shape.clone(), bytes).ok()
}

/// A float tensor with each value replaced by `f(index, value)`; other
/// dtypes: `None`.
fn remap(t: &HostTensor, f: impl Fn(usize, f64) -> f64) -> Option<HostTensor> {
    let v: Vec<f64> = values(t)
        .into_iter()
        .enumerate()
        .map(|(i, x)| f(i, x))
        .collect();
    encode(&v, t)
}

/// x's last 32 columns (or its last partial 32) scaled by `factor`.
fn k_tail(sent: &Sent, factor: f64) -> Option<Sent> {
    let x = sent.tensor("x").ok()?;
    let k = *x.shape.last()?;
    let t = if k % TILE != 0 { k % TILE } else { TILE };
    if k <= t {
        return None;
    }
    let x2 = remap(x, |i, v| if i % k >= k - t { v * factor } else { v })?;
    Some(sent.with("x", Arg::Tensor(x2)))
}

/// The weight argument's name (`weight` or `w`).
fn weight_name(sent: &Sent) -> Option<&'static str> {
    ["weight", "w"].into_iter().find(|n| sent.tensor(n).is_ok())
}

/// The last group's column of `name` (`scales` or `biases`, [.., G])
/// copied from group G − 2.
fn neighbour_group(sent: &Sent, name: &'static str) -> Option<Sent> {
    weight_name(sent)?;
    let s = sent.tensor(name).ok()?;
    let g = *s.shape.last()?;
    if g < 2 {
        return None;
    }
    let size = s.dtype.size();
    let mut bytes = s.bytes.clone();
    for row in bytes.chunks_mut(g * size) {
        let (head, last) = row.split_at_mut((g - 1) * size);
        last.copy_from_slice(&head[(g - 2) * size..]);
    }
    let s2 = HostTensor::new(s.dtype, s.shape.clone(), bytes).ok()?;
    Some(sent.with(name, Arg::Tensor(s2)))
}

/// `t` ([A, ..]) with its first-axis blocks `a` and `b` swapped.
fn swap_first_axis(t: &HostTensor, a: usize, b: usize) -> Option<HostTensor> {
    let n = *t.shape.first()?;
    if a.max(b) >= n || t.shape.len() < 2 {
        return None;
    }
    let block = t.bytes.len() / n;
    let mut bytes = t.bytes.clone();
    let (lo, hi) = (a.min(b), a.max(b));
    let (x, y) = bytes.split_at_mut(hi * block);
    x[lo * block..(lo + 1) * block].swap_with_slice(&mut y[..block]);
    HostTensor::new(t.dtype, t.shape.clone(), bytes).ok()
}

/// Experts 0 and 1's weights, scales and biases swapped (3-D stacks).
fn experts_swapped(sent: &Sent) -> Option<Sent> {
    let w = weight_name(sent)?;
    let wt = sent.tensor(w).ok()?;
    if wt.shape.len() != 3 || wt.shape[0] < 2 {
        return None;
    }
    let mut out = sent.with(w, Arg::Tensor(swap_first_axis(wt, 0, 1)?));
    for name in ["scales", "biases"] {
        if let Ok(t) = sent.tensor(name) {
            out = out.with(name, Arg::Tensor(swap_first_axis(t, 0, 1)?));
        }
    }
    Some(out)
}

/// The last batch row of the KV (`keys`/`values` or `k0`/`v0`, [B, ..])
/// replaced by row 0's.
fn kv_from_row0(sent: &Sent) -> Option<Sent> {
    let pairs = [("keys", "values"), ("k0", "v0")];
    let (k, v) = pairs.into_iter().find(|(k, _)| sent.tensor(k).is_ok())?;
    let mut out = sent.clone();
    for name in [k, v] {
        let t = sent.tensor(name).ok()?;
        let b = *t.shape.first()?;
        if b < 2 || t.is_empty() {
            return None;
        }
        let block = t.bytes.len() / b;
        let mut bytes = t.bytes.clone();
        let (first, rest) = bytes.split_at_mut((b - 1) * block);
        rest.copy_from_slice(&first[..block]);
        out = out.with(
            name,
            Arg::Tensor(HostTensor::new(t.dtype, t.shape.clone(), bytes).ok()?),
        );
    }
    Some(out)
}

/// Every position one further: a `positions` tensor (int32 / int64 /
/// float) plus one, or a `cache_offset` plus one.
fn positions_plus_one(sent: &Sent) -> Option<Sent> {
    if let Ok(offset) = sent.int("cache_offset") {
        return Some(sent.with("cache_offset", Arg::Int(offset + 1)));
    }
    let p = sent.tensor("positions").ok()?;
    let bytes: Vec<u8> = match p.dtype {
        DType::Int32 => p
            .bytes
            .chunks(4)
            .flat_map(|c| (i32::from_le_bytes(c.try_into().expect("4")) + 1).to_le_bytes())
            .collect(),
        DType::Int64 => p
            .bytes
            .chunks(8)
            .flat_map(|c| (i64::from_le_bytes(c.try_into().expect("8")) + 1).to_le_bytes())
            .collect(),
        _ => return Some(sent.with("positions", Arg::Tensor(remap(p, |_, v| v + 1.0)?))),
    };
    let p2 = HostTensor::new(p.dtype, p.shape.clone(), bytes).ok()?;
    Some(sent.with("positions", Arg::Tensor(p2)))
}

/// One injected fault measured: where, which kind, whether the oracle
/// flagged it, and its worst error over the bound.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultCheck {
    pub output: String,
    pub kind: FaultKind,
    /// The exact oracle put the injected reference outside its bound.
    pub flagged: bool,
    /// The injected output's worst |error| / bound (below 1: an escape);
    /// `None` where it is not finite (a bound of 0, a NaN): JSON has no
    /// infinity.
    pub max_ratio: Option<f64>,
    /// Elements the fault changed, of all.
    pub changed: usize,
    pub total: usize,
}

/// An input fault's effect on one output: the exact value of the op on
/// the faulty inputs (computed where the exact value is).
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    pub kind: FaultKind,
    pub value: Vec<f64>,
}

/// Every applicable fault injected into reference output `y` (output
/// `name`, with exact values `pair`), measured.
pub fn inject_all(name: &str, y: &HostTensor, pair: &ExactPair) -> Vec<FaultCheck> {
    let exact = &pair.reference;
    let mut out = Vec::new();
    for kind in FaultKind::ALL {
        let injected = match pair.variants.iter().find(|v| v.kind == kind) {
            Some(v) if v.value.len() == exact.value.len() && v.value.len() == y.len() => {
                let ys = values(y);
                let moved: Vec<f64> = ys
                    .iter()
                    .zip(v.value.iter().zip(&exact.value))
                    .map(|(y, (f, e))| if f == e { *y } else { y + (f - e) })
                    .collect();
                encode(&moved, y)
            }
            Some(_) => None,
            None => kind.inject_output(exact.op, y),
        };
        let Some(injected) = injected else { continue };
        let changed = (0..y.len())
            .filter(|&i| injected.bits(i) != y.bits(i))
            .count();
        if changed == 0 {
            continue;
        }
        let c = ExactCheck::measure(&injected, &injected, pair, true);
        out.push(FaultCheck {
            output: name.to_owned(),
            kind,
            flagged: c.class != ExactClass::Within,
            max_ratio: Some(c.reference.max_ratio).filter(|r| r.is_finite()),
            changed,
            total: y.len(),
        });
    }
    out
}
