//! Exact values of the quantized and float layers' outputs, from the glue
//! arguments the reference received (names as the glue's parameters).

use exact::matmul::{add_bias, add_broadcast, gather_qmm, lora_residual, matmul, quantized_matmul};
use exact::{Exact, ExactError, Float, Format, Model, QuantizedMatrix, Tracked};
use oracle::{DType, HostTensor};

use super::{float_dtype, float_of, values, Sent};

/// A quantized matrix's arguments, owned (the scales decoded exactly).
pub struct Matrix {
    pub format: Format,
    pub bits: usize,
    pub group_size: usize,
    /// Every row of every expert: `[E * N, K]` (or `[N, K]`).
    pub rows: usize,
    pub cols: usize,
    /// Output rows per expert (`N`).
    pub n: usize,
    packed: Vec<u8>,
    scales: Vec<f64>,
    codes: Vec<u8>,
    biases: Vec<f64>,
    pub scales_dtype: DType,
}

fn usize_of(v: i64, what: &str) -> Result<usize, ExactError> {
    usize::try_from(v).map_err(|_| ExactError(format!("{what} {v} is negative")))
}

impl Matrix {
    /// From `weight` (uint32, `[.., N, K * bits / 32]`), `scales`, `biases`
    /// and `mode`, `bits`, `group_size` (`mode` absent: affine).
    pub fn from_sent(sent: &Sent, weight: &str) -> Result<Self, ExactError> {
        let w = sent.tensor(weight)?;
        let scales = sent.tensor("scales")?;
        let biases = sent.opt_tensor("biases")?;
        let mode = sent.string("mode").unwrap_or("affine");
        let format = Format::from_name(mode)?;
        let bits = usize_of(sent.int("bits")?, "bits")?;
        let group_size = usize_of(sent.int("group_size")?, "group_size")?;
        if w.dtype != DType::Uint32 || w.shape.len() < 2 || bits == 0 {
            return Err(ExactError(format!(
                "weight is {} {:?}, not packed uint32 [.., N, K * bits / 32]",
                w.dtype.name(),
                w.shape
            )));
        }
        let n = w.shape[w.shape.len() - 2];
        let cols = w.shape[w.shape.len() - 1] * 32 / bits;
        let rows = w.len() / w.shape[w.shape.len() - 1].max(1);
        let (scale_values, codes) = match format {
            Format::Affine => (values(scales), Vec::new()),
            _ => {
                if scales.dtype != DType::Uint8 {
                    return Err(ExactError(format!(
                        "{mode} scales are {}, not uint8",
                        scales.dtype.name()
                    )));
                }
                (Vec::new(), scales.bytes.clone())
            }
        };
        Ok(Matrix {
            format,
            bits,
            group_size,
            rows,
            cols,
            n,
            packed: w.bytes.clone(),
            scales: scale_values,
            codes,
            biases: biases.map(values).unwrap_or_default(),
            scales_dtype: scales.dtype,
        })
    }

    pub fn view(&self) -> QuantizedMatrix<'_> {
        QuantizedMatrix {
            format: self.format,
            bits: self.bits,
            group_size: self.group_size,
            rows: self.rows,
            cols: self.cols,
            packed: &self.packed,
            scales: &self.scales,
            scale_codes: &self.codes,
            biases: &self.biases,
        }
    }

    /// The output dtype of `quantized_matmul` on activations `x`: affine
    /// promotes with the scales' dtype, fp modes keep x's.
    pub fn out_dtype(&self, x: &HostTensor) -> Result<Float, ExactError> {
        let t = float_of(x)?;
        Ok(match self.format {
            Format::Affine => t.promote(float_dtype(self.scales_dtype)?),
            _ => t,
        })
    }
}

/// The output shape: x's leading dimensions, then `n`.
fn out_shape(x: &HostTensor, n: usize) -> Vec<usize> {
    let mut s = x.shape[..x.shape.len().saturating_sub(1)].to_vec();
    s.push(n);
    s
}

/// The shape `mx.quantized_matmul(x, w, transpose=True)` gives for a
/// weight `w` `[.., N, K']` whose leading axes are all 1 (a batched weight
/// of one matrix: the same matmul as the plain weight): x 1-D or 2-D keeps
/// its rows (`[.., N]`, the weight's batch not added, as MLX 0.32 does);
/// x of three axes or more broadcasts its batch axes with the weight's,
/// then `[M, N]`. A weight of several matrices is not modelled (an
/// error: no such layer is exact-checked).
fn qmm_shape(x: &HostTensor, w: &HostTensor, n: usize) -> Result<Vec<usize>, ExactError> {
    let wb = &w.shape[..w.shape.len().saturating_sub(2)];
    if wb.iter().any(|&d| d != 1) {
        return Err(ExactError(format!(
            "a weight of shape {:?} holds several matrices (not modelled)",
            w.shape
        )));
    }
    if x.shape.len() <= 2 || wb.is_empty() {
        return Ok(out_shape(x, n));
    }
    let r = x.shape.len();
    let mut s = exact::matmul::broadcast_shapes(&x.shape[..r - 2], wb)?;
    s.extend([x.shape[r - 2], n]);
    Ok(s)
}

/// Adds the additive `bias` argument when present (`x + bias`, or
/// `addmm`'s `bias`), broadcast against `shape` as MLX broadcasts it (a
/// scalar, `[1]`, `[N]`, `[1, N]`, a row per row, a bias that widens the
/// output): the sums, their dtype and shape.
fn with_bias(
    sent: &Sent,
    y: Vec<Tracked>,
    t: Float,
    shape: Vec<usize>,
) -> Result<(Vec<Tracked>, Float, Vec<usize>), ExactError> {
    Ok(match sent.opt_tensor("bias")? {
        Some(b) => {
            let out = t.promote(float_of(b)?);
            let (y, shape) = add_broadcast(&y, &shape, &values(b), &b.shape, out)?;
            (y, out, shape)
        }
        None => (y, t, shape),
    })
}

/// The LoRA residuals of `lora_a`, `lora_b`, `lora_scales`, nested in order
/// (adapter 0 innermost), onto `y`.
fn with_adapters(
    sent: &Sent,
    x: &HostTensor,
    mut y: Vec<Tracked>,
    mut t: Float,
    model: Model,
) -> Result<(Vec<Tracked>, Float), ExactError> {
    let a = sent.tensors("lora_a")?;
    let b = sent.tensors("lora_b")?;
    let s = sent.floats("lora_scales")?;
    if a.len() != b.len() || a.len() != s.len() {
        return Err(ExactError(format!(
            "{} lora_a, {} lora_b, {} scales",
            a.len(),
            b.len(),
            s.len()
        )));
    }
    let xt = float_of(x)?;
    let xv = values(x);
    for ((a, b), s) in a.iter().zip(&b).zip(&s) {
        let rank = *a.shape.last().unwrap_or(&0);
        let z_dtype = xt.promote(float_of(a)?).promote(float_of(b)?);
        let out = t.promote(xt);
        y = lora_residual(
            &y,
            &xv,
            &values(a),
            &values(b),
            rank,
            *s,
            z_dtype,
            xt,
            out,
            model,
        )?;
        t = out;
    }
    Ok((y, t))
}

/// `nn.QuantizedLinear.__call__` (and `mx.quantized_matmul` with `w` for
/// the weight's name), with LoRA adapters when `lora` is set.
pub fn linear(sent: &Sent, model: Model, weight: &str, lora: bool) -> Result<Exact, ExactError> {
    let x = sent.tensor("x")?;
    let m = Matrix::from_sent(sent, weight)?;
    let t = m.out_dtype(x)?;
    let shape = qmm_shape(x, sent.tensor(weight)?, m.n)?;
    let y = quantized_matmul(&values(x), &m.view(), t, model)?;
    let (y, t, shape) = with_bias(sent, y, t, shape)?;
    let (y, _) = if lora {
        with_adapters(sent, x, y, t, model)?
    } else {
        (y, t)
    };
    Ok(Exact::from_tracked("quantized_matmul", model, shape, &y))
}

/// The expert index of every (token, slot) of `indices` (any integer dtype).
fn expert_ids(indices: &HostTensor) -> Result<Vec<usize>, ExactError> {
    (0..indices.len())
        .map(|i| usize_of(indices.value(i) as i64, "expert index"))
        .collect()
}

/// x `[.., D]` repeated for each of its `top_k` slots: `[tokens * top_k, D]`.
fn rows_per_slot(x: &HostTensor, top_k: usize) -> Vec<f64> {
    let d = *x.shape.last().unwrap_or(&1);
    let xv = values(x);
    xv.chunks(d.max(1))
        .flat_map(|row| std::iter::repeat_n(row, top_k).flatten().copied())
        .collect()
}

/// mlx-lm's `QuantizedSwitchLinear.__call__` as `SwitchGLU` drives it:
/// `[.., top_k, N]`, expert biases added.
pub fn switch(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    switch_with(sent, model, false)
}

/// [`switch`] on a layer holding stride-0 views of expert 0 (`expert0_views`):
/// every slot reads expert 0, whatever its index.
pub fn switch_expert0(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    switch_with(sent, model, true)
}

fn switch_with(sent: &Sent, model: Model, expert0: bool) -> Result<Exact, ExactError> {
    let x = sent.tensor("x")?;
    let indices = sent.tensor("indices")?;
    let m = Matrix::from_sent(sent, "weight")?;
    let t = m.out_dtype(x)?;
    let top_k = *indices.shape.last().unwrap_or(&1);
    let mut experts = expert_ids(indices)?;
    if expert0 {
        experts.iter_mut().for_each(|e| *e = 0);
    }
    let y = gather_qmm(&rows_per_slot(x, top_k), &experts, &m.view(), m.n, t, model)?;
    let (y, _) = with_expert_bias(sent, y, &experts, m.n, t)?;
    let mut shape = indices.shape.clone();
    shape.push(m.n);
    Ok(Exact::from_tracked("gather_qmm", model, shape, &y))
}

/// `y + bias[indices]` per (token, slot) row when the layer has a bias
/// (`x + expand_dims(bias[indices], -2)`): each expert's bias row `[N]`,
/// or `[1]` (a bias `[E, 1]`) broadcast over the row's `n` outputs.
fn with_expert_bias(
    sent: &Sent,
    y: Vec<Tracked>,
    experts: &[usize],
    n: usize,
    t: Float,
) -> Result<(Vec<Tracked>, Float), ExactError> {
    let Some(b) = sent.opt_tensor("bias")? else {
        return Ok((y, t));
    };
    let out = t.promote(float_of(b)?);
    let bv = values(b);
    let e_count = b.shape.first().copied().unwrap_or(0);
    let per = bv.len().checked_div(e_count).unwrap_or(0);
    if b.shape.len() < 2 || !(per == n || per == 1) {
        return Err(ExactError(format!(
            "an expert bias of shape {:?} for {n} outputs (not [E, N] or [E, 1])",
            b.shape
        )));
    }
    if let Some(&e) = experts.iter().find(|&&e| e >= e_count) {
        return Err(ExactError::undefined(format!(
            "expert index {e} of {e_count} expert biases"
        )));
    }
    let y = y
        .chunks(n)
        .zip(experts)
        .flat_map(|(row, &e)| add_bias(row, &bv[e * per..(e + 1) * per], out))
        .collect();
    Ok((y, out))
}

/// The dtype `x @ w` computes in (MLX's promotion: a float dtype with an
/// integer one is the float one), and w's values as the matmul reads them:
/// an integer weight is cast to that dtype first, which is exact where
/// every value is one of its values (otherwise not modelled: an error).
fn float_weight(x: &HostTensor, w: &HostTensor) -> Result<(Float, Vec<f64>), ExactError> {
    let xt = float_of(x)?;
    let wv = values(w);
    match float_of(w) {
        Ok(wt) => Ok((xt.promote(wt), wv)),
        Err(_) if w.dtype.name().contains("int") => {
            if let Some(v) = wv.iter().find(|&&v| exact::formats::round_to(v, xt) != v) {
                return Err(ExactError(format!(
                    "integer weight value {v} is no {xt:?} value (its cast rounds: not modelled)"
                )));
            }
            Ok((xt, wv))
        }
        Err(e) => Err(e),
    }
}

/// `nn.Linear`: `x @ weight.T + bias` (`addmm`), the bias broadcast as
/// MLX broadcasts it; an integer weight read as x's dtype.
pub fn float_linear(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    let x = sent.tensor("x")?;
    let w = sent.tensor("weight")?;
    let (n, k) = (w.shape[0], w.shape[1]);
    let (t, wv) = float_weight(x, w)?;
    let wt = transpose(&wv, n, k);
    let xt: Vec<Tracked> = values(x).into_iter().map(Tracked::exact).collect();
    let y = matmul(&xt, &wt, k, n, t, model)?;
    let (y, _, shape) = with_bias(sent, y, t, out_shape(x, n))?;
    Ok(Exact::from_tracked("matmul", model, shape, &y))
}

/// mlx-lm's `SwitchLinear` driven as `SwitchGLU` drives it (`gather_mm`).
pub fn float_switch(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    let x = sent.tensor("x")?;
    let indices = sent.tensor("indices")?;
    let w = sent.tensor("weight")?;
    let (n, k) = (w.shape[1], w.shape[2]);
    let (t, wv) = float_weight(x, w)?;
    let top_k = *indices.shape.last().unwrap_or(&1);
    let experts = expert_ids(indices)?;
    let xs = rows_per_slot(x, top_k);
    let mut y = Vec::with_capacity(experts.len() * n);
    for (r, &e) in experts.iter().enumerate() {
        if e >= w.shape[0] {
            return Err(ExactError::undefined(format!(
                "expert index {e} of {}",
                w.shape[0]
            )));
        }
        let wt = transpose(&wv[e * n * k..(e + 1) * n * k], n, k);
        let xr: Vec<Tracked> = xs[r * k..(r + 1) * k]
            .iter()
            .map(|&v| Tracked::exact(v))
            .collect();
        y.extend(matmul(&xr, &wt, k, n, t, model)?);
    }
    let (y, _) = with_expert_bias(sent, y, &experts, n, t)?;
    let mut shape = indices.shape.clone();
    shape.push(n);
    Ok(Exact::from_tracked("gather_mm", model, shape, &y))
}

/// `[n, k]` row-major to `[k, n]`.
fn transpose(w: &[f64], n: usize, k: usize) -> Vec<f64> {
    let mut t = vec![0.0; n * k];
    for r in 0..n {
        for c in 0..k {
            t[c * n + r] = w[r * k + c];
        }
    }
    t
}

/// `nn.QuantizedEmbedding.__call__(ids)`: the dequantized rows.
pub fn embedding_lookup(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    let ids = sent.tensor("ids")?;
    let m = Matrix::from_sent(sent, "weight")?;
    let t = float_dtype(m.scales_dtype).unwrap_or(Float::Float32);
    let t = if m.format == Format::Affine {
        t
    } else {
        Float::Bfloat16
    };
    let y = exact::matmul::embedding(&expert_ids(ids)?, &m.view(), t)?;
    let mut shape = ids.shape.clone();
    shape.push(m.cols);
    Ok(Exact::from_tracked("dequantize", model, shape, &y))
}

/// `nn.QuantizedEmbedding.as_linear(x)`: the tied `lm_head`.
pub fn embedding_as_linear(sent: &Sent, model: Model) -> Result<Exact, ExactError> {
    linear(sent, model, "weight", false)
}

/// A port-loaded layer's tensors as glue-style arguments (`weight`,
/// `scales`, `biases`, `bias`, `mode`, `bits`, `group_size`), plus
/// `in_features`: the columns of `x` the layer reads. For cases whose
/// reference builds the layer from a file (checkpoints, adapter
/// directories): the read is bit-checked, the arithmetic is this oracle's.
pub fn payload_args(
    p: &layers::quantized::QuantizedPayload,
    bias: Option<&mlx_rs::Array>,
    in_features: usize,
) -> Result<Vec<(&'static str, oracle::Arg)>, crate::case::CaseError> {
    use oracle::Arg;
    let host = |a: &mlx_rs::Array| HostTensor::from_array(a).map_err(crate::case::CaseError::from);
    let spec = p.spec();
    Ok(vec![
        ("weight", Arg::Tensor(host(p.weight())?)),
        ("scales", Arg::Tensor(host(p.scales())?)),
        (
            "biases",
            p.biases()
                .map(host)
                .transpose()?
                .map_or(Arg::None, Arg::Tensor),
        ),
        (
            "bias",
            bias.map(host).transpose()?.map_or(Arg::None, Arg::Tensor),
        ),
        ("mode", Arg::from(spec.mode.as_str())),
        ("bits", Arg::from(spec.bits)),
        ("group_size", Arg::from(spec.group_size)),
        ("in_features", Arg::from(in_features)),
    ])
}

/// `sent` with `x` cut to its first `in_features` columns (`x[..., :in]`).
pub fn sliced(sent: &Sent) -> Result<Sent, ExactError> {
    let cols = usize::try_from(sent.int("in_features")?)
        .map_err(|_| ExactError("in_features is negative".into()))?;
    let x = super::first_columns(sent.tensor("x")?, cols)?;
    Ok(sent.with("x", oracle::Arg::Tensor(x)))
}

/// `mx.dequantize` with an nvfp4 global scale, of the reference's own
/// `mx.quantize` results (`weight`, `scales`, `global_scale`), in `out`.
pub fn dequantize_global_scale(
    weight: &HostTensor,
    scales: &HostTensor,
    global_scale: &HostTensor,
    group_size: i64,
    out: Float,
    model: Model,
) -> Result<Exact, ExactError> {
    let sent = Sent::new(vec![
        ("weight", oracle::Arg::Tensor(weight.clone())),
        ("scales", oracle::Arg::Tensor(scales.clone())),
        ("mode", oracle::Arg::from("nvfp4")),
        ("bits", oracle::Arg::Int(4)),
        ("group_size", oracle::Arg::Int(group_size)),
    ]);
    let m = Matrix::from_sent(&sent, "weight")?;
    if global_scale.len() != 1 {
        return Err(ExactError(format!(
            "global_scale has {} elements, not 1",
            global_scale.len()
        )));
    }
    let y = exact::matmul::dequantize_global_scale(&m.view(), global_scale.value(0), out)?;
    Ok(Exact::from_tracked(
        "dequantize",
        model,
        vec![m.rows, m.cols],
        &y,
    ))
}

/// `mx.max(mx.abs(w), axis=...).astype(float32)` over each of `groups`
/// equal slices of `w` (1: the whole tensor; E: per expert, as mlx-lm's
/// `_quantize_experts`): a maximum is exact, so the bound is zero.
pub fn max_abs(sent: &Sent, model: Model, groups: usize) -> Result<Exact, ExactError> {
    let w = sent.tensor("w")?;
    if groups == 0 || w.len() % groups != 0 {
        return Err(ExactError(format!(
            "{} values in {groups} equal slices",
            w.len()
        )));
    }
    let v = values(w);
    let per: Vec<Tracked> = v
        .chunks(v.len() / groups)
        .map(|c| {
            Tracked::exact(c.iter().fold(0.0_f64, |m, x| m.max(x.abs()))).round(Float::Float32)
        })
        .collect();
    let shape = if groups == 1 { vec![] } else { vec![groups] };
    Ok(Exact::from_tracked("max_abs", model, shape, &per))
}
