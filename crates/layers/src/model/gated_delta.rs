//! The gated delta rule as mlx-vlm 0.7.6 runs it
//! (`models/qwen3_5/gated_delta.py`, vendored from mlx-lm 0.31.3).
//!
//! `gated_delta_update` picks its algorithm by backend and token count:
//!
//! | where                                   | T > 1                    | T = 1            |
//! |-----------------------------------------|--------------------------|------------------|
//! | default device GPU with Metal            | `gated_delta_kernel`     | `gated_delta_kernel` |
//! | otherwise (CPU, CUDA)                    | `gated_delta_chunked` (C = 64) | `gated_delta_ops` |
//!
//! This port mirrors the two portable algorithms op for op and refuses the
//! Metal kernel ([`Recurrence`] says which ran).

use mlx_rs::error::Exception;
use mlx_rs::ops::{
    broadcast_to, clip, concatenate, cumsum, exp, expand_dims, log, logaddexp, ones_dtype, select,
    squeeze_axes, stack, sum_axis, swap_axes, transpose_axes, tril, zeros_dtype, zeros_like,
};
use mlx_rs::{Array, Dtype};

use super::ops::{run_compiled, slice_axis, weak_scalar};
use super::ModelError;

/// Which algorithm computed a recurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recurrence {
    /// `gated_delta_ops`: the per-token loop of `_gated_delta_step_ops`.
    Ops,
    /// `gated_delta_chunked`: the chunked parallel scan, chunks of 64.
    Chunked,
}

impl Recurrence {
    pub fn as_str(self) -> &'static str {
        match self {
            Recurrence::Ops => "gated_delta_ops",
            Recurrence::Chunked => "gated_delta_chunked",
        }
    }
}

/// `gated_delta_chunked`'s chunk length `C`.
pub const CHUNK: i32 = 64;

/// `a[..., i, ...]` on `axis` (an integer index: slice, then drop the axis).
fn at(a: &Array, axis: usize, i: i32) -> Result<Array, ModelError> {
    Ok(squeeze_axes(
        &slice_axis(a, axis, i, i + 1)?,
        &[axis as i32],
    )?)
}

/// `_compute_g_beta(A_log, a, b, dt_bias)` (`@partial(mx.compile,
/// shapeless=True)`, calling the compiled `compute_g` and `nn.softplus`):
/// `g = exp(-exp(A_log.astype(f32)) * softplus(a + dt_bias))`, `beta = sigmoid(b)`.
pub fn compute_g_beta(
    a_log: &Array,
    a: &Array,
    b: &Array,
    dt_bias: &Array,
) -> Result<(Array, Array), ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        let (a_log, a, b, dt_bias) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        let x = a.add(dt_bias)?;
        // `mx.logaddexp(x, 0)`: a Python scalar, so x's dtype.
        let softplus = logaddexp(&x, Array::from_f32(0.0).as_dtype(x.dtype())?)?;
        let decay = exp(a_log.as_dtype(Dtype::Float32)?)?.negative()?;
        let g = exp(decay.multiply(&softplus)?)?;
        let beta = mlx_rs::ops::sigmoid(b)?;
        Ok(vec![g, beta])
    }
    let inputs = [a_log.clone(), a.clone(), b.clone(), dt_bias.clone()];
    let mut out = run_compiled("_compute_g_beta", true, graph, &inputs)?.into_iter();
    let g = out.next().expect("the graph returns g and beta");
    let beta = out.next().expect("the graph returns g and beta");
    Ok((g, beta))
}

/// `mx.repeat(x, factor, -2)` when `factor > 1`.
fn repeat_heads(x: &Array, factor: i32) -> Result<Array, ModelError> {
    if factor <= 1 {
        return Ok(x.clone());
    }
    let axis = x.ndim() as i32 - 2;
    Ok(mlx_rs::ops::repeat_axis::<f32>(x.clone(), factor, axis)?)
}

/// `_gated_delta_step_ops` (`@mx.compile`; scalar gating, no mask): one
/// token. q, k `[B, H, Dk]`, v `[B, H, Dv]`, g, beta `[B, H]`, state
/// `[B, H, Dv, Dk]`. Compiled as the reference's is: on CUDA the fused
/// kernel computes `state + k * delta` with an FMA.
fn step_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<(Array, Array), ModelError> {
    fn graph(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
        let (q, k, v, g, beta, state) = (
            &inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4], &inputs[5],
        );
        let decay = expand_dims(&expand_dims(g, -1)?, -1)?;
        let state = state.multiply(&decay)?;
        let k_row = expand_dims(k, -2)?;
        let kv_mem = sum_axis(&state.multiply(&k_row)?, -1, None)?;
        let delta = v.subtract(&kv_mem)?.multiply(&expand_dims(beta, -1)?)?;
        let state = state.add(&k_row.multiply(&expand_dims(&delta, -1)?)?)?;
        let y = sum_axis(&state.multiply(&expand_dims(q, -2)?)?, -1, None)?;
        Ok(vec![y.as_dtype(q.dtype())?, state])
    }
    let inputs = [
        q.clone(),
        k.clone(),
        v.clone(),
        g.clone(),
        beta.clone(),
        state.clone(),
    ];
    let mut out = run_compiled("_gated_delta_step_ops", false, graph, &inputs)?.into_iter();
    let y = out.next().expect("the graph returns y and the state");
    let state = out.next().expect("the graph returns y and the state");
    Ok((y, state))
}

/// `gated_delta_ops(q, k, v, g, beta, state)`: q, k `[B, T, Hk, Dk]`, v
/// `[B, T, Hv, Dv]`, g, beta `[B, T, Hv]`, state `[B, Hv, Dv, Dk]`.
pub fn gated_delta_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<(Array, Array), ModelError> {
    let (t_len, hk, hv) = (q.shape()[1], q.shape()[2], v.shape()[2]);
    let q = repeat_heads(q, hv / hk)?;
    let k = repeat_heads(k, hv / hk)?;
    let mut state = state.clone();
    let mut ys = Vec::with_capacity(t_len as usize);
    for t in 0..t_len {
        let (y, s) = step_ops(
            &at(&q, 1, t)?,
            &at(&k, 1, t)?,
            &at(v, 1, t)?,
            &at(g, 1, t)?,
            &at(beta, 1, t)?,
            &state,
        )?;
        ys.push(y);
        state = s;
    }
    Ok((stack(&ys, 1)?, state))
}

/// `_invert_unit_lower(T, C)`: forward substitution, row by row.
fn invert_unit_lower(t: &Array, c: i32) -> Result<Array, ModelError> {
    let eye = Array::eye::<f32>(c, None, None)?;
    let x = broadcast_to(&eye, t.shape())?.add(zeros_like(t)?)?;
    let nd = t.ndim();
    let mut rows = vec![slice_axis(&x, nd - 2, 0, 1)?];
    for i in 1..c {
        let tij = slice_axis(&slice_axis(t, nd - 2, i, i + 1)?, nd - 1, 0, i)?;
        let xj = concatenate(&rows, -2)?;
        let xi = slice_axis(&x, nd - 2, i, i + 1)?;
        rows.push(xi.subtract(tij.matmul(&xj)?)?);
    }
    Ok(concatenate(&rows, -2)?)
}

/// `gated_delta_chunked(q, k, v, g, beta, state, mask=None, C=64)`.
pub fn gated_delta_chunked(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<(Array, Array), ModelError> {
    let (b, t_len, hk, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (hv, dv) = (v.shape()[2], v.shape()[3]);
    let in_dtype = v.dtype();
    let mut q = repeat_heads(q, hv / hk)?;
    let mut k = repeat_heads(k, hv / hk)?;
    let (mut v, mut g, mut beta) = (v.clone(), g.clone(), beta.clone());
    let c = CHUNK;
    let pad = (c - t_len % c) % c;
    if pad > 0 {
        let z = |a: &Array, d: i32| zeros_dtype(&[b, pad, hv, d], a.dtype());
        q = concatenate(&[&q, &z(&q, dk)?], 1)?;
        k = concatenate(&[&k, &z(&k, dk)?], 1)?;
        v = concatenate(&[&v, &z(&v, dv)?], 1)?;
        g = concatenate(&[&g, &ones_dtype(&[b, pad, hv], g.dtype())?], 1)?;
        beta = concatenate(&[&beta, &zeros_dtype(&[b, pad, hv], beta.dtype())?], 1)?;
    }
    let tp = t_len + pad;
    let n_c = tp / c;
    let rc = |x: &Array, d: i32| -> Result<Array, ModelError> {
        Ok(
            transpose_axes(&x.reshape(&[b, n_c, c, hv, d])?, &[0, 3, 1, 2, 4])?
                .as_dtype(Dtype::Float32)?,
        )
    };
    let (q, k, v) = (rc(&q, dk)?, rc(&k, dk)?, rc(&v, dv)?);
    let g = transpose_axes(&g.reshape(&[b, n_c, c, hv])?, &[0, 3, 1, 2])?;
    let beta = transpose_axes(&beta.reshape(&[b, n_c, c, hv])?, &[0, 3, 1, 2])?;

    let f32s = |v: f64| weak_scalar(v, Dtype::Float32);
    let lcg = cumsum(
        &log(&clip(&g, (&f32s(1e-6)?, &f32s(1.0)?))?)?,
        -1,
        None,
        None,
    )?;
    let cumg = exp(&lcg)?;
    let ones_cc = ones_dtype(&[c, c], Dtype::Float32)?;
    let lower_incl = tril(&ones_cc, 0)?;
    let strict_lower = tril(&ones_cc, -1)?;
    let diff = select(
        &lower_incl.gt(weak_scalar(0.0, Dtype::Float32)?)?,
        &expand_dims(&lcg, -1)?.subtract(&expand_dims(&lcg, -2)?)?,
        &f32s(-1e30)?,
    )?;
    let dr = exp(&diff)?;

    let kt_swap = swap_axes(&k, -1, -2)?;
    let kk = k.matmul(&kt_swap)?;
    let beta_col = expand_dims(&beta, -1)?;
    let a = beta_col
        .multiply(&dr)?
        .multiply(&kk)?
        .multiply(&strict_lower)?;
    let eye = Array::eye::<f32>(c, None, None)?;
    let tinv = invert_unit_lower(&eye.add(&a)?, c)?;

    let kbeta = expand_dims(&beta.multiply(&cumg)?, -1)?.multiply(&k)?;
    let u0 = tinv.matmul(&beta_col.multiply(&v)?)?;
    let kt = tinv.matmul(&kbeta)?;
    let m = dr.multiply(&q.matmul(&kt_swap)?)?.multiply(&lower_incl)?;
    let qeff = expand_dims(&cumg, -1)?
        .multiply(&q)?
        .subtract(&m.matmul(&kt)?)?;
    let mu0 = m.matmul(&u0)?;
    let last = lcg.shape()[3] - 1;
    let cumg_last = at(&cumg, 3, last)?;
    let ratio_last = exp(&slice_axis(&lcg, 3, last, last + 1)?.subtract(&lcg)?)?;

    let mut s = state.as_dtype(Dtype::Float32)?;
    let mut ys = Vec::with_capacity(n_c as usize);
    for ci in 0..n_c {
        let st = swap_axes(&s, -1, -2)?;
        ys.push(at(&mu0, 2, ci)?.add(&at(&qeff, 2, ci)?.matmul(&st)?)?);
        let uc = at(&u0, 2, ci)?.subtract(&at(&kt, 2, ci)?.matmul(&st)?)?;
        let uscaled = expand_dims(&at(&ratio_last, 2, ci)?, -1)?.multiply(&uc)?;
        let decay = expand_dims(&expand_dims(&at(&cumg_last, 2, ci)?, -1)?, -1)?;
        s = decay
            .multiply(&s)?
            .add(&swap_axes(&uscaled, -1, -2)?.matmul(&at(&k, 2, ci)?)?)?;
    }
    let y = transpose_axes(&stack(&ys, 2)?, &[0, 2, 3, 1, 4])?.reshape(&[b, tp, hv, dv])?;
    let y = slice_axis(&y, 1, 0, t_len)?.as_dtype(in_dtype)?;
    Ok((y, s))
}

/// `gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask=None)`
/// off Metal: chunked for T > 1, the per-token ops for T = 1. `state`
/// `None` starts from float32 zeros.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array, Recurrence), ModelError> {
    if crate::position::metal_is_available()? {
        return Err(ModelError::Unsupported {
            what: "the gated delta recurrence on a Metal GPU".into(),
            why: "the reference runs its fused Metal kernel there (gated_delta_kernel), which this port does not mirror; run on the CPU or CUDA".into(),
        });
    }
    let (g, beta) = compute_g_beta(a_log, a, b, dt_bias)?;
    let state = match state {
        Some(s) if s.shape()[0] == q.shape()[0] => s.clone(),
        _ => {
            let (bsz, dk) = (q.shape()[0], q.shape()[3]);
            let (hv, dv) = (v.shape()[2], v.shape()[3]);
            zeros_dtype(&[bsz, hv, dv, dk], Dtype::Float32)?
        }
    };
    if q.shape()[1] > 1 {
        let (y, s) = gated_delta_chunked(q, k, v, &g, &beta, &state)?;
        Ok((y, s, Recurrence::Chunked))
    } else {
        let (y, s) = gated_delta_ops(q, k, v, &g, &beta, &state)?;
        Ok((y, s, Recurrence::Ops))
    }
}
