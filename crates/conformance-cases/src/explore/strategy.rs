//! Where the explorer samples: proptest strategies per family, weighted
//! toward the regions where MLX's kernels switch. They describe shapes
//! only; nothing known about a past finding (single-group rows, say) is
//! written into them.
//!
//! `quantized/linear`:
//! - spec: every `(mode, bits, group_size)` `mx.quantize` accepts;
//! - K: 1 to 16 groups (K equal to the group size as often as 2 to 4
//!   groups together, since kernels tile K by the group);
//! - N: small and odd (1–8) often, up to 72 around the 64-column tiles,
//!   and 120–136 around 128;
//! - M (rows): 1–8 (matrix-vector kernels), 9–40, and 60–70 around 64;
//!   sometimes with leading batch dimensions;
//! - x contiguous, or (a third as often) a sliced view (row stride K + 64)
//!   or row 0 broadcast over M (stride 0);
//! - dtype, bias, scales dtype, and the inputs' seed.
//!
//! `quantized/switch` (`gather_qmm`): experts 1–16, top-k 1–4 (at most the
//! experts), batch 1–3 and tokens per row 1–24 or 30–40 (routed rows around
//! SwitchGLU's sort threshold of 64), sorted or unsorted routing, K of 1 to
//! 8 groups, N as above, dtype and bias.
//!
//! `attention/sdpa`: KV length L around every power of two up to 4096
//! (2^k − 1, 2^k, 2^k + 1), sometimes small (1–64) or around 8192;
//! batch 1–8 requests (a batch of several more often than not); query rows
//! M = 1 (decode) most often, 2–8 (speculative verify) and 9–16 (chunked
//! prefill); KV heads 1–4 at GQA ratios 1, 2, 4, 6 and 8; head_dim 32, 64,
//! 80, 96, 128 and 256; dtype; the keys contiguous or the prefix of a
//! step-256 cache buffer.
//!
//! `position/mrope` (Qwen3.5 interleaved mRoPE after the rope index):
//! head_dim 64, 128 or 256 with rotary_dim a quarter, half or all of it;
//! mrope_section adding up to rotary_dim / 2 most often, sometimes less and
//! sometimes more (the reference's selector clips there); rope_theta; q and
//! k heads (GQA); one or two prompt rows of text, images (t = 1) and
//! videos (2-4 frames) with grids of 2 to 16 patches a side (shorter rows
//! padded with text to equal length); the prefill, or 1-8 decode tokens
//! just after the prompt or around offset 65536.

use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::Description;
use crate::families::quantized::linear::{Bias, LinearShape, XView};
use layers::quantized::{Mode, QuantSpec};
use oracle::DType;

/// The families the explorer can sample.
pub const FAMILIES: [&str; 4] = [
    "quantized/linear",
    "quantized/switch",
    "attention/sdpa",
    "position/mrope",
];

/// Every spec, simplest first (what shrinking moves toward).
pub fn specs() -> Vec<QuantSpec> {
    let mut specs = Vec::new();
    for bits in [4, 8, 2, 3, 5, 6] {
        for group_size in [64, 32, 128] {
            specs.push(QuantSpec::new(Mode::Affine, bits, group_size).expect("valid"));
        }
    }
    specs.extend([Mode::Mxfp4, Mode::Mxfp8, Mode::Nvfp4].map(QuantSpec::defaults));
    specs
}

fn quantized_linear() -> BoxedStrategy<Description> {
    let m = prop_oneof![4 => 1usize..=8, 2 => 9usize..=40, 1 => 60usize..=70];
    let n = prop_oneof![3 => 1usize..=8, 3 => 9usize..=72, 1 => 120usize..=136];
    // K equal to the group size (one group) as often as 2-4 groups.
    let groups = prop_oneof![3 => Just(1usize), 3 => 2usize..=4, 1 => 5usize..=16];
    let batch =
        prop_oneof![4 => Just(Vec::new()), 1 => proptest::collection::vec(1usize..=3, 1..=2)];
    let dtype = prop::sample::select(vec![DType::Bfloat16, DType::Float32, DType::Float16]);
    let bias = prop::sample::select(vec![Bias::None, Bias::Same, Bias::F32]);
    let x_view = prop_oneof![4 => Just(XView::Contiguous), 1 => Just(XView::Sliced), 1 => Just(XView::Broadcast)];
    (
        prop::sample::select(specs()),
        dtype,
        m,
        groups,
        n,
        batch,
        bias,
        x_view,
        0u64..1 << 32,
    )
        .prop_map(|(spec, dtype, m, groups, n, batch, bias, x_view, seed)| {
            let shape = LinearShape {
                k: groups * spec.group_size as usize,
                n,
                batch,
                bias,
                x_view,
                ..LinearShape::new(spec, dtype, m)
            };
            Description::QuantizedLinear { shape, seed }
        })
        .boxed()
}

fn quantized_switch() -> BoxedStrategy<Description> {
    use crate::families::quantized::switch::SwitchShape;
    let n = prop_oneof![3 => 1usize..=8, 3 => 9usize..=72, 1 => 120usize..=136];
    let len = prop_oneof![3 => 1usize..=24, 1 => 30usize..=40];
    let dtype = prop::sample::select(vec![DType::Bfloat16, DType::Float32, DType::Float16]);
    (
        prop::sample::select(specs()),
        dtype,
        1usize..=16,
        1usize..=4,
        1usize..=3,
        len,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![3 => 1usize..=4, 1 => 5usize..=8],
        n,
        0u64..1 << 32,
    )
        .prop_map(
            |(spec, dtype, experts, top, batch, len, sorted, bias, groups, n, seed)| {
                let shape = SwitchShape {
                    dtype,
                    top: top.min(experts),
                    batch,
                    len,
                    bias,
                    k: groups * spec.group_size as usize,
                    n,
                    ..SwitchShape::new(spec, experts, sorted)
                };
                Description::QuantizedSwitch { shape, seed }
            },
        )
        .boxed()
}

fn attention_sdpa() -> BoxedStrategy<Description> {
    use crate::families::attention::sdpa::{KvView, SdpaShape};
    let around_powers = (0u32..=12, -1i64..=1).prop_map(|(k, d)| ((1i64 << k) + d).max(1) as usize);
    let kv_len = prop_oneof![
        6 => around_powers,
        2 => 1usize..=64,
        1 => 8191usize..=8193,
    ];
    let m = prop_oneof![4 => Just(1usize), 2 => 2usize..=8, 1 => 9usize..=16];
    let batch = prop_oneof![2 => Just(1usize), 3 => 2usize..=4, 1 => 5usize..=8];
    let dtype = prop::sample::select(vec![DType::Bfloat16, DType::Float16, DType::Float32]);
    (
        dtype,
        batch,
        1usize..=4,
        prop::sample::select(vec![1usize, 2, 4, 6, 8]),
        prop::sample::select(vec![64usize, 128, 32, 80, 96, 256]),
        kv_len,
        m,
        prop::sample::select(vec![KvView::Contiguous, KvView::CacheBuffer]),
        0u64..1 << 32,
    )
        .prop_map(
            |(dtype, batch, n_kv_heads, ratio, head_dim, kv_len, m, kv_view, seed)| {
                let shape = SdpaShape {
                    dtype,
                    batch,
                    n_heads: n_kv_heads * ratio,
                    n_kv_heads,
                    head_dim,
                    kv_len,
                    m: m.min(kv_len),
                    kv_view,
                };
                Description::AttentionSdpa { shape, seed }
            },
        )
        .boxed()
}

fn position_mrope() -> BoxedStrategy<Description> {
    use crate::families::position::mrope::shape::{MropeShape, PromptPiece};
    let side = (1usize..=8).prop_map(|n| 2 * n);
    let piece = prop_oneof![
        3 => (1usize..=20).prop_map(|tokens| PromptPiece::Text { tokens }),
        2 => (side.clone(), side.clone()).prop_map(|(h, w)| PromptPiece::Image { t: 1, h, w }),
        1 => (2usize..=4, 1usize..=4, 1usize..=4).prop_map(|(t, h, w)| PromptPiece::Video { t, h: 2 * h, w: 2 * w }),
    ];
    let row = proptest::collection::vec(piece, 1..=4);
    let rows = prop_oneof![3 => proptest::collection::vec(row.clone(), 1..=1), 1 => proptest::collection::vec(row, 2..=2)];
    let decode = prop_oneof![
        2 => Just(None),
        2 => (0usize..=64, 1usize..=8).prop_map(Some),
        1 => (65_400usize..=65_600, 1usize..=8).prop_map(Some),
    ];
    // The sections' shares and how their sum stands to rotary_dim / 2.
    let sum_delta = prop_oneof![4 => Just(0i64), 1 => -4i64..=-1, 1 => 1i64..=4];
    (
        prop::sample::select(vec![DType::Bfloat16, DType::Float16, DType::Float32]),
        prop::sample::select(vec![128usize, 64, 256]),
        prop::sample::select(vec![4usize, 2, 1]),
        (1usize..=8, 1usize..=8, 1usize..=8),
        sum_delta,
        prop::sample::select(vec![1e7f64, 1e4, 1e5, 1e6, 5e6]),
        (1usize..=8, 1usize..=4),
        rows,
        decode,
        0u64..1 << 32,
    )
        .prop_map(
            |(
                dtype,
                head_dim,
                divisor,
                (wa, wb, wc),
                delta,
                rope_theta,
                (hq, hk),
                mut rows,
                decode,
                seed,
            )| {
                let rotary_dim = head_dim / divisor;
                let half = (rotary_dim / 2) as i64;
                let total = (half + delta).max(0) as usize;
                let w = wa + wb + wc;
                let a = total * wa / w;
                let b = total * wb / w;
                let mrope_section = [a, b, total - a - b];
                // Equal token counts: pad the shorter rows with text.
                let longest = rows
                    .iter()
                    .map(|r| r.iter().map(|p| p.tokens()).sum::<usize>())
                    .max()
                    .unwrap_or(0);
                for r in &mut rows {
                    let len: usize = r.iter().map(|p| p.tokens()).sum();
                    if len < longest {
                        r.push(PromptPiece::Text {
                            tokens: longest - len,
                        });
                    }
                }
                let shape = MropeShape {
                    dtype,
                    head_dim,
                    rotary_dim,
                    rope_theta,
                    mrope_section,
                    q_heads: hq.max(hk),
                    k_heads: hk,
                    rows,
                    decode,
                };
                Description::PositionMrope { shape, seed }
            },
        )
        .boxed()
}

/// The strategies of `families` (empty: every family), by name; an
/// unknown name is an error listing the known ones.
pub fn for_families(
    families: &[String],
) -> Result<Vec<(String, BoxedStrategy<Description>)>, String> {
    let chosen: Vec<&str> = if families.is_empty() {
        FAMILIES.to_vec()
    } else {
        families.iter().map(String::as_str).collect()
    };
    chosen
        .into_iter()
        .map(|f| match f {
            "quantized/linear" => Ok((f.to_owned(), quantized_linear())),
            "quantized/switch" => Ok((f.to_owned(), quantized_switch())),
            "attention/sdpa" => Ok((f.to_owned(), attention_sdpa())),
            "position/mrope" => Ok((f.to_owned(), position_mrope())),
            other => Err(format!(
                "--family {other}: the explorer samples {}",
                FAMILIES.join(", ")
            )),
        })
        .collect()
}

/// Sample `index` of `seed`: its own generator, so shards and reruns draw
/// the same description.
pub fn draw(
    strategy: &BoxedStrategy<Description>,
    seed: u64,
    index: usize,
    family: &str,
) -> Result<Box<dyn ValueTree<Value = Description>>, String> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&(index as u64).to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    strategy
        .new_tree(&mut runner)
        .map(|t| Box::new(t) as Box<dyn ValueTree<Value = Description>>)
        .map_err(|e| format!("{family}: cannot draw sample {index}: {e}"))
}
