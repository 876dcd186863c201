//! What a case is.

use std::sync::Arc;

use oracle::{compare, Comparison, HostTensor, Oracle, OracleError};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use layers::Backend;

/// The device asked for on the command line (`--device cpu|gpu`). `gpu` is
/// the GPU backend of the linked libmlx (Metal on macOS, CUDA with the
/// CUDA environment); the run resolves it to one [`Backend`] at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

/// Every GPU backend (for [`Case::only_on`]).
pub const GPU_BACKENDS: &[Backend] = &[Backend::Metal, Backend::Cuda];

/// What a case promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// Port and reference must produce identical bits: a verdict.
    MustEqual,
    /// A measured relation (where two paths differ, which lengths break
    /// exactness). Recorded in the snapshot and checked both ways: a
    /// recorded divergence that disappears is drift, as is a new one.
    Finding,
}

/// Where a case can run: data over backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    Everywhere,
    /// Only on these backends; elsewhere a skip with the reason.
    Only(&'static [Backend], &'static str),
}

impl Applies {
    /// Whether the case runs on `backend`; otherwise the skip reason.
    pub fn on(self, backend: Backend) -> Result<(), &'static str> {
        match self {
            Applies::Only(backends, reason) if !backends.contains(&backend) => Err(reason),
            _ => Ok(()),
        }
    }
}

/// Everything a case needs while it runs.
pub struct Ctx<'a> {
    pub oracle: &'a Oracle,
    /// The backend this run resolved `--device` to.
    pub backend: Backend,
    pub seed: u64,
    pub case: &'a str,
    /// Proof mode: the reference receives its first non-empty tensor
    /// argument with one bit flipped, so a sound must-equal case must fail.
    /// When the first tensor argument is empty (an empty batch, whose
    /// outputs are only a shape and a dtype), it also gets another float
    /// dtype, which must show in the output's dtype.
    pub perturb: bool,
}

impl Ctx<'_> {
    /// Calls a glue function of the reference on behalf of this case.
    pub fn reference(
        &self,
        function: &str,
        args: &[oracle::Arg],
        kwargs: &[(&str, oracle::Arg)],
    ) -> Result<oracle::Value, CaseError> {
        if self.perturb {
            let mut args = args.to_vec();
            if let Some(oracle::Arg::Tensor(t)) = args
                .iter_mut()
                .find(|a| matches!(a, oracle::Arg::Tensor(t) if !t.is_empty()))
            {
                *t = crate::inputs::flip_lowest_bit(t, 0);
            }
            if let Some(oracle::Arg::Tensor(t)) = args
                .iter_mut()
                .find(|a| matches!(a, oracle::Arg::Tensor(_)))
            {
                if t.is_empty() {
                    *t = crate::inputs::other_float_dtype(t);
                }
            }
            return Ok(self.oracle.call(self.case, function, &args, kwargs)?);
        }
        Ok(self.oracle.call(self.case, function, args, kwargs)?)
    }
    /// Seeded generator for this case's inputs.
    pub fn inputs(&self) -> crate::inputs::Inputs {
        crate::inputs::Inputs::new(self.seed)
    }
    /// Like [`Ctx::reference`], for a function returning one array.
    pub fn reference_tensor(
        &self,
        function: &str,
        args: &[oracle::Arg],
        kwargs: &[(&str, oracle::Arg)],
    ) -> Result<HostTensor, CaseError> {
        self.reference(function, args, kwargs)?
            .tensor()
            .ok_or_else(|| CaseError::Harness(format!("`{function}` did not return one array")))
    }
}

/// A case that could not be evaluated (not a verdict).
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error(transparent)]
    Oracle(#[from] OracleError),
    #[error("the port raised: {0}")]
    Port(String),
    #[error("{0}")]
    Harness(String),
}

impl From<mlx_rs::error::Exception> for CaseError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        CaseError::Port(e.to_string())
    }
}
impl From<oracle::TensorError> for CaseError {
    fn from(e: oracle::TensorError) -> Self {
        CaseError::Harness(e.to_string())
    }
}

/// One compared output.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Output {
    pub name: String,
    pub comparison: Comparison,
}

/// What a case produced.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct CaseOutput {
    /// The reference path that ran (e.g. `pure-mlx`, `metal-kernel`).
    pub path: String,
    /// Port outputs compared with the reference (must-equal cases).
    pub outputs: Vec<Output>,
    /// The measured relation (finding cases), deterministic JSON.
    pub finding: Option<serde_json::Value>,
    /// sha256 over the port's output bits (dtype, shape, bytes), in order.
    pub digest: String,
}

impl CaseOutput {
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }
    /// Compares one port output with the reference's and folds its bits into
    /// the digest.
    pub fn compare(&mut self, name: &str, port: &HostTensor, reference: &HostTensor) {
        self.digest_tensor(port);
        self.outputs.push(Output {
            name: name.into(),
            comparison: compare(port, reference),
        });
    }
    /// Folds a tensor into the output digest without comparing it.
    pub fn digest_tensor(&mut self, t: &HostTensor) {
        let mut h = Sha256::new();
        h.update(self.digest.as_bytes());
        h.update(t.dtype.name().as_bytes());
        for d in &t.shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update(&t.bytes);
        self.digest = format!("{:x}", h.finalize());
    }
    /// Records a measured relation.
    pub fn with_finding(mut self, finding: serde_json::Value) -> Self {
        self.finding = Some(finding);
        self
    }
    pub fn all_equal(&self) -> bool {
        self.outputs.iter().all(|o| o.comparison.is_equal())
    }
}

/// The run function of a case.
pub type RunFn = Arc<dyn Fn(&Ctx) -> Result<CaseOutput, CaseError> + Send + Sync>;

/// One registered case.
#[derive(Clone)]
pub struct Case {
    /// Path-like, unique: `quantized/linear/affine-4b-gs64/bf16/M8`.
    pub name: String,
    /// First component(s) of the name, e.g. `quantized/linear`.
    pub family: &'static str,
    /// The reference function mirrored (module, function, pinned version).
    pub reference: &'static str,
    pub expect: Expect,
    pub applies: Applies,
    /// Seed offset of this case (inputs are generated from run seed + this).
    pub seed: u64,
    pub run: RunFn,
}

impl Case {
    /// A must-equal case.
    pub fn must_equal(
        name: impl Into<String>,
        family: &'static str,
        reference: &'static str,
        run: impl Fn(&Ctx) -> Result<CaseOutput, CaseError> + Send + Sync + 'static,
    ) -> Self {
        let name = name.into();
        let seed = seed_of(&name);
        Self {
            name,
            family,
            reference,
            expect: Expect::MustEqual,
            applies: Applies::Everywhere,
            seed,
            run: Arc::new(run),
        }
    }
    /// A finding case.
    pub fn finding(
        name: impl Into<String>,
        family: &'static str,
        reference: &'static str,
        run: impl Fn(&Ctx) -> Result<CaseOutput, CaseError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            expect: Expect::Finding,
            ..Self::must_equal(name, family, reference, run)
        }
    }
    /// Restricts the case to some backends (e.g. `&[Backend::Metal]`,
    /// [`GPU_BACKENDS`], `&[Backend::Cpu]`).
    pub fn only_on(mut self, backends: &'static [Backend], reason: &'static str) -> Self {
        self.applies = Applies::Only(backends, reason);
        self
    }
}

/// A stable per-case seed offset derived from the name (FNV-1a), so adding
/// a case never changes another case's inputs.
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
