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
            use layers::config::{Qwen3_5Config, RopeTheta};
            let c = Qwen3_5Config::from_json(&config_json(a)?).map_err(s)?;
            let mrope = c.mrope().map_err(s)?;
            let tokens = c.vision_tokens().map_err(s)?;
            let fields = [
                c.head_dim,
                mrope.rotary_dim,
                tokens.image_token_id as usize,
                tokens.video_token_id as usize,
                tokens.vision_start_token_id as usize,
                tokens.spatial_merge_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.hidden_size,
                c.num_hidden_layers,
            ]
            .map(|v| v as i64);
            let section: Vec<i64> = c.rope.mrope_section.iter().map(|&v| v as i64).collect();
            Ok(dict(vec![
                ("fields", int64(&fields)?),
                ("mrope_section", int64(&section)?),
                (
                    "floats",
                    Value::List(vec![
                        Value::Float(c.rope.rope_theta.as_f64()),
                        Value::Float(c.rope.partial_rotary_factor),
                    ]),
                ),
                (
                    "theta_is_int",
                    int64(&[i64::from(matches!(c.rope.rope_theta, RopeTheta::Int(_)))])?,
                ),
            ]))
        }
        "gemma4_vision_config" => {
            let c = layers::config::Gemma4VisionConfig::from_json(&config_json(a)?).map_err(s)?;
            let fields = [
                c.head_dim,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.hidden_size,
                c.patch_size,
            ]
            .map(|v| v as i64);
            Ok(dict(vec![
                ("fields", int64(&fields)?),
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
        other => Err(format!("no op `{other}`")),
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
            json!({"type": "hello", "protocol": 1, "name": "conformance-port-candidate", "ops": ops})
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
