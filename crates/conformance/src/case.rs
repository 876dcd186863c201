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

/// Everything a case needs while it runs. Families reach the reference
/// only through the typed functions of [`crate::reference`], which go
/// through [`Ctx::call`].
pub struct Ctx<'a> {
    oracle: &'a Oracle,
    backend: Backend,
    seed: u64,
    run_seed: u64,
    case: &'a str,
    perturb: bool,
}

impl<'a> Ctx<'a> {
    /// `seed` is this case's seed (run seed + the case's offset); `perturb`
    /// is the proof mode (see [`crate::reference::Perturb`]).
    pub fn new(
        oracle: &'a Oracle,
        backend: Backend,
        seed: u64,
        case: &'a str,
        perturb: bool,
    ) -> Self {
        Self {
            oracle,
            backend,
            seed,
            run_seed: seed.wrapping_sub(seed_of(case)),
            case,
            perturb,
        }
    }
    /// Sets the run's base seed (`--seed`), when the case's offset is not
    /// the one its name gives (descriptions carry their seed).
    pub fn with_run_seed(mut self, run_seed: u64) -> Self {
        self.run_seed = run_seed;
        self
    }
    /// The run's base seed (`--seed`), without the case's offset: for
    /// inputs shared between cases.
    pub fn run_seed(&self) -> u64 {
        self.run_seed
    }
    /// The backend this run resolved `--device` to.
    pub fn backend(&self) -> Backend {
        self.backend
    }
    /// This case's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// This case's name.
    pub fn case(&self) -> &str {
        self.case
    }
    /// Whether this is the proof mode (`--perturb`).
    pub fn perturbed(&self) -> bool {
        self.perturb
    }
    /// Seeded generator for this case's inputs.
    pub fn inputs(&self) -> crate::inputs::Inputs {
        crate::inputs::Inputs::new(self.seed)
    }
    /// Calls glue function `function` with keyword arguments. In the proof
    /// mode every parameter marked perturbable is perturbed first.
    pub(crate) fn call(
        &self,
        function: &'static str,
        params: Vec<crate::reference::Param>,
    ) -> Result<oracle::Value, CaseError> {
        Ok(self.call_sent(function, params)?.0)
    }

    /// Like [`Ctx::call`], also giving the arguments each side computed
    /// from (for the exact oracle: the reference is checked on what it
    /// received, perturbed or not).
    pub(crate) fn call_sent(
        &self,
        function: &'static str,
        params: Vec<crate::reference::Param>,
    ) -> Result<(oracle::Value, crate::exactness::Calls), CaseError> {
        let mut kwargs = Vec::with_capacity(params.len());
        let mut original = Vec::new();
        for p in params {
            let value = if self.perturb {
                original.push((p.name, p.value.clone()));
                crate::reference::perturb(p.value, p.perturb).map_err(|what| {
                    CaseError::Harness(format!("`{function}` argument `{}`: {what}", p.name))
                })?
            } else {
                p.value
            };
            kwargs.push((p.name, value));
        }
        crate::poison::before_call(self.backend);
        let value = self.oracle.call(self.case, function, &[], &kwargs);
        // After too: the port's next call must not get the reference's
        // freed output buffer (it holds a correct result).
        crate::poison::poison();
        crate::export::record(function, &kwargs, value.as_ref());
        if crate::candidate::active() && crate::candidate::sends(function) {
            // The candidate gets what the port gets: the unperturbed
            // arguments.
            let sent = if self.perturb { &original } else { &kwargs };
            match crate::candidate::call(self.case, function, sent) {
                Ok(reply) => {
                    crate::candidate::tape::record(value.as_ref().ok(), &reply);
                    if let (Ok(_), crate::candidate::Reply::Raised(m)) = (&value, &reply) {
                        return Err(CaseError::Port(format!(
                            "the candidate raised where the reference computed (op of `{function}`): {m}"
                        )));
                    }
                }
                Err(crate::candidate::CallError::Unsupported(why)) => {
                    return Err(CaseError::Unsupported(why))
                }
                Err(crate::candidate::CallError::Failed(why)) => {
                    return Err(CaseError::Candidate(why))
                }
            }
        }
        let value = value?;
        let calls = crate::exactness::Calls {
            reference: crate::exactness::Sent::new(kwargs),
            port: self.perturb.then(|| crate::exactness::Sent::new(original)),
            model: crate::exactness::model_of(self.backend),
        };
        Ok((value, calls))
    }
}

/// A case that could not be evaluated (not a verdict), by who raised.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// The reference raised (its traceback and the case name are inside).
    #[error(transparent)]
    Reference(#[from] OracleError),
    /// The port (the `layers` crate) returned an error.
    #[error("the port raised: {0}")]
    Port(String),
    /// The harness itself: building inputs, reading results, its own MLX
    /// calls.
    #[error("harness: {0}")]
    Harness(String),
    /// `--candidate`: the candidate does not implement an op the case
    /// calls (a skip row with the reason, not a verdict).
    #[error("unsupported by the candidate: {0}")]
    Unsupported(String),
    /// `--candidate`: the candidate crashed, hung, or broke the protocol.
    #[error("{0}")]
    Candidate(String),
}

/// Whether a case's error message is a [`CaseError::Port`] (its Display
/// starts so): the port refused or failed where the reference did not.
pub fn is_port_error(message: &str) -> bool {
    message.starts_with("the port raised: ")
}

impl CaseError {
    /// A port error, with what was being done.
    pub fn port(what: &str, e: impl std::fmt::Display) -> Self {
        CaseError::Port(format!("{what}: {e}"))
    }
    /// A harness error, with what was being done.
    pub fn harness(what: &str, e: impl std::fmt::Display) -> Self {
        CaseError::Harness(format!("{what}: {e}"))
    }
}

/// The harness's own MLX calls (building inputs, copying results to the
/// host, measuring a finding). The port's MLX calls map their errors with
/// [`CaseError::port`] instead.
impl From<mlx_rs::error::Exception> for CaseError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        CaseError::Harness(format!("MLX: {e}"))
    }
}

impl From<oracle::TensorError> for CaseError {
    fn from(e: oracle::TensorError) -> Self {
        CaseError::Harness(e.to_string())
    }
}

/// A reference output: constructed only by [`crate::reference`] from what
/// a glue call returned, so a must-equal comparison can never be the port
/// against itself.
///
/// A numeric output also carries its exact value and bound (the second
/// oracle, [`crate::exactness`]), attached by the same wrapper from the
/// arguments the reference received.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected(
    HostTensor,
    Option<crate::exactness::ExactPair>,
    /// With `--candidate`: the candidate's arrays at this array's place in
    /// its result (see `crate::candidate::tape`).
    Option<Vec<crate::candidate::tape::Counterpart>>,
);

impl Expected {
    pub(crate) fn from_reference(t: HostTensor) -> Self {
        let counterparts = crate::candidate::active()
            .then(|| crate::candidate::tape::counterparts_of(&t))
            .flatten();
        Self(t, None, counterparts)
    }
    /// An array a reader derives from reference value `value` with
    /// `convert` (a list of floats as their bits, say); with `--candidate`
    /// the candidate's value at the same place is converted the same way.
    pub(crate) fn derived(
        value: &oracle::Value,
        convert: impl Fn(&oracle::Value) -> Result<HostTensor, String>,
    ) -> Result<Self, String> {
        let t = convert(value)?;
        let counterparts = crate::candidate::active().then(|| {
            crate::candidate::tape::values_beside(value)
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.and_then(|c| convert(&c)))
                .collect()
        });
        Ok(Self(t, None, counterparts))
    }
    /// A reference flag whose candidate counterpart is whether the
    /// candidate raised on the case's last call (refusal cases).
    pub(crate) fn raised_flag(raised: bool) -> Self {
        let flag = |v: bool| {
            HostTensor::new(oracle::DType::Uint8, vec![1], vec![u8::from(v)])
                .expect("sized by construction")
        };
        let counterparts = crate::candidate::active().then(|| {
            vec![crate::candidate::tape::last_raised()
                .map(flag)
                .ok_or_else(|| "the candidate was not called".to_owned())]
        });
        Self(flag(raised), None, counterparts)
    }
    /// Attaches the exact value this output stands for.
    /// (`None`: the definition has no value for these inputs.)
    pub(crate) fn with_exact(
        mut self,
        exact: impl Into<Option<crate::exactness::ExactPair>>,
    ) -> Self {
        self.1 = exact.into();
        self
    }
    pub fn tensor(&self) -> &HostTensor {
        &self.0
    }
    pub fn exact(&self) -> Option<&crate::exactness::ExactPair> {
        self.1.as_ref()
    }
    pub fn into_tensor(self) -> HostTensor {
        self.0
    }
    /// A conversion of the reference output (e.g. int32 widened to int64)
    /// is still a reference output (no longer the exact op's value); a
    /// candidate's counterpart is converted the same way.
    pub fn map<E: std::fmt::Display>(
        &self,
        f: impl Fn(&HostTensor) -> Result<HostTensor, E>,
    ) -> Result<Expected, E> {
        let counterparts = self.2.as_ref().map(|cs| {
            cs.iter()
                .map(|c| {
                    c.as_ref()
                        .map_err(Clone::clone)
                        .and_then(|t| f(t).map_err(|e| e.to_string()))
                })
                .collect()
        });
        f(&self.0).map(|t| Expected(t, None, counterparts))
    }
    /// What stands for the port in a comparison with this output: `port`
    /// itself, or with `--candidate` the candidate's counterpart (a
    /// differing one first), or why there is none.
    fn port_side<'a>(&'a self, port: &'a HostTensor) -> Result<&'a HostTensor, String> {
        if !crate::candidate::active() {
            return Ok(port);
        }
        let Some(counterparts) = &self.2 else {
            return Err("the reference array has no counterpart in the candidate's results (a reader that derives it; see candidate/tape.rs)".into());
        };
        if let Some(e) = counterparts.iter().find_map(|c| c.as_ref().err()) {
            return Err(e.clone());
        }
        let ok = counterparts.iter().filter_map(|c| c.as_ref().ok());
        let mut first = None;
        for t in ok {
            if t != &self.0 {
                return Ok(t);
            }
            first.get_or_insert(t);
        }
        first.ok_or_else(|| "no counterpart".to_owned())
    }
}

/// One compared output.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Output {
    pub name: String,
    pub comparison: Comparison,
    /// Set when no perturbable argument reaches this output (it is derived
    /// from constants of the case): why. The proof mode lists it instead of
    /// requiring it to differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derived: Option<String>,
    /// Both sides against the exact oracle, where the output is in its
    /// scope (arithmetic ops): the bound and each side's error relative to
    /// it. Never part of the bit verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<crate::exactness::ExactCheck>,
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
    /// sha256 of each port output's bits (dtype, shape, bytes), by name, in
    /// order: compared outputs and the tensors a finding measured.
    pub digests: Vec<(String, String)>,
    /// sha256 chained over the same tensors in order: one value for the
    /// whole case (reported; the snapshot pins [`CaseOutput::digests`]).
    pub case_digest: String,
    /// Outputs measured by the exact oracle only, not bit-compared (a
    /// finding's output whose bytes vary run to run: an unwritten buffer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exact_only: Vec<(String, crate::exactness::ExactCheck)>,
    /// With `--keep-outputs`: every compared or digested tensor, named
    /// `port/<output>` or `reference/<output>` (the release gate compares
    /// two environments' tensors element by element).
    #[serde(skip)]
    pub kept: Vec<(String, HostTensor)>,
    /// With `--candidate`: outputs the candidate gave nothing comparable
    /// for (it raised, its result lacked the place): the case is an ERROR.
    #[serde(skip)]
    pub candidate_errors: Vec<String>,
}

static KEEP_TENSORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every [`CaseOutput`] of this process keep its tensors
/// (`--keep-outputs`).
pub fn keep_tensors() {
    KEEP_TENSORS.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn keeping() -> bool {
    KEEP_TENSORS.load(std::sync::atomic::Ordering::Relaxed)
}

/// sha256 over a tensor's dtype name, shape (u64 LE) and bytes.
pub fn digest_of(t: &HostTensor) -> String {
    let mut h = Sha256::new();
    h.update(t.dtype.name().as_bytes());
    for d in &t.shape {
        h.update((*d as u64).to_le_bytes());
    }
    h.update(&t.bytes);
    format!("{:x}", h.finalize())
}

impl CaseOutput {
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }
    /// Compares one port output with the reference's and records its digest.
    pub fn compare(&mut self, name: &str, port: &HostTensor, expected: &Expected) {
        let port = match expected.port_side(port) {
            Ok(t) => t,
            Err(why) => {
                self.candidate_errors
                    .push(format!("output `{name}`: {why}"));
                return;
            }
        };
        self.digest(name, port);
        if keeping() {
            self.kept
                .push((format!("reference/{name}"), expected.tensor().clone()));
        }
        let comparison = compare(port, expected.tensor());
        let exact = expected.exact().map(|pair| {
            crate::exactness::ExactCheck::measure(
                port,
                expected.tensor(),
                pair,
                comparison.is_equal(),
            )
        });
        self.outputs.push(Output {
            name: name.into(),
            comparison,
            derived: None,
            exact,
        });
    }
    /// Like [`CaseOutput::compare`], for an output no perturbable argument
    /// reaches; `why` says what fixes it.
    pub fn compare_derived(
        &mut self,
        name: &str,
        port: &HostTensor,
        expected: &Expected,
        why: &str,
    ) {
        self.compare(name, port, expected);
        if let Some(o) = self.outputs.last_mut() {
            o.derived = Some(why.to_owned());
        }
    }
    /// Measures `port` and the reference's output against the exact
    /// oracle only (no bit comparison, no digest: for findings whose bytes
    /// vary); the check is returned and reported like a compared output's.
    pub fn measure_exact(
        &mut self,
        name: &str,
        port: &HostTensor,
        expected: &Expected,
    ) -> Result<crate::exactness::ExactCheck, CaseError> {
        let pair = expected
            .exact()
            .ok_or_else(|| CaseError::Harness(format!("`{name}` carries no exact value")))?;
        let port = expected.port_side(port).map_err(CaseError::Candidate)?;
        let equal = compare(port, expected.tensor()).is_equal();
        let check = crate::exactness::ExactCheck::measure(port, expected.tensor(), pair, equal);
        self.exact_only.push((name.to_owned(), check.clone()));
        Ok(check)
    }
    /// Every exact check of the case: compared outputs', then exact-only.
    pub fn exact_checks(&self) -> impl Iterator<Item = (&str, &crate::exactness::ExactCheck)> {
        self.outputs
            .iter()
            .filter_map(|o| Some((o.name.as_str(), o.exact.as_ref()?)))
            .chain(self.exact_only.iter().map(|(n, c)| (n.as_str(), c)))
    }
    /// Records the digest of a port tensor a finding measured.
    pub fn digest(&mut self, name: &str, t: &HostTensor) {
        self.digests.push((name.to_owned(), digest_of(t)));
        if keeping() {
            self.kept.push((format!("port/{name}"), t.clone()));
        }
        let mut h = Sha256::new();
        h.update(self.case_digest.as_bytes());
        h.update(t.dtype.name().as_bytes());
        for d in &t.shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update(&t.bytes);
        self.case_digest = format!("{:x}", h.finalize());
    }
    /// Records a measured relation.
    pub fn with_finding(mut self, finding: serde_json::Value) -> Self {
        self.finding = Some(finding);
        self
    }
    pub fn all_equal(&self) -> bool {
        self.outputs.iter().all(|o| o.comparison.is_equal())
    }
    /// The first digest name recorded twice, if any (a harness error).
    pub fn duplicate_name(&self) -> Option<&str> {
        let mut seen = std::collections::BTreeSet::new();
        self.digests
            .iter()
            .map(|(n, _)| n.as_str())
            .find(|n| !seen.insert(*n))
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
    /// Empty when the glue calls one reference function or module. Else
    /// the case is glue-composed: no single reference function exists, and
    /// these are the reference pieces the glue puts together.
    pub glue_composed: &'static [&'static str],
    pub expect: Expect,
    pub applies: Applies,
    /// Seed offset of this case (inputs are generated from run seed + this).
    pub seed: u64,
    /// Cases with the same key share host work one process memoises (the
    /// attention scenarios): the runner gives them to one worker, in
    /// order, so that work is done once per run. Never changes a bit.
    pub shares: Option<&'static str>,
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
            glue_composed: &[],
            expect: Expect::MustEqual,
            applies: Applies::Everywhere,
            seed,
            shares: None,
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
    /// Labels the case glue-composed, with the reference pieces the glue
    /// puts together (no single reference function does what it checks).
    pub fn glue_composed(mut self, pieces: &'static [&'static str]) -> Self {
        self.glue_composed = pieces;
        self
    }
    /// Marks the case as sharing memoised host work with every case of the
    /// same `key` (see [`Case::shares`]).
    pub fn sharing(mut self, key: &'static str) -> Self {
        self.shares = Some(key);
        self
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
