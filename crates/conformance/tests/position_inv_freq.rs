//! Property: the port's device `inv_freq` (`layers::position::compute_inv_freq`)
//! equals the reference's `mlx_vlm.models.rope_utils.compute_inv_freq`
//! (mlx-vlm 0.7.6) bit for bit, for every even rotary dim 2..=512 and theta
//! in [100, 1e7] (log-uniform, so small and large thetas both occur).

use conformance::case::{Backend, Ctx};
use conformance::reference::position::position_inv_freq;
use conformance::runner;
use layers::position::compute_inv_freq;
use oracle::{compare, Comparison, HostTensor, Oracle};
use proptest::prelude::*;

fn oracle() -> Oracle {
    let oracle = Oracle::start().expect("oracle starts (run `cargo xtask setup`)");
    runner::set_device(Backend::Cpu);
    oracle.set_device(Backend::Cpu).expect("cpu");
    oracle
}

fn port(dim: usize, theta: f64) -> HostTensor {
    HostTensor::from_array(&compute_inv_freq(dim, theta).expect("inv_freq")).expect("to host")
}

fn reference(oracle: &Oracle, dim: usize, theta: f64) -> HostTensor {
    let ctx = Ctx::new(oracle, Backend::Cpu, 0, "proptest/position/inv-freq", false);
    position_inv_freq(&ctx, &[dim], theta)
        .expect("reference call")
        .into_tensor()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn device_inv_freq_equals_reference(half in 1usize..=256, exponent in 2.0f64..=7.0) {
        let dim = 2 * half;
        let theta = 10f64.powf(exponent).clamp(100.0, 1e7);
        let oracle = oracle();
        let comparison = compare(&port(dim, theta), &reference(&oracle, dim, theta));
        prop_assert!(comparison == Comparison::Equal, "dim {dim}, theta {theta}: {}", comparison.summary());
    }
}

#[test]
fn the_property_can_fail() {
    // A different theta gives different bits: the comparison is not vacuous.
    let oracle = oracle();
    let comparison = compare(&port(64, 1e4), &reference(&oracle, 64, 1e4 + 1.0));
    assert!(!comparison.is_equal());
}
