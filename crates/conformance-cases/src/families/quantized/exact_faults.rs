//! The exact oracle's self-test: each fault kind that a bit comparison
//! against the same kernel cannot see is planted into a copy of a real
//! port output (MLX on this machine's CPU), and the oracle must put it
//! outside the bound, with a readable row. The unplanted output must be
//! within.

use exact::Model;
use layers::quantized::{Mode, QuantizedLinear};
use oracle::{Arg, DType, HostTensor};

use super::{
    activation, affine, host, layer_tensors, mode_default, quantized_weight, QuantizedTensors,
};
use crate::exactness::{quantized::linear, ExactCheck, ExactClass, ExactPair, Sent};
use crate::inputs::Inputs;

const M: usize = 6;
const N: usize = 32;

fn sent(x: &HostTensor, t: &QuantizedTensors) -> Sent {
    Sent::new(vec![
        ("x", Arg::Tensor(x.clone())),
        ("weight", Arg::Tensor(t.weight.clone())),
        ("scales", Arg::Tensor(t.scales.clone())),
        ("biases", t.biases.clone().map_or(Arg::None, Arg::Tensor)),
        ("bias", Arg::None),
        ("mode", Arg::from(t.spec.mode.as_str())),
        ("bits", Arg::from(t.spec.bits)),
        ("group_size", Arg::from(t.spec.group_size)),
    ])
}

struct Setup {
    x: HostTensor,
    tensors: QuantizedTensors,
    layer: QuantizedLinear,
    y: HostTensor,
    exact: ExactPair,
}

fn setup(mode: Mode, seed: u64) -> Setup {
    let spec = if mode == Mode::Affine {
        affine(4, 32)
    } else {
        mode_default(mode)
    };
    let mut inputs = Inputs::new(seed);
    let k = 3 * spec.group_size as usize;
    let x = activation(&mut inputs, DType::Bfloat16, &[M, k]);
    let payload = quantized_weight(&mut inputs, spec, DType::Bfloat16, &[N, k]).unwrap();
    let tensors = layer_tensors(&payload, None).unwrap();
    let layer = QuantizedLinear::new(payload, None).unwrap();
    let y = host(&layer.forward(&x.to_array()).unwrap()).unwrap();
    let e = std::sync::Arc::new(linear(&sent(&x, &tensors), Model::Cpu, "weight", false).unwrap());
    Setup {
        x,
        tensors,
        layer,
        y,
        exact: ExactPair::same(e),
    }
}

/// Measures a planted output as both sides (a fault both share) and
/// returns the row.
fn caught(planted: &HostTensor, exact: &ExactPair, fault: &str) -> String {
    let c = ExactCheck::measure(planted, planted, exact, true);
    let row = c.line("y");
    assert_eq!(
        c.class,
        ExactClass::ReferenceOutside,
        "{fault} not caught: {row}"
    );
    println!("{fault}: {row}");
    row
}

/// bf16 bits of `values` in a tensor of `shape`.
fn bf16(values: &[f64], shape: &[usize]) -> HostTensor {
    let bytes = values
        .iter()
        .flat_map(|v| half::bf16::from_f64(*v).to_bits().to_le_bytes())
        .collect();
    HostTensor::new(DType::Bfloat16, shape.to_vec(), bytes).unwrap()
}

#[test]
fn the_unplanted_output_is_within_its_bound() {
    for mode in [Mode::Affine, Mode::Mxfp4] {
        let s = setup(mode, 1);
        let c = ExactCheck::measure(&s.y, &s.y, &s.exact, true);
        assert_eq!(c.class, ExactClass::Within, "{}", c.line("y"));
    }
}

#[test]
fn a_zeroed_output_is_caught() {
    let s = setup(Mode::Affine, 2);
    let mut z = s.y.clone();
    z.bytes.iter_mut().for_each(|b| *b = 0);
    caught(&z, &s.exact, "zeroed output");
}

#[test]
fn an_output_holding_a_recycled_buffer_is_caught() {
    // The bytes an earlier call of the same shape left: its result.
    let s = setup(Mode::Affine, 3);
    let earlier = setup(Mode::Affine, 4);
    caught(&earlier.y, &s.exact, "recycled buffer");
}

#[test]
fn a_broadcast_read_as_contiguous_is_caught() {
    // x is row 0 broadcast to M rows (stride 0); a kernel ignoring the
    // stride reads the buffer's rows 0..M instead.
    let s = setup(Mode::Affine, 5);
    let k = s.x.shape[1];
    let row0 = HostTensor::new(DType::Bfloat16, vec![1, k], s.x.bytes[..2 * k].to_vec()).unwrap();
    let broadcast: Vec<u8> = std::iter::repeat_n(row0.bytes.clone(), M)
        .flatten()
        .collect();
    let xb = HostTensor::new(DType::Bfloat16, vec![M, k], broadcast).unwrap();
    let e =
        std::sync::Arc::new(linear(&sent(&xb, &s.tensors), Model::Cpu, "weight", false).unwrap());
    let exact = ExactPair::same(e);
    // The right result is within: the port on the materialised broadcast.
    let right = host(&s.layer.forward(&xb.to_array()).unwrap()).unwrap();
    assert_eq!(
        ExactCheck::measure(&right, &right, &exact, true).class,
        ExactClass::Within
    );
    caught(
        &s.y,
        &exact,
        "stride ignored (broadcast read as contiguous)",
    );
}

#[test]
fn a_scale_byte_used_raw_is_caught() {
    // mxfp4: the e8m0 byte s used as the value s instead of 2^(s - 127).
    let s = setup(Mode::Mxfp4, 6);
    let m =
        crate::exactness::quantized::Matrix::from_sent(&sent(&s.x, &s.tensors), "weight").unwrap();
    let w = m.view();
    let k = w.cols;
    let xs = crate::exactness::values(&s.x);
    let mut raw = Vec::with_capacity(M * N);
    for r in 0..M {
        for n in 0..N {
            let row = w.row(n);
            let mut sum = 0.0;
            for c in 0..k {
                let g = c / w.group_size;
                sum += xs[r * k + c]
                    * row.code[c]
                    * f64::from(s.tensors.scales.bytes[n * (k / w.group_size) + g]);
            }
            raw.push(sum);
        }
    }
    caught(&bf16(&raw, &[M, N]), &s.exact, "scale applied raw");
}

#[test]
fn one_rows_result_swapped_with_anothers_is_caught() {
    let s = setup(Mode::Affine, 7);
    let mut swapped = s.y.clone();
    let row = 2 * N;
    let (a, b) = swapped.bytes.split_at_mut(row);
    a.swap_with_slice(&mut b[..row]);
    caught(&swapped, &s.exact, "rows swapped");
}

/// The fault catalogue (`exactness::faults`, issue 41) on a real output:
/// an input fault (the exact value of the faulty inputs, added to the
/// real output) and an output fault are flagged; the unfaulty output's
/// bits are never counted as a fault.
#[test]
fn the_fault_catalogue_flags_a_dropped_k_tail_and_a_neighbour_groups_scale() {
    use crate::exactness::faults::{inject_all, FaultKind, Variant};
    let s = setup(Mode::Affine, 8);
    let inputs = sent(&s.x, &s.tensors);
    let mut pair = s.exact.clone();
    for kind in FaultKind::ALL {
        if let Some(faulty) = kind.mutate(&inputs) {
            let e = linear(&faulty, Model::Cpu, "weight", false).unwrap();
            pair.variants.push(Variant {
                kind,
                value: e.value,
            });
        }
    }
    let checks = inject_all("y", &s.y, &pair);
    let of = |k: FaultKind| {
        checks
            .iter()
            .find(|c| c.kind == k)
            .unwrap_or_else(|| panic!("{k:?} not injected: {checks:?}"))
    };
    for k in [
        FaultKind::KTailDropped,
        FaultKind::KTailDoubled,
        FaultKind::GroupScaleFromNeighbour,
        FaultKind::GroupBiasFromNeighbour,
        FaultKind::LastNTileZero,
        FaultKind::RowsSwapped,
    ] {
        let c = of(k);
        assert!(c.flagged && c.changed > 0, "{c:?}");
        assert!(c.max_ratio.is_some_and(|r| r > 1.0), "{c:?}");
    }
    // No KV, no positions, no experts, a bf16 output: not applicable.
    for k in [
        FaultKind::KvRowFromAnotherRow,
        FaultKind::RopePositionOffByOne,
        FaultKind::ExpertRowsSwapped,
        FaultKind::Bf16Intermediate,
    ] {
        assert!(checks.iter().all(|c| c.kind != k), "{k:?}: {checks:?}");
    }
}

/// The x86-64 CPU's quantized matmul bound (issue 41: the scalar loops
/// emulated, `exact::matmul`'s module doc, "Emulated"): over 24 seeds,
/// affine, mxfp4, mxfp8 and nvfp4, bf16 and f16, K of 96 and 512, every
/// correct output (MLX's CPU kernel through the port) is within it, and
/// the bound is that tight: the output rounded through bf16 (f16) or its
/// last 32 of K dropped (bf16) is flagged, where the worst-case bound let
/// them pass.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_emulated_cpu_bound_holds_over_many_seeds_and_is_tight() {
    use crate::exactness::faults::{inject_all, FaultKind, Variant};
    let specs = [
        affine(4, 32),
        mode_default(Mode::Mxfp4),
        mode_default(Mode::Mxfp8),
        mode_default(Mode::Nvfp4),
    ];
    for seed in 0..24u64 {
        for (dtype, spec) in [DType::Bfloat16, DType::Float16]
            .into_iter()
            .flat_map(|d| specs.iter().map(move |s| (d, *s)))
        {
            for k in [96usize, 512] {
                let mut inputs = Inputs::new(1000 + seed);
                let x = activation(&mut inputs, dtype, &[M, k]);
                let payload = quantized_weight(&mut inputs, spec, dtype, &[N, k]).unwrap();
                let tensors = layer_tensors(&payload, None).unwrap();
                let layer = QuantizedLinear::new(payload, None).unwrap();
                let y = host(&layer.forward(&x.to_array()).unwrap()).unwrap();
                let inputs = sent(&x, &tensors);
                let e = linear(&inputs, Model::Cpu, "weight", false).unwrap();
                let mut pair = ExactPair::same(std::sync::Arc::new(e));
                let c = ExactCheck::measure(&y, &y, &pair, true);
                let at = format!("seed {seed} {} {spec:?} K {k}", dtype.name());
                assert_eq!(c.class, ExactClass::Within, "{at}: {}", c.line("y"));
                let faulty = FaultKind::KTailDropped.mutate(&inputs).unwrap();
                pair.variants.push(Variant {
                    kind: FaultKind::KTailDropped,
                    value: linear(&faulty, Model::Cpu, "weight", false).unwrap().value,
                });
                let checks = inject_all("y", &y, &pair);
                let tight = if dtype == DType::Float16 {
                    FaultKind::Bf16Intermediate
                } else {
                    FaultKind::KTailDropped
                };
                let f = checks.iter().find(|f| f.kind == tight).unwrap();
                assert!(f.flagged, "{at}: {f:?}");
            }
        }
    }
}
