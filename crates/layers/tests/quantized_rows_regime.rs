//! The rows regime: chunked rows-independent forwards (linear and switch),
//! `ExpertIndices` (checked and by construction), and their typed errors.

mod checkpoint_support;

use checkpoint_support::{normal, normal_as, same_bits};
use layers::backend::Backend;
use layers::quantized::rows_regime::{RowsEntry, MEASURED_SPECS};
use layers::quantized::{
    ExpertIndices, Forward, LayerError, LoraAdapter, Mode, QuantSpec, QuantizedLinear,
    QuantizedPayload, QuantizedSwitchLinear, RowsCall, RowsLimit, RowsRegime,
};
use mlx_rs::{ops, Array, Dtype};

fn spec(mode: Mode, bits: i32, group_size: i32) -> QuantSpec {
    QuantSpec::new(mode, bits, group_size).unwrap()
}

/// A CPU regime that chunks by `limit` rows, for every measured spec.
fn regime(limit: usize) -> RowsRegime {
    let entries = [RowsCall::QuantizedMatmul, RowsCall::GatherQmm]
        .into_iter()
        .flat_map(|call| {
            MEASURED_SPECS
                .into_iter()
                .map(move |(mode, bits, group_size)| RowsEntry {
                    backend: Backend::Cpu,
                    call,
                    mode,
                    bits,
                    group_size,
                    dtype: Dtype::Bfloat16,
                    limit: RowsLimit::AtMost(limit),
                })
        })
        .collect();
    RowsRegime::from_measured(Backend::Cpu, entries)
}

fn row_slice(a: &Array, start: i32, len: i32) -> Array {
    let parts = a.split_at_indices(&[start, start + len], 0).unwrap();
    parts[1].clone()
}

#[test]
fn chunked_rows_equal_rows_sent_alone_for_every_chunk_size() {
    for (mode, bits, gs) in MEASURED_SPECS {
        let w = normal_as(&[32, 256], 1, Dtype::Bfloat16);
        let payload = QuantizedPayload::quantize(&w, spec(mode, bits, gs)).unwrap();
        let bias = normal_as(&[11, 32], 2, Dtype::Bfloat16);
        let mut l = QuantizedLinear::new(payload, Some(bias)).unwrap();
        let x = normal_as(&[11, 256], 3, Dtype::Bfloat16);
        for limit in [1, 3, 7, 11, 64] {
            l.set_rows_regime(Some(regime(limit)));
            assert_eq!(
                l.rows_limit(Dtype::Bfloat16).unwrap(),
                RowsLimit::AtMost(limit)
            );
            let y = l.forward_as(&x, Forward::RowsIndependent).unwrap();
            for i in 0..11 {
                // Row i alone, with its own row of the per-row bias.
                let alone = QuantizedLinear::new(
                    l.payload().clone(),
                    Some(row_slice(l.bias().unwrap(), i, 1)),
                )
                .unwrap()
                .forward(&row_slice(&x, i, 1))
                .unwrap();
                assert!(
                    same_bits(&row_slice(&y, i, 1), &alone),
                    "{mode} limit {limit} row {i}"
                );
            }
        }
    }
}

#[test]
fn adapters_keep_one_row_per_call() {
    let w = normal_as(&[32, 128], 4, Dtype::Bfloat16);
    let payload = QuantizedPayload::quantize(&w, spec(Mode::Affine, 4, 64)).unwrap();
    let mut l = QuantizedLinear::new(payload, None).unwrap();
    l.set_rows_regime(Some(regime(7)));
    l.attach_adapter(
        "a",
        LoraAdapter::new(normal(&[128, 4], 5), normal(&[4, 32], 6), 2.0).unwrap(),
    )
    .unwrap();
    assert_eq!(l.rows_limit(Dtype::Bfloat16).unwrap(), RowsLimit::AtMost(1));
}

#[test]
fn the_default_regime_is_the_default_devices() {
    let w = normal_as(&[32, 128], 4, Dtype::Bfloat16);
    let payload = QuantizedPayload::quantize(&w, spec(Mode::Affine, 4, 64)).unwrap();
    let l = QuantizedLinear::new(payload, None).unwrap();
    // The tests run on the CPU: measured unbounded there.
    assert_eq!(Backend::of_default_device().unwrap(), Backend::Cpu);
    assert_eq!(l.rows_limit(Dtype::Bfloat16).unwrap(), RowsLimit::Unbounded);
    // An unmeasured dtype gets one row per call.
    assert_eq!(
        RowsRegime::for_backend(Backend::Cpu).limit(
            RowsCall::QuantizedMatmul,
            spec(Mode::Affine, 4, 64),
            Dtype::Float64,
            128
        ),
        RowsLimit::AtMost(1)
    );
}

fn switch_layer(experts: i32, out: i32, inp: i32) -> QuantizedSwitchLinear {
    let w = normal_as(&[experts, out, inp], 7, Dtype::Bfloat16);
    let payload = QuantizedPayload::quantize(&w, spec(Mode::Affine, 4, 64)).unwrap();
    QuantizedSwitchLinear::new(payload, None).unwrap()
}

#[test]
fn routed_forward_equals_the_checked_forward() {
    let layer = switch_layer(8, 32, 128);
    let x = normal_as(&[1, 3, 1, 1, 128], 8, Dtype::Bfloat16);
    let scores = normal(&[1, 3, 8], 9);
    let top = ExpertIndices::top_k(&scores, 2).unwrap();
    assert_eq!(top.array().shape(), &[1, 3, 2]);
    assert_eq!(top.num_experts(), 8);
    let routed = layer.forward_routed(&x, &top, false).unwrap();
    let checked = layer.forward(&x, top.array(), false).unwrap();
    assert!(same_bits(&routed, &checked));
    // The top-k are the two largest scores of each row.
    let picked = scores.take_along_axis(top.array(), -1).unwrap();
    let below: i32 = ops::sum(
        ops::ge(&scores, picked.min_axis(-1, true).unwrap())
            .unwrap()
            .as_dtype(Dtype::Int32)
            .unwrap(),
        None,
    )
    .unwrap()
    .try_item_exact::<i32>()
    .unwrap();
    // Exactly the k = 2 picked scores of each of the 3 rows reach the
    // smallest picked one (normal scores have no ties).
    assert_eq!(below, 6);
}

#[test]
fn expert_indices_errors_are_typed() {
    let layer = switch_layer(8, 32, 128);
    let x = normal_as(&[1, 1, 1, 1, 128], 8, Dtype::Bfloat16);
    let other = ExpertIndices::top_k(&normal(&[1, 1, 4], 1), 2).unwrap();
    assert!(matches!(
        layer.forward_routed(&x, &other, false),
        Err(LayerError::ExpertCount {
            indices_for: 4,
            num_experts: 8
        })
    ));
    for k in [0, 9] {
        let e = ExpertIndices::top_k(&normal(&[1, 8], 1), k).unwrap_err();
        assert!(matches!(e, LayerError::TopK { .. }), "{e}");
        assert!(e.to_string().contains("1 <= k <= E"));
    }
    assert!(matches!(
        ExpertIndices::top_k(&Array::from_f32(1.0), 1),
        Err(LayerError::TopK { .. })
    ));
    let bad = Array::from_slice(&[0i32, 8], &[1, 2]);
    assert!(matches!(
        ExpertIndices::checked(bad, 8),
        Err(LayerError::ExpertIndexOutOfRange {
            index: 8,
            position: 1,
            num_experts: 8
        })
    ));
}

#[test]
fn switch_rows_independent_equals_tokens_sent_alone() {
    let layer = switch_layer(8, 32, 128);
    let tokens = 7;
    let x = normal_as(&[tokens, 1, 1, 128], 10, Dtype::Bfloat16);
    let top = ExpertIndices::top_k(&normal(&[tokens, 8], 11), 2).unwrap();
    for limit in [1, 2, 5, 7, 64] {
        let y = layer
            .forward_rows_independent(&x, &top, &regime(limit))
            .unwrap();
        assert_eq!(y.shape(), &[tokens, 2, 1, 32]);
        for t in 0..tokens {
            let ids = ExpertIndices::checked(row_slice(top.array(), t, 1), 8).unwrap();
            let alone = layer
                .forward_routed(&row_slice(&x, t, 1), &ids, false)
                .unwrap();
            assert!(
                same_bits(&row_slice(&y, t, 1), &alone),
                "limit {limit} token {t}"
            );
        }
    }
}

#[test]
fn switch_rows_independent_refuses_other_layouts() {
    let layer = switch_layer(8, 32, 128);
    let top = ExpertIndices::top_k(&normal(&[3, 8], 11), 2).unwrap();
    for shape in [
        &[3, 128][..],
        &[4, 1, 1, 128],
        &[3, 3, 1, 128],
        &[1, 3, 1, 1, 128],
    ] {
        let x = normal_as(shape, 12, Dtype::Bfloat16);
        let e = layer
            .forward_rows_independent(&x, &top, &regime(7))
            .unwrap_err();
        assert!(matches!(e, LayerError::RowsLayout { .. }), "{shape:?}: {e}");
        assert!(e.to_string().contains("forward_routed"));
    }
}

/// The shipped table is the measurement: CPU unbounded (the finder, x86-64,
/// M = 1..=24, 1..=12 switch tokens), CUDA `quantized_matmul` at most 7 rows
/// and `gather_qmm` split at 7 routed rows (H200, 2026-12-02,
/// `fixtures/gpu-runs/h200-2026-12-02/rows-regime/` in this repository),
/// Metal absent (one row per call until Apple hardware measures it). The
/// conformance finders `quantized/rows-regime/*/finder` re-measure it.
#[test]
fn the_shipped_table_is_the_measured_one() {
    let rows = layers::quantized::rows_regime::shipped();
    assert_eq!(
        rows.len(),
        2 * 2 * 6 * 3,
        "CPU and CUDA, both calls, 6 specs, 3 dtypes"
    );
    for e in &rows {
        let expected = match (e.backend, e.call) {
            (Backend::Cpu, _) => RowsLimit::Unbounded,
            (Backend::Cuda, RowsCall::QuantizedMatmul) => RowsLimit::AtMost(7),
            (Backend::Cuda, RowsCall::GatherQmm) => RowsLimit::Boundary(7),
            (Backend::Metal, _) => panic!("Metal has not been measured: {e:?}"),
        };
        assert_eq!(e.limit, expected, "{e:?}");
    }
    // Top-8 tokens batch at any count on CUDA; top-2 in threes.
    let cuda = RowsRegime::for_backend(Backend::Cuda);
    let gather = cuda.limit(
        RowsCall::GatherQmm,
        spec(Mode::Affine, 4, 64),
        Dtype::Bfloat16,
        512,
    );
    assert_eq!(gather.units(8, 12), 12);
    assert_eq!(gather.units(2, 12), 3);
}
