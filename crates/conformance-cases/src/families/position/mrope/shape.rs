//! `position/mrope` as data: the explorer's mRoPE family (and the kept
//! cases it writes). A description is a rotary configuration (head_dim,
//! rotary_dim, rope_theta, mrope_section, q / k heads), prompts of vision
//! grids between text (one per batch row, equal lengths), and a window:
//! the whole prompt (prefill) or `len` decode tokens at cache offset
//! `prompt_len + extra`. It runs as the fixed apply cases run
//! ([`super::apply::run_rows`]), with its own seed.

use layers::position::{GridThw, Mrope};
use oracle::DType;
use serde::{Deserialize, Serialize};

use super::super::{host, mrope_path, port, Piece};
use super::apply::{run_rows, window, Scenario};
use super::{Model, APPLY_PIECES, APPLY_REFERENCE, FAMILY};
use crate::case::{Case, CaseError};
use crate::families::support::dtype_tag;
use crate::inputs::Inputs;

/// One piece of a prompt row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PromptPiece {
    Text {
        tokens: usize,
    },
    /// `(t, h, w)` in patches (h, w multiples of the merge size 2).
    Image {
        t: usize,
        h: usize,
        w: usize,
    },
    Video {
        t: usize,
        h: usize,
        w: usize,
    },
    /// `tokens` image tokens in one span whose grid is `(t, h, w)`,
    /// whatever that claims.
    ImageSpan {
        t: usize,
        h: usize,
        w: usize,
        tokens: usize,
    },
    /// An image grid no span consumes.
    ImageGrid {
        t: usize,
        h: usize,
        w: usize,
    },
    /// One image token outside every span.
    StrayImageToken,
}

impl PromptPiece {
    pub(crate) fn of(p: Piece) -> Self {
        match p {
            Piece::Text(tokens) => PromptPiece::Text { tokens },
            Piece::Image(g) => PromptPiece::Image {
                t: g.t,
                h: g.h,
                w: g.w,
            },
            Piece::Video(g) => PromptPiece::Video {
                t: g.t,
                h: g.h,
                w: g.w,
            },
            Piece::ImageSpan(g, tokens) => PromptPiece::ImageSpan {
                t: g.t,
                h: g.h,
                w: g.w,
                tokens,
            },
            Piece::ImageGrid(g) => PromptPiece::ImageGrid {
                t: g.t,
                h: g.h,
                w: g.w,
            },
            Piece::StrayImageToken => PromptPiece::StrayImageToken,
        }
    }

    pub(crate) fn piece(self) -> Piece {
        match self {
            PromptPiece::Text { tokens } => Piece::Text(tokens),
            PromptPiece::Image { t, h, w } => Piece::Image(GridThw::new(t, h, w)),
            PromptPiece::Video { t, h, w } => Piece::Video(GridThw::new(t, h, w)),
            PromptPiece::ImageSpan { t, h, w, tokens } => {
                Piece::ImageSpan(GridThw::new(t, h, w), tokens)
            }
            PromptPiece::ImageGrid { t, h, w } => Piece::ImageGrid(GridThw::new(t, h, w)),
            PromptPiece::StrayImageToken => Piece::StrayImageToken,
        }
    }

    /// Tokens the piece puts in the prompt (Qwen3.5: merge size 2).
    pub fn tokens(self) -> usize {
        // Saturating: a kept file's absurd grid is refused by `check`, never an overflow.
        match self {
            PromptPiece::Text { tokens } => tokens,
            PromptPiece::Image { t, h, w } => t
                .saturating_mul((h / 2).saturating_mul(w / 2))
                .saturating_add(2),
            PromptPiece::Video { t, h, w } => {
                t.saturating_mul((h / 2).saturating_mul(w / 2).saturating_add(4))
            }
            PromptPiece::ImageSpan { tokens, .. } => tokens.saturating_add(2),
            PromptPiece::ImageGrid { .. } => 0,
            PromptPiece::StrayImageToken => 1,
        }
    }
}

/// Why prompt rows cannot be laid out, if so: every vision grid needs t
/// positive and h, w at least the merge size 2; at most 2^20 tokens a row.
pub(crate) fn check_pieces(rows: &[Vec<PromptPiece>]) -> Result<(), String> {
    for p in rows.iter().flatten() {
        // An `ImageSpan` may hold any grid: it is there to mismatch.
        if let PromptPiece::Image { t, h, w }
        | PromptPiece::Video { t, h, w }
        | PromptPiece::ImageGrid { t, h, w } = *p
        {
            // h and w at least the merge size (they are floored by it, as
            // the reference floors them; below it a grid covers no token,
            // which the reference refuses).
            if t == 0 || h < 2 || w < 2 {
                return Err(format!(
                    "grid ({t}, {h}, {w}): t positive, h and w at least the merge size 2"
                ));
            }
        }
    }
    if let Some(len) = rows.iter().map(|r| row_len(r)).find(|&l| l > 1 << 20) {
        return Err(format!("a prompt of {len} tokens (more than 2^20)"));
    }
    Ok(())
}

/// A prompt row's tokens (saturating).
fn row_len(row: &[PromptPiece]) -> usize {
    row.iter().fold(0usize, |a, p| a.saturating_add(p.tokens()))
}

/// One mRoPE apply as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MropeShape {
    pub dtype: DType,
    pub head_dim: usize,
    /// Rotated channels per head (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub mrope_section: [usize; 3],
    pub q_heads: usize,
    pub k_heads: usize,
    /// One prompt per batch row (equal token counts).
    pub rows: Vec<Vec<PromptPiece>>,
    /// `(extra, len)`: decode `len` tokens at offset `prompt_len + extra`;
    /// absent: the prefill of the whole prompt.
    pub decode: Option<(usize, usize)>,
}

impl MropeShape {
    /// A fixed apply case's description: `model`'s rotary, `scenario`'s
    /// prompts and window.
    pub(super) fn fixed(model: &Model, dtype: DType, scenario: Scenario) -> Self {
        let rows_of = |rows: &[&[Piece]]| -> Vec<Vec<PromptPiece>> {
            rows.iter()
                .map(|r| r.iter().map(|p| PromptPiece::of(*p)).collect())
                .collect()
        };
        let (rows, decode) = match scenario {
            Scenario::Text { prompt } => (rows_of(&[prompt]), None),
            Scenario::Prompt { rows } => (rows_of(rows), None),
            Scenario::Decode { prompt, extra, len } => (rows_of(&[prompt]), Some((extra, len))),
        };
        MropeShape {
            dtype,
            head_dim: model.head_dim,
            rotary_dim: (model.head_dim as f64 * model.partial_rotary_factor) as usize,
            rope_theta: model.rope_theta,
            mrope_section: model.mrope_section,
            q_heads: model.heads.0,
            k_heads: model.heads.1,
            rows,
            decode,
        }
    }

    fn model(&self) -> Model {
        Model {
            name: "explore",
            head_dim: self.head_dim,
            partial_rotary_factor: self.rotary_dim as f64 / self.head_dim as f64,
            rope_theta: self.rope_theta,
            mrope_section: self.mrope_section,
            heads: (self.q_heads, self.k_heads),
        }
    }

    fn pieces(&self) -> Vec<Vec<Piece>> {
        self.rows
            .iter()
            .map(|r| r.iter().map(|p| p.piece()).collect())
            .collect()
    }

    /// Tokens of a row's prompt.
    pub fn prompt_len(&self) -> usize {
        self.rows.first().map_or(0, |r| row_len(r))
    }

    /// Why the shape cannot run, if so. Sections adding up to more than the
    /// rotary_dim / 2 frequencies are allowed: the reference computes them.
    pub fn check(&self) -> Result<(), String> {
        if self.rows.is_empty() || self.rows.iter().any(|r| r.is_empty()) {
            return Err("every batch row needs a prompt".into());
        }
        let len = self.prompt_len();
        if len == 0 || self.rows.iter().any(|r| row_len(r) != len) {
            return Err("batch rows must have the same positive token count".into());
        }
        if len > 1 << 20 {
            return Err(format!("a prompt of {len} tokens (more than 2^20)"));
        }
        check_pieces(&self.rows)?;
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return Err(format!(
                "rotary_dim {} must be even, positive and at most head_dim {}",
                self.rotary_dim, self.head_dim
            ));
        }
        if self.q_heads == 0
            || self.k_heads == 0
            || !(self.rope_theta.is_finite() && self.rope_theta > 1.0)
        {
            return Err("heads must be positive and rope_theta finite above 1".into());
        }
        if !matches!(
            self.dtype,
            DType::Bfloat16 | DType::Float16 | DType::Float32
        ) {
            return Err(format!("dtype {} is not a float dtype", self.dtype.name()));
        }
        let window = self.decode.map_or(len, |(_, l)| l);
        if window == 0
            || self
                .decode
                .is_some_and(|(extra, _)| len.saturating_add(extra) > 1 << 24)
        {
            return Err("a decode window needs tokens, at offsets below 2^24".into());
        }
        let elements = [
            self.q_heads.saturating_add(self.k_heads),
            window,
            self.head_dim,
        ]
        .into_iter()
        .try_fold(self.rows.len(), |a, d| a.checked_mul(d));
        if elements.is_none_or(|e| e > 1 << 26) {
            return Err("q and k hold more than 2^26 elements".into());
        }
        Ok(())
    }

    /// `position/mrope/<dtype>/hd<d>-rot<r>-theta<t>-sec<a>-<b>-<c>-H<q>-<k>/B<b>-L<len>[/decode<offset>-L<n>]`.
    pub fn name(&self) -> String {
        let [a, b, c] = self.mrope_section;
        let mut name = format!(
            "{FAMILY}/{}/hd{}-rot{}-theta{}-sec{a}-{b}-{c}-H{}-{}/B{}-L{}",
            dtype_tag(self.dtype),
            self.head_dim,
            self.rotary_dim,
            self.rope_theta,
            self.q_heads,
            self.k_heads,
            self.rows.len(),
            self.prompt_len()
        );
        let vision = self
            .rows
            .iter()
            .flatten()
            .filter(|p| !matches!(p, PromptPiece::Text { .. }))
            .count();
        if vision > 0 {
            name += &format!("-vision{vision}");
        }
        if let Some((extra, len)) = self.decode {
            name += &format!("/decode{}-L{len}", self.prompt_len().saturating_add(extra));
        }
        name
    }

    pub fn case_named(self, name: String) -> Case {
        self.case_on(name, None).glue_composed(APPLY_PIECES)
    }

    /// The must-equal case of this shape with the port and the reference
    /// both forced onto `path` (the fused Metal kernel).
    pub fn case_forced(self, name: String, path: layers::position::MropePath) -> Case {
        self.case_on(name, Some(path))
    }

    /// The must-equal case: on `forced`, or on the path the backend takes.
    fn case_on(self, name: String, forced: Option<layers::position::MropePath>) -> Case {
        Case::must_equal(name, FAMILY, APPLY_REFERENCE, move |ctx| {
            self.check().map_err(|e| CaseError::harness("shape", e))?;
            let pieces = self.pieces();
            let rows: Vec<&[Piece]> = pieces.iter().map(Vec::as_slice).collect();
            let path = match forced {
                Some(path) => path,
                None => mrope_path(ctx)?,
            };
            run_rows(
                ctx,
                self.model(),
                self.dtype,
                &rows,
                self.decode,
                forced,
                path,
            )
        })
    }

    /// The window's seeded `q`, `k` and the port's `position_ids` (for
    /// reproducers).
    pub fn host_inputs(&self, seed: u64) -> Result<Vec<(String, oracle::HostTensor)>, CaseError> {
        self.check().map_err(|e| CaseError::harness("shape", e))?;
        let pieces = self.pieces();
        let rows: Vec<&[Piece]> = pieces.iter().map(Vec::as_slice).collect();
        let w = window(
            &mut Inputs::new(seed),
            &self.model(),
            self.dtype,
            &rows,
            self.decode,
        )?;
        Ok(vec![
            ("q".into(), w.q),
            ("k".into(), w.k),
            ("position_ids".into(), w.positions),
        ])
    }

    /// Invariance of the port (a finding): each batch row's apply alone has
    /// the bits of its row in the batch.
    pub fn invariances(&self, seed: u64) -> Result<Vec<(String, bool)>, CaseError> {
        self.check().map_err(|e| CaseError::harness("shape", e))?;
        if self.rows.len() < 2 {
            return Ok(Vec::new());
        }
        let model = self.model();
        let pieces = self.pieces();
        let rows: Vec<&[Piece]> = pieces.iter().map(Vec::as_slice).collect();
        let w = window(
            &mut Inputs::new(seed),
            &model,
            self.dtype,
            &rows,
            self.decode,
        )?;
        let mrope = Mrope::new(model.config()).map_err(port)?;
        let (q, k) = mrope
            .apply(&w.q.to_array(), &w.k.to_array(), &w.positions.to_array())
            .map_err(port)?;
        let (q, k) = (host(&q)?, host(&k)?);
        let b = self.rows.len();
        let text = w.positions.shape.len() == 2;
        for r in 0..b {
            let row = |t: &oracle::HostTensor| crate::families::attention::step::rows(t, r, r + 1);
            // Positions: [B, L] (text) or [3, B, L].
            let positions = if text {
                row(&w.positions)
            } else {
                let per_axis = w.positions.len() / 3;
                let width = per_axis / b * 4;
                let bytes = (0..3)
                    .flat_map(|axis| {
                        let start = axis * per_axis * 4 + r * width;
                        w.positions.bytes[start..start + width].to_vec()
                    })
                    .collect();
                oracle::HostTensor::new(DType::Int32, vec![3, 1, per_axis / b], bytes)
                    .map_err(|e| CaseError::harness("positions", e))?
            };
            let (qa, ka) = mrope
                .apply(
                    &row(&w.q).to_array(),
                    &row(&w.k).to_array(),
                    &positions.to_array(),
                )
                .map_err(port)?;
            if host(&qa)?.bytes != row(&q).bytes || host(&ka)?.bytes != row(&k).bytes {
                return Ok(vec![("batch = each row alone".into(), false)]);
            }
        }
        Ok(vec![("batch = each row alone".into(), true)])
    }
}
