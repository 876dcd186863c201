//! The port's own trace of a forward: named intermediate values, in the
//! order they are computed, for naming the first point where the port and
//! the reference part. Recording never changes what is computed (it keeps
//! a handle on an array the graph already holds).

use mlx_rs::Array;

use super::gated_delta::Recurrence;

/// One recorded value: `point` is `layers.{i}.{op}` (or `embed`,
/// `final_norm`, `logits`).
#[derive(Debug, Clone)]
pub struct TracePoint {
    pub point: String,
    pub value: Array,
}

/// Intermediate values of one forward, when enabled.
#[derive(Debug, Default)]
pub struct Trace {
    enabled: bool,
    pub points: Vec<TracePoint>,
    /// Which recurrence algorithm each linear layer ran (`layers.{i}` →
    /// algorithm), recorded even when tracing is off.
    pub recurrences: Vec<(String, Recurrence)>,
}

impl Trace {
    /// A trace that records nothing but the algorithms chosen.
    pub fn off() -> Self {
        Trace::default()
    }

    /// A trace that records every point.
    pub fn on() -> Self {
        Trace {
            enabled: true,
            ..Trace::default()
        }
    }

    pub fn is_on(&self) -> bool {
        self.enabled
    }

    /// Records `value` as `{at}.{op}`.
    pub fn record(&mut self, at: &str, op: &str, value: &Array) {
        if self.enabled {
            self.points.push(TracePoint {
                point: if at.is_empty() {
                    op.to_owned()
                } else {
                    format!("{at}.{op}")
                },
                value: value.clone(),
            });
        }
    }

    /// Records a KV cache's `[offset, capacity]` as `{at}.kv_layout` (the
    /// layout SDPA's view comes from; CUDA picks kernels by it).
    pub fn record_layout(&mut self, at: &str, offset: usize, capacity: usize) {
        if self.enabled {
            let v = Array::from_slice(&[offset as i32, capacity as i32], &[2]);
            self.record(at, "kv_layout", &v);
        }
    }

    pub fn note_recurrence(&mut self, at: &str, which: Recurrence) {
        self.recurrences.push((at.to_owned(), which));
    }
}
