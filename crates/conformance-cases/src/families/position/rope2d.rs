//! `position/rope2d`: Gemma vision multidimensional RoPE against
//! `optiq.vlm.gemma4.vision.apply_multidimensional_rope`, for patch
//! positions `[B, L, 2]` (x = column, y = row, padding patches at -1) and
//! the 1-D form `[B, L]`; head dims 64 and 72, and 70 (not a multiple of
//! 4: the reference drops the trailing channels, the port mirrors it).

use layers::position::apply_multidimensional_rope;
use oracle::DType;

use super::{dtype_tag, host, int32_tensor, port};
use crate::case::{Case, CaseError, CaseOutput, Ctx};
use crate::families::describe::{described, Described, Params};
use crate::reference;

const FAMILY: &str = "position/rope2d";
const REFERENCE: &str = "optiq.vlm.gemma4.vision.apply_multidimensional_rope (mlx-optiq 0.7.7)";

/// Gemma vision `rope_theta` (the vision config's default).
const BASE_FREQUENCY: f64 = 100.0;

/// A batch of patch sequences: `grid` (rows, columns) patches then
/// `padding` padding patches per row; odd rows use the transposed grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    batch: usize,
    /// (rows, columns) of patches.
    grid: (usize, usize),
    /// Padding patches after the grid, per row.
    padding: usize,
    heads: usize,
}

impl Shape {
    fn len(&self) -> usize {
        self.grid.0 * self.grid.1 + self.padding
    }

    /// `B<batch>-L<len>-N<heads>`.
    fn tag(&self) -> String {
        format!("B{}-L{}-N{}", self.batch, self.len(), self.heads)
    }

    /// Why the shape cannot run, if so (checked before any length is
    /// computed: a description is data).
    fn check(&self) -> Result<(), String> {
        let elements = self
            .grid
            .0
            .checked_mul(self.grid.1)
            .and_then(|g| g.checked_add(self.padding))
            .and_then(|len| len.checked_mul(self.batch))
            .and_then(|e| e.checked_mul(self.heads));
        match elements {
            Some(e) if e > 0 && e <= 1 << 24 => Ok(()),
            _ => Err(
                "batch, heads and patches must be positive, with at most 2^24 vectors in x".into(),
            ),
        }
    }
}

const SHAPES: [Shape; 2] = [
    Shape {
        batch: 1,
        grid: (16, 16),
        padding: 0,
        heads: 4,
    },
    Shape {
        batch: 2,
        grid: (9, 10),
        padding: 10,
        heads: 3,
    },
];

/// A `position/rope2d` case as data.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rope2dCase {
    form: Form,
    head_dim: usize,
    dtype: DType,
    shape: Shape,
}

impl Params for Rope2dCase {
    const BUILDER: &'static str = FAMILY;
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
            self.shape
                .check()
                .map_err(|e| CaseError::harness("shape", e))?;
            if self.head_dim == 0 || self.head_dim > 4096 {
                return Err(CaseError::Harness(format!(
                    "head_dim {} outside 1..=4096",
                    self.head_dim
                )));
            }
            run(ctx, self.form, self.head_dim, self.dtype, self.shape)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Form {
    /// positions `[B, L, 2]`.
    TwoAxes,
    /// positions `[B, L]` (the reference's 1-D fallback).
    OneAxis,
}

pub fn descriptions() -> Vec<Described> {
    let mut cases = Vec::new();
    for (form, form_tag) in [(Form::TwoAxes, "2d"), (Form::OneAxis, "1d")] {
        for head_dim in [64, 72, 70] {
            for dtype in [DType::Bfloat16, DType::Float32] {
                for shape in SHAPES {
                    let name = format!(
                        "{FAMILY}/{form_tag}/hd{head_dim}/{}/{}",
                        dtype_tag(dtype),
                        shape.tag()
                    );
                    cases.push(described(
                        name,
                        &Rope2dCase {
                            form,
                            head_dim,
                            dtype,
                            shape,
                        },
                    ));
                }
            }
        }
    }
    cases
}

fn run(
    ctx: &Ctx,
    form: Form,
    head_dim: usize,
    dtype: DType,
    shape: Shape,
) -> Result<CaseOutput, CaseError> {
    let mut inputs = ctx.inputs();
    let len = shape.len();
    let x = inputs.uniform(dtype, &[shape.batch, len, shape.heads, head_dim], 2.0);
    let mut positions = Vec::new();
    for b in 0..shape.batch {
        let (rows, cols) = if b % 2 == 0 {
            shape.grid
        } else {
            (shape.grid.1, shape.grid.0)
        };
        for p in 0..len {
            let (col, row) = if p < rows * cols {
                ((p % cols) as i32, (p / cols) as i32)
            } else {
                (-1, -1)
            };
            match form {
                Form::TwoAxes => positions.extend([col, row]),
                Form::OneAxis => positions.push(if p < rows * cols { p as i32 } else { -1 }),
            }
        }
    }
    let positions = match form {
        Form::TwoAxes => int32_tensor(&positions, &[shape.batch, len, 2]),
        Form::OneAxis => int32_tensor(&positions, &[shape.batch, len]),
    };
    let y = apply_multidimensional_rope(&x.to_array(), &positions.to_array(), BASE_FREQUENCY)
        .map_err(port)?;
    let reference = reference::position::position_rope2d(ctx, &x, &positions, BASE_FREQUENCY)?;
    let mut out = CaseOutput::new("pure-mlx");
    out.compare("y", &host(&y)?, &reference);
    Ok(out)
}

/// `(what is broken, the reference's message, the port's variant)`: inputs
/// both sides refuse. The proof mode gives the reference valid inputs
/// (head dim 8, positions `[1, 4, 2]`), on which it computes.
pub const REFUSED: &[(&str, &str, &str)] = &[
    // head_dim 2 leaves no channel pair per axis: 2.0 / 0.
    ("head-dim-too-small", "division by zero", "HeadDimTooSmall"),
    // positions [B, L, 0]: no axis.
    (
        "no-position-axes",
        "division or modulo by zero",
        "NoPositionAxes",
    ),
    // The 1-D form with an odd head dim: cos/sin have head_dim - 1 channels.
    ("odd-head-dim-1d", "broadcast_shapes", "OddHeadDim"),
    // positions [1, 5, 2] for inputs of 4 patches.
    (
        "positions-of-another-length",
        "broadcast_shapes",
        "PositionIdsShape",
    ),
    // positions [4]: one axis only.
    ("positions-rank-1", "expand_dims", "Rank"),
];

/// A `position/rope2d/refused` case as data: what is broken ([`REFUSED`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rope2dRefusedCase {
    broken: String,
}

impl Params for Rope2dRefusedCase {
    const BUILDER: &'static str = "position/rope2d/refused";
    fn build(self, name: String) -> Case {
        Case::must_equal(name, FAMILY, REFERENCE, move |ctx| {
            refused(ctx, &self.broken)
        })
    }
}

pub fn refused_descriptions() -> Vec<Described> {
    REFUSED
        .iter()
        .map(|&(broken, _, _)| {
            described(
                format!("{FAMILY}/refused/{broken}"),
                &Rope2dRefusedCase {
                    broken: broken.into(),
                },
            )
        })
        .collect()
}

fn refused(ctx: &Ctx, broken: &str) -> Result<CaseOutput, CaseError> {
    let &(_, expected, variant) = REFUSED
        .iter()
        .find(|r| r.0 == broken)
        .ok_or_else(|| CaseError::Harness(format!("`{broken}` is none of {REFUSED:?}")))?;
    let mut inputs = ctx.inputs();
    let two_axes = int32_tensor(&[0, 0, 1, 0, 0, 1, 1, 1], &[1, 4, 2]);
    let (head_dim, positions) = match broken {
        "head-dim-too-small" => (2, two_axes.clone()),
        "no-position-axes" => (8, int32_tensor(&[], &[1, 4, 0])),
        "odd-head-dim-1d" => (7, int32_tensor(&[0, 1, 2, 3], &[1, 4])),
        "positions-of-another-length" => {
            (8, int32_tensor(&[0, 0, 1, 0, 0, 1, 1, 1, 2, 0], &[1, 5, 2]))
        }
        "positions-rank-1" => (8, int32_tensor(&[0, 1, 2, 3], &[4])),
        other => return Err(CaseError::Harness(format!("no breakage `{other}`"))),
    };
    let x = inputs.uniform(DType::Float32, &[1, 4, 2, head_dim], 2.0);
    let port_said = super::super::support::port_refused(
        apply_multidimensional_rope(&x.to_array(), &positions.to_array(), BASE_FREQUENCY).and_then(
            |y| {
                y.eval()?;
                Ok(y)
            },
        ),
        variant,
    )?;
    let valid_x = inputs.uniform(DType::Float32, &[1, 4, 2, 8], 2.0);
    let (given_x, given_positions) = if ctx.perturbed() {
        (&valid_x, &two_axes)
    } else {
        (&x, &positions)
    };
    let reference = reference::refusal(
        reference::position::position_rope2d(ctx, given_x, given_positions, BASE_FREQUENCY),
        expected,
    )?;
    super::super::support::refusal_output(ctx, "pure-mlx", port_said, reference)
}
