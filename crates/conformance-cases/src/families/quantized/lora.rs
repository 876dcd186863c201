//! `quantized/lora`: `QuantizedLinear` with LoRA adapters against
//! `mlx_lm.tuner.lora.LoRALinear.__call__` (dropout 0, eval mode).
//!
//! **Two adapters.** mlx-lm applies one adapter per layer; the only way to
//! stack two with the reference's own code is to nest `LoRALinear`s, and
//! that is the order the port documents: attaching `a` then `b` computes
//! `LoRALinear_b(LoRALinear_a(base))`, i.e. `(base(x) + r_a(x)) + r_b(x)`,
//! each residual `(scale * ((x @ A) @ B)).astype(x.dtype)` from the same
//! `x`. The inner `LoRALinear` is built by `LoRALinear.from_base` (as
//! mlx-lm's `linear_to_lora_layers` does); the outer by its constructor,
//! because `from_base` reads `linear.weight`, which a `LoRALinear` has not.
//!
//! **Payload exchange.** A port layer (bias + adapter) built on payload A,
//! then `exchange_payload(B)`, must equal the reference layer built from B
//! (with the same bias and adapter); the payload handed back must be A.
//!
//! The scales are sent to Python as Python floats (f64) and to the port as
//! the nearest f32, as a config's `scale` would reach both.

use layers::quantized::{LoraAdapter, Mode, QuantSpec, QuantizedLinear};
use oracle::{DType, HostTensor};

use super::layer_tensors;
use super::{activation, affine, base_k, dtype_tag, host, mode_default, port, quantized_weight};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::inputs::Inputs;
use crate::reference;
use crate::reference::quantized::Adapter as ReferenceAdapter;

const FAMILY: &str = "quantized/lora";
const REFERENCE: &str =
    "mlx_lm.tuner.lora.LoRALinear.__call__ (mlx-lm 0.32.2) over mlx.nn.QuantizedLinear.__call__ (mlx 0.32.2)";
const N: usize = 64;

/// One adapter: rank, scale, parameter dtype.
/// One adapter: rank, scale and the dtype of its A and B.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adapter {
    r: usize,
    scale: f64,
    dtype: DType,
}

const A8: Adapter = Adapter {
    r: 8,
    scale: 20.0,
    dtype: DType::Float32,
};
const A4: Adapter = Adapter {
    r: 4,
    scale: 0.5,
    dtype: DType::Float32,
};
const A16_BF16: Adapter = Adapter {
    r: 16,
    scale: 0.1,
    dtype: DType::Bfloat16,
};

/// A `quantized/lora` case as data: `LoRALinear` over a quantized linear
/// (N = 64, K = three groups of the spec), adapters applied in order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraCase {
    #[serde(with = "crate::families::describe::spec")]
    spec: QuantSpec,
    dtype: DType,
    batch: Vec<usize>,
    m: usize,
    bias: bool,
    adapters: Vec<Adapter>,
    /// Built on this spec first, then exchanged to `spec`.
    #[serde(with = "crate::families::describe::spec_opt")]
    exchanged_from: Option<QuantSpec>,
    /// The adapters' label in the name (`1-adapter`, …).
    tag: String,
}

type Shape = LoraCase;

impl Params for LoraCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        self.case_named(name)
    }
}

impl Shape {
    fn new(spec: QuantSpec, adapters: &[Adapter], tag: &'static str) -> Self {
        Shape {
            spec,
            dtype: DType::Bfloat16,
            batch: Vec::new(),
            m: 8,
            bias: false,
            adapters: adapters.to_vec(),
            exchanged_from: None,
            tag: tag.to_owned(),
        }
    }

    fn name(&self) -> String {
        let mut name = match self.exchanged_from {
            Some(from) => format!(
                "{FAMILY}/exchange/{from}-to-{}/{}",
                self.spec,
                dtype_tag(self.dtype)
            ),
            None => format!("{FAMILY}/{}/{}", self.spec, dtype_tag(self.dtype)),
        };
        if !self.batch.is_empty() {
            let b: Vec<String> = self.batch.iter().map(usize::to_string).collect();
            name += &format!("/B{}", b.join("x"));
        }
        name += &format!("/M{}/{}", self.m, self.tag);
        if self.bias {
            name += "/bias";
        }
        name
    }

    /// Why the description cannot run, if so: positive M, batch
    /// dimensions and ranks, an adapter unless exchanged, finite scales,
    /// a bounded size.
    fn check(&self) -> Result<(), CaseError> {
        let mut named: Vec<(&str, usize)> = vec![("m", self.m), ("K", base_k(self.spec)), ("N", N)];
        named.extend(self.batch.iter().map(|b| ("batch", *b)));
        named.extend(self.adapters.iter().map(|a| ("adapter r", a.r)));
        crate::families::describe::dims(&named, 1 << 34)?;
        if self.adapters.is_empty() && self.exchanged_from.is_none() {
            return Err(CaseError::Harness(
                "a LoRA case needs at least one adapter".into(),
            ));
        }
        if self.adapters.iter().any(|a| !a.scale.is_finite()) {
            return Err(CaseError::Harness("adapter scales must be finite".into()));
        }
        Ok(())
    }

    fn case_named(self, name: String) -> Case {
        let stacked = self.adapters.len() > 1;
        let case = Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
            self.check()?;
            run(ctx, &self)
        });
        if stacked {
            // mlx-lm attaches one LoRALinear per module; stacking several is
            // the glue's composition of that class.
            case.glue_composed(&["mlx_lm.tuner.lora.LoRALinear.__call__, one wrapping per adapter"])
        } else {
            case
        }
    }
}

pub(super) fn descriptions() -> Vec<Described> {
    let specs = [
        affine(4, 64),
        affine(3, 32),
        mode_default(Mode::Mxfp4),
        mode_default(Mode::Nvfp4),
    ];
    let mut shapes = Vec::new();
    for spec in specs {
        shapes.push(Shape::new(spec, &[A8], "1-adapter"));
        shapes.push(Shape::new(spec, &[A8, A4], "2-adapters"));
    }
    shapes.push(Shape::new(mode_default(Mode::Mxfp8), &[A8], "1-adapter"));
    for dtype in [DType::Float16, DType::Float32] {
        shapes.push(Shape {
            dtype,
            ..Shape::new(affine(4, 64), &[A8], "1-adapter")
        });
        shapes.push(Shape {
            dtype,
            ..Shape::new(affine(4, 64), &[A8, A4], "2-adapters")
        });
    }
    shapes.push(Shape {
        m: 1,
        ..Shape::new(affine(4, 64), &[A8], "1-adapter")
    });
    shapes.push(Shape {
        m: 33,
        ..Shape::new(affine(4, 64), &[A8, A4], "2-adapters")
    });
    shapes.push(Shape::new(affine(4, 64), &[A16_BF16], "1-adapter-bf16-r16"));
    shapes.push(Shape::new(
        mode_default(Mode::Nvfp4),
        &[A4, A16_BF16],
        "2-adapters-f32-bf16",
    ));
    shapes.push(Shape {
        bias: true,
        ..Shape::new(affine(4, 64), &[A8], "1-adapter")
    });
    shapes.push(Shape {
        bias: true,
        ..Shape::new(mode_default(Mode::Mxfp4), &[A8, A4], "2-adapters")
    });
    shapes.push(Shape {
        batch: vec![2, 3],
        m: 4,
        ..Shape::new(affine(4, 64), &[A8, A4], "2-adapters")
    });
    // Payload exchange (K = 192 fits every target's group size).
    for (from, to, adapters, tag) in [
        (affine(4, 64), affine(8, 64), &[][..], "no-adapter"),
        (affine(4, 64), affine(8, 64), &[A8][..], "1-adapter"),
        (
            affine(4, 64),
            mode_default(Mode::Mxfp4),
            &[A8][..],
            "1-adapter",
        ),
        (
            mode_default(Mode::Mxfp8),
            mode_default(Mode::Nvfp4),
            &[A8, A4][..],
            "2-adapters",
        ),
        (affine(2, 64), affine(6, 32), &[A8][..], "1-adapter"),
    ] {
        shapes.push(Shape {
            exchanged_from: Some(from),
            bias: true,
            ..Shape::new(to, adapters, tag)
        });
    }
    shapes
        .into_iter()
        .map(|s| described(s.name(), &s))
        .collect()
}

fn adapter_tensors(
    inputs: &mut Inputs,
    a: Adapter,
    k: usize,
    n: usize,
) -> Result<(HostTensor, HostTensor), CaseError> {
    let lora_a = inputs.uniform(a.dtype, &[k, a.r], 1.0 / (k as f32).sqrt());
    let lora_b = inputs.uniform(a.dtype, &[a.r, n], 0.05);
    Ok((lora_a, lora_b))
}

fn run(ctx: &Ctx, s: &Shape) -> Result<CaseOutput, CaseError> {
    // Exchanges keep in/out features: K = 192 for every exchange.
    let k = if s.exchanged_from.is_some() {
        192
    } else {
        base_k(s.spec)
    };
    let mut inputs = ctx.inputs();
    let mut x_shape = s.batch.clone();
    x_shape.extend([s.m, k]);
    let x = activation(&mut inputs, s.dtype, &x_shape);
    let first = match s.exchanged_from {
        Some(from) => Some(quantized_weight(&mut inputs, from, s.dtype, &[N, k])?),
        None => None,
    };
    let payload = quantized_weight(&mut inputs, s.spec, s.dtype, &[N, k])?;
    let bias = s.bias.then(|| inputs.uniform(s.dtype, &[N], 0.5));
    let adapters = s
        .adapters
        .iter()
        .map(|&a| adapter_tensors(&mut inputs, a, k, N))
        .collect::<Result<Vec<_>, _>>()?;

    let reference_adapters: Vec<ReferenceAdapter> = adapters
        .iter()
        .zip(&s.adapters)
        .map(|((lora_a, lora_b), a)| ReferenceAdapter {
            lora_a: lora_a.clone(),
            lora_b: lora_b.clone(),
            scale: a.scale,
        })
        .collect();
    let reference = reference::quantized::quantized_lora(
        ctx,
        &x,
        &layer_tensors(&payload, bias.as_ref())?,
        &reference_adapters,
    )?;

    let bias = bias.as_ref().map(HostTensor::to_array);
    let mut layer = match &first {
        Some(p) => QuantizedLinear::new(p.clone(), bias),
        None => QuantizedLinear::new(payload.clone(), bias),
    }
    .map_err(port)?;
    for (i, ((lora_a, lora_b), a)) in adapters.iter().zip(&s.adapters).enumerate() {
        let adapter =
            LoraAdapter::new(lora_a.to_array(), lora_b.to_array(), a.scale as f32).map_err(port)?;
        layer
            .attach_adapter(format!("adapter{i}"), adapter)
            .map_err(port)?;
    }
    if let Some(first) = &first {
        let previous = layer.exchange_payload(payload).map_err(port)?;
        if previous.spec() != first.spec() || host(previous.weight())? != host(first.weight())? {
            return Err(CaseError::Port(
                "exchange_payload did not hand back the previous payload".into(),
            ));
        }
        if layer.spec() != s.spec {
            return Err(CaseError::Port(format!(
                "after the exchange the layer is {}",
                layer.spec()
            )));
        }
    }
    let y = layer.forward(&x.to_array()).map_err(port)?;
    let mut out = CaseOutput::new("mlx.core");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}
