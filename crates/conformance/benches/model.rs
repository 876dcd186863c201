//! The whole decoder, Rust (`layers::model`) against the Python reference
//! (mlx-vlm 0.7.6's own model) on the same libmlx, on the `model/`
//! family's tiny checkpoints (or `MLX_BENCH_MODEL_DIR`, a checkpoint of
//! the same kinds). Not a timed test: it prints numbers.
//!
//! Per model, each the best of N runs after a warm-up, one eval per call:
//! * prefill of a P-token prompt on a fresh cache (tokens per second);
//! * one decode step after the prompt (tokens per second);
//! * k = 4 and 8 drafted tokens after the prompt: the port's
//!   rows-independent [`Model::verify`] (bit-identical to k single steps,
//!   checked here too), its k single steps, and the reference's k single
//!   steps and its own block call of k tokens (not bit-identical to its
//!   steps on the dense model: the `finding-block-vs-single-steps` finding).
//!
//! The floor is the checkpoint's weight bytes (safetensors payload) over
//! the memory bandwidth measured in the same run: what one call that reads
//! every weight once costs at best (for the MoE it overstates a step,
//! which reads only the routed experts). On the tiny checkpoints every
//! call is far above it: the figures there measure per-call overhead.
//!
//! `cargo bench -p conformance --bench model`; `MLX_BENCH_DEVICE=gpu` for
//! the GPU; `MLX_BENCH_ITERATIONS` (default 20) runs per figure.

use std::path::{Path, PathBuf};
use std::time::Instant;

use conformance::reference::bench::model_bench;
use layers::model::{LayerCache, Model, Trace};
use mlx_rs::Array;
use oracle::{DType, HostTensor, Oracle};

const PROMPT: usize = 64;
const KS: [usize; 2] = [4, 8];

fn eval(logits: &Array, cache: &[LayerCache]) {
    let mut arrays: Vec<&Array> = vec![logits];
    for c in cache {
        arrays.extend(c.arrays());
    }
    mlx_rs::transforms::eval(arrays).expect("MLX evaluates");
}

fn call(model: &Model, tokens: &Array, cache: &mut [LayerCache]) {
    let logits = model
        .forward(tokens, cache, &mut Trace::off())
        .expect("the port's forward runs");
    eval(&logits, cache);
}

/// Best seconds of `timed` over `iterations` runs after one warm-up, each
/// on the state `setup` makes (untimed).
fn best<S>(iterations: usize, setup: impl Fn() -> S, timed: impl Fn(&mut S)) -> f64 {
    let mut out = f64::INFINITY;
    for i in 0..=iterations {
        let mut state = setup();
        let start = Instant::now();
        timed(&mut state);
        if i > 0 {
            out = out.min(start.elapsed().as_secs_f64());
        }
    }
    out
}

fn weight_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("the checkpoint directory is readable")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

fn host(a: &Array) -> HostTensor {
    HostTensor::from_array(a).expect("an array converts to host bytes")
}

fn bench(oracle: &Oracle, dir: &Path, floor_bps: f64, iterations: usize) {
    let model = Model::load(dir).expect("the port loads the checkpoint");
    let vocab = model.config.vocab_size as i32;
    let ids: Vec<i32> = (0..PROMPT as i32).map(|i| (i * 97 + 13) % vocab).collect();
    let prompt = Array::from_slice(&ids, &[1, PROMPT as i32]);
    let prompt_host = HostTensor::new(
        DType::Int32,
        vec![1, PROMPT],
        ids.iter().flat_map(|t| t.to_le_bytes()).collect(),
    )
    .expect("a prompt tensor");
    let prefilled = || {
        let mut cache = model.make_cache();
        call(&model, &prompt, &mut cache);
        cache
    };
    let rust_prefill = best(
        iterations,
        || model.make_cache(),
        |c| call(&model, &prompt, c),
    );
    let first = Array::from_slice(&ids[..1], &[1, 1]);
    let rust_decode = best(iterations, prefilled, |c| call(&model, &first, c));
    let python = model_bench(oracle, dir, &prompt_host, &KS, iterations)
        .expect("the reference's model_bench runs");
    let bytes = weight_bytes(dir) as f64;
    let floor = bytes / floor_bps;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    println!(
        "{name}: {:.2} MB of weights, floor (one read of every weight) {:.3} ms",
        bytes / 1e6,
        floor * 1e3
    );
    let p = python["prefill"];
    println!(
        "  prefill {PROMPT} tokens: rust {:>8.3} ms {:>9.1} tok/s | python {:>8.3} ms {:>9.1} tok/s | rust/python {:.2}",
        rust_prefill * 1e3,
        PROMPT as f64 / rust_prefill,
        p * 1e3,
        PROMPT as f64 / p,
        rust_prefill / p
    );
    let d = python["decode"];
    println!(
        "  decode step:        rust {:>8.3} ms {:>9.1} tok/s | python {:>8.3} ms {:>9.1} tok/s | rust/python {:.2} | rust = {:.1}x floor",
        rust_decode * 1e3,
        1.0 / rust_decode,
        d * 1e3,
        1.0 / d,
        rust_decode / d,
        rust_decode / floor
    );
    for k in KS {
        let drafts = Array::from_slice(&ids[..k], &[1, k as i32]);
        let singles: Vec<Array> = ids[..k]
            .iter()
            .map(|&t| Array::from_slice(&[t], &[1, 1]))
            .collect();
        let verify = |c: &mut Vec<LayerCache>| {
            let logits = model.verify(&drafts, c).expect("the port's verify runs");
            eval(&logits, c);
        };
        // Bit for bit: the verify rows are the k single steps' logits.
        let mut a = prefilled();
        let verified = model.verify(&drafts, &mut a).expect("verify runs");
        let mut b = prefilled();
        let steps: Vec<Array> = singles
            .iter()
            .map(|t| {
                model
                    .forward(t, &mut b, &mut Trace::off())
                    .expect("a decode step runs")
            })
            .collect();
        let joined = mlx_rs::ops::concatenate(&steps, 1).expect("concatenate");
        let identical = host(&verified) == host(&joined);
        let rust_verify = best(iterations, prefilled, verify);
        let rust_steps = best(iterations, prefilled, |c| {
            for t in &singles {
                call(&model, t, c);
            }
        });
        let (block, psteps) = (python[&format!("block_{k}")], python[&format!("steps_{k}")]);
        println!(
            "  verify k={k}: rust rows-independent {:>8.3} ms ({:.2}x its {k} steps {:.3} ms, {:.1}x floor; == {k} steps: {}) | python {k} steps {:>8.3} ms, block call {:.3} ms | rust verify / python steps {:.2}",
            rust_verify * 1e3,
            rust_verify / rust_steps,
            rust_steps * 1e3,
            rust_verify / floor,
            if identical { "bit-identical" } else { "DIFFERS" },
            psteps * 1e3,
            block * 1e3,
            rust_verify / psteps
        );
    }
}

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    let iterations: usize = std::env::var("MLX_BENCH_ITERATIONS")
        .ok()
        .map(|v| v.parse().expect("MLX_BENCH_ITERATIONS: a number"))
        .unwrap_or(20);
    let floor = conformance::bench::memory_bandwidth(backend.is_gpu());
    println!(
        "device {backend}; best of {iterations} runs after a warm-up, one eval per call\nmemory bandwidth (f32 x + 1, read + write): {:.1} GB/s",
        floor / 1e9
    );
    let dirs: Vec<PathBuf> = match std::env::var_os("MLX_BENCH_MODEL_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => conformance::families::model::CHECKPOINTS
            .iter()
            .map(|c| {
                conformance::home::Home::get()
                    .fixtures_dir()
                    .join("checkpoints")
                    .join(c)
            })
            .collect(),
    };
    for dir in dirs {
        bench(&oracle, &dir, floor, iterations);
    }
}
