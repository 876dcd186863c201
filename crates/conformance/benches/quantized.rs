//! Quantized layers from Rust versus the reference from Python, on the same
//! libmlx, the same shapes and the same packed weights:
//!
//! * `QuantizedLinear` 4096 -> 4096, affine 4-bit group 64, bf16, M = 1 and
//!   M = 8, without and with one LoRA adapter (r = 16, f32, scale 20):
//!   `mlx.nn.QuantizedLinear.__call__` / `mlx_lm.tuner.lora.LoRALinear.__call__`;
//! * `QuantizedSwitchLinear` 8 experts, top-2, 2048 -> 1408, affine 4-bit
//!   group 64, bf16, 1 and 8 tokens, driven as `SwitchGLU` drives it
//!   (unsorted): `mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__`
//!   under the glue's `global_scale` shim.
//!
//! Each side times N iterations of forward + eval after a warm-up (Python
//! inside Python with `time.perf_counter`, glue `quantized_bench`), two
//! rounds interleaved, best round kept. Prints `rust/python` (target <=
//! 0.8). Not a timed test: it prints numbers.
//!
//! `cargo bench -p conformance --bench quantized`

use std::time::Instant;

use conformance::reference::bench::{quantized_bench, QuantizedLayer};
use conformance::reference::quantized::{Adapter, QuantizedTensors};
use layers::quantized::{
    ExpertIndices, LoraAdapter, QuantSpec, QuantizedLinear, QuantizedPayload, QuantizedSwitchLinear,
};
use mlx_rs::{Array, Dtype};
use oracle::{HostTensor, Oracle};

const WARMUP: usize = 1;
const ROUNDS: usize = 2;
/// Wall time aimed at per measurement; the iteration count follows from
/// one timed call (MLX's CPU quantized kernels take ~0.2 s for one
/// 4096 x 4096 bf16 matrix-vector product on this machine).
const TARGET_SECONDS: f64 = 1.5;

fn host(a: &Array) -> HostTensor {
    HostTensor::from_array(a).unwrap()
}

/// Seeded uniform floats in `[-scale, scale)` of `dtype`, made by MLX.
fn uniform(shape: &[i32], scale: f32, dtype: Dtype, key: u64) -> Array {
    let key = mlx_rs::random::key(key).unwrap();
    let a = mlx_rs::random::uniform::<_, f32>(-scale, scale, shape, &key).unwrap();
    let a = a.as_dtype(dtype).unwrap();
    a.eval().unwrap();
    a
}

/// Iterations for `TARGET_SECONDS`, from one warm-up-and-timed call of `f`
/// (between 3 and 200).
fn iterations_for(f: impl Fn() -> Array) -> usize {
    f().eval().unwrap();
    let start = Instant::now();
    f().eval().unwrap();
    let one = start.elapsed().as_secs_f64();
    ((TARGET_SECONDS / one) as usize).clamp(3, 200)
}

/// Seconds per call of `f` over `iterations`, after a warm-up.
fn time_rust(iterations: usize, f: impl Fn() -> Array) -> f64 {
    for _ in 0..WARMUP {
        f().eval().unwrap();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f().eval().unwrap();
    }
    start.elapsed().as_secs_f64() / iterations as f64
}

/// The reference's payload tensors, no additive bias.
fn tensors(p: &QuantizedPayload) -> QuantizedTensors {
    QuantizedTensors {
        weight: host(p.weight()),
        scales: host(p.scales()),
        biases: p.biases().map(host),
        bias: None,
        spec: p.spec(),
    }
}

fn report(label: &str, rust: f64, python: f64) {
    println!(
        "{label:<52} rust {:>8.3} ms   python {:>8.3} ms   rust/python {:.2}",
        rust * 1e3,
        python * 1e3,
        rust / python
    );
}

/// Best of `ROUNDS` interleaved rounds for each side.
fn measure(rust: &mut dyn FnMut() -> f64, python: &mut dyn FnMut() -> f64) -> (f64, f64) {
    let (mut r, mut p) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..ROUNDS {
        r = r.min(rust());
        p = p.min(python());
    }
    (r, p)
}

fn main() {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    let backend = conformance::bench::select_backend(&oracle);
    println!(
        "device {backend}, forward + eval per iteration, {WARMUP} warm-up, best of {ROUNDS} interleaved rounds"
    );

    let spec = QuantSpec::new(layers::quantized::Mode::Affine, 4, 64).unwrap();
    let (k, n) = (4096, 4096);
    let w = uniform(&[n, k], 1.0 / (k as f32).sqrt(), Dtype::Bfloat16, 1);
    let payload = QuantizedPayload::quantize(&w, spec).unwrap();
    let lora_a = uniform(&[k, 16], 1.0 / (k as f32).sqrt(), Dtype::Float32, 2);
    let lora_b = uniform(&[16, n], 0.01, Dtype::Float32, 3);
    let plain = QuantizedLinear::new(payload.clone(), None).unwrap();
    let mut with_lora = QuantizedLinear::new(payload.clone(), None).unwrap();
    with_lora
        .attach_adapter(
            "a",
            LoraAdapter::new(lora_a.clone(), lora_b.clone(), 20.0).unwrap(),
        )
        .unwrap();
    let base = tensors(&payload);
    let adapters = [Adapter {
        lora_a: host(&lora_a),
        lora_b: host(&lora_b),
        scale: 20.0,
    }];

    for m in [1, 8] {
        let x = uniform(&[m, k], 1.0, Dtype::Bfloat16, 10 + m as u64);
        let iterations = iterations_for(|| plain.forward(&x).unwrap());
        for (layer, adapter) in [(&plain, false), (&with_lora, true)] {
            let kind = QuantizedLayer::Linear {
                adapters: if adapter { &adapters } else { &[] },
            };
            let x_host = host(&x);
            let (rust, python) = measure(
                &mut || time_rust(iterations, || layer.forward(&x).unwrap()),
                &mut || quantized_bench(&oracle, &x_host, &base, kind, iterations).unwrap(),
            );
            let label = format!(
                "QuantizedLinear 4096x4096 affine-4b-gs64 bf16 M={m}{}",
                if adapter { " +LoRA r16" } else { "" }
            );
            let label = format!("{label} ({iterations} it)");
            report(&label, rust, python);
        }
    }

    let (experts, top, d, out) = (8, 2, 2048, 1408);
    let w = uniform(
        &[experts, out, d],
        1.0 / (d as f32).sqrt(),
        Dtype::Bfloat16,
        4,
    );
    let payload = QuantizedPayload::quantize(&w, spec).unwrap();
    let switch = QuantizedSwitchLinear::new(payload.clone(), None).unwrap();
    let switch_tensors = tensors(&payload);
    for tokens in [1, 8] {
        let x = uniform(&[1, tokens, d], 1.0, Dtype::Bfloat16, 20 + tokens as u64);
        // Expert t*3 % 8 and (t*3+5) % 8 for token t: distinct, spread.
        let ids: Vec<i32> = (0..tokens)
            .flat_map(|t| [(t * 3) % experts, (t * 3 + 5) % experts])
            .collect();
        let indices = Array::from_slice(&ids, &[1, tokens, top]);
        let xe = x.expand_dims_axes(&[-2, -3]).unwrap();
        // The hot path: ids checked once where they are made (a router's
        // top-k needs no check at all), no host synchronisation per call.
        let routed = ExpertIndices::checked(indices.clone(), experts).unwrap();
        let call = || {
            switch
                .forward_routed(&xe, &routed, false)
                .unwrap()
                .squeeze_axes(&[-2])
                .unwrap()
        };
        // The checked entry point: evaluates and range-checks the ids on
        // the host at every call.
        let checked = || {
            switch
                .forward(&xe, &indices, false)
                .unwrap()
                .squeeze_axes(&[-2])
                .unwrap()
        };
        let iterations = iterations_for(call);
        let (x_host, indices_host) = (host(&x), host(&indices));
        let kind = QuantizedLayer::Switch {
            indices: &indices_host,
        };
        for (label, f) in [
            ("forward_routed", &call as &dyn Fn() -> Array),
            ("forward (host check)", &checked),
        ] {
            let (rust, python) = measure(&mut || time_rust(iterations, f), &mut || {
                quantized_bench(&oracle, &x_host, &switch_tensors, kind, iterations).unwrap()
            });
            report(
                &format!(
                    "QuantizedSwitchLinear E8 top-2 2048->1408 bf16 tokens={tokens} {label} ({iterations} it)"
                ),
                rust,
                python,
            );
        }
    }
}
