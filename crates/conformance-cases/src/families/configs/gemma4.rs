//! Gemma 4 configs: the vision config as read, then the 2-D RoPE at the
//! vision tower's head_dim, heads and theta.

use std::path::PathBuf;

use layers::config::Gemma4VisionConfig;
use layers::position::apply_multidimensional_rope;
use oracle::DType;

use super::{
    case_shape, f64_bits, int64, models, read_text, register, ConfigCase, ConfigCheck,
    LOAD_MODEL_STEPS,
};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::Described;
use crate::families::support::{host, int32_tensor, port};
use crate::reference;

const FAMILY: &str = "configs/gemma4";
const READ_REFERENCE: &str =
    "mlx_vlm.models.gemma4.config ModelConfig, VisionConfig (mlx-vlm 0.7.6), as mlx_vlm.utils.load_model builds them";
const ROPE_REFERENCE: &str =
    "mlx_vlm.models.gemma4.vision.apply_multidimensional_rope with VisionAttention's rope_theta (mlx-vlm 0.7.6)";

/// Patch grid (rows, columns) and trailing padding patches.
const GRID: (usize, usize) = (6, 8);
const PADDING: usize = 4;

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for (model, _) in models("gemma4") {
        let config = ConfigCase {
            dir: "gemma4".into(),
            model: model.clone(),
            variant: None,
            check: ConfigCheck::Read,
        };
        register(&mut cases, FAMILY, &model, &config, "rope2d");
    }
    cases
}

/// The case of a Gemma 4 config at `path`.
pub(super) fn build(
    name: String,
    path: PathBuf,
    variant: Option<String>,
    check: ConfigCheck,
) -> Case {
    if let Some(v) = variant {
        return super::failing(
            name,
            format!("variant `{v}`: Gemma 4 configs have no variants"),
        );
    }
    let case = match check {
        ConfigCheck::Read => Case::must_equal(name, FAMILY, READ_REFERENCE, move |ctx| {
            run_read(ctx, &path)
        }),
        ConfigCheck::Apply { dtype } => {
            Case::must_equal(name, FAMILY, ROPE_REFERENCE, move |ctx| {
                run_rope2d(ctx, &path, dtype)
            })
        }
        other => {
            return super::failing(
                name,
                format!("{other:?} is not a Gemma 4 config check (read, apply)"),
            )
        }
    };
    case.glue_composed(LOAD_MODEL_STEPS)
}

fn parse(path: &PathBuf) -> Result<Gemma4VisionConfig, CaseError> {
    Gemma4VisionConfig::from_file(path).map_err(port)
}

/// What the port reads from a Gemma 4 vision config, as
/// `config_gemma4_vision`'s `fields` (the linked case and the port
/// candidate): head_dim, heads, KV heads, hidden_size, patch_size.
pub fn read_fields(c: &Gemma4VisionConfig) -> [i64; 5] {
    [
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.hidden_size,
        c.patch_size,
    ]
    .map(|v| v as i64)
}

fn run_read(ctx: &Ctx, path: &PathBuf) -> Result<CaseOutput, CaseError> {
    let c = parse(path)?;
    let fields = read_fields(&c);
    let r = reference::configs::config_gemma4_vision(ctx, &read_text(path)?)?;
    let mut out = CaseOutput::new("config");
    out.compare("fields", &int64(&fields), &r.fields);
    out.compare("floats", &f64_bits(&[c.rope_theta]), &r.floats);
    Ok(out)
}

fn run_rope2d(ctx: &Ctx, path: &PathBuf, dtype: DType) -> Result<CaseOutput, CaseError> {
    let c = parse(path)?;
    let (rows, cols) = GRID;
    let len = rows * cols + PADDING;
    let mut inputs = ctx.inputs();
    let shape = case_shape(
        &[1, len, c.num_attention_heads, c.head_dim],
        "vision_config.num_attention_heads and head_dim",
    )?;
    let x = inputs.uniform(dtype, &shape, 2.0);
    let mut positions = Vec::with_capacity(2 * len);
    for p in 0..len {
        if p < rows * cols {
            positions.extend([(p % cols) as i32, (p / cols) as i32]);
        } else {
            positions.extend([-1, -1]);
        }
    }
    let positions = int32_tensor(&positions, &[1, len, 2]);
    let y = apply_multidimensional_rope(&x.to_array(), &positions.to_array(), c.rope_theta)
        .map_err(port)?;
    let r = reference::configs::config_gemma4_rope2d(ctx, &read_text(path)?, &x, &positions)?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare("y", &host(&y)?, &r);
    Ok(out)
}
