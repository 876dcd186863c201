//! How many rows one quantized matmul call may carry and still give every
//! row the bits of its own M = 1 call: the rows regime table.
//!
//! Speculative verification and chunked prefill need a k-row forward that
//! equals k decode steps (M = 1 each) bit for bit. A backend picks its
//! quantized-matmul kernel from the number of rows a call carries, and
//! different kernels round differently, so one batched call is exact only
//! while its rows stay in the kernel class of the M = 1 call. The table
//! says, per backend and spec, how many rows that is; the rows-independent
//! forwards ([`crate::quantized::Forward::RowsIndependent`],
//! [`crate::quantized::QuantizedSwitchLinear::forward_rows_independent`])
//! issue one call per chunk of at most that many rows. It is the same idea
//! as the KV append table ([`crate::position::RegimeTable`]), applied to
//! rows.
//!
//! A limit is measured, never assumed: the conformance crate's rows-regime
//! finder (`quantized/rows-regime/…` cases) re-measures it per spec from
//! the reference alone and fails loudly when a shipped limit is too large
//! (a chunk would not be exact); one that is too small is a finding. A spec
//! or dtype the table has no measurement for gets one row per call (always
//! exact).

use mlx_rs::Dtype;

use crate::backend::Backend;
use crate::ffi::Mode;

use super::QuantSpec;

/// How many rows one call may carry with every row equal to its M = 1 call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowsLimit {
    /// Any number: the backend's kernel does not depend on the row count.
    Unbounded,
    /// At most this many (at least 1): calls of more rows take another
    /// kernel, whose bits may differ from M = 1.
    AtMost(usize),
    /// Two kernel classes, each independent of the row count: calls of at
    /// most this many rows take one, calls of more the other. A unit of
    /// more rows than this (a switch token routed to `top_k` experts with
    /// `top_k` above it) is already in the second class on its own, so any
    /// number of such units share one call.
    Boundary(usize),
}

impl RowsLimit {
    /// The chunk size for `rows` rows: `rows` itself when unbounded.
    pub fn chunk(self, rows: usize) -> usize {
        match self {
            RowsLimit::Unbounded => rows.max(1),
            RowsLimit::AtMost(n) | RowsLimit::Boundary(n) => n.clamp(1, rows.max(1)),
        }
    }

    /// How many whole units of `rows_per_unit` rows (tokens of a switch
    /// layer, each routed to `top_k` experts) fit in one call: at least 1,
    /// since a single unit is the M = 1 call itself.
    pub fn units(self, rows_per_unit: usize, units: usize) -> usize {
        match self {
            RowsLimit::Unbounded => units.max(1),
            RowsLimit::AtMost(n) => (n / rows_per_unit.max(1)).clamp(1, units.max(1)),
            RowsLimit::Boundary(n) if rows_per_unit > n => units.max(1),
            RowsLimit::Boundary(n) => (n / rows_per_unit.max(1)).clamp(1, units.max(1)),
        }
    }

    /// The limit as a number, `None` when unbounded (for reports).
    pub fn as_option(self) -> Option<usize> {
        match self {
            RowsLimit::Unbounded => None,
            RowsLimit::AtMost(n) | RowsLimit::Boundary(n) => Some(n),
        }
    }
}

/// Which call a limit is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowsCall {
    /// `mlx.core.quantized_matmul` (QuantizedLinear): rows are the M query
    /// rows.
    QuantizedMatmul,
    /// `mlx.core.gather_qmm` (QuantizedSwitchLinear): rows are the routed
    /// rows, tokens × top_k.
    GatherQmm,
}

/// One measured row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsEntry {
    /// The backend measured.
    pub backend: Backend,
    /// The call measured.
    pub call: RowsCall,
    /// The quantization spec.
    pub mode: Mode,
    /// Bits per element.
    pub bits: i32,
    /// Elements per scale.
    pub group_size: i32,
    /// The activation dtype.
    pub dtype: Dtype,
    /// The measured limit.
    pub limit: RowsLimit,
}

const fn entry(
    backend: Backend,
    call: RowsCall,
    (mode, bits, group_size): (Mode, i32, i32),
    dtype: Dtype,
    limit: RowsLimit,
) -> RowsEntry {
    RowsEntry {
        backend,
        call,
        mode,
        bits,
        group_size,
        dtype,
        limit,
    }
}

/// The specs the table measures, as `(mode, bits, group_size)`: the four
/// modes' defaults plus affine 3-bit group 32 and 8-bit group 64.
pub const MEASURED_SPECS: [(Mode, i32, i32); 6] = [
    (Mode::Affine, 4, 64),
    (Mode::Affine, 3, 32),
    (Mode::Affine, 8, 64),
    (Mode::Mxfp4, 4, 32),
    (Mode::Mxfp8, 8, 32),
    (Mode::Nvfp4, 4, 16),
];

/// The activation dtypes the table measures.
pub const MEASURED_DTYPES: [Dtype; 3] = [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32];

/// The CUDA quantized-matmul limit of MLX 0.32.2, by measurement: calls of
/// up to 7 rows match M = 1, calls of 8 or more do not.
///
/// Measured 2026-12-02 on an NVIDIA H200 (sm_90, CUDA 13.0, `mlx-cuda-13`
/// 0.32.2) by the finder (`quantized/rows-regime/<spec>/<dtype>/linear/finder`,
/// M = 1 ..= 24 at K = 512, N = 256), every spec of [`MEASURED_SPECS`] and
/// dtype of [`MEASURED_DTYPES`]: the batched call matched the calls per row
/// up to M = 7 and differed at every M from 8 to 24, except mxfp8 bf16,
/// which also matched at M = 8 (then differed from 9: the limit is not
/// raised for one coincidence). Evidence under
/// `fixtures/gpu-runs/h200-2026-12-02/rows-regime/` in the conformance
/// repository. It agrees with the dispatch in
/// `mlx/backend/cuda/quantized/quantized.cpp`: `qmv` while `M * B < 8`,
/// then a tiled `qmm` kernel.
const CUDA_QMM: RowsLimit = RowsLimit::AtMost(7);

/// The CUDA `gather_qmm` regime of MLX 0.32.2, by measurement: two classes
/// split at 7 routed rows, each independent of the count.
///
/// Same run, `…/switch-E8-top{2,8}/finder` (E = 8, T = 1 ..= 12 tokens):
/// at top-2 a batched call matched the calls per token up to 3 tokens (6
/// routed rows) and differed from 4 (8 rows) on, in every spec and dtype
/// (affine-8b bf16 matched once more at 4, mxfp8 bf16 up to 9); at top-8
/// every token is 8 routed rows on its own, and a batched call matched the
/// calls per token at every T up to 12 (96 rows) in every spec and dtype.
/// It agrees with `GatherQMM::eval_gpu`: `gather_qmv` while `M * B < 8`.
const CUDA_GATHER: RowsLimit = RowsLimit::Boundary(7);

/// The table as shipped: every measured row.
///
/// * CPU (MLX 0.32.2, x86-64 `mlx-cpu` wheel): unbounded for every spec,
///   dtype and call: the CPU kernels loop over rows one at a time
///   (`_qmm_t_simd` / `_qmm_t`), and the finder measured M = 1 ..= 24 (and
///   1 ..= 12 tokens of a switch layer at top-k 2 and 8) equal everywhere,
///   2026-12-02 (x86-64).
/// * CUDA: [`CUDA_QMM`] and [`CUDA_GATHER`].
/// * Metal: not measured (no Apple hardware here), so absent: every Metal
///   lookup gives one row per call until the Apple CI bootstrap measures
///   it.
pub fn shipped() -> Vec<RowsEntry> {
    let mut rows = Vec::new();
    for call in [RowsCall::QuantizedMatmul, RowsCall::GatherQmm] {
        for spec in MEASURED_SPECS {
            for dtype in MEASURED_DTYPES {
                rows.push(entry(Backend::Cpu, call, spec, dtype, RowsLimit::Unbounded));
                let cuda = match call {
                    RowsCall::QuantizedMatmul => CUDA_QMM,
                    RowsCall::GatherQmm => CUDA_GATHER,
                };
                rows.push(entry(Backend::Cuda, call, spec, dtype, cuda));
            }
        }
    }
    rows
}

/// The rows regime of one backend.
#[derive(Debug, Clone, PartialEq)]
pub struct RowsRegime {
    backend: Backend,
    entries: Vec<RowsEntry>,
}

impl RowsRegime {
    /// The shipped table's rows for `backend`.
    pub fn for_backend(backend: Backend) -> Self {
        let entries = shipped()
            .into_iter()
            .filter(|e| e.backend == backend)
            .collect();
        RowsRegime { backend, entries }
    }

    /// A regime from a caller's own measurement (another GPU, MLX build or
    /// spec): `entries` for other backends are ignored.
    pub fn from_measured(backend: Backend, entries: Vec<RowsEntry>) -> Self {
        let entries = entries
            .into_iter()
            .filter(|e| e.backend == backend)
            .collect();
        RowsRegime { backend, entries }
    }

    /// The backend described.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The measured rows of this backend.
    pub fn entries(&self) -> &[RowsEntry] {
        &self.entries
    }

    /// The limit for `call` with `spec`, activations of `dtype` and an input
    /// width `in_features`: the measured row, else [`RowsLimit::AtMost`]`(1)`.
    ///
    /// On CUDA a quantized matmul whose input width is at most one group
    /// (`in_features <= group_size`) runs MLX 0.32.2's sm_90 kernel for
    /// every M > 1 (its dispatch requires `group_size >= K`), so it gets
    /// one row per call: the table's measurement does not cover it.
    pub fn limit(
        &self,
        call: RowsCall,
        spec: QuantSpec,
        dtype: Dtype,
        in_features: i32,
    ) -> RowsLimit {
        if self.backend == Backend::Cuda
            && call == RowsCall::QuantizedMatmul
            && in_features <= spec.group_size
        {
            return RowsLimit::AtMost(1);
        }
        self.entries
            .iter()
            .find(|e| {
                e.call == call
                    && (e.mode, e.bits, e.group_size) == (spec.mode, spec.bits, spec.group_size)
                    && e.dtype == dtype
            })
            .map_or(RowsLimit::AtMost(1), |e| e.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_units_never_go_below_one() {
        assert_eq!(RowsLimit::AtMost(7).chunk(8), 7);
        assert_eq!(RowsLimit::AtMost(7).chunk(3), 3);
        assert_eq!(RowsLimit::Unbounded.chunk(33), 33);
        assert_eq!(RowsLimit::AtMost(7).units(2, 10), 3);
        assert_eq!(RowsLimit::AtMost(7).units(8, 10), 1);
        assert_eq!(RowsLimit::Unbounded.units(8, 10), 10);
        assert_eq!(RowsLimit::Boundary(7).units(2, 10), 3);
        assert_eq!(RowsLimit::Boundary(7).units(8, 10), 10);
        assert_eq!(RowsLimit::Boundary(7).chunk(8), 7);
    }

    #[test]
    fn unmeasured_backends_and_specs_get_one_row() {
        let spec = QuantSpec::defaults(Mode::Affine);
        let metal = RowsRegime::for_backend(Backend::Metal);
        assert!(metal.entries().is_empty());
        assert_eq!(
            metal.limit(RowsCall::QuantizedMatmul, spec, Dtype::Bfloat16, 4096),
            RowsLimit::AtMost(1)
        );
        let cpu = RowsRegime::for_backend(Backend::Cpu);
        let unmeasured = QuantSpec::new(Mode::Affine, 5, 128).unwrap();
        assert_eq!(
            cpu.limit(RowsCall::QuantizedMatmul, unmeasured, Dtype::Bfloat16, 4096),
            RowsLimit::AtMost(1)
        );
        assert_eq!(
            cpu.limit(RowsCall::QuantizedMatmul, spec, Dtype::Bfloat16, 4096),
            RowsLimit::Unbounded
        );
    }

    #[test]
    fn cuda_one_group_rows_get_one_row_per_call() {
        let cuda = RowsRegime::for_backend(Backend::Cuda);
        let spec = QuantSpec::defaults(Mode::Affine);
        assert_eq!(
            cuda.limit(RowsCall::QuantizedMatmul, spec, Dtype::Bfloat16, 64),
            RowsLimit::AtMost(1)
        );
        assert_eq!(
            cuda.limit(RowsCall::QuantizedMatmul, spec, Dtype::Bfloat16, 4096),
            RowsLimit::AtMost(7)
        );
    }
}
