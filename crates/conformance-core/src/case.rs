//! What a case is.

use std::sync::Arc;

use oracle::{compare, Comparison, HostTensor, Oracle};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use crate::error::CaseError;
pub use layers::Backend;

/// Every GPU backend (for [`Case::only_on`]).
pub const GPU_BACKENDS: &[Backend] = &[Backend::Metal, Backend::Cuda];

/// What a case promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// Port and reference must produce identical bits: a verdict.
    MustEqual,
    /// A measured relation (where two paths differ, which lengths break
    /// exactness). Pinned by the tool and checked both ways: a pinned
    /// divergence that disappears is drift, as is a new one.
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

/// How deep a run goes (`--tier`): a case names the lowest tier whose runs
/// include it ([`Case::tier`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The run a user waits for: every must-equal case, and the findings
    /// that cost a single comparison over a short window.
    #[default]
    Default,
    /// Also the findings that sweep a range (the finders), re-run a whole
    /// model over another schedule, or cover more than 32k positions:
    /// what CI, the release gate, `cargo xtask fixtures accept` and the
    /// Apple bootstrap run.
    Deep,
}

impl Tier {
    /// The name `--tier` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Default => "default",
            Tier::Deep => "deep",
        }
    }
}

/// Everything a case needs while it runs. Cases reach the reference
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
    /// is the proof mode (see [`crate::param::Perturb`]).
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
    /// Marks a port output where an interceptor may inject a fault
    /// (`Interceptor::port_output` in hooks.rs): `family` and two of
    /// the case's sizes say where it is.
    pub fn port_output(&self, family: &str, m: usize, n: usize, y: &mut HostTensor) {
        crate::scope::current(|hooks| hooks.port_output(family, m, n, y));
    }
    /// Calls glue function `function` with keyword arguments. In the proof
    /// mode every parameter marked perturbable is perturbed first.
    pub(crate) fn call(
        &self,
        function: &'static str,
        params: Vec<crate::param::Param>,
    ) -> Result<oracle::Value, CaseError> {
        Ok(self.call_sent(function, params)?.0)
    }

    /// Like [`Ctx::call`], also giving the arguments each side computed
    /// from (for the exact oracle: the reference is checked on what it
    /// received, perturbed or not).
    pub(crate) fn call_sent(
        &self,
        function: &'static str,
        params: Vec<crate::param::Param>,
    ) -> Result<(oracle::Value, crate::exactness::Calls), CaseError> {
        let mut kwargs = Vec::with_capacity(params.len());
        let mut original = Vec::new();
        for p in params {
            let value = if self.perturb {
                original.push((p.name, p.value.clone()));
                crate::param::perturb(p.value, p.perturb).map_err(|what| {
                    CaseError::Harness(format!("`{function}` argument `{}`: {what}", p.name))
                })?
            } else {
                p.value
            };
            kwargs.push((p.name, value));
        }
        // The hooks' order is a contract (see hooks.rs).
        let value = crate::scope::current(|hooks| {
            hooks.before_call(self.backend);
            let value = self.oracle.call(self.case, function, &[], &kwargs);
            let call = crate::scope::ReferenceCall {
                function,
                kwargs: &kwargs,
                result: value.as_ref(),
            };
            hooks.after_call(&call);
            if let Some(substitute) = hooks.substitute().filter(|s| s.sends(function)) {
                // The substitute gets what the port gets: the unperturbed
                // arguments.
                let sent = if self.perturb { &original } else { &kwargs };
                match substitute.call(self.case, function, sent, value.as_ref().ok()) {
                    // The substitute's message names its op (the glue
                    // function's name would mean nothing to its author).
                    Ok(crate::scope::Answer::RefusedByPolicy(m)) if value.is_ok() => {
                        return Err(CaseError::Refused(m));
                    }
                    Ok(crate::scope::Answer::Raised(m)) if value.is_ok() => {
                        return Err(CaseError::SubstituteRaised(format!(
                            "the candidate raised where the reference computed: {m}"
                        )));
                    }
                    Ok(_) => {}
                    Err(crate::scope::SubstituteError::Unsupported(why)) => {
                        return Err(CaseError::Unsupported(why))
                    }
                    Err(crate::scope::SubstituteError::Failed(why)) => {
                        return Err(CaseError::Substitute(why))
                    }
                }
            }
            Ok(value?)
        })?;
        let calls = crate::exactness::Calls {
            reference: crate::exactness::Sent::new(kwargs),
            port: self.perturb.then(|| crate::exactness::Sent::new(original)),
            model: crate::exactness::model_of(self.backend),
        };
        Ok((value, calls))
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
pub struct Expected {
    tensor: HostTensor,
    exact: Option<crate::exactness::ExactPair>,
    /// What stands for the port in a comparison with this output.
    port_side: PortSide,
    /// The reference node it was read from ([`node_digest`] of the array
    /// or value in a result; `None`: whether the last call raised). Kept
    /// through [`Expected::map`], so a compared output is traced to the
    /// place in its call's result it came from (an interceptor reads it
    /// at the case's end).
    origin: Option<String>,
}

/// What a comparison with an [`Expected`] takes as the port's side.
#[derive(Debug, Clone, PartialEq)]
enum PortSide {
    /// The linked port's own tensor (no substitute in this run).
    Linked,
    /// A substitute's arrays at this array's place in its results
    /// ([`crate::scope::Substitute`]); `None`: it has none there.
    Substitute(Option<Vec<crate::scope::Counterpart>>),
}

/// The port side of a new reference output: the substitute's arrays found
/// by `find` when a substitute is installed.
fn port_side_of(
    find: impl FnOnce(&dyn crate::scope::Substitute) -> Option<Vec<crate::scope::Counterpart>>,
) -> PortSide {
    crate::scope::current(|hooks| match hooks.substitute() {
        None => PortSide::Linked,
        Some(s) => PortSide::Substitute(find(s)),
    })
}

impl Expected {
    pub(crate) fn from_reference(t: HostTensor) -> Self {
        let port_side = port_side_of(|s| s.counterparts_of(&t));
        Self {
            origin: Some(digest_of(&t)),
            tensor: t,
            exact: None,
            port_side,
        }
    }
    /// A reference output from a bare tensor, for the tool's unit tests of
    /// reports and gates; a case never calls it (tidy.rs checks).
    #[doc(hidden)]
    pub fn for_tests(t: HostTensor) -> Self {
        Self::from_reference(t)
    }
    /// An array a reader derives from reference value `value` with
    /// `convert` (a list of floats as their bits, say); with a substitute
    /// its value at the same place is converted the same way.
    pub(crate) fn derived(
        value: &oracle::Value,
        convert: impl Fn(&oracle::Value) -> Result<HostTensor, String>,
    ) -> Result<Self, String> {
        let t = convert(value)?;
        let port_side = port_side_of(|s| {
            Some(
                s.values_beside(value)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| c.and_then(|c| convert(&c)))
                    .collect(),
            )
        });
        Ok(Self {
            tensor: t,
            exact: None,
            port_side,
            origin: Some(node_digest(value)),
        })
    }
    /// A reference flag whose substitute counterpart is whether the
    /// substitute raised on the case's last call (refusal cases).
    pub(crate) fn raised_flag(raised: bool) -> Self {
        let flag = |v: bool| {
            HostTensor::new(oracle::DType::Uint8, vec![1], vec![u8::from(v)])
                .expect("sized by construction")
        };
        let port_side = port_side_of(|s| {
            Some(vec![s
                .last_raised()
                .map(flag)
                .ok_or_else(|| "the candidate was not called".to_owned())])
        });
        Self {
            tensor: flag(raised),
            exact: None,
            port_side,
            origin: None,
        }
    }
    /// Attaches the exact value this output stands for.
    /// (`None`: the definition has no value for these inputs.)
    pub fn with_exact(mut self, exact: impl Into<Option<crate::exactness::ExactPair>>) -> Self {
        self.exact = exact.into();
        self
    }
    pub fn tensor(&self) -> &HostTensor {
        &self.tensor
    }
    /// The [`node_digest`] of the reference node this output was read
    /// from (`None`: the raised flag of a refusal case).
    pub fn origin(&self) -> Option<&str> {
        self.origin.as_deref()
    }
    pub fn exact(&self) -> Option<&crate::exactness::ExactPair> {
        self.exact.as_ref()
    }
    pub fn into_tensor(self) -> HostTensor {
        self.tensor
    }
    /// A conversion of the reference output (e.g. int32 widened to int64)
    /// is still a reference output (no longer the exact op's value); a
    /// substitute's counterpart is converted the same way.
    pub fn map<E: std::fmt::Display>(
        &self,
        f: impl Fn(&HostTensor) -> Result<HostTensor, E>,
    ) -> Result<Expected, E> {
        let port_side = match &self.port_side {
            PortSide::Linked => PortSide::Linked,
            PortSide::Substitute(cs) => PortSide::Substitute(cs.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| {
                        c.as_ref()
                            .map_err(Clone::clone)
                            .and_then(|t| f(t).map_err(|e| e.to_string()))
                    })
                    .collect()
            })),
        };
        f(&self.tensor).map(|t| Expected {
            tensor: t,
            exact: None,
            port_side,
            origin: self.origin.clone(),
        })
    }
    /// What stands for the port in a comparison with this output: `port`
    /// itself, or with a substitute its counterpart (a differing one
    /// first), or why there is none.
    fn port_side<'a>(&'a self, port: &'a HostTensor) -> Result<&'a HostTensor, String> {
        let counterparts = match &self.port_side {
            PortSide::Linked => return Ok(port),
            PortSide::Substitute(None) => return Err("the reference array has no counterpart in the candidate's results (a reader that derives it; see candidate/tape.rs)".into()),
            PortSide::Substitute(Some(counterparts)) => counterparts,
        };
        if let Some(e) = counterparts.iter().find_map(|c| c.as_ref().err()) {
            return Err(e.clone());
        }
        let ok = counterparts.iter().filter_map(|c| c.as_ref().ok());
        let mut first = None;
        for t in ok {
            if t != &self.tensor {
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
    /// whole case (reported; the tool pins [`CaseOutput::digests`]).
    pub case_digest: String,
    /// Outputs measured by the exact oracle only, not bit-compared (a
    /// finding's output whose bytes vary run to run: an unwritten buffer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exact_only: Vec<(String, crate::exactness::ExactCheck)>,
    /// When an interceptor injects faults (`Interceptor::injects_faults` in
    /// hooks.rs): each applicable fault of the catalogue injected into a
    /// copy of each compared output's reference side, measured against
    /// the exact oracle. Never part of the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<crate::exactness::faults::FaultCheck>,
    /// When an interceptor asks (`Interceptor::keeps_tensors` in hooks.rs):
    /// every compared or digested tensor, named `port/<output>` or
    /// `reference/<output>`, for its case end.
    #[serde(skip)]
    pub tensors: Vec<(String, HostTensor)>,
    /// With a substitute: outputs it gave nothing comparable for (it
    /// raised, its result lacked the place): the case is an ERROR.
    #[serde(skip)]
    pub substitute_errors: Vec<String>,
    /// Each compared output's name and the reference node it was read
    /// from ([`Expected::origin`]), in comparison order: where in which
    /// call's result a compared output lives (for the interceptors).
    #[serde(skip)]
    pub origins: Vec<(String, Option<String>)>,
    /// With a substitute: outputs not compared because the substitute
    /// left out an internal intermediate (`Substitute::omitted_internal`):
    /// `(output, where and why)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_compared: Vec<(String, String)>,
}

/// Whether compared and digested tensors are kept for the case's end
/// (an interceptor asked, see `Interceptor::keeps_tensors` in hooks.rs).
fn keeping() -> bool {
    crate::scope::current(|hooks| hooks.keeps_tensors())
}

/// A content digest of any node of a reference result: an array's is
/// [`digest_of`]; a scalar's, list's or dict's hashes its kind and
/// content (a list's and dict's through their items' digests). A reader's
/// output is traced back to its place by this digest.
pub fn node_digest(v: &oracle::Value) -> String {
    use oracle::Value;
    let mut h = Sha256::new();
    match v {
        Value::Tensor(t) => return digest_of(t),
        Value::Int(i) => h.update(format!("int:{i}")),
        Value::Float(f) => h.update(format!("float:{}", f.to_bits())),
        Value::Bool(b) => h.update(format!("bool:{b}")),
        Value::Str(s) => {
            h.update("str:");
            h.update(s.as_bytes());
        }
        Value::None => h.update("none"),
        Value::List(items) => {
            h.update(format!("list:{}", items.len()));
            for item in items {
                h.update(node_digest(item));
            }
        }
        Value::Dict(map) => {
            h.update(format!("dict:{}", map.len()));
            for (k, item) in map {
                h.update(k.as_bytes());
                h.update([0]);
                h.update(node_digest(item));
            }
        }
    }
    format!("{:x}", h.finalize())
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
        self.origins
            .push((name.to_owned(), expected.origin.clone()));
        if let Some(place) = expected.origin.as_deref().and_then(|o| {
            crate::scope::current(|h| h.substitute().and_then(|s| s.omitted_internal(o)))
        }) {
            self.not_compared.push((
                name.to_owned(),
                format!("{place}: internal, left out by the candidate"),
            ));
            return;
        }
        let port = match expected.port_side(port) {
            Ok(t) => t,
            Err(why) => {
                self.substitute_errors
                    .push(format!("output `{name}`: {why}"));
                return;
            }
        };
        self.digest(name, port);
        if keeping() {
            self.tensors
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
        if let Some(pair) = expected.exact() {
            if crate::scope::current(|hooks| hooks.injects_faults()) {
                self.faults.extend(crate::exactness::faults::inject_all(
                    name,
                    expected.tensor(),
                    pair,
                ));
            }
        }
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
        let port = expected.port_side(port).map_err(CaseError::Substitute)?;
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
            self.tensors.push((format!("port/{name}"), t.clone()));
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
    /// attention scenarios): whoever runs cases gives them to one process, in
    /// order, so that work is done once per run. Never changes a bit.
    pub shares: Option<&'static str>,
    /// The lowest tier whose runs include this case.
    pub tier: Tier,
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
            tier: Tier::Default,
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
    /// Runs the case only in the deep tier (`--tier deep`): for findings
    /// that re-run the reference over another schedule, a sweep or a long
    /// window, which the default run leaves to CI and the gate.
    pub fn deep(mut self) -> Self {
        self.tier = Tier::Deep;
        self
    }
    /// [`Case::deep`] when a window ends beyond `long` positions.
    pub fn deep_beyond(self, end: usize, long: usize) -> Self {
        if end > long {
            self.deep()
        } else {
            self
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

/// A case's name as one file name stem: every `/` as `__`. Every file a
/// case owns (its pinned record, its kept tensors, its golden vectors) is
/// named by this one rule, so names that collide here collide everywhere.
pub fn file_stem(name: &str) -> String {
    name.replace('/', "__")
}
