//! The fused Metal mRoPE kernel: its source text and launch settings as pure
//! functions (comparable on any platform with what the reference passes to
//! `mx.fast.metal_kernel`), and its execution through raw mlx-c calls when
//! Metal is available.
//!
//! Mirrors `mlx_vlm.models.rope_utils._mrope_apply_kernel` and
//! `_fast_mrope_apply` (mlx-vlm 0.7.6) on MLX 0.32.2.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype, Stream};

use super::error::PositionError;

/// How a rotated channel is paired with its partner.
///
/// Mirrors `rope_utils._pairing_for_style` (mlx-vlm 0.7.6). Qwen3.5's
/// `"interleaved"` style uses [`Pairing::HalfSplit`]; [`Pairing::EvenOdd`]
/// exists for the kernel text of the even/odd styles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pairing {
    /// Channel `d` pairs with `d + rotary_dim/2` (`rotate_half`).
    HalfSplit,
    /// Channel `2i` pairs with `2i + 1` (`rotate_half_even_odd`).
    EvenOdd,
}

impl Pairing {
    /// The reference's string for this pairing (`_HALF_SPLIT`,
    /// `_EVEN_ODD`), as it appears in kernel names.
    pub fn as_str(self) -> &'static str {
        match self {
            Pairing::HalfSplit => "half_split",
            Pairing::EvenOdd => "even_odd",
        }
    }
}

/// Whether this libmlx has a usable Metal back end
/// (`mx.metal.is_available()`, MLX 0.32.2). Cached for the process, as the
/// reference caches it in `_HAS_METAL`.
///
/// # Errors
/// [`PositionError::MetalKernel`] if the mlx-c call fails;
/// [`PositionError::Mlx`] if MLX cannot report a default device.
pub fn metal_is_available() -> Result<bool, PositionError> {
    static HAS_METAL: OnceLock<bool> = OnceLock::new();
    if let Some(&known) = HAS_METAL.get() {
        return Ok(known);
    }
    // Any wrapped op installs mlx-rs's error handler; without it a failing
    // raw mlx-c call would print and exit the process.
    mlx_rs::Device::try_default()?;
    let mut available = false;
    // SAFETY: `available` is a valid out-pointer for the duration of the call.
    let status = unsafe { mlx_sys::mlx_metal_is_available(&mut available) };
    if status != 0 {
        return Err(PositionError::MetalKernel {
            call: "mlx_metal_is_available",
        });
    }
    Ok(*HAS_METAL.get_or_init(|| available))
}

/// Threads per threadgroup of every mRoPE kernel launch (`threadgroup=(256,
/// 1, 1)` in `_fast_mrope_apply`).
pub const MROPE_KERNEL_THREADGROUP: [i32; 3] = [256, 1, 1];

/// Everything `_mrope_apply_kernel` passes to `mx.fast.metal_kernel`, plus
/// the defaults it leaves implicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MropeKernelSpec {
    /// `mrope_apply_{pairing}_{rotary_dim}_{position_ndim}d`.
    pub name: String,
    /// `["x", "position_ids", "inv_freq", "position_selector"]`.
    pub input_names: [&'static str; 4],
    /// `["x_out"]`.
    pub output_names: [&'static str; 1],
    /// The kernel body, byte for byte as the reference's f-string renders it.
    pub source: String,
    /// `""`: the reference passes no header.
    pub header: String,
    /// `true`: `mx.fast.metal_kernel`'s default, which the reference keeps.
    /// (mlx-rs's `MetalKernelOptions` defaults to `false`; this port sets it.)
    pub ensure_row_contiguous: bool,
    /// `false`: the default.
    pub atomic_outputs: bool,
}

/// The launch settings `_fast_mrope_apply.apply_one` uses for one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MropeKernelLaunch {
    /// `(work_size, 1, 1)`, `work_size = B·H·L·slots`, `slots = half_dim +
    /// D − 2·half_dim` (one thread per rotated pair or pass-through channel).
    pub grid: [i32; 3],
    /// [`MROPE_KERNEL_THREADGROUP`].
    pub threadgroup: [i32; 3],
    /// `[("T", x.dtype)]`.
    pub template: Vec<(&'static str, Dtype)>,
    /// `[x.shape]`.
    pub output_shapes: Vec<Vec<i32>>,
    /// `[x.dtype]`.
    pub output_dtypes: Vec<Dtype>,
}

/// The kernel `rope_utils._mrope_apply_kernel(rotary_dim, position_ndim,
/// pairing)` builds (mlx-vlm 0.7.6), as data.
///
/// `position_ndim == 2` selects the text form (`position_ids[b * q_len +
/// t]`, no selector line); any other value the 3-D form reading
/// `position_selector`, exactly as the reference branches. `rotary_dim / 2`
/// is floor division, as `rotary_dim // 2`. Pure: runs on any platform.
///
/// The kernel computes, per rotated pair, `angle = float(pos) *
/// inv_freq[i]`, `c = metal::cos(angle)`, `s = metal::sin(angle)`, and
/// writes `x·c − x_pair·s` and `x_pair·c + x·s` rounded once to `T`; pass-
/// through channels are copied. It does not apply `attention_scaling`.
///
/// Finding: the origin (`qwen-mrope.ts` `mropeKernel`) renders only the 3-D
/// form, and its text differs from the reference's in whitespace only: it
/// lacks the two indentation-only lines (`"        "`) around the pair
/// block and the trailing `"    "`. Same code, not the same bytes.
pub fn mrope_kernel_spec(
    rotary_dim: usize,
    position_ndim: usize,
    pairing: Pairing,
) -> MropeKernelSpec {
    let (position_expr, selector_source) = if position_ndim == 2 {
        ("position_ids[b * q_len + t]", "")
    } else {
        (
            "position_ids[(axis * q_bsz + b) * q_len + t]",
            "int axis = int(position_selector[freq_idx]);",
        )
    };
    let (d_expr, pair_expr) = match pairing {
        Pairing::EvenOdd => ("freq_idx * 2", "d + 1"),
        Pairing::HalfSplit => ("freq_idx", "d + half_dim"),
    };
    let pair_source = format!(
        concat!(
            "\n",
            "        int freq_idx = slot;\n",
            "        int d = {d_expr};\n",
            "        int pair_d = {pair_expr};\n",
            "        {selector_source}\n",
            "        float pos = static_cast<float>({position_expr});\n",
            "        float angle = pos * static_cast<float>(inv_freq[freq_idx]);\n",
            "        float c = metal::cos(angle);\n",
            "        float s = metal::sin(angle);\n",
            "        ",
        ),
        d_expr = d_expr,
        pair_expr = pair_expr,
        selector_source = selector_source,
        position_expr = position_expr,
    );
    let source = format!(
        concat!(
            "\n",
            "        uint elem = thread_position_in_grid.x;\n",
            "\n",
            "        const int half_dim = {half};\n",
            "        const int q_bsz = x_shape[0];\n",
            "        const int q_heads = x_shape[1];\n",
            "        const int q_len = x_shape[2];\n",
            "        const int q_dim = x_shape[3];\n",
            "        const int slots = half_dim + q_dim - {rotary_dim};\n",
            "        const int work_size = q_bsz * q_heads * q_len * slots;\n",
            "\n",
            "        if (elem >= uint(work_size)) {{\n",
            "            return;\n",
            "        }}\n",
            "\n",
            "        int local = int(elem);\n",
            "        int slot = local % slots;\n",
            "        int tmp = local / slots;\n",
            "        int t = tmp % q_len;\n",
            "        tmp = tmp / q_len;\n",
            "        int h = tmp % q_heads;\n",
            "        int b = tmp / q_heads;\n",
            "        int base = ((b * q_heads + h) * q_len + t) * q_dim;\n",
            "\n",
            "        if (slot >= half_dim) {{\n",
            "            int pass_d = {rotary_dim} + slot - half_dim;\n",
            "            int pass_idx = base + pass_d;\n",
            "            x_out[pass_idx] = x[pass_idx];\n",
            "            return;\n",
            "        }}\n",
            "\n",
            "        {pair_source}\n",
            "\n",
            "        int idx = base + d;\n",
            "        float xv = static_cast<float>(x[idx]);\n",
            "        float xp = static_cast<float>(x[base + pair_d]);\n",
            "        x_out[idx] = static_cast<T>(xv * c - xp * s);\n",
            "        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);\n",
            "    ",
        ),
        half = rotary_dim / 2,
        rotary_dim = rotary_dim,
        pair_source = pair_source,
    );
    MropeKernelSpec {
        name: format!(
            "mrope_apply_{}_{}_{}d",
            pairing.as_str(),
            rotary_dim,
            position_ndim
        ),
        input_names: ["x", "position_ids", "inv_freq", "position_selector"],
        output_names: ["x_out"],
        source,
        header: String::new(),
        ensure_row_contiguous: true,
        atomic_outputs: false,
    }
}

/// The launch `_fast_mrope_apply.apply_one(x)` makes (mlx-vlm 0.7.6):
/// `half_dim = inv_freq.shape[0]`, `slots = half_dim + D − 2·half_dim`,
/// grid `(B·H·L·slots, 1, 1)`, threadgroup `(256, 1, 1)`, template
/// `[("T", x.dtype)]`, one output of x's shape and dtype.
///
/// `x_shape` is `[B, H, L, D]` and `half_dim` the length of `inv_freq`.
///
/// # Errors
/// [`PositionError::Rank`] if `x_shape` is not 4-D;
/// [`PositionError::RotaryDimExceedsHeadDim`] if `2·half_dim > D`;
/// [`PositionError::GridOverflow`] if the thread count exceeds `i32`.
pub fn mrope_kernel_launch(
    x_shape: &[i32],
    x_dtype: Dtype,
    half_dim: usize,
) -> Result<MropeKernelLaunch, PositionError> {
    let [b, h, l, d] = *x_shape else {
        return Err(PositionError::Rank {
            tensor: "x",
            expected: "[B, H, L, D]",
            shape: x_shape.to_vec(),
        });
    };
    let head_dim = d.max(0) as usize;
    let rotary_dim = 2 * half_dim;
    if rotary_dim > head_dim {
        return Err(PositionError::RotaryDimExceedsHeadDim {
            rotary_dim,
            head_dim,
        });
    }
    let slots = (half_dim + head_dim - rotary_dim) as u128;
    let work = [b, h, l]
        .iter()
        .fold(slots, |acc, &n| acc * n.max(0) as u128);
    let grid_x = i32::try_from(work).map_err(|_| PositionError::GridOverflow { work })?;
    Ok(MropeKernelLaunch {
        grid: [grid_x, 1, 1],
        threadgroup: MROPE_KERNEL_THREADGROUP,
        template: vec![("T", x_dtype)],
        output_shapes: vec![x_shape.to_vec()],
        output_dtypes: vec![x_dtype],
    })
}

/// Runs the kernel on one tensor through mlx-c's `mlx_fast_metal_kernel_*`
/// (the same entry point `mx.fast.metal_kernel` reaches; mlx-c passes no
/// compile options, as Python's default `compile_options=None` does). The
/// stream is mlx-rs's current one (default device unless scoped), as
/// Python's `stream=None`.
///
/// `inputs` are `[x, position_ids, inv_freq, position_selector]`.
pub(super) fn run_mrope_kernel(
    spec: &MropeKernelSpec,
    launch: &MropeKernelLaunch,
    inputs: &[Array; 4],
) -> Result<Array, PositionError> {
    if !metal_is_available()? {
        return Err(PositionError::MetalUnavailable);
    }
    // One handler registration per process: a failing raw call must become
    // an error, never mlx-c's default `exit(-1)`.
    crate::ffi::install_error_handler();
    let stream = Stream::thread_local_or_default();
    let c = |s: &str| CString::new(s).expect("kernel strings contain no NUL");
    let name = c(&spec.name);
    let source = c(&spec.source);
    let header = c(&spec.header);
    let input_names = StringVector::new(&spec.input_names);
    let output_names = StringVector::new(&spec.output_names);

    // SAFETY: every handle passed below is live (owned by a guard that frees
    // it on drop), every pointer points to a NUL-terminated string or a
    // slice that outlives the call, and each out-parameter is initialised
    // with its `_new` constructor first.
    unsafe {
        let kernel = KernelGuard(mlx_sys::mlx_fast_metal_kernel_new(
            name.as_ptr(),
            input_names.0,
            output_names.0,
            source.as_ptr(),
            header.as_ptr(),
            spec.ensure_row_contiguous,
            spec.atomic_outputs,
        ));
        if kernel.0.ctx.is_null() {
            return Err(PositionError::MetalKernel {
                call: "mlx_fast_metal_kernel_new",
            });
        }
        let config = ConfigGuard(mlx_sys::mlx_fast_metal_kernel_config_new());
        let check = |status: i32, call: &'static str| {
            if status == 0 {
                Ok(())
            } else {
                Err(PositionError::MetalKernel { call })
            }
        };
        for (shape, dtype) in launch.output_shapes.iter().zip(&launch.output_dtypes) {
            check(
                mlx_sys::mlx_fast_metal_kernel_config_add_output_arg(
                    config.0,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                ),
                "mlx_fast_metal_kernel_config_add_output_arg",
            )?;
        }
        let [g1, g2, g3] = launch.grid;
        check(
            mlx_sys::mlx_fast_metal_kernel_config_set_grid(config.0, g1, g2, g3),
            "mlx_fast_metal_kernel_config_set_grid",
        )?;
        let [t1, t2, t3] = launch.threadgroup;
        check(
            mlx_sys::mlx_fast_metal_kernel_config_set_thread_group(config.0, t1, t2, t3),
            "mlx_fast_metal_kernel_config_set_thread_group",
        )?;
        for (arg, dtype) in &launch.template {
            let arg = c(arg);
            check(
                mlx_sys::mlx_fast_metal_kernel_config_add_template_arg_dtype(
                    config.0,
                    arg.as_ptr(),
                    *dtype as mlx_sys::mlx_dtype,
                ),
                "mlx_fast_metal_kernel_config_add_template_arg_dtype",
            )?;
        }
        let input_vector = ArrayVector(mlx_sys::mlx_vector_array_new());
        for x in inputs {
            check(
                mlx_sys::mlx_vector_array_append_value(input_vector.0, x.as_ptr()),
                "mlx_vector_array_append_value",
            )?;
        }
        let mut outputs = ArrayVector(mlx_sys::mlx_vector_array_new());
        check(
            mlx_sys::mlx_fast_metal_kernel_apply(
                &mut outputs.0,
                kernel.0,
                input_vector.0,
                config.0,
                stream.as_ptr(),
            ),
            "mlx_fast_metal_kernel_apply",
        )?;
        if mlx_sys::mlx_vector_array_size(outputs.0) != 1 {
            return Err(PositionError::MetalKernel {
                call: "mlx_fast_metal_kernel_apply",
            });
        }
        let mut out = mlx_sys::mlx_array_new();
        if mlx_sys::mlx_vector_array_get(&mut out, outputs.0, 0) != 0 {
            mlx_sys::mlx_array_free(out);
            return Err(PositionError::MetalKernel {
                call: "mlx_vector_array_get",
            });
        }
        Ok(Array::from_ptr(out))
    }
}

/// Owns an `mlx_vector_string`.
struct StringVector(mlx_sys::mlx_vector_string);

impl StringVector {
    fn new(items: &[&str]) -> Self {
        // SAFETY: `mlx_vector_string_new` has no preconditions; appended
        // strings are copied by mlx-c before the CString is dropped.
        unsafe {
            let vector = mlx_sys::mlx_vector_string_new();
            for item in items {
                let item = CString::new(*item).expect("kernel names contain no NUL");
                mlx_sys::mlx_vector_string_append_value(vector, item.as_ptr() as *const c_char);
            }
            StringVector(vector)
        }
    }
}

impl Drop for StringVector {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `mlx_vector_string_new` and is freed once.
        unsafe {
            mlx_sys::mlx_vector_string_free(self.0);
        }
    }
}

/// Owns an `mlx_vector_array`.
struct ArrayVector(mlx_sys::mlx_vector_array);

impl Drop for ArrayVector {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `mlx_vector_array_new` and is freed once.
        unsafe {
            mlx_sys::mlx_vector_array_free(self.0);
        }
    }
}

/// Owns an `mlx_fast_metal_kernel`.
struct KernelGuard(mlx_sys::mlx_fast_metal_kernel);

impl Drop for KernelGuard {
    fn drop(&mut self) {
        // SAFETY: created by `mlx_fast_metal_kernel_new`; a null ctx is accepted.
        unsafe { mlx_sys::mlx_fast_metal_kernel_free(self.0) }
    }
}

/// Owns an `mlx_fast_metal_kernel_config`.
struct ConfigGuard(mlx_sys::mlx_fast_metal_kernel_config);

impl Drop for ConfigGuard {
    fn drop(&mut self) {
        // SAFETY: created by `mlx_fast_metal_kernel_config_new`, freed once.
        unsafe { mlx_sys::mlx_fast_metal_kernel_config_free(self.0) }
    }
}
