//! The fused Metal mRoPE kernel as data: source text, name and launch
//! settings against what the pinned reference passes to
//! `mx.fast.metal_kernel` (mlx-vlm 0.7.6 `rope_utils._mrope_apply_kernel`,
//! `_fast_mrope_apply`). The expected texts were captured from the
//! reference by forcing `_HAS_METAL = True` and recording the keyword
//! arguments of a stubbed `mx.fast.metal_kernel`; they are kernel source,
//! not float outputs, so they are the same on every platform.

use layers::position::{
    mrope_kernel_launch, mrope_kernel_spec, Pairing, PositionError, MROPE_KERNEL_THREADGROUP,
};
use mlx_rs::Dtype;

struct KernelCase {
    rotary_dim: usize,
    position_ndim: usize,
    pairing: Pairing,
    name: &'static str,
    source: &'static str,
}

const CASES: &[KernelCase] = &[
    KernelCase {
        rotary_dim: 64,
        position_ndim: 3,
        pairing: Pairing::HalfSplit,
        name: "mrope_apply_half_split_64_3d",
        source: "\n        uint elem = thread_position_in_grid.x;\n\n        const int half_dim = 32;\n        const int q_bsz = x_shape[0];\n        const int q_heads = x_shape[1];\n        const int q_len = x_shape[2];\n        const int q_dim = x_shape[3];\n        const int slots = half_dim + q_dim - 64;\n        const int work_size = q_bsz * q_heads * q_len * slots;\n\n        if (elem >= uint(work_size)) {\n            return;\n        }\n\n        int local = int(elem);\n        int slot = local % slots;\n        int tmp = local / slots;\n        int t = tmp % q_len;\n        tmp = tmp / q_len;\n        int h = tmp % q_heads;\n        int b = tmp / q_heads;\n        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n\n        if (slot >= half_dim) {\n            int pass_d = 64 + slot - half_dim;\n            int pass_idx = base + pass_d;\n            x_out[pass_idx] = x[pass_idx];\n            return;\n        }\n\n        \n        int freq_idx = slot;\n        int d = freq_idx;\n        int pair_d = d + half_dim;\n        int axis = int(position_selector[freq_idx]);\n        float pos = static_cast<float>(position_ids[(axis * q_bsz + b) * q_len + t]);\n        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n        float c = metal::cos(angle);\n        float s = metal::sin(angle);\n        \n\n        int idx = base + d;\n        float xv = static_cast<float>(x[idx]);\n        float xp = static_cast<float>(x[base + pair_d]);\n        x_out[idx] = static_cast<T>(xv * c - xp * s);\n        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n    ",
    },
    KernelCase {
        rotary_dim: 64,
        position_ndim: 2,
        pairing: Pairing::HalfSplit,
        name: "mrope_apply_half_split_64_2d",
        source: "\n        uint elem = thread_position_in_grid.x;\n\n        const int half_dim = 32;\n        const int q_bsz = x_shape[0];\n        const int q_heads = x_shape[1];\n        const int q_len = x_shape[2];\n        const int q_dim = x_shape[3];\n        const int slots = half_dim + q_dim - 64;\n        const int work_size = q_bsz * q_heads * q_len * slots;\n\n        if (elem >= uint(work_size)) {\n            return;\n        }\n\n        int local = int(elem);\n        int slot = local % slots;\n        int tmp = local / slots;\n        int t = tmp % q_len;\n        tmp = tmp / q_len;\n        int h = tmp % q_heads;\n        int b = tmp / q_heads;\n        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n\n        if (slot >= half_dim) {\n            int pass_d = 64 + slot - half_dim;\n            int pass_idx = base + pass_d;\n            x_out[pass_idx] = x[pass_idx];\n            return;\n        }\n\n        \n        int freq_idx = slot;\n        int d = freq_idx;\n        int pair_d = d + half_dim;\n        \n        float pos = static_cast<float>(position_ids[b * q_len + t]);\n        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n        float c = metal::cos(angle);\n        float s = metal::sin(angle);\n        \n\n        int idx = base + d;\n        float xv = static_cast<float>(x[idx]);\n        float xp = static_cast<float>(x[base + pair_d]);\n        x_out[idx] = static_cast<T>(xv * c - xp * s);\n        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n    ",
    },
    KernelCase {
        rotary_dim: 128,
        position_ndim: 3,
        pairing: Pairing::EvenOdd,
        name: "mrope_apply_even_odd_128_3d",
        source: "\n        uint elem = thread_position_in_grid.x;\n\n        const int half_dim = 64;\n        const int q_bsz = x_shape[0];\n        const int q_heads = x_shape[1];\n        const int q_len = x_shape[2];\n        const int q_dim = x_shape[3];\n        const int slots = half_dim + q_dim - 128;\n        const int work_size = q_bsz * q_heads * q_len * slots;\n\n        if (elem >= uint(work_size)) {\n            return;\n        }\n\n        int local = int(elem);\n        int slot = local % slots;\n        int tmp = local / slots;\n        int t = tmp % q_len;\n        tmp = tmp / q_len;\n        int h = tmp % q_heads;\n        int b = tmp / q_heads;\n        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n\n        if (slot >= half_dim) {\n            int pass_d = 128 + slot - half_dim;\n            int pass_idx = base + pass_d;\n            x_out[pass_idx] = x[pass_idx];\n            return;\n        }\n\n        \n        int freq_idx = slot;\n        int d = freq_idx * 2;\n        int pair_d = d + 1;\n        int axis = int(position_selector[freq_idx]);\n        float pos = static_cast<float>(position_ids[(axis * q_bsz + b) * q_len + t]);\n        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n        float c = metal::cos(angle);\n        float s = metal::sin(angle);\n        \n\n        int idx = base + d;\n        float xv = static_cast<float>(x[idx]);\n        float xp = static_cast<float>(x[base + pair_d]);\n        x_out[idx] = static_cast<T>(xv * c - xp * s);\n        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n    ",
    },
    KernelCase {
        rotary_dim: 48,
        position_ndim: 2,
        pairing: Pairing::EvenOdd,
        name: "mrope_apply_even_odd_48_2d",
        source: "\n        uint elem = thread_position_in_grid.x;\n\n        const int half_dim = 24;\n        const int q_bsz = x_shape[0];\n        const int q_heads = x_shape[1];\n        const int q_len = x_shape[2];\n        const int q_dim = x_shape[3];\n        const int slots = half_dim + q_dim - 48;\n        const int work_size = q_bsz * q_heads * q_len * slots;\n\n        if (elem >= uint(work_size)) {\n            return;\n        }\n\n        int local = int(elem);\n        int slot = local % slots;\n        int tmp = local / slots;\n        int t = tmp % q_len;\n        tmp = tmp / q_len;\n        int h = tmp % q_heads;\n        int b = tmp / q_heads;\n        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n\n        if (slot >= half_dim) {\n            int pass_d = 48 + slot - half_dim;\n            int pass_idx = base + pass_d;\n            x_out[pass_idx] = x[pass_idx];\n            return;\n        }\n\n        \n        int freq_idx = slot;\n        int d = freq_idx * 2;\n        int pair_d = d + 1;\n        \n        float pos = static_cast<float>(position_ids[b * q_len + t]);\n        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n        float c = metal::cos(angle);\n        float s = metal::sin(angle);\n        \n\n        int idx = base + d;\n        float xv = static_cast<float>(x[idx]);\n        float xp = static_cast<float>(x[base + pair_d]);\n        x_out[idx] = static_cast<T>(xv * c - xp * s);\n        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n    ",
    },
    KernelCase {
        rotary_dim: 6,
        position_ndim: 3,
        pairing: Pairing::HalfSplit,
        name: "mrope_apply_half_split_6_3d",
        source: "\n        uint elem = thread_position_in_grid.x;\n\n        const int half_dim = 3;\n        const int q_bsz = x_shape[0];\n        const int q_heads = x_shape[1];\n        const int q_len = x_shape[2];\n        const int q_dim = x_shape[3];\n        const int slots = half_dim + q_dim - 6;\n        const int work_size = q_bsz * q_heads * q_len * slots;\n\n        if (elem >= uint(work_size)) {\n            return;\n        }\n\n        int local = int(elem);\n        int slot = local % slots;\n        int tmp = local / slots;\n        int t = tmp % q_len;\n        tmp = tmp / q_len;\n        int h = tmp % q_heads;\n        int b = tmp / q_heads;\n        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n\n        if (slot >= half_dim) {\n            int pass_d = 6 + slot - half_dim;\n            int pass_idx = base + pass_d;\n            x_out[pass_idx] = x[pass_idx];\n            return;\n        }\n\n        \n        int freq_idx = slot;\n        int d = freq_idx;\n        int pair_d = d + half_dim;\n        int axis = int(position_selector[freq_idx]);\n        float pos = static_cast<float>(position_ids[(axis * q_bsz + b) * q_len + t]);\n        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n        float c = metal::cos(angle);\n        float s = metal::sin(angle);\n        \n\n        int idx = base + d;\n        float xv = static_cast<float>(x[idx]);\n        float xp = static_cast<float>(x[base + pair_d]);\n        x_out[idx] = static_cast<T>(xv * c - xp * s);\n        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n    ",
    },
];

#[test]
fn kernel_text_matches_the_reference_byte_for_byte() {
    for case in CASES {
        let spec = mrope_kernel_spec(case.rotary_dim, case.position_ndim, case.pairing);
        assert_eq!(spec.name, case.name);
        if spec.source != case.source {
            let first = spec
                .source
                .bytes()
                .zip(case.source.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(spec.source.len().min(case.source.len()));
            panic!(
                "{}: source differs at byte {first}:\n port: {:?}\n  ref: {:?}",
                case.name,
                &spec.source[first.saturating_sub(20)..(first + 40).min(spec.source.len())],
                &case.source[first.saturating_sub(20)..(first + 40).min(case.source.len())],
            );
        }
        assert_eq!(
            spec.input_names,
            ["x", "position_ids", "inv_freq", "position_selector"]
        );
        assert_eq!(spec.output_names, ["x_out"]);
        // `mx.fast.metal_kernel` defaults the reference relies on.
        assert_eq!(spec.header, "");
        assert!(spec.ensure_row_contiguous);
        assert!(!spec.atomic_outputs);
    }
}

#[test]
fn kernel_selects_the_axis_only_in_the_3d_form() {
    let three = mrope_kernel_spec(64, 3, Pairing::HalfSplit);
    let two = mrope_kernel_spec(64, 2, Pairing::HalfSplit);
    assert!(three
        .source
        .contains("int axis = int(position_selector[freq_idx]);"));
    assert!(!two.source.contains("position_selector"));
    assert!(two.source.contains("position_ids[b * q_len + t]"));
}

#[test]
fn launch_matches_the_reference_for_q_and_k() {
    // Captured from `_fast_mrope_apply` with a recording kernel:
    // q (2, 4, 5, 256) and k (2, 1, 5, 256) bf16, inv_freq of length 32.
    let q = mrope_kernel_launch(&[2, 4, 5, 256], Dtype::Bfloat16, 32).unwrap();
    assert_eq!(q.grid, [8960, 1, 1]);
    assert_eq!(q.threadgroup, [256, 1, 1]);
    assert_eq!(q.template, vec![("T", Dtype::Bfloat16)]);
    assert_eq!(q.output_shapes, vec![vec![2, 4, 5, 256]]);
    assert_eq!(q.output_dtypes, vec![Dtype::Bfloat16]);
    let k = mrope_kernel_launch(&[2, 1, 5, 256], Dtype::Bfloat16, 32).unwrap();
    assert_eq!(k.grid, [2240, 1, 1]);
    assert_eq!(MROPE_KERNEL_THREADGROUP, [256, 1, 1]);
}

#[test]
fn launch_without_pass_through_has_one_thread_per_pair() {
    let launch = mrope_kernel_launch(&[1, 2, 3, 64], Dtype::Float32, 32).unwrap();
    assert_eq!(launch.grid, [2 * 3 * 32, 1, 1]);
}

#[test]
fn launch_errors() {
    assert!(matches!(
        mrope_kernel_launch(&[1, 2, 64], Dtype::Float32, 32),
        Err(PositionError::Rank { .. })
    ));
    assert!(matches!(
        mrope_kernel_launch(&[1, 2, 3, 32], Dtype::Float32, 32),
        Err(PositionError::RotaryDimExceedsHeadDim {
            rotary_dim: 64,
            head_dim: 32
        })
    ));
    assert!(matches!(
        mrope_kernel_launch(&[65_536, 65_536, 1, 64], Dtype::Float32, 32),
        Err(PositionError::GridOverflow { .. })
    ));
}
