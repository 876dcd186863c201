//! The Qwen3.5 text decoder (dense `qwen3_5`, MoE `qwen3_5_moe`), as
//! mlx-vlm 0.7.6's `mlx_vlm.models.qwen3_5.language` (and
//! `qwen3_5_moe.language`) computes it, built from this crate's layers:
//! quantized linears / switch linears / embedding, the checkpoint reader,
//! the config reader and the interleaved mRoPE.
//!
//! ```text
//! h = embed_tokens(tokens)
//! for layer, cache in zip(layers, caches):            # 3 linear : 1 full attention
//!     r = layer.mixer(input_layernorm(h), cache)      # GatedDeltaNet or gated attention
//!     h = h + r
//!     h = h + mlp(post_attention_layernorm(h))        # MLP or sparse MoE
//! logits = lm_head(norm(h))                           # or embed_tokens.as_linear (tied)
//! ```
//!
//! One request at a time (batch rows of equal length, no padding): the
//! reference's batch paths (left padding, ragged decode, batch-invariant
//! decode, the speculative verifier) are not mirrored and not reachable
//! from these entry points. Positions are the reference's for text:
//! `offset + arange(L)` on every mRoPE axis.

mod blocks;
mod cache;
mod config;
mod error;
mod gated_delta;
mod linear;
mod load;
mod ops;
mod trace;

use std::path::Path;

use mlx_rs::ops::{arange, expand_dims, transpose_axes};
use mlx_rs::Array;

pub use blocks::{
    Attention, DecoderLayer, FeedForward, GatedDeltaNet, Mixer, Mlp, RmsNorm, SparseMoe, SwitchGlu,
    DECODE_BLOCK_SIZE,
};
pub use cache::{KvCache, KvLayout, LayerCache, LinearCache, KV_STEP};
pub use config::{MoeConfig, TextConfig};
pub use error::ModelError;
pub use gated_delta::{
    compute_g_beta, gated_delta_chunked, gated_delta_ops, gated_delta_update, Recurrence, CHUNK,
};
pub use linear::{Embedding, Linear};
pub use ops::{slice_axis, slice_update_axis};
pub use trace::{Trace, TracePoint};

use crate::checkpoint::Checkpoint;
use crate::position::Mrope;
use crate::quantized::QuantizedSwitchLinear;
use load::Weights;

/// Faults that can be planted in the port (tests of the first-divergence
/// report; all off by default). Each is a plausible porting mistake.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// The linear-attention recurrent state written back in bfloat16.
    pub recurrent_state_bf16: bool,
    /// The gated RMSNorm's eps multiplied by this factor.
    pub gated_norm_eps_scale: Option<f32>,
    /// The conv window kept one token too early.
    pub conv_state_shift: bool,
    /// KV caches concatenated (contiguous) instead of the step-256 buffer.
    pub kv_contiguous: bool,
    /// [`Model::verify`] as one batched call of the k drafts (the
    /// reference's block call), not rows-independent.
    pub verify_as_block: bool,
}

/// The text decoder with its weights.
#[derive(Debug)]
pub struct Model {
    pub config: TextConfig,
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// `None` when the embeddings are tied.
    pub lm_head: Option<Linear>,
    pub rope: Mrope,
    pub faults: Faults,
}

impl Model {
    /// Loads a model directory (`config.json` + safetensors) through the
    /// crate's checkpoint reader, with the reference's load-time rules
    /// (see `load.rs`).
    ///
    /// # Errors
    /// [`ModelError`] naming the file, key or tensor at fault.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let checkpoint = Checkpoint::open(dir.as_ref())?;
        let config = TextConfig::from_json(checkpoint.config())?;
        if config.num_hidden_layers < config.full_attention_interval {
            return Err(ModelError::Unsupported {
                what: format!(
                    "{} layers with full_attention_interval {}",
                    config.num_hidden_layers, config.full_attention_interval
                ),
                why: "the reference reads positions from cache[full_attention_interval - 1], which must be a full-attention layer".into(),
            });
        }
        let w = Weights::new(checkpoint)?;
        let c = &config;
        let d = c.hidden_size;
        let norm = |path: &str, dims: usize| -> Result<RmsNorm, ModelError> {
            Ok(RmsNorm {
                weight: w.tensor(path, "weight", &[dims as i32])?,
                eps: c.rms_norm_eps,
            })
        };
        let root = "language_model.model";
        let embed_tokens = Embedding::load(&w, &format!("{root}.embed_tokens"), c.vocab_size, d)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("{root}.layers.{i}");
            let mixer = if c.is_linear(i) {
                let a = format!("{p}.linear_attn");
                let (hk, hv) = (c.linear_num_key_heads, c.linear_num_value_heads);
                let (dk, dv) = (c.linear_key_head_dim, c.linear_value_head_dim);
                if hk == 0 || hv % hk != 0 {
                    return Err(ModelError::ConfigKey {
                        key: "linear_num_value_heads".into(),
                        problem: format!("{hv} is not a multiple of linear_num_key_heads {hk}"),
                    });
                }
                let conv_dim = c.conv_dim();
                let kernel = c.linear_conv_kernel_dim;
                let conv_weight = w.tensor(
                    &format!("{a}.conv1d"),
                    "weight",
                    &[conv_dim as i32, kernel as i32, 1],
                )?;
                let conv_weight_decode =
                    transpose_axes(&blocks_squeeze_last(&conv_weight)?, &[1, 0])?
                        .as_dtype(mlx_rs::Dtype::Float32)?;
                Mixer::Linear(GatedDeltaNet {
                    in_proj_qkv: Linear::load(&w, &format!("{a}.in_proj_qkv"), d, conv_dim)?,
                    in_proj_z: Linear::load(&w, &format!("{a}.in_proj_z"), d, hv * dv)?,
                    in_proj_b: Linear::load(&w, &format!("{a}.in_proj_b"), d, hv)?,
                    in_proj_a: Linear::load(&w, &format!("{a}.in_proj_a"), d, hv)?,
                    conv_weight,
                    conv_weight_decode,
                    dt_bias: w.tensor(&a, "dt_bias", &[hv as i32])?,
                    a_log: w.tensor(&a, "A_log", &[hv as i32])?,
                    norm: norm(&format!("{a}.norm"), dv)?,
                    out_proj: Linear::load(&w, &format!("{a}.out_proj"), hv * dv, d)?,
                    num_k_heads: hk as i32,
                    num_v_heads: hv as i32,
                    head_k_dim: dk as i32,
                    head_v_dim: dv as i32,
                    conv_kernel: kernel as i32,
                })
            } else {
                let a = format!("{p}.self_attn");
                let (h, hkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                Mixer::Attention(Attention {
                    q_proj: Linear::load(&w, &format!("{a}.q_proj"), d, h * hd * 2)?,
                    k_proj: Linear::load(&w, &format!("{a}.k_proj"), d, hkv * hd)?,
                    v_proj: Linear::load(&w, &format!("{a}.v_proj"), d, hkv * hd)?,
                    o_proj: Linear::load(&w, &format!("{a}.o_proj"), h * hd, d)?,
                    q_norm: norm(&format!("{a}.q_norm"), hd)?,
                    k_norm: norm(&format!("{a}.k_norm"), hd)?,
                    n_heads: h as i32,
                    n_kv_heads: hkv as i32,
                    head_dim: hd as i32,
                })
            };
            let m = format!("{p}.mlp");
            let ff = match (&c.moe, c.intermediate_size) {
                (Some(moe), _) => {
                    let sw =
                        |name: &str, inf: usize| -> Result<QuantizedSwitchLinear, ModelError> {
                            let path = format!("{m}.switch_mlp.{name}");
                            let stored = w.module_name(&path, "weight")?;
                            Ok(QuantizedSwitchLinear::from_checkpoint(
                                w.checkpoint(),
                                &stored,
                                inf as i32,
                            )?)
                        };
                    let mi = moe.moe_intermediate_size;
                    let si = moe.shared_expert_intermediate_size;
                    FeedForward::Moe(SparseMoe {
                        gate: Linear::load(&w, &format!("{m}.gate"), d, moe.num_experts)?,
                        switch_mlp: SwitchGlu {
                            gate_proj: sw("gate_proj", d)?,
                            up_proj: sw("up_proj", d)?,
                            down_proj: sw("down_proj", mi)?,
                        },
                        shared_expert: Mlp {
                            gate_proj: Linear::load(
                                &w,
                                &format!("{m}.shared_expert.gate_proj"),
                                d,
                                si,
                            )?,
                            up_proj: Linear::load(
                                &w,
                                &format!("{m}.shared_expert.up_proj"),
                                d,
                                si,
                            )?,
                            down_proj: Linear::load(
                                &w,
                                &format!("{m}.shared_expert.down_proj"),
                                si,
                                d,
                            )?,
                        },
                        shared_expert_gate: Linear::load(
                            &w,
                            &format!("{m}.shared_expert_gate"),
                            d,
                            1,
                        )?,
                        top_k: moe.num_experts_per_tok as i32,
                    })
                }
                (None, Some(inter)) => FeedForward::Dense(Mlp {
                    gate_proj: Linear::load(&w, &format!("{m}.gate_proj"), d, inter)?,
                    up_proj: Linear::load(&w, &format!("{m}.up_proj"), d, inter)?,
                    down_proj: Linear::load(&w, &format!("{m}.down_proj"), inter, d)?,
                }),
                (None, None) => unreachable!("TextConfig reads intermediate_size for dense models"),
            };
            layers.push(DecoderLayer {
                mixer,
                input_layernorm: norm(&format!("{p}.input_layernorm"), d)?,
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm"), d)?,
                ff,
            });
        }
        let final_norm = norm(&format!("{root}.norm"), d)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(&w, "language_model.lm_head", d, c.vocab_size)?)
        };
        let rope = Mrope::new(c.mrope.clone())?;
        Ok(Model {
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            rope,
            faults: Faults::default(),
        })
    }

    /// `LanguageModel.make_cache()`: `ArraysCache(size=2)` per linear
    /// layer, `KVCache()` per full-attention layer.
    pub fn make_cache(&self) -> Vec<LayerCache> {
        let layout = if self.faults.kv_contiguous {
            KvLayout::Contiguous
        } else {
            KvLayout::Step256
        };
        self.layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Linear(_) => LayerCache::Linear(LinearCache::default()),
                Mixer::Attention(_) => LayerCache::Attention(KvCache::with_layout(layout)),
            })
            .collect()
    }

    /// Tokens already in `cache` (`cache[fa_idx].offset`).
    pub fn offset(&self, cache: &[LayerCache]) -> usize {
        let fa_idx = self.config.full_attention_interval - 1;
        match cache.get(fa_idx) {
            Some(LayerCache::Attention(c)) => c.offset(),
            _ => 0,
        }
    }

    /// `LanguageModel.__call__(tokens, cache=cache).logits`: `tokens`
    /// int32 `[B, L]` → logits `[B, L, vocab]`. The cache advances by L.
    ///
    /// # Errors
    /// [`ModelError::Input`] for tokens of another shape or a cache of
    /// another model; layer and MLX errors.
    pub fn forward(
        &self,
        tokens: &Array,
        cache: &mut [LayerCache],
        trace: &mut Trace,
    ) -> Result<Array, ModelError> {
        if tokens.ndim() != 2 || tokens.shape()[1] == 0 {
            return Err(ModelError::Input(format!(
                "tokens {:?}: expected int [B, L] with L >= 1",
                tokens.shape()
            )));
        }
        self.check_cache(cache)?;
        let (b, l) = (tokens.shape()[0], tokens.shape()[1]);
        let offset = self.offset(cache) as i32;
        let positions = arange::<_, i32>(offset, offset + l, None)?;
        let position_ids = mlx_rs::ops::broadcast_to(&expand_dims(&positions, 0)?, &[b, l])?;

        let mut h = self.embed_tokens.lookup(tokens)?;
        trace.record("", "embed", &h);
        for (i, (layer, c)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let at = format!("layers.{i}");
            let x = layer.input_layernorm.forward(&h)?;
            trace.record(&at, "input_norm", &x);
            let r = match (&layer.mixer, c) {
                (Mixer::Linear(m), LayerCache::Linear(c)) => {
                    m.forward(&x, c, &self.faults, trace, &at)?
                }
                (Mixer::Attention(m), LayerCache::Attention(c)) => {
                    m.forward(&x, c, &self.rope, &position_ids, trace, &at)?
                }
                _ => {
                    return Err(ModelError::Input(format!(
                        "layer {i}: the cache is not of this layer's kind"
                    )))
                }
            };
            trace.record(&at, "mixer", &r);
            h = h.add(&r)?;
            let x = layer.post_attention_layernorm.forward(&h)?;
            let y = layer.ff.forward(&x, trace, &format!("{at}.mlp"))?;
            trace.record(&at, "mlp", &y);
            h = h.add(&y)?;
            trace.record(&at, "output", &h);
        }
        let out = self.norm.forward(&h)?;
        trace.record("", "final_norm", &out);
        let logits = match &self.lm_head {
            Some(head) => head.forward(&out)?,
            None => self.embed_tokens.as_linear(&out)?,
        };
        trace.record("", "logits", &logits);
        Ok(logits)
    }
}

impl Model {
    /// The rows-independent verify of k drafted tokens (`tokens` int32
    /// `[1, k]`), as a speculative decoder checks them: logits `[1, k,
    /// vocab]` whose row `j` has the bits of the `j`-th of k single decode
    /// steps ([`Model::forward`] of one token each) from the same cache.
    /// The weight-bound work runs over the k rows at once, in the chunks
    /// the backend's measured [`crate::quantized::RowsRegime`] allows (the
    /// linears, the experts, the lm_head); norms, routing and activations
    /// run along rows; each token then passes the conv, the recurrence
    /// and SDPA as its own decode step. The cache advances by k.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn verify(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array, ModelError> {
        if tokens.ndim() != 2 || tokens.shape()[0] != 1 || tokens.shape()[1] == 0 {
            return Err(ModelError::Input(format!(
                "tokens {:?}: expected int [1, k] with k >= 1 (one request)",
                tokens.shape()
            )));
        }
        self.check_cache(cache)?;
        if self.faults.verify_as_block {
            return self.forward(tokens, cache, &mut Trace::off());
        }
        let k = tokens.shape()[1];
        let offset = self.offset(cache) as i32;
        let position_ids = expand_dims(&arange::<_, i32>(offset, offset + k, None)?, 0)?;
        let mut h = self.embed_tokens.lookup(tokens)?;
        for (i, (layer, c)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let x = layer.input_layernorm.forward(&h)?;
            let r = match (&layer.mixer, c) {
                (Mixer::Linear(m), LayerCache::Linear(c)) => m.verify(&x, c, &self.faults)?,
                (Mixer::Attention(m), LayerCache::Attention(c)) => {
                    m.verify(&x, c, &self.rope, &position_ids)?
                }
                _ => {
                    return Err(ModelError::Input(format!(
                        "layer {i}: the cache is not of this layer's kind"
                    )))
                }
            };
            h = h.add(&r)?;
            let x = layer.post_attention_layernorm.forward(&h)?;
            h = h.add(&layer.ff.forward_rows(&x)?)?;
        }
        let out = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward_rows(&out),
            None => self.embed_tokens.as_linear_rows(&out),
        }
    }
}

impl Model {
    /// One cache per layer, as [`Model::make_cache`] makes them.
    fn check_cache(&self, cache: &[LayerCache]) -> Result<(), ModelError> {
        if cache.len() != self.layers.len() {
            return Err(ModelError::Input(format!(
                "a cache of {} layers for a model of {}",
                cache.len(),
                self.layers.len()
            )));
        }
        Ok(())
    }
}

fn blocks_squeeze_last(w: &Array) -> Result<Array, ModelError> {
    Ok(mlx_rs::ops::squeeze_axes(w, &[-1])?)
}
