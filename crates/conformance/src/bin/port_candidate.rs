//! `conformance-port-candidate`: this repository's port (crate `layers`)
//! served through the candidate protocol, the protocol's self-test. Run
//! `conformance --candidate target/debug/conformance-port-candidate`: every
//! case it implements must get the verdict the linked run gets
//! (`tests/candidate.rs`).
//!
//! Each op decodes the arguments the reference received, calls the port as
//! the linked case does, and answers the reference's result tree. A port
//! error is a `raised` reply (the port refused), as the linked run's port
//! error is the case's. It links no Python: `oracle` is used for its
//! tensor type only.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use conformance::candidate::wire;
use layers::quantized::{
    ExpertIndices, Forward, LoraAdapter, Mode, QuantSpec, QuantizedEmbedding, QuantizedLinear,
    QuantizedPayload, QuantizedSwitchLinear, RowsRegime,
};
use mlx_rs::Array;
use oracle::{HostTensor, Value};
use serde_json::{json, Value as Json};

type Result<T> = std::result::Result<T, String>;

/// A call's keyword arguments.
struct Args(BTreeMap<String, Value>);

impl Args {
    fn get(&self, name: &str) -> Result<&Value> {
        self.0
            .get(name)
            .ok_or_else(|| format!("argument `{name}` missing"))
    }
    fn host(&self, name: &str) -> Result<HostTensor> {
        match self.get(name)? {
            Value::Tensor(t) => Ok(t.clone()),
            _ => Err(format!("argument `{name}` is not an array")),
        }
    }
    fn array(&self, name: &str) -> Result<Array> {
        Ok(self.host(name)?.to_array())
    }
    fn opt_array(&self, name: &str) -> Result<Option<Array>> {
        match self.0.get(name) {
            None | Some(Value::None) => Ok(None),
            Some(_) => self.array(name).map(Some),
        }
    }
    fn arrays(&self, name: &str) -> Result<Vec<Array>> {
        match self.0.get(name) {
            None => Ok(Vec::new()),
            Some(Value::List(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => Ok(t.to_array()),
                    _ => Err(format!("`{name}` holds a non-array")),
                })
                .collect(),
            _ => Err(format!("argument `{name}` is not a list")),
        }
    }
    fn int(&self, name: &str) -> Result<i64> {
        match self.get(name)? {
            Value::Int(i) => Ok(*i),
            _ => Err(format!("argument `{name}` is not an int")),
        }
    }
    fn float(&self, name: &str) -> Result<f64> {
        match self.get(name)? {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            _ => Err(format!("argument `{name}` is not a number")),
        }
    }
    fn floats(&self, name: &str) -> Result<Vec<f64>> {
        match self.0.get(name) {
            None => Ok(Vec::new()),
            Some(Value::List(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Float(f) => Ok(*f),
                    Value::Int(i) => Ok(*i as f64),
                    _ => Err(format!("`{name}` holds a non-number")),
                })
                .collect(),
            _ => Err(format!("argument `{name}` is not a list")),
        }
    }
    fn usizes(&self, name: &str) -> Result<Vec<usize>> {
        usizes(self.get(name)?, name)
    }
    fn string(&self, name: &str) -> Result<String> {
        match self.get(name)? {
            Value::Str(s) => Ok(s.clone()),
            _ => Err(format!("argument `{name}` is not a string")),
        }
    }
    fn strings(&self, name: &str) -> Result<Vec<String>> {
        match self.get(name)? {
            Value::List(items) => items
                .iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s.clone()),
                    _ => Err(format!("`{name}` holds a non-string")),
                })
                .collect(),
            _ => Err(format!("argument `{name}` is not a list")),
        }
    }
    fn flag(&self, name: &str) -> Result<bool> {
        match self.0.get(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            _ => Err(format!("argument `{name}` is not a bool")),
        }
    }
    /// mode, bits, group_size as a spec.
    fn spec(&self) -> Result<QuantSpec> {
        let mode: Mode = self.string("mode")?.parse().map_err(|e| format!("{e}"))?;
        QuantSpec::new(
            mode,
            self.int("bits")? as i32,
            self.int("group_size")? as i32,
        )
        .map_err(|e| e.to_string())
    }
    /// weight, scales, biases with the spec.
    fn payload(&self) -> Result<QuantizedPayload> {
        QuantizedPayload::new(
            self.array("weight")?,
            self.array("scales")?,
            self.opt_array("biases")?,
            self.spec()?,
        )
        .map_err(|e| e.to_string())
    }
}

fn usizes(v: &Value, name: &str) -> Result<Vec<usize>> {
    match v {
        Value::List(items) => items
            .iter()
            .map(|v| match v {
                Value::Int(i) => usize::try_from(*i).map_err(|_| format!("`{name}` holds {i}")),
                _ => Err(format!("`{name}` holds a non-int")),
            })
            .collect(),
        _ => Err(format!("argument `{name}` is not a list")),
    }
}

fn tensor(a: &Array) -> Result<Value> {
    HostTensor::from_array(a)
        .map(Value::Tensor)
        .map_err(|e| e.to_string())
}

fn int32(values: &[i32]) -> Result<Value> {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(oracle::DType::Int32, vec![values.len()], bytes)
        .map(Value::Tensor)
        .map_err(|e| e.to_string())
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A quantized linear with the call's LoRA adapters attached.
fn linear_with_adapters(a: &Args) -> Result<QuantizedLinear> {
    let mut layer = QuantizedLinear::new(a.payload()?, a.opt_array("bias")?).map_err(s)?;
    let (lora_a, lora_b, scales) = (
        a.arrays("lora_a")?,
        a.arrays("lora_b")?,
        a.floats("lora_scales")?,
    );
    for (i, ((la, lb), scale)) in lora_a.into_iter().zip(lora_b).zip(scales).enumerate() {
        let adapter = LoraAdapter::new(la, lb, scale as f32).map_err(s)?;
        layer
            .attach_adapter(format!("adapter{i}"), adapter)
            .map_err(s)?;
    }
    Ok(layer)
}

/// As `SwitchGLU.__call__` drives one projection (the linked case's
/// `port_apply`).
fn switch_apply(
    forward: impl Fn(&Array, &Array, bool) -> Result<Array>,
    x: &Array,
    indices: &Array,
    sort: bool,
) -> Result<Value> {
    use conformance::families::quantized::switch::{gather_sort, scatter_unsort};
    let x = x.expand_dims_axes(&[-2, -3]).map_err(s)?;
    let y = if sort {
        let (xs, idx, inv_order) = gather_sort(&x, indices).map_err(s)?;
        let y = forward(&xs, &idx, true)?;
        scatter_unsort(&y, &inv_order, indices.shape()).map_err(s)?
    } else {
        forward(&x, indices, false)?
    };
    tensor(&y.squeeze_axes(&[-2]).map_err(s)?)
}

fn call(op: &str, a: &Args) -> Result<Value> {
    match op {
        "quantized_matmul" => tensor(
            &mlx_rs::ops::quantized_matmul(
                a.array("x")?,
                a.array("w")?,
                a.array("scales")?,
                &a.array("biases")?,
                true,
                a.int("group_size")? as i32,
                a.int("bits")? as i32,
            )
            .map_err(s)?,
        ),
        "quantized_linear" | "lora_linear" => tensor(
            &linear_with_adapters(a)?
                .forward(&a.array("x")?)
                .map_err(s)?,
        ),
        "quantized_linear_rows" => tensor(
            &linear_with_adapters(a)?
                .forward_as(&a.array("x")?, Forward::RowsIndependent)
                .map_err(s)?,
        ),
        "quantized_switch_linear" => {
            let layer =
                QuantizedSwitchLinear::new(a.payload()?, a.opt_array("bias")?).map_err(s)?;
            switch_apply(
                |x, i, sorted| layer.forward(x, i, sorted).map_err(s),
                &a.array("x")?,
                &a.array("indices")?,
                a.flag("sort")?,
            )
        }
        "quantized_switch_linear_rows" => {
            let layer =
                QuantizedSwitchLinear::new(a.payload()?, a.opt_array("bias")?).map_err(s)?;
            let indices =
                ExpertIndices::checked(a.array("indices")?, layer.num_experts()).map_err(s)?;
            let x = a.array("x")?.expand_dims_axes(&[-2, -3]).map_err(s)?;
            let regime = RowsRegime::for_backend(layers::Backend::of_default_device().map_err(s)?);
            let y = layer
                .forward_rows_independent(&x, &indices, &regime)
                .map_err(s)?;
            tensor(&y.squeeze_axes(&[-2]).map_err(s)?)
        }
        "linear" => {
            let layer =
                layers::dense::Linear::new(a.array("weight")?, a.opt_array("bias")?).map_err(s)?;
            tensor(&layer.forward(&a.array("x")?).map_err(s)?)
        }
        "switch_linear" => {
            let layer = layers::dense::SwitchLinear::new(a.array("weight")?, a.opt_array("bias")?)
                .map_err(s)?;
            switch_apply(
                |x, i, sorted| layer.forward(x, i, sorted).map_err(s),
                &a.array("x")?,
                &a.array("indices")?,
                a.flag("sort")?,
            )
        }
        "quantized_embedding" => {
            let emb = QuantizedEmbedding::new(a.payload()?).map_err(s)?;
            Ok(dict(vec![
                ("lookup", tensor(&emb.lookup(&a.array("ids")?).map_err(s)?)?),
                (
                    "logits",
                    tensor(&emb.as_linear(&a.array("x")?).map_err(s)?)?,
                ),
            ]))
        }
        "rope2d_apply" => tensor(
            &layers::position::apply_multidimensional_rope(
                &a.array("inputs")?,
                &a.array("positions")?,
                a.float("base_frequency")?,
            )
            .map_err(s)?,
        ),
        "mrope_apply" => Ok(dict(mrope_rotate(
            a,
            &a.array("q")?,
            &a.array("position_ids")?,
            None,
        )?)),
        "inv_freq" => {
            let base = a.float("base")?;
            let parts = a
                .usizes("dims")?
                .into_iter()
                .map(|d| layers::position::compute_inv_freq(d, base).map_err(s))
                .collect::<Result<Vec<_>>>()?;
            tensor(&mlx_rs::ops::concatenate(&parts, 0).map_err(s)?)
        }
        "mrope_position_selector" => {
            let Value::List(sections) = a.get("sections")? else {
                return Err("`sections` is not a list".into());
            };
            let mut out = Vec::new();
            for (freq_dim, section) in a.usizes("freq_dims")?.into_iter().zip(sections) {
                let section = usizes(section, "sections")?;
                out.extend(
                    layers::position::interleaved_position_selector(&section, freq_dim)
                        .map_err(s)?,
                );
            }
            int32(&out)
        }
        "qwen3_5_config" => {
            use conformance::families::configs::qwen3_5::read_fields;
            let c = layers::config::Qwen3_5Config::from_json(&config_json(a)?).map_err(s)?;
            let r = read_fields(&c).map_err(s)?;
            Ok(dict(vec![
                ("fields", int64(&r.fields)?),
                ("mrope_section", int64(&r.mrope_section)?),
                (
                    "floats",
                    Value::List(r.floats.iter().map(|&f| Value::Float(f)).collect()),
                ),
                ("theta_is_int", int64(&[r.theta_is_int])?),
            ]))
        }
        "gemma4_vision_config" => {
            let c = layers::config::Gemma4VisionConfig::from_json(&config_json(a)?).map_err(s)?;
            Ok(dict(vec![
                (
                    "fields",
                    int64(&conformance::families::configs::gemma4::read_fields(&c))?,
                ),
                ("floats", Value::List(vec![Value::Float(c.rope_theta)])),
            ]))
        }
        "gemma4_config_rope2d" => {
            let c = layers::config::Gemma4VisionConfig::from_json(&config_json(a)?).map_err(s)?;
            tensor(
                &layers::position::apply_multidimensional_rope(
                    &a.array("inputs")?,
                    &a.array("positions")?,
                    c.rope_theta,
                )
                .map_err(s)?,
            )
        }
        "rope_index" | "rope_decode_positions" => {
            let p = PromptArgs::read(a)?;
            let indices = p.indices(&VisionTokens::QWEN3_5, true)?;
            let dtype = indices
                .first()
                .map_or(PositionDtype::Int32, RopeIndex::position_dtype);
            let streams: Vec<[Vec<i32>; 3]> =
                indices.iter().map(|i| i.position_ids().clone()).collect();
            let deltas: Vec<i32> = indices.iter().map(RopeIndex::rope_delta).collect();
            let mut out = vec![
                ("position_ids", positions(&indices, &streams, p.len, dtype)?),
                ("rope_deltas", ints_as(&deltas, &[p.batch, 1], dtype)?),
            ];
            if op == "rope_decode_positions" {
                let (offset, n) = (a.int("cache_offset")? as usize, a.int("length")? as usize);
                let windows = indices
                    .iter()
                    .map(|i| i.window(offset, n).map_err(s))
                    .collect::<Result<Vec<_>>>()?;
                out.push((
                    "decode_position_ids",
                    positions(&indices, &windows, n, dtype)?,
                ));
            }
            Ok(dict(out))
        }
        "mrope_prefill" | "mrope_decode_step" => {
            let p = PromptArgs::read(a)?;
            let indices = p.indices(&VisionTokens::QWEN3_5, false)?;
            let q = a.array("q")?;
            let len = q.shape()[2] as usize;
            let offset = if op == "mrope_decode_step" {
                a.int("cache_offset")? as usize
            } else {
                0
            };
            let windows = indices
                .iter()
                .map(|i| i.window(offset, len).map_err(s))
                .collect::<Result<Vec<_>>>()?;
            let window = positions(&indices, &windows, len, PositionDtype::Int32)?;
            let streams: Vec<[Vec<i32>; 3]> =
                indices.iter().map(|i| i.position_ids().clone()).collect();
            let deltas: Vec<i32> = indices.iter().map(RopeIndex::rope_delta).collect();
            let Value::Tensor(window_host) = &window else {
                unreachable!("an array")
            };
            let mut out = mrope_rotate(a, &q, &window_host.to_array(), None)?;
            if op == "mrope_decode_step" {
                out.push((
                    "position_ids",
                    positions(&indices, &streams, p.len, PositionDtype::Int32)?,
                ));
                out.push(("decode_position_ids", window));
            } else {
                out.push(("position_ids", window));
            }
            out.push((
                "rope_deltas",
                ints_as(&deltas, &[p.batch, 1], PositionDtype::Int32)?,
            ));
            Ok(dict(out))
        }
        "qwen3_5_config_mrope" => {
            use layers::config::Qwen3_5Config;
            let c = Qwen3_5Config::from_json(&config_json(a)?).map_err(s)?;
            let tokens = c.vision_tokens().map_err(s)?;
            let p = PromptArgs::read(a)?;
            let indices = p.indices(&tokens, false)?;
            let windows = indices
                .iter()
                .map(|i| i.window(0, p.len).map_err(s))
                .collect::<Result<Vec<_>>>()?;
            let dtype = indices
                .first()
                .map_or(PositionDtype::Int32, RopeIndex::position_dtype);
            let values: Vec<i32> = (0..3)
                .flat_map(|axis| windows.iter().flat_map(move |w| w[axis].iter().copied()))
                .collect();
            let pos = ints_as(&values, &[3, p.batch, p.len], PositionDtype::Int32)?;
            let Value::Tensor(pos_host) = &pos else {
                unreachable!("an array")
            };
            let mut out = mrope_rotate(
                a,
                &a.array("q")?,
                &pos_host.to_array(),
                Some(c.mrope().map_err(s)?),
            )?;
            out.retain(|(k, _)| ["q", "k", "path"].contains(k));
            out.push((
                "position_ids",
                ints_as(&values, &[3, p.batch, p.len], dtype)?,
            ));
            let deltas: Vec<i32> = indices.iter().map(RopeIndex::rope_delta).collect();
            out.push(("rope_deltas", ints_as(&deltas, &[p.batch, 1], dtype)?));
            Ok(dict(out))
        }
        "model_generate" => {
            let model = layers::model::Model::load(a.string("directory")?).map_err(s)?;
            let prompt = a.host("prompt")?;
            if prompt.dtype != oracle::DType::Int32 {
                return Err(format!("prompt is {}, not int32", prompt.dtype.name()));
            }
            let tokens: Vec<i32> = prompt
                .bytes
                .chunks(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let trace_step = a.int("trace_step")?;
            let g = conformance::families::model::port_generate(
                &model,
                &tokens,
                a.int("chunk")?.max(0) as usize,
                a.int("steps")?.max(0) as usize,
                (trace_step >= 0).then_some(trace_step as usize),
            )
            .map_err(|e| e.to_string())?;
            let trace = match g.trace {
                Some(t) => {
                    let mut points = BTreeMap::new();
                    for p in &t.points {
                        if !points.contains_key(&p.point) {
                            points.insert(p.point.clone(), tensor(&p.value)?);
                        }
                    }
                    Value::Dict(points)
                }
                None => Value::None,
            };
            Ok(dict(vec![
                ("prefill", Value::Tensor(g.prefill)),
                ("decode", Value::Tensor(g.decode)),
                ("tokens", Value::Tensor(g.tokens)),
                ("kv_layout", Value::Tensor(g.kv_layout)),
                ("trace", trace),
            ]))
        }
        "safetensors_load" => {
            let file = layers::checkpoint::SafetensorsFile::open(a.string("path")?).map_err(s)?;
            let mut arrays = BTreeMap::new();
            for (name, _) in file.tensors() {
                arrays.insert(name.to_owned(), tensor(&file.array(name).map_err(s)?)?);
            }
            let metadata = file
                .metadata()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
                        .collect()
                })
                .unwrap_or_default();
            Ok(dict(vec![
                ("arrays", Value::Dict(arrays)),
                ("metadata", Value::Dict(metadata)),
            ]))
        }
        "mrope_kernel_source" => {
            use layers::position::Pairing;
            let pairing = match a.string("pairing")?.as_str() {
                "half_split" => Pairing::HalfSplit,
                "even_odd" => Pairing::EvenOdd,
                other => return Err(format!("pairing `{other}`")),
            };
            let spec = layers::position::mrope_kernel_spec(
                a.int("rotary_dim")? as usize,
                a.int("position_ndim")? as usize,
                pairing,
            );
            Ok(dict(vec![
                ("name", bytes(&spec.name)?),
                ("input_names", bytes(&spec.input_names.join("\0"))?),
                ("output_names", bytes(&spec.output_names.join("\0"))?),
                ("source", bytes(&spec.source)?),
                ("header", bytes(&spec.header)?),
                (
                    "flags",
                    int32(&[
                        i32::from(spec.ensure_row_contiguous),
                        i32::from(spec.atomic_outputs),
                        0,
                    ])?,
                ),
            ]))
        }
        "mrope_kernel_launch" => {
            let dtype = match a.string("dtype_name")?.as_str() {
                "bfloat16" => mlx_rs::Dtype::Bfloat16,
                "float16" => mlx_rs::Dtype::Float16,
                "float32" => mlx_rs::Dtype::Float32,
                other => return Err(format!("dtype `{other}`")),
            };
            let half = a.int("rotary_dim")? as usize / 2;
            let (b, l, d) = (
                a.int("batch")? as i32,
                a.int("length")? as i32,
                a.int("head_dim")? as i32,
            );
            let mut launches = Vec::new();
            for heads in [a.int("q_heads")? as i32, a.int("kv_heads")? as i32] {
                let launch = layers::position::mrope_kernel_launch(&[b, heads, l, d], dtype, half)
                    .map_err(s)?;
                let template: Vec<String> = launch
                    .template
                    .iter()
                    .map(|(n, t)| format!("{n}={}", dtype_name(*t)))
                    .collect();
                let shapes: Vec<i32> = launch.output_shapes.concat();
                let shapes = HostTensor::new(
                    oracle::DType::Int32,
                    vec![launch.output_shapes.len(), 4],
                    shapes.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )
                .map_err(s)?;
                launches.push(dict(vec![
                    ("grid", int32(&launch.grid)?),
                    ("threadgroup", int32(&launch.threadgroup)?),
                    ("template", Value::Str(template.join(","))),
                    ("output_shapes", Value::Tensor(shapes)),
                    (
                        "output_dtypes",
                        Value::List(
                            launch
                                .output_dtypes
                                .iter()
                                .map(|t| Value::Str(dtype_name(*t).into()))
                                .collect(),
                        ),
                    ),
                    // [x, position_ids, inv_freq, position_selector]
                    ("inputs", Value::Int(4)),
                ]));
            }
            Ok(Value::List(launches))
        }
        "quantized_checkpoint_forward" => {
            use conformance::families::quantized::checkpoint::port_modules;
            let paths = a.strings("paths")?;
            let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
            let m = port_modules(
                std::path::Path::new(&a.string("directory")?),
                &a.host("x")?,
                &a.host("indices")?,
                &paths,
            )
            .map_err(s)?;
            let outputs = m
                .outputs
                .into_iter()
                .map(|o| o.map_or(Value::None, Value::Tensor))
                .collect();
            Ok(dict(vec![
                ("specs", Value::Tensor(m.table)),
                ("outputs", Value::List(outputs)),
            ]))
        }
        "float_checkpoint_forward" => {
            use mlx_rs::ops::indexing::IndexOp;
            let checkpoint =
                layers::checkpoint::Checkpoint::open(a.string("directory")?).map_err(s)?;
            let layer = layers::dense::Linear::from_checkpoint(&checkpoint, &a.string("path")?)
                .map_err(s)?;
            let x = a.array("x")?.index((.., ..layer.in_features()));
            Ok(dict(vec![
                ("module", Value::Str("Linear".into())),
                ("y", tensor(&layer.forward(&x).map_err(s)?)?),
            ]))
        }
        "lora_adapters_apply" => adapters_apply(a),
        "nvfp4_global_scale" => {
            let w = a.array("w")?;
            let spec = QuantSpec::new(Mode::Nvfp4, 4, a.int("group_size")? as i32).map_err(s)?;
            let gs = max_abs(&w)?;
            let payload = QuantizedPayload::quantize_with_global_scale(&w, spec, &gs).map_err(s)?;
            let dequantized = payload.dequantize(None).map_err(s)?;
            let (weight, scales) = (tensor(payload.weight())?, tensor(payload.scales())?);
            // The port refuses the forward the pinned MLX cannot run.
            let refused = match QuantizedLinear::new(payload, None)
                .map_err(s)?
                .forward(&a.array("x")?)
            {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            };
            Ok(dict(vec![
                ("global_scale", tensor(&gs)?),
                ("weight", weight),
                ("scales", scales),
                ("dequantized", tensor(&dequantized)?),
                ("matmul_refused", Value::Str(refused)),
            ]))
        }
        "switch_nvfp4_global_scale" => {
            let spec = QuantSpec::new(Mode::Nvfp4, 4, a.int("group_size")? as i32).map_err(s)?;
            let payload =
                QuantizedPayload::quantize_experts_with_global_scale(&a.array("w")?, spec)
                    .map_err(s)?;
            let gs = tensor(payload.global_scale().ok_or("no global scale")?)?;
            let (weight, scales) = (tensor(payload.weight())?, tensor(payload.scales())?);
            let refused = match QuantizedSwitchLinear::new(payload, None)
                .map_err(s)?
                .forward(&a.array("x")?, &a.array("indices")?, false)
            {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            };
            Ok(dict(vec![
                ("weight", weight),
                ("scales", scales),
                ("global_scale", gs),
                ("call_refused", Value::Str(refused)),
            ]))
        }
        "attention_decode_step" => attention_decode_step(a),
        "sdpa_kv_cache" => {
            use conformance::families::attention::sdpa::{KvView, SdpaShape};
            let (q, k, v) = (a.host("queries")?, a.host("keys")?, a.host("values")?);
            let [batch, n_heads, m, head_dim] = q.shape[..] else {
                return Err(format!("queries of shape {:?}, not [B, H, M, D]", q.shape));
            };
            let shape = SdpaShape {
                dtype: q.dtype,
                batch,
                n_heads,
                n_kv_heads: *k.shape.get(1).ok_or("keys are not [B, H_kv, L, D]")?,
                head_dim,
                kv_len: *k.shape.get(2).ok_or("keys are not [B, H_kv, L, D]")?,
                m,
                // The port's own cache (an `attention/sdpa` case's
                // `cache-buffer` view is a port-side choice the op does not
                // carry).
                kv_view: KvView::Contiguous,
            };
            shape.check()?;
            if a.float("scale")? as f32 != shape.scale() {
                return Err(format!(
                    "scale {} is not head_dim ** -0.5, the only scale the port's step takes",
                    a.float("scale")?
                ));
            }
            tensor(
                &shape
                    .port(&q.to_array(), &k.to_array(), &v.to_array(), shape.kv_view)
                    .map_err(s)?,
            )
        }
        other => Err(format!("no op `{other}`")),
    }
}

/// `mx.max(mx.abs(w)).astype(mx.float32)`, the global scale as mlx-lm
/// takes it (the linked case's `max_abs`).
fn max_abs(w: &Array) -> Result<Array> {
    mlx_rs::ops::max(&mlx_rs::ops::abs(w).map_err(s)?, None)
        .map_err(s)?
        .as_dtype(mlx_rs::Dtype::Float32)
        .map_err(s)
}

/// The directory the library wrote, opened by the port's loader; each
/// path's adapted module and its fuse on `x[:, :in]` (the linked
/// `quantized/adapters` case's port side).
fn adapters_apply(a: &Args) -> Result<Value> {
    use layers::quantized::{lora, AdapterFormat, AdapterSet};
    use mlx_rs::ops::indexing::IndexOp;
    let library = a.string("library")?;
    let format = match library.as_str() {
        "mlx-lm" => AdapterFormat::MlxLm,
        "mlx-vlm" => AdapterFormat::MlxVlm,
        "mlx-vlm-legacy" => AdapterFormat::MlxVlmLegacy,
        other => return Err(format!("library `{other}`")),
    };
    let set = AdapterSet::open(a.string("directory")?, format).map_err(s)?;
    let keys = a.strings("keys")?;
    let (weights, scales) = (a.arrays("weights")?, a.arrays("scales")?);
    let biases = match a.get("biases")? {
        Value::List(items) => items
            .iter()
            .map(|v| match v {
                Value::None => Ok(None),
                Value::Tensor(t) => Ok(Some(t.to_array())),
                _ => Err("`biases` holds a non-array".to_owned()),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => return Err("`biases` is not a list".into()),
    };
    let spec = a.spec()?;
    let x = a.array("x")?;
    let (mut ys, mut fused, mut refused) = (Vec::new(), Vec::new(), String::new());
    for path in a.strings("paths")? {
        let key = keys
            .iter()
            .position(|k| path.ends_with(&format!(".{k}")))
            .ok_or_else(|| format!("`{path}` ends in none of the keys"))?;
        let payload = QuantizedPayload::new(
            weights[key].clone(),
            scales[key].clone(),
            biases.get(key).cloned().flatten(),
            spec,
        )
        .map_err(s)?;
        let adapter = set
            .get(&path)
            .ok_or_else(|| format!("no adapter for `{path}` in the directory"))?;
        let base = QuantizedLinear::new(payload.clone(), None).map_err(s)?;
        let mut adapted = QuantizedLinear::new(payload, None).map_err(s)?;
        adapted
            .attach_adapter(path.clone(), adapter.clone())
            .map_err(s)?;
        let xi = x.index((.., ..base.in_features()));
        ys.push(tensor(&adapted.forward(&xi).map_err(s)?)?);
        match lora::fuse(&base, adapter).and_then(|f| f.forward(&xi)) {
            Ok(y) => fused.push(tensor(&y)?),
            Err(e) => {
                if refused.is_empty() {
                    refused = e.to_string();
                }
                fused.push(Value::None);
            }
        }
    }
    Ok(dict(vec![
        ("y", Value::List(ys)),
        ("y_fused", Value::List(fused)),
        ("fuse_refused", Value::Str(refused)),
    ]))
}

/// One token at a time through the port's attention step on a cache
/// prefilled with k0/v0 (the linked `attention/decode` case's M = 1
/// trajectory).
fn attention_decode_step(a: &Args) -> Result<Value> {
    use conformance::families::attention::step::{
        rows, stack_rows, AttentionShape, DecodeStep, HostProjection, HostWeights, KvCache,
    };
    let x = a.host("x")?;
    let projection = |p: &str| -> Result<HostProjection> {
        Ok(HostProjection {
            weight: a.host(&format!("{p}_w"))?,
            scales: a.host(&format!("{p}_s"))?,
            biases: a.host(&format!("{p}_b"))?,
        })
    };
    let weights = HostWeights {
        q: projection("q")?,
        k: projection("k")?,
        v: projection("v")?,
        o: projection("o")?,
    };
    let shape = AttentionShape {
        hidden: *x.shape.last().ok_or("x has no axes")?,
        n_heads: a.int("n_heads")? as usize,
        n_kv_heads: a.int("n_kv_heads")? as usize,
        head_dim: a.int("head_dim")? as usize,
        rotary_dims: a.int("rotary_dims")? as usize,
        rope_base: a.float("rope_base")? as f32,
        spec: QuantSpec::new(
            Mode::Affine,
            a.int("bits")? as i32,
            a.int("group_size")? as i32,
        )
        .map_err(s)?,
    };
    let step = DecodeStep::new(shape, &weights).map_err(s)?;
    let (k0, v0) = (a.host("k0")?, a.host("v0")?);
    let prefill = (k0.shape[2] > 0).then(|| (k0.to_array(), v0.to_array()));
    let mut cache = KvCache::prefilled(prefill);
    let mut parts: [Vec<HostTensor>; 4] = Default::default();
    for t in 0..x.shape[0] {
        let out = step
            .forward(&rows(&x, t, t + 1).to_array(), &mut cache)
            .map_err(s)?;
        for (part, array) in parts
            .iter_mut()
            .zip([&out.attn, &out.y, &out.keys, &out.values])
        {
            part.push(HostTensor::from_array(array).map_err(s)?);
        }
    }
    Ok(Value::List(
        parts.iter().map(|p| Value::Tensor(stack_rows(p))).collect(),
    ))
}

/// Text as uint8 bytes (how the kernel's strings are compared).
fn bytes(text: &str) -> Result<Value> {
    HostTensor::new(
        oracle::DType::Uint8,
        vec![text.len()],
        text.as_bytes().to_vec(),
    )
    .map(Value::Tensor)
    .map_err(s)
}

/// The `mlx.core` name of a dtype.
fn dtype_name(dtype: mlx_rs::Dtype) -> &'static str {
    match dtype {
        mlx_rs::Dtype::Bfloat16 => "bfloat16",
        mlx_rs::Dtype::Float16 => "float16",
        mlx_rs::Dtype::Float32 => "float32",
        _ => "other",
    }
}

use layers::position::{
    GridThw, PositionDtype, PositionLayout, RopeIndex, RopeIndexInput, VisionTokens,
};

/// A prompt's arguments: `input_ids` [B, L], the grids (one global list
/// in row order, or None), and the attention mask when given.
struct PromptArgs {
    ids: Vec<i32>,
    mask: Option<Vec<bool>>,
    images: Option<Vec<GridThw>>,
    videos: Option<Vec<GridThw>>,
    batch: usize,
    len: usize,
}

fn i32s(t: &HostTensor) -> Vec<i32> {
    (0..t.len()).map(|i| t.value(i) as i32).collect()
}

fn grids(a: &Args, name: &str) -> Result<Option<Vec<GridThw>>> {
    match a.0.get(name) {
        None | Some(Value::None) => Ok(None),
        Some(Value::Tensor(t)) => {
            let v = i32s(t);
            Ok(Some(
                v.chunks(3)
                    .map(|g| GridThw::new(g[0] as usize, g[1] as usize, g[2] as usize))
                    .collect(),
            ))
        }
        Some(Value::List(rows)) => rows
            .iter()
            .map(|r| {
                let g = usizes(r, name)?;
                (g.len() == 3)
                    .then(|| GridThw::new(g[0], g[1], g[2]))
                    .ok_or_else(|| format!("`{name}` rows are [t, h, w]"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        _ => Err(format!("`{name}` is neither an array, a list nor None")),
    }
}

impl PromptArgs {
    fn read(a: &Args) -> Result<Self> {
        let ids = a.host("input_ids")?;
        let (batch, len) = match ids.shape[..] {
            [b, l] => (b, l),
            _ => return Err("input_ids must be [B, L]".into()),
        };
        let mask = match a.0.get("attention_mask") {
            Some(Value::Tensor(m)) => {
                let m: Vec<bool> = i32s(m).into_iter().map(|v| v != 0).collect();
                m.iter().any(|v| !v).then_some(m)
            }
            _ => None,
        };
        Ok(PromptArgs {
            ids: i32s(&ids),
            mask,
            images: grids(a, "image_grid_thw")?,
            videos: grids(a, "video_grid_thw")?,
            batch,
            len,
        })
    }

    /// The rope index of each row; the global grid lists are split by the
    /// spans each row opens (`vision_start` then the image or video token),
    /// as get_rope_index consumes them.
    fn indices(&self, tokens: &VisionTokens, grids_as_given: bool) -> Result<Vec<RopeIndex>> {
        let present = self.images.is_some() || self.videos.is_some();
        let (mut next_image, mut next_video) = (0, 0);
        (0..self.batch)
            .map(|row| {
                let ids = &self.ids[row * self.len..(row + 1) * self.len];
                let spans = |token: i32| {
                    ids.windows(2)
                        .filter(|w| w[0] == tokens.vision_start_token_id && w[1] == token)
                        .count()
                };
                let (ni, nv) = (spans(tokens.image_token_id), spans(tokens.video_token_id));
                // An image grid is one span; a video grid of t frames is t.
                let take = |all: &Option<Vec<GridThw>>,
                            next: &mut usize,
                            spans: usize,
                            frames: bool|
                 -> Result<Option<Vec<GridThw>>> {
                    let mut slice = Vec::new();
                    let mut covered = 0;
                    while covered < spans {
                        let g = all
                            .as_ref()
                            .and_then(|g| g.get(*next))
                            .ok_or("fewer grids than vision spans")?;
                        covered += if frames { g.t.max(1) } else { 1 };
                        slice.push(*g);
                        *next += 1;
                    }
                    Ok((present && (!grids_as_given || all.is_some())).then_some(slice))
                };
                let images = take(&self.images, &mut next_image, ni, false)?;
                let videos = take(&self.videos, &mut next_video, nv, true)?;
                let input = RopeIndexInput {
                    input_ids: ids,
                    image_grid_thw: images.as_deref(),
                    video_grid_thw: videos.as_deref(),
                    attention_mask: self
                        .mask
                        .as_ref()
                        .map(|m| &m[row * self.len..(row + 1) * self.len]),
                };
                layers::position::rope_index(&input, tokens).map_err(s)
            })
            .collect()
    }
}

/// Streams of every row as the reference stacks them: `[B, width]` when
/// every row is text, else `[3, B, width]`.
fn positions(
    indices: &[RopeIndex],
    streams: &[[Vec<i32>; 3]],
    width: usize,
    dtype: PositionDtype,
) -> Result<Value> {
    let batch = streams.len();
    if indices.iter().all(|i| i.layout() == PositionLayout::Text) {
        let values: Vec<i32> = streams.iter().flat_map(|s| s[0].iter().copied()).collect();
        return ints_as(&values, &[batch, width], dtype);
    }
    let values: Vec<i32> = (0..3)
        .flat_map(|axis| streams.iter().flat_map(move |s| s[axis].iter().copied()))
        .collect();
    ints_as(&values, &[3, batch, width], dtype)
}

/// int32 values as an array of the position dtype.
fn ints_as(values: &[i32], shape: &[usize], dtype: PositionDtype) -> Result<Value> {
    let t = match dtype {
        PositionDtype::Int32 => HostTensor::new(
            oracle::DType::Int32,
            shape.to_vec(),
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        PositionDtype::Int64 => HostTensor::new(
            oracle::DType::Int64,
            shape.to_vec(),
            values
                .iter()
                .flat_map(|v| i64::from(*v).to_le_bytes())
                .collect(),
        ),
    };
    t.map(Value::Tensor).map_err(s)
}

/// The rotary of the call (its head_dim, factor, theta and section, or a
/// config's) applied to q and k with `position_ids`, on the call's path.
fn mrope_rotate(
    a: &Args,
    q: &Array,
    position_ids: &Array,
    config: Option<layers::position::MropeConfig>,
) -> Result<Vec<(&'static str, Value)>> {
    use layers::position::{Mrope, MropeConfig, MropePath};
    let path = match a.string("path")?.as_str() {
        "pure-mlx" => MropePath::PureMlx,
        "metal-kernel" => MropePath::MetalKernel,
        other => return Err(format!("path `{other}`")),
    };
    let config = match config {
        Some(c) => c,
        None => MropeConfig::qwen3_5(
            a.int("head_dim")? as usize,
            a.float("partial_rotary_factor")?,
            a.float("rope_theta")?,
            a.usizes("mrope_section")?,
        ),
    };
    let rope = Mrope::new(config).map_err(s)?;
    let k = a.array("k")?;
    let (q, k) = if path == MropePath::current().map_err(s)? {
        rope.apply(q, &k, position_ids)
    } else {
        rope.apply_with_path(path, q, &k, position_ids)
    }
    .map_err(s)?;
    Ok(vec![
        ("q", tensor(&q)?),
        ("k", tensor(&k)?),
        ("path", Value::Str(path.as_str().to_owned())),
        ("inv_freq", tensor(rope.inv_freq())?),
        ("position_selector", int32(rope.position_selector())?),
    ])
}

/// `config_text` as the port's config reader parses a `config.json`.
fn config_json(a: &Args) -> Result<serde_json::Map<String, Json>> {
    layers::config::parse_config_json(
        a.string("config_text")?.as_bytes(),
        std::path::Path::new("config.json"),
    )
    .map_err(s)
}

fn int64(values: &[i64]) -> Result<Value> {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(oracle::DType::Int64, vec![values.len()], bytes)
        .map(Value::Tensor)
        .map_err(|e| e.to_string())
}

/// The ops this candidate implements, with their versions.
const OPS: &[&str] = &[
    "quantized_matmul",
    "quantized_linear",
    "lora_linear",
    "quantized_linear_rows",
    "quantized_switch_linear",
    "quantized_switch_linear_rows",
    "linear",
    "switch_linear",
    "quantized_embedding",
    "rope2d_apply",
    "mrope_apply",
    "inv_freq",
    "mrope_position_selector",
    "qwen3_5_config",
    "gemma4_vision_config",
    "gemma4_config_rope2d",
    "rope_index",
    "rope_decode_positions",
    "mrope_prefill",
    "mrope_decode_step",
    "qwen3_5_config_mrope",
    "safetensors_load",
    "mrope_kernel_source",
    "mrope_kernel_launch",
    "quantized_checkpoint_forward",
    "float_checkpoint_forward",
    "lora_adapters_apply",
    "nvfp4_global_scale",
    "switch_nvfp4_global_scale",
    "attention_decode_step",
    "sdpa_kv_cache",
    "model_generate",
];

fn answer(out: &mut impl Write, message: Json) -> bool {
    writeln!(out, "{message}")
        .and_then(|()| out.flush())
        .is_ok()
}

fn serve(request: &Json) -> Json {
    let id = request["id"].clone();
    let op = request["op"].as_str().unwrap_or_default();
    let tensors = match request["inputs"]
        .as_str()
        .map(std::path::Path::new)
        .map(wire::read_tensors)
    {
        Some(Ok(t)) => t,
        Some(Err(e)) => return json!({"type": "error", "id": id, "kind": "raised", "message": e}),
        None => {
            return json!({"type": "error", "id": id, "kind": "raised", "message": "no inputs path"})
        }
    };
    let args = match wire::decode_args(&request["args"], &tensors) {
        Ok(args) => Args(args.into_iter().collect()),
        Err(e) => return json!({"type": "error", "id": id, "kind": "raised", "message": e}),
    };
    match call(op, &args) {
        Ok(value) => {
            let encoded = wire::encode_value(&value);
            if !encoded.tensors.is_empty() {
                let path =
                    std::path::PathBuf::from(request["outputs"].as_str().unwrap_or_default());
                if let Err(e) = conformance::kept::write_file(&path, &encoded.tensors, None) {
                    return json!({"type": "error", "id": id, "kind": "raised", "message": e});
                }
            }
            json!({"type": "result", "id": id, "value": encoded.json})
        }
        Err(e) => json!({"type": "error", "id": id, "kind": "raised", "message": e}),
    }
}

fn main() {
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(request) = serde_json::from_str::<Json>(&line) else {
            eprintln!("port-candidate: a request that is not JSON: {line}");
            std::process::exit(3);
        };
        let reply = if request["type"] == "hello" {
            let backend = request["backend"].as_str().unwrap_or("cpu");
            match conformance::runner::worker::parse_backend(backend) {
                Some(b) => mlx_rs::Device::set_default(&b.device()),
                None => eprintln!(
                    "port-candidate: unknown backend {backend}; staying on the default device"
                ),
            }
            let ops: serde_json::Map<String, Json> =
                OPS.iter().map(|o| ((*o).to_owned(), json!(1))).collect();
            // The libmlx this process mapped (the runner checks it is the
            // reference's file, by sha256); none named when it cannot tell.
            let libmlx = oracle::guards::check_single_libmlx().ok();
            json!({"type": "hello", "protocol": 1, "name": "conformance-port-candidate", "ops": ops, "libmlx": libmlx})
        } else if OPS.contains(&request["op"].as_str().unwrap_or_default()) {
            serve(&request)
        } else {
            json!({"type": "error", "id": request["id"], "kind": "unsupported", "message": "not served"})
        };
        if !answer(&mut out, reply) {
            break;
        }
    }
}

/// The op names have one source, the vocabulary (`candidate/ops.rs`, whose
/// page is docs/ops.md): every op this candidate announces is in it, and
/// the ops `call` dispatches on are exactly the ones it announces.
#[cfg(test)]
mod op_names {
    use std::collections::BTreeSet;

    /// The string patterns of `call`'s match arms (`"a" | "b" => ...` at
    /// the match's indentation), read from this file.
    fn dispatched() -> BTreeSet<String> {
        let source = include_str!("port_candidate.rs");
        let start = source.find("\nfn call(op: &str").expect("fn call");
        let body = &source[start..];
        let end = body.find("\n}\n").expect("end of fn call");
        let mut names = BTreeSet::new();
        for line in body[..end].lines() {
            let Some(arm) = line.strip_prefix("        \"") else {
                continue;
            };
            let Some((pattern, _)) = arm.split_once(" => ") else {
                continue;
            };
            for name in format!("\"{pattern}").split(" | ") {
                names.insert(name.trim_matches('"').to_owned());
            }
        }
        names
    }

    #[test]
    fn every_announced_op_is_in_the_vocabulary_and_sent() {
        for name in super::OPS {
            let op = conformance::candidate::ops::by_name(name)
                .unwrap_or_else(|| panic!("`{name}` is in no op of candidate/ops.rs"));
            assert!(op.sent(), "`{name}` is a setup op, never sent");
        }
    }

    #[test]
    fn the_dispatch_serves_exactly_the_announced_ops() {
        let announced: BTreeSet<String> = super::OPS.iter().map(|s| (*s).to_owned()).collect();
        let dispatched = dispatched();
        assert!(
            dispatched.len() >= 20,
            "the match arms were not read: {dispatched:?}"
        );
        assert_eq!(
            dispatched, announced,
            "fn call's arms and OPS differ (announced but not dispatched, or the reverse)"
        );
    }
}
