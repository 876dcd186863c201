//! What a serving engine pays, Rust (`layers`) versus the Python reference
//! on the same libmlx, against the hardware floor measured in the same run.
//! Not a timed test: it prints numbers.
//!
//! 1. **Memory bandwidth** (the floor): `y = x + 1` over an f32 array far
//!    larger than any cache (256 MiB on CPU, 2 GiB on a GPU), bytes read
//!    plus written per second, best of 5.
//! 2. **Decode step**: a stack of quantized layers at real model sizes,
//!    built once, one `eval` per token, Rust and Python interleaved:
//!    * dense, Qwen3.5-9B projections (hidden 4096, 16 q / 4 kv heads of
//!      256, MLP 12288): q/k/v/o, gate/up/down;
//!    * MoE, Qwen3.5-35B-A3B projections (hidden 2048, 16 q / 2 kv heads of
//!      256, 256 experts of 512, top-8): q/k/v/o, router, and three
//!      switch projections driven as SwitchGLU drives them (the shared
//!      expert left out);
//!
//!    both with the Qwen3.5 mRoPE (partial 0.25, theta 1e7, sections
//!    11/11/10) applied to q and k as the reference applies it (its
//!    compiled graph; the port issues the same one), and SDPA stood in for
//!    by q itself (attention is its own bench). Printed: step time, tokens
//!    per second, Rust/Python, and the weight bytes a token streams per
//!    second as a fraction of the measured bandwidth.
//! 3. **Speculative verify** of k = 4 and 8 draft rows through one dense
//!    layer's projections and through one 4096×4096 QuantizedLinear:
//!    rows-independent (the rows regime's chunks), k separate M = 1 calls
//!    (one eval for all), and one batched call; the rows-independent result
//!    is checked bit for bit against the k M = 1 calls.
//!
//! `cargo bench -p conformance --bench serving`; `MLX_BENCH_DEVICE=gpu` for
//! the GPU; `MLX_BENCH_LAYERS=N` to change the stack depth (default 1 on
//! CPU, 8 on a GPU).

use std::time::Instant;

use conformance::reference::bench::{decode_bench, DecodeStack};
use layers::position::{Mrope, MropeConfig};
use layers::quantized::{
    ExpertIndices, Forward, Mode, QuantSpec, QuantizedLinear, QuantizedPayload,
    QuantizedSwitchLinear,
};
use mlx_rs::{ops, Array, Dtype};
use oracle::{HostTensor, Oracle};

const ROUNDS: usize = 2;
const TARGET_SECONDS: f64 = 2.0;
const SEED: u64 = 0x5e41;

/// `mlx_rs::random::uniform` in `[-scale, scale)` from `key(seed)`, then
/// `dtype`: the glue's `_bench_uniform` makes the same bits.
fn uniform(shape: &[i32], scale: f32, seed: u64, dtype: Dtype) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    let a = mlx_rs::random::uniform::<_, f32>(-scale, scale, shape, &key).unwrap();
    a.as_dtype(dtype).unwrap()
}

fn quantized(shape: &[i32], seed: u64, spec: QuantSpec) -> QuantizedPayload {
    let k = *shape.last().unwrap() as f32;
    let w = uniform(shape, 1.0 / k.sqrt(), seed, Dtype::Bfloat16);
    let p = QuantizedPayload::quantize(&w, spec).unwrap();
    mlx_rs::transforms::eval([p.weight(), p.scales()]).unwrap();
    if let Some(b) = p.biases() {
        b.eval().unwrap();
    }
    p
}

fn linear(shape: &[i32], seed: u64, spec: QuantSpec) -> QuantizedLinear {
    QuantizedLinear::new(quantized(shape, seed, spec), None).unwrap()
}

fn switch(shape: &[i32], seed: u64, spec: QuantSpec) -> QuantizedSwitchLinear {
    QuantizedSwitchLinear::new(quantized(shape, seed, spec), None).unwrap()
}

/// Bytes a layer's payload occupies (what a decode step streams of it).
fn payload_bytes(p: &QuantizedPayload) -> usize {
    p.weight().nbytes() + p.scales().nbytes() + p.biases().map_or(0, Array::nbytes)
}

fn eval_all(outs: &[Array]) {
    mlx_rs::transforms::eval(outs.iter()).unwrap();
}

/// Seconds per call of `f` (one eval of all its outputs), over
/// `iterations` after one warm-up.
fn time(iterations: usize, f: &dyn Fn() -> Vec<Array>) -> f64 {
    eval_all(&f());
    let start = Instant::now();
    for _ in 0..iterations {
        eval_all(&f());
    }
    start.elapsed().as_secs_f64() / iterations as f64
}

/// Iterations for [`TARGET_SECONDS`], from one warm and one timed call.
fn iterations_for(f: &dyn Fn() -> Vec<Array>) -> usize {
    let one = time(1, f);
    ((TARGET_SECONDS / one) as usize).clamp(3, 500)
}

enum Mlp {
    Dense {
        gate: QuantizedLinear,
        up: QuantizedLinear,
        down: QuantizedLinear,
    },
    Moe {
        router: QuantizedLinear,
        gate: QuantizedSwitchLinear,
        up: QuantizedSwitchLinear,
        down: QuantizedSwitchLinear,
        top_k: i32,
    },
}

struct Layer {
    q: QuantizedLinear,
    k: QuantizedLinear,
    v: QuantizedLinear,
    o: QuantizedLinear,
    mlp: Mlp,
}

struct Stack<'a> {
    shape: DecodeStack<'a>,
    layers: Vec<Layer>,
    mrope: Mrope,
    positions: Array,
    /// Weight bytes one token streams (the routed experts only, for MoE).
    streamed: usize,
}

fn build(shape: DecodeStack) -> Stack {
    let (h, hd) = (shape.hidden as i32, shape.head_dim as i32);
    let (q_out, kv_out) = (shape.heads as i32 * hd, shape.kv_heads as i32 * hd);
    let spec = shape.spec;
    let mut streamed = 0;
    let layers = (0..shape.layers)
        .map(|l| {
            let s = shape.seed + 16 * l as u64;
            let q = linear(&[q_out, h], s, spec);
            let k = linear(&[kv_out, h], s + 1, spec);
            let v = linear(&[kv_out, h], s + 2, spec);
            let o = linear(&[h, q_out], s + 3, spec);
            for p in [&q, &k, &v, &o] {
                streamed += payload_bytes(p.payload());
            }
            let mlp = if shape.kind == "dense" {
                let i = shape.intermediate as i32;
                let gate = linear(&[i, h], s + 4, spec);
                let up = linear(&[i, h], s + 5, spec);
                let down = linear(&[h, i], s + 6, spec);
                for p in [&gate, &up, &down] {
                    streamed += payload_bytes(p.payload());
                }
                Mlp::Dense { gate, up, down }
            } else {
                let (e, i) = (shape.experts as i32, shape.moe_intermediate as i32);
                let router = linear(&[e, h], s + 4, spec);
                let gate = switch(&[e, i, h], s + 5, spec);
                let up = switch(&[e, i, h], s + 6, spec);
                let down = switch(&[e, h, i], s + 7, spec);
                streamed += payload_bytes(router.payload());
                for p in [&gate, &up, &down] {
                    streamed += payload_bytes(p.payload()) * shape.top_k / shape.experts;
                }
                Mlp::Moe {
                    router,
                    gate,
                    up,
                    down,
                    top_k: shape.top_k as i32,
                }
            };
            Layer { q, k, v, o, mlp }
        })
        .collect();
    let mrope = Mrope::new(MropeConfig::qwen3_5(
        shape.head_dim,
        shape.partial_rotary_factor,
        shape.rope_theta,
        shape.mrope_section.to_vec(),
    ))
    .unwrap();
    let p = shape.position;
    let positions = Array::from_slice(&[p, p, p], &[3, 1, 1]);
    Stack {
        shape,
        layers,
        mrope,
        positions,
        streamed,
    }
}

fn silu_mul(g: &Array, u: &Array) -> Array {
    ops::multiply(ops::multiply(g, ops::sigmoid(g).unwrap()).unwrap(), u).unwrap()
}

/// One decode step: the glue's `decode_bench` step, op for op.
fn step(s: &Stack, x: &Array) -> Vec<Array> {
    let sh = &s.shape;
    let (heads, kv_heads, hd) = (sh.heads as i32, sh.kv_heads as i32, sh.head_dim as i32);
    let mut x = x.clone();
    let mut outs = Vec::new();
    for l in &s.layers {
        let q =
            l.q.forward(&x)
                .unwrap()
                .reshape(&[1, 1, heads, hd])
                .unwrap();
        let q = q.transpose_axes(&[0, 2, 1, 3]).unwrap();
        let k =
            l.k.forward(&x)
                .unwrap()
                .reshape(&[1, 1, kv_heads, hd])
                .unwrap();
        let k = k.transpose_axes(&[0, 2, 1, 3]).unwrap();
        let v = l.v.forward(&x).unwrap();
        let (q, k) = s.mrope.apply(&q, &k, &s.positions).unwrap();
        let attn = q
            .transpose_axes(&[0, 2, 1, 3])
            .unwrap()
            .reshape(&[1, 1, heads * hd])
            .unwrap();
        x = ops::add(&x, l.o.forward(&attn).unwrap()).unwrap();
        let m = match &l.mlp {
            Mlp::Dense { gate, up, down } => {
                let g = gate.forward(&x).unwrap();
                down.forward(&silu_mul(&g, &up.forward(&x).unwrap()))
                    .unwrap()
            }
            Mlp::Moe {
                router,
                gate,
                up,
                down,
                top_k,
            } => {
                let gates = ops::softmax_axis(router.forward(&x).unwrap(), -1, true).unwrap();
                let inds = ExpertIndices::top_k(&gates, *top_k).unwrap();
                let scores = gates.take_along_axis(inds.array(), -1).unwrap();
                let xe = x.expand_dims_axes(&[-2, -3]).unwrap();
                let g = gate.forward_routed(&xe, &inds, false).unwrap();
                let u = up.forward_routed(&xe, &inds, false).unwrap();
                let h = down
                    .forward_routed(&silu_mul(&g, &u), &inds, false)
                    .unwrap()
                    .squeeze_axes(&[-2])
                    .unwrap();
                ops::multiply(&h, scores.expand_dims(-1).unwrap())
                    .unwrap()
                    .sum_axis(-2, false)
                    .unwrap()
                    .as_dtype(x.dtype())
                    .unwrap()
            }
        };
        x = ops::add(&x, &m).unwrap();
        outs.push(k);
        outs.push(v);
    }
    outs.insert(0, x);
    outs
}

fn decode(oracle: &Oracle, shape: DecodeStack, floor: f64, label: &str) {
    let stack = build(shape);
    let x = uniform(
        &[1, 1, shape.hidden as i32],
        1.0,
        shape.seed + 1000,
        Dtype::Bfloat16,
    );
    x.eval().unwrap();
    let f = || step(&stack, &x);
    let iterations = iterations_for(&f);
    let (mut rust, mut python) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..ROUNDS {
        rust = rust.min(time(iterations, &f));
        python = python.min(decode_bench(oracle, &shape, iterations).unwrap());
    }
    let gbs = |t: f64| stack.streamed as f64 / t / 1e9;
    println!(
        "decode step, {label}, {} layer(s), {:.1} MB streamed/token ({iterations} it)\n  rust {:>9.3} ms {:>8.1} tok/s {:>7.1} GB/s = {:.3} of floor | python {:>9.3} ms {:>8.1} tok/s {:>7.1} GB/s = {:.3} of floor | rust/python {:.2}",
        shape.layers,
        stack.streamed as f64 / 1e6,
        rust * 1e3,
        1.0 / rust,
        gbs(rust),
        gbs(rust) * 1e9 / floor,
        python * 1e3,
        1.0 / python,
        gbs(python),
        gbs(python) * 1e9 / floor,
        rust / python,
    );
}

/// k draft rows through `layers` (each fed the same x, as the projections
/// of one layer read the same hidden state), three ways.
fn verify(label: &str, projections: &[&QuantizedLinear], k_in: i32) {
    for k in [4, 8] {
        let x = uniform(&[k, k_in], 1.0, SEED + k as u64, Dtype::Bfloat16);
        x.eval().unwrap();
        let rows: Vec<Array> = x.split_equal(k, 0).unwrap();
        let rows_independent = || {
            projections
                .iter()
                .map(|p| p.forward_as(&x, Forward::RowsIndependent).unwrap())
                .collect::<Vec<_>>()
        };
        let m1 = || {
            projections
                .iter()
                .flat_map(|p| {
                    rows.iter()
                        .map(|r| p.forward_as(r, Forward::Batched).unwrap())
                })
                .collect::<Vec<_>>()
        };
        let batched = || {
            projections
                .iter()
                .map(|p| p.forward_as(&x, Forward::Batched).unwrap())
                .collect::<Vec<_>>()
        };
        // Bit for bit: rows-independent equals the k M = 1 calls.
        let ri = rows_independent();
        let singles = m1();
        eval_all(&ri);
        eval_all(&singles);
        let identical = ri.iter().enumerate().all(|(j, y)| {
            let joined =
                ops::concatenate(&singles[j * k as usize..(j + 1) * k as usize], 0).unwrap();
            HostTensor::from_array(y).unwrap() == HostTensor::from_array(&joined).unwrap()
        });
        let batched_equal = batched()
            .iter()
            .zip(&ri)
            .all(|(b, y)| HostTensor::from_array(b).unwrap() == HostTensor::from_array(y).unwrap());
        let iterations = iterations_for(&batched);
        let (mut t_ri, mut t_m1, mut t_b) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
        for _ in 0..ROUNDS {
            t_ri = t_ri.min(time(iterations, &rows_independent));
            t_m1 = t_m1.min(time(iterations, &m1));
            t_b = t_b.min(time(iterations, &batched));
        }
        let chunk = projections[0]
            .rows_limit(Dtype::Bfloat16)
            .unwrap()
            .chunk(k as usize);
        println!(
            "speculative verify k={k}, {label} ({iterations} it): rows-independent (chunks of {chunk}) {:.3} ms = {:.2}x batched | {k} x M=1 {:.3} ms = {:.2}x | batched {:.3} ms | rows-independent == {k} x M=1: {} | batched == M=1: {}",
            t_ri * 1e3,
            t_ri / t_b,
            t_m1 * 1e3,
            t_m1 / t_b,
            t_b * 1e3,
            if identical { "bit-identical" } else { "DIFFERS" },
            if batched_equal { "yes" } else { "no" },
        );
    }
}

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    let gpu = backend.is_gpu();
    let layers: usize = std::env::var("MLX_BENCH_LAYERS")
        .ok()
        .map(|v| v.parse().expect("MLX_BENCH_LAYERS: a number of layers"))
        .unwrap_or(if gpu { 8 } else { 1 });
    let floor = conformance::bench::memory_bandwidth(gpu);
    println!(
        "device {backend}; one eval per step, best of {ROUNDS} interleaved rounds\nmemory bandwidth (f32 x + 1, read + write): {:.1} GB/s",
        floor / 1e9
    );
    let spec = QuantSpec::new(Mode::Affine, 4, 64).unwrap();
    let dense = DecodeStack {
        kind: "dense",
        layers,
        hidden: 4096,
        heads: 16,
        kv_heads: 4,
        head_dim: 256,
        intermediate: 12288,
        experts: 0,
        top_k: 0,
        moe_intermediate: 0,
        partial_rotary_factor: 0.25,
        rope_theta: 1e7,
        mrope_section: &[11, 11, 10],
        position: 512,
        spec,
        dtype: "bfloat16",
        seed: SEED,
    };
    let moe = DecodeStack {
        kind: "moe",
        hidden: 2048,
        heads: 16,
        kv_heads: 2,
        intermediate: 0,
        experts: 256,
        top_k: 8,
        moe_intermediate: 512,
        ..dense
    };
    decode(
        &oracle,
        dense,
        floor,
        "dense Qwen3.5-9B projections, affine-4b-gs64 bf16",
    );
    decode(
        &oracle,
        moe,
        floor,
        "MoE Qwen3.5-35B-A3B projections (E256 top-8), affine-4b-gs64 bf16",
    );

    let one = build(DecodeStack { layers: 1, ..dense });
    let l = &one.layers[0];
    let Mlp::Dense { gate, up, .. } = &l.mlp else {
        unreachable!("a dense stack")
    };
    verify(
        "QuantizedLinear 4096x4096 affine-4b-gs64 bf16",
        &[&l.o],
        4096,
    );
    verify(
        "one dense layer's q/k/v/gate/up projections (4096 -> 4096, 1024, 1024, 12288, 12288)",
        &[&l.q, &l.k, &l.v, gate, up],
        4096,
    );
}
