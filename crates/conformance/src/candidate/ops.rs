//! The op vocabulary: every reference call a must-equal case makes, as a
//! named op with a versioned signature. A candidate (`--candidate`) is
//! sent exactly the arguments the reference received, by these names, and
//! must return what the reference returned: the same tree (see
//! [`super::wire`]) with arrays of the same dtype, shape and bits.
//!
//! `docs/ops.md` is generated from [`OPS`] (`cargo xtask ops-doc`); a test
//! checks it is current and that each op's inputs are exactly its glue
//! function's parameters, in order.

/// One input of an op: its name (the glue's parameter) and what it holds.
#[derive(Debug, Clone, Copy)]
pub struct Input {
    pub name: &'static str,
    /// Kind, dtype and shape, e.g. `array bfloat16|float16|float32 [*, M, K]`.
    pub what: &'static str,
}

/// One op of the vocabulary.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// The published name (`quantized_linear`).
    pub name: &'static str,
    /// Bumped whenever the inputs, the outputs or their meaning change.
    pub version: u32,
    /// The glue function that calls the reference (`reference_glue.<glue>`).
    pub glue: &'static str,
    /// The reference function mirrored (module, function, pinned version).
    pub reference: &'static str,
    pub inputs: &'static [Input],
    /// The result tree: its keys, dtypes and shapes.
    pub outputs: &'static str,
}

const fn i(name: &'static str, what: &'static str) -> Input {
    Input { name, what }
}

const X: Input = i("x", "array float [*, M, K]: the activation");
const MODE: Input = i("mode", "str: `affine`, `mxfp4`, `mxfp8` or `nvfp4`");
const BITS: Input = i(
    "bits",
    "int: bits per code (affine 2..8; mxfp4/nvfp4 4; mxfp8 8)",
);
const GROUP: Input = i(
    "group_size",
    "int: elements per scale (affine 32/64/128; mxfp 32; nvfp4 16)",
);
const WEIGHT: Input = i(
    "weight",
    "array uint32 [N, K*bits/32]: packed codes, as `mx.quantize` returns them",
);
const SCALES: Input = i(
    "scales",
    "array [N, K/group_size]: float (affine) or uint8 (mx/nv formats)",
);
const BIASES: Input = i(
    "biases",
    "array [N, K/group_size] or None: affine offsets (None for the mx/nv formats)",
);
const BIAS: Input = i("bias", "array [N] or None: additive bias");
const SW_WEIGHT: Input = i(
    "weight",
    "array uint32 [E, N, K*bits/32]: packed codes per expert",
);
const SW_SCALES: Input = i("scales", "array [E, N, K/group_size]");
const SW_BIASES: Input = i("biases", "array [E, N, K/group_size] or None");
const SW_BIAS: Input = i("bias", "array [E, N] or None");
const INDICES: Input = i(
    "indices",
    "array uint32|int32 [T.., k]: expert ids per token",
);
const HEAD_DIM: Input = i("head_dim", "int");
const PRF: Input = i(
    "partial_rotary_factor",
    "float: rotary_dim = int(head_dim * factor)",
);
const THETA: Input = i("rope_theta", "float");
const SECTION: Input = i(
    "mrope_section",
    "list of 3 ints: the interleaved section sizes (t, h, w)",
);
const PATH: Input = i(
    "path",
    "str: the reference path the case expects, in mlx-vlm's own names (`pure-mlx` or `metal-kernel`); informational, specific to that implementation",
);
const CONFIG: Input = i("config_text", "str: a `config.json`'s text");
const Q: Input = i("q", "array float [B, Hq, L, head_dim]");
const K: Input = i("k", "array float [B, Hk, L, head_dim]");
const IDS: Input = i(
    "input_ids",
    "array int [B, L]: token ids (image/video pad tokens mark vision spans)",
);
const IMAGE_GRID: Input = i(
    "image_grid_thw",
    "a JSON list of n `[t, h, w]` int lists, or None",
);
const VIDEO_GRID: Input = i(
    "video_grid_thw",
    "a JSON list of n `[t, h, w]` int lists, or None",
);
const QW: &str = "array uint32: packed affine codes";
const QS: &str = "array float: scales";
const QB: &str = "array float: biases";

/// Every op, in documentation order.
pub const OPS: &[Op] = &[
    Op {
        name: "quantized_matmul",
        version: 1,
        glue: "smoke_quantized_matmul",
        reference: "mlx.core.quantized_matmul(transpose=True) (mlx 0.32.2)",
        inputs: &[
            i("x", "array float [M, K]"),
            i("w", "array uint32 [N, K*bits/32]"),
            i("scales", "array float [N, K/group_size]"),
            i("biases", "array float [N, K/group_size]"),
            GROUP,
            BITS,
        ],
        outputs: "array [M, N], x's dtype",
    },
    Op {
        name: "quantized_linear",
        version: 1,
        glue: "quantized_linear",
        reference: "mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2)",
        inputs: &[X, WEIGHT, SCALES, BIASES, BIAS, MODE, BITS, GROUP],
        outputs: "array [*, M, N]: x's dtype (float32 when scales or bias promote it)",
    },
    Op {
        name: "quantized_linear_rows",
        version: 1,
        glue: "quantized_linear_rows",
        reference: "mlx.nn.QuantizedLinear.__call__ (and mlx_lm LoRALinear.__call__) (mlx 0.32.2, mlx-lm 0.32.2), called once per row (M = 1)",
        inputs: &[
            X, WEIGHT, SCALES, BIASES, BIAS, MODE, BITS, GROUP,
            i("lora_a", "list of arrays [K, r] (may be empty)"),
            i("lora_b", "list of arrays [r, N] (may be empty)"),
            i("lora_scales", "list of floats, one per adapter"),
        ],
        outputs: "array [*, M, N]: each row computed alone, rows in x's order",
    },
    Op {
        name: "lora_linear",
        version: 1,
        glue: "quantized_lora",
        reference: "mlx_lm.tuner.lora.LoRALinear.__call__ (mlx-lm 0.32.2), nested once per adapter",
        inputs: &[
            X, WEIGHT, SCALES, BIASES, BIAS,
            i("lora_a", "list of arrays [K, r]"),
            i("lora_b", "list of arrays [r, N]"),
            i("lora_scales", "list of floats"),
            MODE, BITS, GROUP,
        ],
        outputs: "array [*, M, N]",
    },
    Op {
        name: "quantized_switch_linear",
        version: 1,
        glue: "quantized_switch",
        reference: "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2; global_scale=None dropped)",
        inputs: &[
            i("x", "array float [T.., K]: the tokens (expanded to [T.., 1, 1, K] as SwitchGLU does)"),
            INDICES, SW_WEIGHT, SW_SCALES, SW_BIASES, SW_BIAS, MODE, BITS, GROUP,
            i("sort", "bool: sorted_indices (SwitchGLU sorts at >= 64 ids)"),
            i("expert0_views", "bool: weights handed as views of expert 0 (layout test; values unchanged)"),
        ],
        outputs: "array [T.., k, N]",
    },
    Op {
        name: "quantized_switch_linear_as_pinned",
        version: 1,
        glue: "quantized_switch_as_pinned",
        reference: "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2) exactly as pinned",
        inputs: &[i("x", "array float [T.., K]"), INDICES, SW_WEIGHT, SW_SCALES, SW_BIASES, SW_BIAS, MODE, BITS, GROUP],
        outputs: "dict: `raised` (bool), and `y` [T.., k, N] or the exception's `type` and `message`",
    },
    Op {
        name: "quantized_switch_linear_rows",
        version: 1,
        glue: "quantized_switch_rows",
        reference: "mlx_lm.models.switch_layers.QuantizedSwitchLinear.__call__ (mlx-lm 0.32.2), once per token",
        inputs: &[i("x", "array float [T, K]"), INDICES, SW_WEIGHT, SW_SCALES, SW_BIASES, SW_BIAS, MODE, BITS, GROUP],
        outputs: "array [T, k, N]: each token computed alone",
    },
    Op {
        name: "quantized_embedding",
        version: 1,
        glue: "quantized_embedding",
        reference: "mlx.nn.QuantizedEmbedding.__call__ and .as_linear (mlx 0.32.2)",
        inputs: &[
            i("ids", "array int32|uint32 [*]: token ids"),
            i("x", "array float [*, D]: for as_linear"),
            i("weight", "array uint32 [V, D*bits/32]"),
            i("scales", "array [V, D/group_size]"),
            i("biases", "array [V, D/group_size] or None"),
            GROUP, BITS, MODE,
        ],
        outputs: "dict: `lookup` [*, D], `logits` [*, V]",
    },
    Op {
        name: "nvfp4_global_scale",
        version: 1,
        glue: "quantized_global_scale",
        reference: "mlx.core.quantize / dequantize / quantized_matmul with global_scale (mlx 0.32.2)",
        inputs: &[i("w", "array float [N, K]"), i("x", "array float [M, K]"), GROUP],
        outputs: "dict: `global_scale`, `weight`, `scales`, `dequantized`, and the forwards the glue records (arrays, or the exception text)",
    },
    Op {
        name: "switch_nvfp4_global_scale",
        version: 1,
        glue: "quantized_switch_global_scale",
        reference: "mlx_lm SwitchLinear.to_quantized(mode=nvfp4, global_scale=True) (mlx-lm 0.32.2)",
        inputs: &[i("w", "array float [E, N, K]"), i("x", "array float [T, 1, 1, K]"), INDICES, GROUP],
        outputs: "dict: `weight`, `scales`, `global_scale`, and the forward (array or exception text)",
    },
    Op {
        name: "linear",
        version: 1,
        glue: "float_linear",
        reference: "mlx.nn.Linear.__call__ (mlx 0.32.2)",
        inputs: &[X, i("weight", "array float [N, K]"), BIAS],
        outputs: "array [*, M, N]",
    },
    Op {
        name: "switch_linear",
        version: 1,
        glue: "float_switch",
        reference: "mlx_lm.models.switch_layers.SwitchLinear.__call__ (mlx-lm 0.32.2)",
        inputs: &[
            i("x", "array float [T.., K]"),
            INDICES,
            i("weight", "array float [E, N, K]"),
            SW_BIAS,
            i("sort", "bool: sorted_indices"),
        ],
        outputs: "array [T.., k, N]",
    },
    Op {
        name: "safetensors_load",
        version: 1,
        glue: "safetensors_load",
        reference: "mlx.core.load(path, return_metadata=True) (mlx 0.32.2)",
        inputs: &[i("path", "str: a safetensors file")],
        outputs: "dict: `arrays` (name -> array), `metadata` (name -> str)",
    },
    Op {
        name: "checkpoint_load",
        version: 1,
        glue: "quantized_checkpoint_load",
        reference: "mlx_lm.utils.load_model (mlx-lm 0.32.2) with the fixtures' tiny model class",
        inputs: &[i("directory", "str: an MLX model directory (config.json + *.safetensors)")],
        outputs: "what load_model raises or builds (see the glue)",
    },
    Op {
        name: "quantized_checkpoint_forward",
        version: 1,
        glue: "quantized_checkpoint",
        reference: "mlx_lm.utils.load_model (mlx-lm 0.32.2), then each quantized module's __call__",
        inputs: &[
            i("x", "array float [M, K]"),
            i("indices", "array uint32 [M, k]: expert ids for switch modules"),
            i("directory", "str: an MLX model directory"),
            i("paths", "list of str: module paths"),
        ],
        outputs: "dict: `specs` int32 [n, 3] (`[bits, group_size, mode_id]` per path, mode_id 0 affine, 1 mxfp4, 2 mxfp8, 3 nvfp4; `[0, 0, -1]` for a module left float), `outputs` list per path: its output on `x[:, :in]` (switch modules on `x[None]` with `indices[None]`; a switch module with an nvfp4 global scale gives the loaded global scale, as the pinned MLX cannot call it), None for float modules",
    },
    Op {
        name: "float_checkpoint_forward",
        version: 1,
        glue: "float_checkpoint",
        reference: "mlx_lm.utils.load_model (mlx-lm 0.32.2), then the float module's __call__",
        inputs: &[i("x", "array float [M, K]"), i("directory", "str"), i("path", "str: a module path")],
        outputs: "dict: `module` (its class name), `y`",
    },
    Op {
        name: "qwen3_5_config",
        version: 1,
        glue: "config_qwen3_5",
        reference: "mlx_vlm.models.qwen3_5 ModelConfig / TextConfig.from_dict (mlx-vlm 0.7.6)",
        inputs: &[CONFIG],
        outputs: "dict of the fields the text attention and the rope index read (see the glue)",
    },
    Op {
        name: "qwen3_5_config_mlx_lm",
        version: 1,
        glue: "config_qwen3_5_mlx_lm",
        reference: "mlx_lm.models.<model_type>.ModelArgs.from_dict (mlx-lm 0.32.2)",
        inputs: &[CONFIG],
        outputs: "dict of the same fields as mlx-lm reads them",
    },
    Op {
        name: "quantization_config_keys",
        version: 1,
        glue: "config_quantization_keys",
        reference: "mlx_lm.utils quantization config handling and mlx_vlm's config (mlx-lm 0.32.2, mlx-vlm 0.7.6)",
        inputs: &[CONFIG],
        outputs: "dict: `written`, `mlx_vlm`: the quantization block's keys as each library keeps them",
    },
    Op {
        name: "qwen3_5_config_mrope",
        version: 1,
        glue: "config_qwen3_5_mrope",
        reference: "mlx_vlm.models.qwen3_5 LanguageModel.get_rope_index and the rotary built from the config (mlx-vlm 0.7.6)",
        inputs: &[CONFIG, Q, K, IDS, IMAGE_GRID, VIDEO_GRID, PATH],
        outputs: "dict: `q`, `k`, `position_ids`, `rope_deltas`, `path`",
    },
    Op {
        name: "gemma4_vision_config",
        version: 1,
        glue: "config_gemma4_vision",
        reference: "mlx_vlm.models.gemma4 VisionConfig.from_dict (mlx-vlm 0.7.6)",
        inputs: &[CONFIG],
        outputs: "dict: `fields` int64 (the integer fields the vision attention reads), `floats` (a JSON list of its float fields, `rope_theta` among them)",
    },
    Op {
        name: "gemma4_config_rope2d",
        version: 1,
        glue: "config_gemma4_rope2d",
        reference: "mlx_vlm.models.gemma4.vision.apply_multidimensional_rope with the config's rope_theta (mlx-vlm 0.7.6)",
        inputs: &[CONFIG, i("inputs", "array float [B, L, H, D]"), i("positions", "array int [B, L, 2]")],
        outputs: "array [B, L, H, D]",
    },
    Op {
        name: "lora_adapters_write",
        version: 1,
        glue: "adapters_write",
        reference: "mlx_lm.tuner (linear_to_lora_layers, save) / mlx_vlm.trainer adapter writing (mlx-lm 0.32.2, mlx-vlm 0.7.6)",
        inputs: &[
            i("library", "str: `mlx-lm`, `mlx-vlm` or `mlx-vlm-legacy`"),
            i("directory", "str"),
            i("blocks", "int"),
            i("keys", "list of str"),
            i("ins", "list of int"),
            i("outs", "list of int"),
            i("rank", "int"),
            i("scale", "float"),
            i("alpha", "float or None"),
            i("num_layers", "int"),
            i("paths", "list of str"),
            i("lora_a", "list of arrays"),
            i("lora_b", "list of arrays"),
        ],
        outputs: "None (the directory's files: `adapters.safetensors` and `adapter_config.json` as the library writes them). A setup op: never sent to a candidate",
    },
    Op {
        name: "lora_adapters_apply",
        version: 1,
        glue: "adapters_apply",
        reference: "mlx_lm.tuner.utils.load_adapters / mlx_vlm.trainer.utils.apply_lora_layers, LoRALinear.__call__ and .fuse (mlx-lm 0.32.2, mlx-vlm 0.7.6)",
        inputs: &[
            i("library", "str"),
            i("directory", "str: an adapter directory"),
            i("blocks", "int"),
            i("keys", "list of str"),
            i("weights", "list of arrays uint32"),
            i("scales", "list of arrays"),
            i("biases", "list of arrays or None"),
            GROUP, BITS, MODE,
            i("paths", "list of str"),
            i("x", "array float [M, K]"),
        ],
        outputs: "dict: `y` list per path (the adapted module on `x[:, :in]`), `y_fused` list per path (the fused module's forward, None where the library's fuse raised), `fuse_refused` str (the first fuse failure, \"\" if none)",
    },
    Op {
        name: "attention_decode_step",
        version: 1,
        glue: "attention_decode_m1",
        reference: "mlx_lm.models.glm4.Glm4Attention.__call__ on a KVCache (mlx-lm 0.32.2), one token at a time",
        inputs: &[
            i("x", "array float [T, hidden]"),
            i("q_w", QW), i("q_s", QS), i("q_b", QB),
            i("k_w", QW), i("k_s", QS), i("k_b", QB),
            i("v_w", QW), i("v_s", QS), i("v_b", QB),
            i("o_w", QW), i("o_s", QS), i("o_b", QB),
            i("k0", "array float [1, n_kv_heads, S, head_dim]: the KV cache's keys before the step"),
            i("v0", "array float [1, n_kv_heads, S, head_dim]"),
            i("n_heads", "int"), i("n_kv_heads", "int"), HEAD_DIM,
            i("rotary_dims", "int"), i("rope_base", "float"), GROUP, BITS,
        ],
        outputs: "list of 4 arrays, token-major: `attn` [T, n_heads*head_dim] (the attention output before o_proj), `y` [T, hidden], this step's roped `keys` and `values` [T, n_kv_heads*head_dim]; the reference also returns a fifth, `queries` [T, n_heads*head_dim] (q_proj's outputs before RoPE, recorded for the exact oracle, never compared: a candidate may leave it out)",
    },
    Op {
        name: "sdpa_kv_cache",
        version: 1,
        glue: "sdpa_kv_cache",
        reference: "mlx_lm.models.base.scaled_dot_product_attention (mlx-lm 0.32.2) on KVCache state",
        inputs: &[
            i("queries", "array float [B, Hq, L, D]"),
            i("keys", "array float [B, Hk, S, D]"),
            i("values", "array float [B, Hk, S, D]"),
            i("scale", "float"),
        ],
        outputs: "array [B, Hq, M, D]: the attention output (M = queries' L; the first S - M keys and values prefill the cache, the last M are appended)",
    },
    Op {
        name: "model_generate",
        version: 1,
        glue: "model_generate",
        reference: "mlx_vlm.models.qwen3_5 / qwen3_5_moe (mlx-vlm 0.7.6): Model.sanitize, LanguageModel.__call__ with make_cache(), greedy argmax",
        inputs: &[
            i("directory", "str: a model directory (config.json + safetensors)"),
            i("prompt", "array int32 [1, P]: prompt token ids"),
            i("steps", "int: greedy decode steps after the prompt"),
            i("chunk", "int: prefill chunk (0: the whole prompt in one call)"),
            i("trace_step", "int: the call whose intermediates to return (0 = first prefill chunk), or -1"),
        ],
        outputs: "dict: `prefill` [P, vocab] logits of every prompt position, `decode` [steps, vocab], `tokens` int32 [steps + 1] greedy tokens, `kv_layout` int32 [full-attention layers, 2] each KV cache's offset and allocated rows, `trace` {point: array} or None",
    },
    Op {
        name: "rope2d_apply",
        version: 1,
        glue: "position_rope2d",
        reference: "optiq.vlm.gemma4.vision.apply_multidimensional_rope (mlx-optiq, pinned)",
        inputs: &[
            i("inputs", "array float [B, L, H, D]"),
            i("positions", "array int [B, L, 2]: (x, y) per patch"),
            i("base_frequency", "float"),
        ],
        outputs: "array [B, L, H, D], inputs' dtype",
    },
    Op {
        name: "rope_index",
        version: 1,
        glue: "position_rope_index",
        reference: "mlx_vlm.models.qwen3_5.language.LanguageModel.get_rope_index (mlx-vlm 0.7.6)",
        inputs: &[i("attention_mask", "array int [B, L]"), IDS, IMAGE_GRID, VIDEO_GRID],
        outputs: "dict: `position_ids` [3, B, L], or [B, L] for a text-only prompt (int32; int64 for a left-padded batch), `rope_deltas` [B, 1]",
    },
    Op {
        name: "rope_decode_positions",
        version: 1,
        glue: "position_rope_decode",
        reference: "mlx_vlm.models.qwen3_5.language.LanguageModel.__call__ (mlx-vlm 0.7.6): the positions it hands its body at a decode step",
        inputs: &[
            i("attention_mask", "array int [B, L]"), IDS, IMAGE_GRID, VIDEO_GRID,
            i("cache_offset", "int"), i("length", "int: tokens in the step"),
        ],
        outputs: "dict: `position_ids` and `rope_deltas` of `get_rope_index` on the prompt (exactly as `rope_index` returns them, shapes and dtypes included: deltas computed from the mask and grids, not the zeros `__call__` keeps for a text-only prompt), and `decode_position_ids`, the positions `__call__` hands its body at the decode step",
    },
    Op {
        name: "mrope_kernel_source",
        version: 1,
        glue: "position_mrope_kernel_source",
        reference: "mlx_vlm.models.qwen3_5 _mrope_apply_kernel (mlx-vlm 0.7.6): the Metal kernel text",
        inputs: &[i("rotary_dim", "int"), i("position_ndim", "int"), i("pairing", "str")],
        outputs: "dict: `template`, `output_dtypes`, `inputs`, the kernel's source",
    },
    Op {
        name: "mrope_kernel_launch",
        version: 1,
        glue: "position_mrope_kernel_launch",
        reference: "mlx_vlm.models.qwen3_5 _fast_mrope_apply (mlx-vlm 0.7.6): the launch it makes",
        inputs: &[
            i("batch", "int"), i("q_heads", "int"), i("kv_heads", "int"), i("length", "int"),
            HEAD_DIM, i("dtype_name", "str"), i("position_ndim", "int"), i("rotary_dim", "int"),
        ],
        outputs: "list of dicts: grid, threadgroup, template, output shapes and dtypes per launch",
    },
    Op {
        name: "mrope_apply",
        version: 1,
        glue: "position_mrope_apply",
        reference: "mlx_vlm.models.qwen3_5.language.MRoPERotaryEmbedding.apply_rotary (mlx-vlm 0.7.6)",
        inputs: &[Q, K, i("position_ids", "array int [3, B, L]: t/h/w positions"), HEAD_DIM, PRF, THETA, SECTION, PATH],
        outputs: "dict: `q`, `k` (q's and k's shapes and dtypes), `path` (str: the path taken), `inv_freq` float32 [rotary_dim/2], `position_selector` int32 [rotary_dim/2]",
    },
    Op {
        name: "inv_freq",
        version: 1,
        glue: "position_inv_freq",
        reference: "mlx_vlm rope_utils.compute_inv_freq (mlx-vlm 0.7.6), per dim, concatenated",
        inputs: &[i("dims", "list of int"), i("base", "float")],
        outputs: "array float32 [sum(dims)/2]",
    },
    Op {
        name: "mrope_position_selector",
        version: 1,
        glue: "position_selectors",
        reference: "mlx_vlm rope_utils._interleaved_position_selector (mlx-vlm 0.7.6), per pair, concatenated",
        inputs: &[i("freq_dims", "list of int"), i("sections", "list of lists of 3 ints")],
        outputs: "array int [sum(freq_dims)]",
    },
    Op {
        name: "mrope_decode_step",
        version: 1,
        glue: "position_mrope_decode",
        reference: "mlx_vlm.models.qwen3_5 get_rope_index, LanguageModel.__call__'s decode positions and MRoPERotaryEmbedding.apply_rotary (mlx-vlm 0.7.6)",
        inputs: &[Q, K, IDS, IMAGE_GRID, VIDEO_GRID, i("cache_offset", "int"), HEAD_DIM, PRF, THETA, SECTION, PATH],
        outputs: "dict: `q`, `k`, `position_ids` (the prompt's), `decode_position_ids` (the step's), `rope_deltas`, `inv_freq`, `position_selector`, `path` (mlx-vlm's path name)",
    },
    Op {
        name: "mrope_prefill",
        version: 1,
        glue: "position_mrope_prompt",
        reference: "mlx_vlm.models.qwen3_5 get_rope_index then MRoPERotaryEmbedding.apply_rotary (mlx-vlm 0.7.6)",
        inputs: &[Q, K, IDS, IMAGE_GRID, VIDEO_GRID, HEAD_DIM, PRF, THETA, SECTION, PATH],
        outputs: "dict: `q`, `k`, `position_ids`, `rope_deltas`, `inv_freq`, `position_selector`, `path` (mlx-vlm's path name)",
    },
    Op {
        name: "mrope_text_vs_rope",
        version: 1,
        glue: "position_mrope_vs_rope",
        reference: "mlx_vlm MRoPERotaryEmbedding.apply_rotary with three equal streams, and mlx.core.fast.rope (mlx-vlm 0.7.6, mlx 0.32.2)",
        inputs: &[i("q", "array float [B, H, L, head_dim]"), i("position_ids", "array int [B, L]"), HEAD_DIM, PRF, THETA, SECTION, PATH],
        outputs: "dict: `mrope`, `rope`, `path`",
    },
];

/// Ops the reference runs to set a case up and a candidate never
/// receives: the directory `lora_adapters_write` leaves is what the
/// candidate's `lora_adapters_apply` loads (a port ports the loader, not
/// the library's training save).
pub const SETUP: &[&str] = &["lora_adapters_write"];

impl Op {
    /// Whether a candidate receives this op (not a [`SETUP`] op).
    pub fn sent(&self) -> bool {
        !SETUP.contains(&self.name)
    }
}

/// The op a glue function is published as.
pub fn by_glue(glue: &str) -> Option<&'static Op> {
    OPS.iter().find(|op| op.glue == glue)
}

/// The op of a published name.
pub fn by_name(name: &str) -> Option<&'static Op> {
    OPS.iter().find(|op| op.name == name)
}

/// Compared result places that are intermediates of the reference's
/// implementation, not the layer's result (by op; paths as in
/// docs/ops.json): a candidate may leave them out (the case then compares
/// the rest and its row says what it did not compare). mRoPE's `path`
/// (mlx-vlm's own names of its code paths) is returned, never compared.
pub const INTERNAL: &[(&str, &[&str])] = &[
    ("mrope_apply", &["inv_freq", "position_selector"]),
    ("mrope_prefill", &["inv_freq", "position_selector"]),
    ("mrope_decode_step", &["inv_freq", "position_selector"]),
];

impl Op {
    /// The result places of this op that are internal ([`INTERNAL`]).
    pub fn internal(&self) -> &'static [&'static str] {
        INTERNAL
            .iter()
            .find(|(name, _)| *name == self.name)
            .map_or(&[], |(_, paths)| paths)
    }
}

/// What the glue does to the arguments, or which setup it gives the
/// reference, before the call (crates/oracle/python/reference_glue/*.py):
/// a candidate wrapping the reference must do the same. Shown under each
/// op in docs/ops.md as "What the glue does".
pub const NOTES: &[(&str, &str)] = &[
    ("quantized_linear_rows", "calls the reference layer once per row of `x` (M = 1 each, with the LoRA adapters when given) and concatenates the rows back to `x`'s shape."),
    ("quantized_switch_linear", "`mx.gather_qmm` is called without the `global_scale=None` keyword that `QuantizedSwitchLinear.__call__` passes (mlx 0.32.2's `gather_qmm` has none: calling mlx-lm 0.32.2's `QuantizedSwitchLinear` directly raises a TypeError, so a wrapper must drop the keyword too, e.g. by giving the module an `mx` whose `gather_qmm` ignores it); `x` is driven as `SwitchGLU.__call__` drives one projection (`x` expanded to `(.., 1, 1, D)`; with `sort`, `_gather_sort`, `sorted_indices=True` and `_scatter_unsort`; then `squeeze(-2)`); with `expert0_views` the layer holds stride-0 views `broadcast_to(t[:1], t.shape)` of expert 0."),
    ("quantized_switch_linear_as_pinned", "no keyword dropped: the call exactly as pinned; a raise is returned as `raised`, `type` and the message's first line."),
    ("quantized_switch_linear_rows", "as `quantized_switch_linear` (the `global_scale=None` keyword dropped), called once per token (`x[t:t+1]`, `indices[t:t+1]`, unsorted), tokens concatenated back to `indices.shape + (out,)`."),
    ("switch_linear", "mlx-lm's `SwitchLinear(K, N, E, bias=...)` holding the tensors, driven as `SwitchGLU.__call__` drives one projection, exactly as `quantized_switch_linear` (`x` expanded to `(.., 1, 1, D)`; with `sort`, `_gather_sort`, `sorted_indices=True` and `_scatter_unsort`; then `squeeze(-2)`); no keyword is dropped."),
    ("lora_linear", "one mlx-lm `LoRALinear` per adapter, nested in order: adapter 0 wraps the `nn.QuantizedLinear` base (`LoRALinear.from_base(base, r, dropout=0.0, scale)`), adapter i wraps adapter i-1 (built by the constructor with the base's dims and `.linear` set, since `from_base` reads `linear.weight`, which a `LoRALinear` has not); `lora_a` / `lora_b` set on each; dropout 0, eval mode."),
    ("sdpa_kv_cache", "a fresh mlx-lm `KVCache` receives the first L - M keys and values in one `update_and_fetch` (when L > M); the mask is `create_attention_mask(queries.swapaxes(1, 2), cache)` (it reads only `shape[1]`, M: None for M = 1, \"causal\" above, at the cache's offset L - M); the last M keys and values enter by `update_and_fetch`, then `scaled_dot_product_attention(queries, k, v, cache=cache, scale=scale, mask=mask)`."),
    ("quantized_embedding", "builds `nn.QuantizedEmbedding(weight.shape[0], weight.shape[-1] * 32 // bits, group_size, bits, mode)` holding the tensors: `lookup` is `__call__(ids)`, `logits` is `as_linear(x)`."),
    ("attention_decode_step", "builds mlx-lm's `Glm4Attention` from glm4 `ModelArgs` (partial_rotary_factor = rotary_dims / head_dim, rope_theta = rope_base, no attention bias, rope_traditional False) with four affine `nn.QuantizedLinear` projections holding the tensors; a `KVCache` prefilled with `k0`/`v0` in one update; each row of `x` is one call `attn(h, mask=create_attention_mask(h, cache), cache=cache)`."),
    ("rope_index", "an `attention_mask` of all ones is passed as `None`; the grid lists become `mx.array(grid, int32).reshape(-1, 3)` (None stays None). The `LanguageModel` is the reference's own, made without its constructor (`LanguageModel.__new__`, `nn.Module.__init__`, then `config`, `model = None`, `_position_ids = _rope_deltas = None`), with the default Qwen3.5 `ModelConfig`: image token 248056, video token 248057, vision-start token 248045, and `VisionConfig().spatial_merge_size` 2. `ModelConfig` has no defaults for its first fields: the glue builds `ModelConfig(text_config=<a namespace with eos_token_id=None>, vision_config=VisionConfig(), model_type=\"qwen3_5\")`."),
    ("rope_decode_positions", "as `rope_index` (all-ones mask passed as `None`, grids as int32 `[n, 3]` arrays, the default `ModelConfig`: image 248056, video 248057, vision-start 248045, spatial_merge_size 2). The reference's `LanguageModel.__call__(..., cache=[kv], skip_logits=True)` runs the prompt with a real mlx-lm `KVCache`, whose `offset` is then set to `cache_offset`; the step is `length` zero token ids (int32 `[B, length]`). The `LanguageModel` is made without its constructor as for `rope_index`; its `model` (the transformer body) is a stand-in with `fa_idx = 0` that records the `position_ids` it is handed and returns zeros `[B, L, 1]`; `args` is not set (`skip_logits=True` never reads it). The decode step passes no grids and no mask again: the positions come from what the prefill kept (`_position_ids`, `_rope_deltas`). The prefill's recorded positions must equal `get_rope_index`'s (else the glue raises); `position_ids` and `rope_deltas` are `rope_index`'s on the prompt, `decode_position_ids` what the step handed the body."),
    ("rope2d_apply", "none: `apply_multidimensional_rope(inputs, positions, base_frequency)` as given."),
    ("mrope_apply", "the rotary is `Qwen3_5RotaryEmbedding(int(head_dim * partial_rotary_factor), base=rope_theta, mrope_section=...)`, applied by `apply_rotary(q, k, position_ids, unsqueeze_dim=1)`; with `path` `pure-mlx` on a Metal build its `fused_apply` is turned off (the reference's own choice without Metal); a path other than the expected one raises."),
    ("inv_freq", "`compute_inv_freq(d, base)` for each `d` of `dims`, concatenated into one array."),
    ("mrope_position_selector", "`_interleaved_position_selector(list(section), freq_dim)` for each pair of `freq_dims` and `sections`, concatenated."),
    ("mrope_prefill", "`rope_index` with an all-ones mask (so `None`) and the default `ModelConfig` (image 248056, video 248057, vision-start 248045, spatial_merge_size 2), then `mrope_apply` with those positions."),
    ("mrope_decode_step", "`rope_decode_positions` with an all-ones mask (so `None`), the default `ModelConfig` (image 248056, video 248057, vision-start 248045, spatial_merge_size 2) and `length = q.shape[2]`, then `mrope_apply` with the step's positions."),
    ("mrope_text_vs_rope", "`mrope_apply` with `k = q`, and `mx.fast.rope(q, rotary_dim, traditional=False, base=rope_theta, scale=1.0, offset=0)`."),
    ("mrope_kernel_source", "runs the kernel builder behind `_mrope_apply_kernel`'s lru_cache with `_HAS_METAL` forced on and `mx.fast.metal_kernel` replaced by a recorder; arguments not passed take `metal_kernel`'s own defaults; strings are returned as UTF-8 bytes (names joined by NUL)."),
    ("mrope_kernel_launch", "calls `_fast_mrope_apply` on zero `q` [B, Hq, L, D], `k` [B, Hk, L, D] and position ids (`[3, B, L]` or `[B, L]` int32), `compute_inv_freq(rotary_dim, 10000.0)` and the selector of sections [11, 11, 10], with a recording kernel that returns zeros."),
    ("qwen3_5_config_mrope", "the config's `ModelConfig` (from `config_text`) is the `LanguageModel`'s config; `get_rope_index` gets `attention_mask=None`; then `mrope_apply` with the text config's head_dim, partial_rotary_factor, rope_theta and mrope_section."),
    ("gemma4_config_rope2d", "mlx-vlm's gemma4 `apply_multidimensional_rope(inputs, positions, theta)` with the theta of the config's `vision_config.rope_parameters[\"rope_theta\"]`."),
];

impl Op {
    /// What the glue does before calling the reference ([`NOTES`]).
    pub fn notes(&self) -> Option<&'static str> {
        NOTES
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|(_, text)| *text)
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn join<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|t| t.to_string()).collect();
    v.join(", ")
}

/// `docs/ops.md`: the vocabulary as a document (generated; never edited
/// by hand): each op's meaning from [`OPS`], and what the cases send and
/// compare from `docs/ops.json` ([`super::signatures`]).
pub fn markdown() -> String {
    let documented = super::signatures::documented().unwrap_or_default();
    let sigs = &documented.ops;
    let mut s = String::new();
    s += "# The op vocabulary\n\n";
    s += "<!-- Generated by `cargo xtask ops-doc` from crates/conformance/src/candidate/ops.rs (meanings) and docs/ops.json (what a whole export's cases send and compare); a test fails when it is stale, and `--verify-export` fails when an export sends or compares anything docs/ops.json does not list. -->\n\n";
    s += "Every reference call a must-equal case makes is one of these ops. A candidate \
(`conformance --candidate CMD`, protocol in docs/src/guide/candidate.md) receives exactly the \
arguments the reference received, under these names, and must return what the reference \
returned: the same tree, with arrays of the same dtype, shape and bits. Exported vectors \
(`cargo xtask export`) name their calls by op and version. Arrays travel as safetensors; \
the tree encoding is in docs/src/guide/candidate.md (the book's \"Checking your own port\").\n\n";
    s += "Each op's tables are generated from what the cases actually send and compare \
(the export of every must-equal case, CPU, deep tier): each argument's JSON type, \
dtype and rank as sent (`x/*` is any item of list `x`), and each place of the result \
(by its key in the result tree; `value` is the whole result, `a/0` item 0 of `a`) with \
what cases compare there. A compared place is *observable* (the layer's result) or \
*internal* (an intermediate of the reference's implementation: a candidate may leave \
it out, and the row then says it was not compared); a place marked *returned* is in \
the reference's result but no case compares it (a candidate may leave it out). The \
shape rule and meaning are written by hand. A refusal case (where the reference \
raises) compares only whether the call raised (its output `refused`), at no result \
place.\n\n";
    s += "| op | version | reference |\n| --- | --- | --- |\n";
    for op in OPS {
        s += &format!(
            "| [`{}`](#{}) | {} | {} |\n",
            op.name, op.name, op.version, op.reference
        );
    }
    for op in OPS {
        s += &format!("\n## `{}`\n\n", op.name);
        s += &format!(
            "Version {}. Reference: {}. Glue: `reference_glue.{}`.\n\n",
            op.version, op.reference, op.glue
        );
        if let Some(notes) = op.notes() {
            s += &format!("What the glue does: {notes}\n\n");
        }
        let sig = sigs.get(op.name);
        let cases = documented
            .cases
            .values()
            .filter(|ops| ops.iter().any(|o| o == op.name))
            .count();
        if cases > 0 {
            let families: Vec<String> = documented
                .families
                .iter()
                .filter(|(_, ops)| ops.contains(op.name))
                .map(|(f, _)| format!("`{f}`"))
                .collect();
            s += &format!(
                "Called by {cases} must-equal case(s), of {} (`--list --ops all` names each case's ops).\n\n",
                families.join(", ")
            );
        }
        s += "| argument | JSON | dtype | rank | shape rule, meaning |\n| --- | --- | --- | --- | --- |\n";
        let mut rows: Vec<(String, String)> = op
            .inputs
            .iter()
            .map(|i| (i.name.to_owned(), cell(i.what)))
            .collect();
        if let Some(sig) = sig {
            for path in sig.inputs.keys() {
                if !rows.iter().any(|(n, _)| n == path) {
                    let at = rows
                        .iter()
                        .rposition(|(n, _)| path.starts_with(&format!("{n}/")))
                        .map_or(rows.len(), |i| i + 1);
                    rows.insert(at, (path.clone(), "an item of the list".into()));
                }
            }
        }
        for (name, what) in rows {
            let seen = sig.and_then(|g| g.inputs.get(&name));
            s += &format!(
                "| `{name}` | {} | {} | {} | {what} |\n",
                seen.map_or("(not sent by any case)".into(), |x| join(&x.kinds)),
                seen.map_or(String::new(), |x| join(&x.dtypes)),
                seen.map_or(String::new(), |x| join(&x.ranks)),
            );
        }
        if let Some(sig) = sig {
            s += "\n| result place | JSON | dtype | rank | compared | as |\n| --- | --- | --- | --- | --- | --- |\n";
            for (path, x) in &sig.outputs {
                let container = x.kinds.iter().all(|k| k == "dict" || k == "list");
                if container && x.compared_as.is_empty() {
                    continue;
                }
                // A place inside a compared list or dict is compared with it.
                let within = sig
                    .outputs
                    .iter()
                    .find(|(p, o)| !o.compared_as.is_empty() && path.starts_with(&format!("{p}/")));
                let inside;
                let compared = if let (true, Some((p, _))) = (x.compared_as.is_empty(), within) {
                    inside = format!("within `{p}`");
                    inside.as_str()
                } else if x.compared_as.is_empty() {
                    "returned"
                } else if op.internal().contains(&path.as_str()) {
                    "**internal**"
                } else {
                    "observable"
                };
                s += &format!(
                    "| `{path}` | {} | {} | {} | {compared} | {} |\n",
                    join(&x.kinds),
                    join(&x.dtypes),
                    join(&x.ranks),
                    join(x.compared_as.iter().map(|n| format!("`{n}`"))),
                );
            }
        } else if op.sent() {
            s += "\nNo must-equal case of the export calls it.\n";
        }
        s += &format!("\nResult: {}.\n", op.outputs);
        if !op.sent() {
            s += "\n**Setup op**: the reference runs it to set the case up; a candidate never receives it (it reads what the setup wrote, by path, in the next op).\n";
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_note_names_one_op() {
        for (n, (name, text)) in NOTES.iter().enumerate() {
            assert!(by_name(name).is_some(), "note for `{name}`, which is no op");
            assert!(!text.trim().is_empty(), "empty note for `{name}`");
            assert!(
                NOTES[n + 1..].iter().all(|(other, _)| other != name),
                "`{name}` noted twice"
            );
        }
    }

    #[test]
    fn names_and_glue_functions_are_unique() {
        for (n, op) in OPS.iter().enumerate() {
            assert!(
                OPS[n + 1..].iter().all(|o| o.name != op.name),
                "{} twice",
                op.name
            );
            assert!(
                OPS[n + 1..].iter().all(|o| o.glue != op.glue),
                "{} twice",
                op.glue
            );
            let mut seen = std::collections::BTreeSet::new();
            for input in op.inputs {
                assert!(
                    seen.insert(input.name),
                    "{}: input {} twice",
                    op.name,
                    input.name
                );
            }
        }
    }
}
