//! The vision grid both the rope index and its errors speak of.

use std::fmt;

/// A vision grid `(t, h, w)` in patch units, as in `image_grid_thw` /
/// `video_grid_thw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GridThw {
    /// Temporal patches (1 for images; frames for videos).
    pub t: usize,
    /// Patch rows, before the spatial merge.
    pub h: usize,
    /// Patch columns, before the spatial merge.
    pub w: usize,
}

impl GridThw {
    /// `GridThw { t, h, w }`.
    pub const fn new(t: usize, h: usize, w: usize) -> Self {
        GridThw { t, h, w }
    }
}

impl fmt::Display for GridThw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {}, {})", self.t, self.h, self.w)
    }
}
