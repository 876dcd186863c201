//! Errors of the quantized layers.

use mlx_rs::Dtype;

use crate::checkpoint::CheckpointError;
use crate::ffi::{MlxError, Mode, UnknownMode};

/// A `(mode, bits, group_size)` the reference rejects.
///
/// The messages are those `mlx.core.quantize` raises (mlx 0.32.2), and the
/// checks run in its order: mode, then group size, then bits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A mode string outside affine, mxfp4, mxfp8, nvfp4.
    #[error(transparent)]
    UnknownMode(#[from] UnknownMode),
    /// A group size the mode does not support.
    #[error("{}", group_size_message(*.mode, *.group_size))]
    UnsupportedGroupSize {
        /// The mode.
        mode: Mode,
        /// The rejected group size.
        group_size: i32,
    },
    /// A bit width the mode does not support.
    #[error("{}", bits_message(*.mode, *.bits))]
    UnsupportedBits {
        /// The mode.
        mode: Mode,
        /// The rejected bit width.
        bits: i32,
    },
}

fn group_size_message(mode: Mode, group_size: i32) -> String {
    match mode {
        Mode::Affine => format!(
            "[quantize] The requested group size {group_size} is not supported. \
             The supported group sizes are 32, 64, and 128."
        ),
        _ => format!(
            "[quantize] {mode} quantization requires group size {} but got {group_size}.",
            mode.defaults().0
        ),
    }
}

fn bits_message(mode: Mode, bits: i32) -> String {
    match mode {
        Mode::Affine => format!(
            "[quantize] The requested number of bits {bits} is not supported. \
             The supported bits are 2, 3, 4, 5, 6 and 8."
        ),
        _ => format!(
            "[quantize] {mode} quantization requires bits to be {} but got {bits}.",
            mode.defaults().1
        ),
    }
}

/// Quantized tensors that do not fit together (or do not fit their spec).
///
/// `weight` is `uint32 [.., out, packed]` with `packed * 32 == in_features *
/// bits`; `scales` (and affine `biases`) are `[.., out, in_features /
/// group_size]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PayloadError {
    /// The spec itself is rejected by the reference.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The packed weight is not `uint32`.
    #[error("the quantized weight must be uint32, got {dtype:?}")]
    WeightDtype {
        /// The dtype found.
        dtype: Dtype,
    },
    /// A tensor with the wrong number of dimensions.
    #[error("`{tensor}` must have {expected} dimensions, got shape {shape:?}")]
    Rank {
        /// `weight`, `scales`, `biases` or `bias`.
        tensor: &'static str,
        /// The required number of dimensions.
        expected: usize,
        /// The shape found.
        shape: Vec<i32>,
    },
    /// `packed * 32` is not a multiple of `bits`, so no integer in_features
    /// packs to this width.
    #[error("a packed width of {packed} uint32 ({} bits) is not a multiple of bits={bits}", .packed * 32)]
    BitsDoNotDivide {
        /// The last dimension of `weight`.
        packed: i32,
        /// The bit width of the spec.
        bits: i32,
    },
    /// `group_size` does not divide in_features.
    #[error("group_size={group_size} does not divide in_features={in_features}")]
    GroupSizeDoesNotDivide {
        /// in_features (`packed * 32 / bits`).
        in_features: i32,
        /// The group size of the spec.
        group_size: i32,
    },
    /// `scales` does not have shape `[.., out, in_features / group_size]`.
    #[error(
        "scales shape {actual:?} does not match weight shape {weight:?}: expected {expected:?}"
    )]
    ScalesShape {
        /// The weight shape.
        weight: Vec<i32>,
        /// The expected scales shape.
        expected: Vec<i32>,
        /// The scales shape found.
        actual: Vec<i32>,
    },
    /// `biases` does not have the shape of `scales`.
    #[error("biases shape {actual:?} does not match scales shape {expected:?}")]
    BiasesShape {
        /// The scales shape.
        expected: Vec<i32>,
        /// The biases shape found.
        actual: Vec<i32>,
    },
    /// Affine quantization without zero points.
    #[error("{mode} quantization requires biases (zero points)")]
    MissingBiases {
        /// The mode.
        mode: Mode,
    },
    /// A global scale for a mode other than nvfp4.
    #[error("a global scale is only supported for nvfp4 (MLX refuses it for {mode}); drop the `.global_scale` tensor or quantize with mode nvfp4")]
    GlobalScaleMode {
        /// The mode.
        mode: Mode,
    },
    /// A global scale that is not float32.
    #[error("the nvfp4 global scale must be float32, got {dtype:?}")]
    GlobalScaleDtype {
        /// The dtype found.
        dtype: Dtype,
    },
    /// A global scale of the wrong shape.
    #[error("the nvfp4 global scale must have shape {expected:?} (a scalar for a linear layer, one per expert for a switch layer), got {actual:?}")]
    GlobalScaleShape {
        /// The weight's leading (expert) shape.
        expected: Vec<i32>,
        /// The shape found.
        actual: Vec<i32>,
    },
    /// Zero points given for a mode that has none.
    #[error("{mode} quantization has no biases (zero points), but biases were given")]
    UnexpectedBiases {
        /// The mode.
        mode: Mode,
    },
    /// The additive `bias` does not have the output shape.
    #[error("bias shape {actual:?} does not match the expected {expected:?}")]
    BiasShape {
        /// The expected shape (`[out]`, or `[E, out]` for switch layers).
        expected: Vec<i32>,
        /// The shape found.
        actual: Vec<i32>,
    },
    /// The tensors describe a layer of another input width than the module
    /// the caller builds (the reference's `load_weights` shape check).
    #[error("the tensors hold in_features={actual}, the module has in_features={expected}")]
    InFeatures {
        /// The module's input width.
        expected: i32,
        /// The input width the tensors hold.
        actual: i32,
    },
}

/// Any error of a quantized layer.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// MLX rejected a call; the message is MLX's.
    #[error(transparent)]
    Mlx(#[from] MlxError),
    /// Invalid quantized tensors or spec.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// Loading from a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A forward with an nvfp4 global scale through an MLX op that has no
    /// `global_scale` in the pinned MLX (0.32.2: `quantized_matmul` and
    /// `gather_qmm`; the reference raises `TypeError` there too).
    #[error("{layer} holds an nvfp4 global scale, but the pinned MLX's `{op}` takes none (the reference raises TypeError); dequantize the weight, or use an MLX whose `{op}` accepts global_scale")]
    GlobalScaleRefused {
        /// The layer type.
        layer: &'static str,
        /// The MLX op.
        op: &'static str,
    },
    /// The input's last dimension is not in_features.
    #[error("input shape {shape:?} does not end in in_features={in_features}")]
    InputShape {
        /// The layer's input width.
        in_features: i32,
        /// The input shape.
        shape: Vec<i32>,
    },
    /// A payload exchange would change the layer's shape (the additive bias
    /// and the LoRA adapters are shaped by it); nothing was exchanged.
    #[error(
        "the new payload is {in_features}->{out_features}, the layer is \
         {expected_in}->{expected_out}; payload not exchanged"
    )]
    FeaturesChanged {
        /// The layer's in_features.
        expected_in: i32,
        /// The layer's out_features.
        expected_out: i32,
        /// The new payload's in_features.
        in_features: i32,
        /// The new payload's out_features.
        out_features: i32,
    },
    /// LoRA matrices that do not fit each other: not both 2-D, or
    /// `lora_a.shape[1] != lora_b.shape[0]` (the rank r).
    #[error(
        "LoRA matrices lora_a {lora_a:?} and lora_b {lora_b:?} do not fit each other: \
         expected lora_a [in, r] and lora_b [r, out] with the same r"
    )]
    AdapterMatrices {
        /// `lora_a`'s shape.
        lora_a: Vec<i32>,
        /// `lora_b`'s shape.
        lora_b: Vec<i32>,
    },
    /// A LoRA adapter that does not fit the layer it is attached to.
    #[error(
        "LoRA adapter `{name}`: lora_a {lora_a:?} and lora_b {lora_b:?} do not fit \
         a {in_features}->{out_features} layer (expected [{in_features}, r] and [r, {out_features}])"
    )]
    AdapterShape {
        /// The adapter's name.
        name: String,
        /// The layer's in_features.
        in_features: i32,
        /// The layer's out_features.
        out_features: i32,
        /// `lora_a`'s shape.
        lora_a: Vec<i32>,
        /// `lora_b`'s shape.
        lora_b: Vec<i32>,
    },
    /// An adapter with this name is already attached.
    #[error("a LoRA adapter named `{name}` is already attached")]
    DuplicateAdapter {
        /// The name.
        name: String,
    },
    /// No adapter with this name is attached.
    #[error("no LoRA adapter named `{name}` is attached")]
    UnknownAdapter {
        /// The name.
        name: String,
    },
    /// An expert index outside `0..num_experts` (checked on the host before
    /// calling MLX, whose gather does not bound-check on every backend).
    #[error("expert index {index} at flat position {position} is out of range for {num_experts} experts")]
    ExpertIndexOutOfRange {
        /// The offending index.
        index: i128,
        /// Its position in the flattened (row-major) indices.
        position: usize,
        /// The number of experts.
        num_experts: i32,
    },
    /// [`crate::quantized::ExpertIndices`] made for another number of
    /// experts than the layer has.
    #[error("expert indices were made for {indices_for} experts, the layer has {num_experts}: build them from this layer's router scores or with ExpertIndices::checked(ids, {num_experts})")]
    ExpertCount {
        /// The `num_experts` the indices were made (and checked) for.
        indices_for: i32,
        /// The layer's.
        num_experts: i32,
    },
    /// A top-k selection that cannot be made: `k` outside `1..=E`, or
    /// scores with no experts axis.
    #[error("cannot take the top {k} experts of router scores {scores:?}: need scores [.., E] with 1 <= k <= E")]
    TopK {
        /// The `k` asked for.
        k: i32,
        /// The scores' shape.
        scores: Vec<i32>,
    },
    /// A rows-independent switch forward of a layout it cannot split into
    /// tokens.
    #[error("the rows-independent switch forward takes x [T.., 1 | top_k, M, in] and indices [T.., top_k] with the same leading (token) axes; got x {x:?}, indices {indices:?} (use forward_routed for other layouts)")]
    RowsLayout {
        /// `x`'s shape.
        x: Vec<i32>,
        /// The indices' shape.
        indices: Vec<i32>,
    },
    /// A token id outside the embedding table.
    #[error(
        "token id {id} at flat position {position} is out of range for {num_embeddings} embeddings"
    )]
    TokenIdOutOfRange {
        /// The offending id.
        id: i128,
        /// Its position in the flattened (row-major) ids.
        position: usize,
        /// Rows of the table.
        num_embeddings: i32,
    },
    /// Expert indices must be integers.
    #[error("expert indices must have an integer dtype, got {dtype:?}")]
    IndicesDtype {
        /// The dtype found.
        dtype: Dtype,
    },
    /// A float layer's weight that is not a floating-point tensor of the
    /// layer's rank (`[out, in]` for `Linear`, `[E, out, in]` for
    /// `SwitchLinear`).
    #[error(
        "{layer} weight {shape:?} {dtype:?} is not a floating-point tensor of rank {rank}{hint}"
    )]
    FloatWeight {
        /// `Linear` or `SwitchLinear`.
        layer: &'static str,
        /// The rank expected.
        rank: usize,
        /// The weight's shape.
        shape: Vec<i32>,
        /// The weight's dtype.
        dtype: Dtype,
        /// How to fix it (a packed uint32 weight is a quantized layer).
        hint: &'static str,
    },
}

impl From<mlx_rs::error::Exception> for LayerError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        LayerError::Mlx(e.into())
    }
}
