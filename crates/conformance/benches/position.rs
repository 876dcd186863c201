//! Position layers from Rust versus the reference from Python, on the same
//! libmlx, the same shapes and the same inputs: mRoPE apply (Qwen3.5:
//! q [1, 16, 512, 256], k [1, 4, 512, 256] bf16, 3-D positions of a
//! prompt with an image) and Gemma vision 2-D RoPE ([1, 1024, 16, 72] bf16,
//! a 32 × 32 patch grid). Each side times N iterations of apply + eval
//! after a warm-up (Python inside Python with `time.perf_counter`). Prints
//! `rust/python` (target ≤ 0.8). Not a timed test: it prints numbers.
//!
//! `cargo bench -p conformance --bench position`

use std::time::Instant;

use conformance::inputs::Inputs;
use conformance::reference::bench::{position_bench_mrope, position_bench_rope2d};
use conformance::reference::position::Rotary;
use layers::position::{
    apply_multidimensional_rope, rope_index, GridThw, Mrope, MropeConfig, MropePath,
    RopeIndexInput, VisionTokens,
};
use mlx_rs::Array;
use oracle::{DType, HostTensor, Oracle};

/// Iterations per timed run, and runs per side (Rust and Python alternate,
/// so load from other processes hits both alike; medians are compared).
const ITERATIONS: usize = 20;
const ROUNDS: usize = 15;
const WARMUP: usize = 3;

fn int32(values: &[i32], shape: &[usize]) -> HostTensor {
    HostTensor::new(
        DType::Int32,
        shape.to_vec(),
        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap()
}

/// Seconds per call of `f` over [`ITERATIONS`] calls.
fn time_rust(f: &mut impl FnMut() -> Vec<Array>) -> f64 {
    let start = Instant::now();
    for _ in 0..ITERATIONS {
        mlx_rs::transforms::eval(&f()).unwrap();
    }
    start.elapsed().as_secs_f64() / ITERATIONS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Alternates Rust and Python runs and prints medians and their ratio.
fn compare(label: &str, mut rust: impl FnMut() -> Vec<Array>, mut python: impl FnMut() -> f64) {
    for _ in 0..WARMUP {
        mlx_rs::transforms::eval(&rust()).unwrap();
    }
    let (mut r, mut p) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        r.push(time_rust(&mut rust));
        p.push(python());
    }
    let (rm, pm) = (median(r.clone()), median(p.clone()));
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{label}\n    median rust {:.3} ms, python {:.3} ms: rust/python {:.2}   (best: {:.3} / {:.3} ms = {:.2})",
        rm * 1e3,
        pm * 1e3,
        rm / pm,
        min(&r) * 1e3,
        min(&p) * 1e3,
        min(&r) / min(&p)
    );
}

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    println!(
        "device {backend}; {ROUNDS} alternating runs per side of {ITERATIONS} iterations (apply + eval), after {WARMUP} warm-up"
    );
    let mut inputs = Inputs::new(0x5eed);

    // mRoPE, Qwen3.5: 100 text tokens, a 32×32-patch image (256 merged
    // tokens between vision start/end), 154 text tokens: L = 512.
    let tokens = VisionTokens::QWEN3_5;
    let mut ids = vec![1_000; 100];
    ids.push(tokens.vision_start_token_id);
    ids.extend(std::iter::repeat_n(tokens.image_token_id, 256));
    ids.push(248_046);
    ids.extend(std::iter::repeat_n(1_000, 154));
    let images = [GridThw::new(1, 32, 32)];
    let index = rope_index(
        &RopeIndexInput {
            input_ids: &ids,
            image_grid_thw: Some(&images),
            video_grid_thw: None,
            attention_mask: None,
        },
        &tokens,
    )
    .unwrap();
    let positions = index.window_position_ids_3d(0, 512).unwrap();
    let q = inputs.uniform(DType::Bfloat16, &[1, 16, 512, 256], 2.0);
    let k = inputs.uniform(DType::Bfloat16, &[1, 4, 512, 256], 2.0);
    let mrope = Mrope::new(MropeConfig::qwen3_5(256, 0.25, 1e7, vec![11, 11, 10])).unwrap();
    let (q_array, k_array) = (q.to_array(), k.to_array());
    let path = MropePath::current().unwrap().as_str();
    compare(
        &format!(
            "mRoPE apply ({path}), Qwen3.5 q[1,16,512,256] k[1,4,512,256] bf16, 3-D positions"
        ),
        || {
            let (q, k) = mrope.apply(&q_array, &k_array, &positions).unwrap();
            vec![q, k]
        },
        || {
            let rotary = Rotary {
                head_dim: 256,
                partial_rotary_factor: 0.25,
                rope_theta: 1e7,
                mrope_section: &[11, 11, 10],
            };
            let positions = HostTensor::from_array(&positions).unwrap();
            position_bench_mrope(&oracle, &q, &k, &positions, rotary, ITERATIONS).unwrap()
        },
    );

    // Gemma vision 2-D RoPE: 32×32 patches, 16 heads, head_dim 72.
    let x = inputs.uniform(DType::Bfloat16, &[1, 1024, 16, 72], 2.0);
    let grid: Vec<i32> = (0..1024).flat_map(|p| [p % 32, p / 32]).collect();
    let grid = int32(&grid, &[1, 1024, 2]);
    let (x_array, grid_array) = (x.to_array(), grid.to_array());
    compare(
        "2-D RoPE (pure-mlx), Gemma vision x[1,1024,16,72] bf16, positions[1,1024,2]",
        || vec![apply_multidimensional_rope(&x_array, &grid_array, 100.0).unwrap()],
        || position_bench_rope2d(&oracle, &x, &grid, 100.0, ITERATIONS).unwrap(),
    );
}
