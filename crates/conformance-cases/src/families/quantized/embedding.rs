//! `quantized/embedding`: `QuantizedEmbedding` (token lookup, and
//! `as_linear` for a tied `lm_head`) against `mlx.nn.QuantizedEmbedding`
//! holding the same packed table, for one spec per mode and two table
//! dtypes. The proof perturbs the token ids and the activation.

use layers::quantized::{QuantSpec, QuantizedEmbedding};
use oracle::DType;

use super::{
    activation, base_k, dtype_tag, host, layer_tensors, mode_specs, port, quantized_weight,
};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const FAMILY: &str = "quantized/embedding";
const REFERENCE: &str = "mlx.nn.QuantizedEmbedding.__call__ and .as_linear (mlx 0.32.2)";
/// Rows of the table: even, so flipping the lowest bit of an id (the
/// proof) stays in range.
const ROWS: usize = 50;

/// A `quantized/embedding` case as data (50 rows looked up).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingCase {
    #[serde(with = "crate::families::describe::spec")]
    pub spec: QuantSpec,
    pub dtype: DType,
}

impl Params for EmbeddingCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
            run(ctx, self.spec, self.dtype)
        })
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for spec in mode_specs() {
        for dtype in [DType::Bfloat16, DType::Float32] {
            let name = format!("{FAMILY}/{spec}/{}/rows{ROWS}", dtype_tag(dtype));
            cases.push(described(name, &EmbeddingCase { spec, dtype }));
        }
    }
    cases
}

fn run(ctx: &Ctx, spec: QuantSpec, dtype: DType) -> Result<CaseOutput, CaseError> {
    let dims = base_k(spec);
    let mut inputs = ctx.inputs();
    let payload = quantized_weight(&mut inputs, spec, dtype, &[ROWS, dims])?;
    let table = layer_tensors(&payload, None)?;
    let ids = inputs.integers(DType::Int32, &[2, 5], 0, ROWS as i64);
    let x = activation(&mut inputs, dtype, &[3, dims]);

    let emb = QuantizedEmbedding::new(payload).map_err(port)?;
    let lookup = emb.lookup(&ids.to_array()).map_err(port)?;
    let logits = emb.as_linear(&x.to_array()).map_err(port)?;

    let r = reference::quantized::quantized_embedding(ctx, &ids, &x, &table)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("lookup", &host(&lookup)?, &r.lookup);
    out.compare("logits", &host(&logits)?, &r.logits);
    Ok(out)
}
