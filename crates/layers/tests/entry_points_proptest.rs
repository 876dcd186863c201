//! Every public entry point of `layers` returns `Ok` or a typed error for
//! any shape, including zero-size dimensions, mismatched widths, wrong
//! ranks, out-of-range expert ids, and sizes near the integer limits: no
//! panic, and no crash (a crash in MLX would end this test process).

mod checkpoint_support;

use checkpoint_support::normal_as;
use layers::dense::{Linear, SwitchLinear};
use layers::position::{
    apply_mrope, apply_multidimensional_rope, compute_inv_freq, Backend, MropeConfig, RegimeTable,
};
use layers::quantized::{
    Forward, Mode, QuantSpec, QuantizedLinear, QuantizedPayload, QuantizedSwitchLinear,
};
use mlx_rs::{Array, Dtype};
use proptest::prelude::*;

fn dims(max_rank: usize) -> impl Strategy<Value = Vec<i32>> {
    prop::collection::vec(
        prop_oneof![3 => 1i32..4, 2 => Just(0), 1 => 4i32..9],
        0..=max_rank,
    )
}

fn width(natural: i32) -> impl Strategy<Value = i32> {
    prop_oneof![4 => Just(natural), 1 => Just(0), 1 => Just(1), 1 => Just(natural + 1)]
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![
        Just(Dtype::Bfloat16),
        Just(Dtype::Float32),
        Just(Dtype::Float16)
    ]
}

fn shaped(mut lead: Vec<i32>, last: i32) -> Vec<i32> {
    lead.push(last);
    lead
}

fn evaluate(y: Result<Array, impl std::fmt::Display>) {
    if let Ok(y) = y {
        let _ = y.eval();
    }
}

fn indices(shape: &[i32], values: &[i64]) -> Array {
    let n: i32 = shape.iter().product();
    let v: Vec<i32> = (0..n as usize)
        .map(|i| values[i % values.len()] as i32)
        .collect();
    Array::from_slice(&v, shape)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn quantized_linear_any_shape(lead in dims(3), k in width(64), dt in dtype(), rows in any::<bool>(),
                                  mode in prop_oneof![Just((Mode::Affine, 4, 64)), Just((Mode::Mxfp4, 4, 32))]) {
        let w = normal_as(&[8, 64], 1, Dtype::Bfloat16);
        let spec = QuantSpec::new(mode.0, mode.1, mode.2).unwrap();
        let layer = QuantizedLinear::new(QuantizedPayload::quantize(&w, spec).unwrap(), None).unwrap();
        let x = normal_as(&shaped(lead, k), 2, dt);
        let forward = if rows { Forward::RowsIndependent } else { Forward::Batched };
        evaluate(layer.forward_as(&x, forward));
    }

    #[test]
    fn switch_layers_any_shape(lead in dims(2), m in prop_oneof![Just(1i32), Just(0), Just(2)], k in width(64),
                               idx_shape in dims(3), ids in prop::collection::vec(prop_oneof![0i64..4, Just(-1), Just(4), Just(i64::from(i32::MAX))], 1..4),
                               dt in dtype()) {
        let w = normal_as(&[4, 8, 64], 1, Dtype::Bfloat16);
        let q = QuantizedSwitchLinear::new(
            QuantizedPayload::quantize(&w, QuantSpec::new(Mode::Affine, 4, 64).unwrap()).unwrap(), None).unwrap();
        let f = SwitchLinear::new(normal_as(&[4, 8, 64], 1, Dtype::Float32), None).unwrap();
        let mut shape = lead;
        shape.extend([m, k]);
        let x = normal_as(&shape, 2, dt);
        let i = indices(&idx_shape, &ids);
        evaluate(q.forward(&x, &i, false));
        evaluate(f.forward(&x, &i, false));
    }

    #[test]
    fn float_linear_any_shape(lead in dims(3), k in width(16), dt in dtype(), bias in any::<bool>()) {
        let l = Linear::new(normal_as(&[8, 16], 1, Dtype::Float32), bias.then(|| normal_as(&[8], 2, Dtype::Float32))).unwrap();
        evaluate(l.forward(&normal_as(&shaped(lead, k), 3, dt)));
    }

    #[test]
    fn mrope_any_shape(q_shape in dims(5), k_shape in dims(5), p_shape in dims(4), dt in dtype(),
                       rotary_dim in prop_oneof![Just(64usize), Just(0), Just(2), Just(usize::MAX)],
                       section in prop::collection::vec(prop_oneof![0usize..12, Just(usize::MAX)], 0..4),
                       theta in prop_oneof![Just(1e4f64), Just(f64::NAN), Just(-1.0), Just(f64::MAX)]) {
        let config = MropeConfig { rotary_dim, rope_theta: theta, mrope_section: section, attention_scaling: 1.0 };
        let q = normal_as(&q_shape, 1, dt);
        let k = normal_as(&k_shape, 2, dt);
        let p = Array::from_slice(&vec![3i32; p_shape.iter().product::<i32>() as usize], &p_shape);
        if let Ok((a, b)) = apply_mrope(&q, &k, &p, &config) {
            let _ = a.eval();
            let _ = b.eval();
        }
    }

    #[test]
    fn rope2d_any_shape(x_shape in dims(5), p_shape in dims(4), dt in dtype(),
                        base in prop_oneof![Just(100.0f64), Just(f64::NAN), Just(0.0), Just(1e300)]) {
        let x = normal_as(&x_shape, 1, dt);
        let p = Array::from_slice(&vec![1i32; p_shape.iter().product::<i32>() as usize], &p_shape);
        evaluate(apply_multidimensional_rope(&x, &p, base));
    }

    #[test]
    fn sizes_near_the_integer_limits(dim in prop_oneof![Just(0usize), Just(usize::MAX), Just(i32::MAX as usize), Just(i32::MAX as usize + 1), 1usize..600],
                                     boundaries in prop::collection::vec(prop_oneof![any::<usize>(), Just(usize::MAX), Just(0usize)], 0..5),
                                     cache_len in prop_oneof![any::<usize>(), Just(usize::MAX)]) {
        // A valid dim stays small (1..600): an i32::MAX-wide inv_freq is a
        // legitimate 4 GiB request, not a bad input.
        if dim < 600 || dim > i32::MAX as usize {
            evaluate(compute_inv_freq(dim, 1e4));
        }
        for backend in [Backend::Cpu, Backend::Metal, Backend::Cuda] {
            if let Ok(table) = RegimeTable::from_measured(backend, boundaries.clone()) {
                let _ = table.append_chunk_size(cache_len);
                let _ = table.regime(cache_len);
            }
        }
        for table in [RegimeTable::cpu(), RegimeTable::metal(), RegimeTable::cuda()] {
            let _ = table.append_chunk_size(cache_len);
        }
    }
}
