//! One embedded CPython (3.11, 3.12 or 3.13: the one setup took) running the pinned reference.
//!
//! The interpreter is started once per process and shared: every case goes
//! through the same imported modules. Reference submodules are imported by
//! the glue package (`python/reference_glue/`, embedded in the binary; see
//! [`GLUE_MODULES`]) without running the packages' `__init__`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::guards::{self, GuardError};
use crate::tensor::{DType, HostTensor, TensorError};

/// `(name, source of python/reference_glue/<name>.py)` for each name.
macro_rules! glue_modules {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../python/reference_glue/", $name, ".py")))),*]
    };
}

/// The glue package: one small module per concern, embedded in the binary
/// (`include_str!`), in dependency order (a module imports only modules
/// listed before it, by absolute name: `from reference_glue.core import
/// load`). Each runs as `reference_glue.<module>`; its public functions (no
/// leading underscore, defined in that module) are also exposed on the
/// `reference_glue` namespace that [`Oracle::call`] looks functions up on.
const GLUE_MODULES: &[(&str, &str)] = glue_modules![
    "core",
    "selftest",
    "smoke",
    "quantized",
    "quantized_linears",
    "quantized_switches",
    "checkpoints",
    "dense",
    "position_common",
    "position_index",
    "position_mrope",
    "position_kernel",
    "position_gemma4",
    "configs",
    "quantized_extras",
    "adapters",
    "attention",
    "bench",
    "model",
];

/// The glue package's name, and the directory its files live in (what
/// tracebacks name, relative to the workspace root).
const GLUE_PACKAGE: &str = "reference_glue";
const GLUE_DIR: &str = "crates/oracle/python/reference_glue";

/// Errors from the oracle.
#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    /// The reference raised. `traceback` is Python's own formatted traceback.
    #[error("case `{case}`: the reference raised in `{function}`:\n{traceback}")]
    Python {
        case: String,
        function: String,
        traceback: String,
    },
    #[error("the embedded Python could not start: {0}. Fix: {fix}", fix = startup_fix())]
    Startup(String),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(
        "case `{case}`: reference `{function}` returned {what}, which the oracle does not transfer"
    )]
    Unsupported {
        case: String,
        function: String,
        what: String,
    },
    #[error("case `{case}`: {source}")]
    Tensor { case: String, source: TensorError },
}

/// An argument to a reference call.
#[derive(Debug, Clone)]
pub enum Arg {
    Tensor(HostTensor),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    None,
    List(Vec<Arg>),
}

impl From<HostTensor> for Arg {
    fn from(t: HostTensor) -> Self {
        Arg::Tensor(t)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::Int(v.into())
    }
}
impl From<usize> for Arg {
    fn from(v: usize) -> Self {
        Arg::Int(v as i64)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::Float(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Str(v)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Str(v.to_owned())
    }
}
impl<T: Into<Arg>> From<Option<T>> for Arg {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::None, Into::into)
    }
}

/// A value returned by a reference call.
#[derive(Debug, Clone)]
pub enum Value {
    Tensor(HostTensor),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    None,
    List(Vec<Value>),
    Dict(BTreeMap<String, Value>),
}

impl Value {
    /// The tensor, or an error naming what came back instead.
    pub fn tensor(self) -> Option<HostTensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// The elements of a list or tuple.
    pub fn into_list(self) -> Option<Vec<Value>> {
        match self {
            Value::List(v) => Some(v),
            _ => None,
        }
    }
}

/// What the embedded reference reports about itself.
#[derive(Debug, Clone)]
pub struct ReferenceInfo {
    pub mlx_version: String,
    /// The GPU backend the reference's MLX can run on here (`mx.gpu` is
    /// Metal when `mx.metal.is_available()`, CUDA when
    /// `mx.cuda.is_available()`), or `None`.
    pub gpu_backend: Option<layers::Backend>,
    pub libmlx: String,
    pub site_packages: PathBuf,
}

/// Handle to the embedded reference. Cheap to copy; all handles share one
/// interpreter.
#[derive(Debug, Clone, Copy)]
pub struct Oracle {
    state: &'static State,
}

#[derive(Debug)]
struct State {
    glue: Py<PyModule>,
    info: ReferenceInfo,
}

static STATE: OnceLock<Result<State, String>> = OnceLock::new();

impl Oracle {
    /// Starts the interpreter (once per process), imports the glue, and runs
    /// the guards: exactly one libmlx mapped, Python's MLX version equal to
    /// the linked one.
    pub fn start() -> Result<Oracle, OracleError> {
        let state = STATE.get_or_init(|| start_state().map_err(|e| e.to_string()));
        match state {
            Ok(state) => Ok(Oracle { state }),
            Err(message) => Err(OracleError::Startup(message.clone())),
        }
    }

    pub fn info(&self) -> &ReferenceInfo {
        &self.state.info
    }

    /// Routes the reference's default device (`mx.set_default_device`) to
    /// `backend`; the glue refuses a GPU backend its MLX does not have.
    pub fn set_device(&self, backend: layers::Backend) -> Result<(), OracleError> {
        self.call("<setup>", "set_device", &[Arg::from(backend.as_str())], &[])
            .map(|_| ())
    }

    /// What the reference reports about the device `backend` runs on:
    /// `name` (the device's own name, e.g. `NVIDIA H200`), `architecture`
    /// (e.g. `sm_90`, `applegpu_g13s`), and for CUDA the driver and CUDA
    /// versions when MLX reports them. Values are strings; absent keys
    /// were not reported.
    pub fn device_info(
        &self,
        backend: layers::Backend,
    ) -> Result<std::collections::BTreeMap<String, String>, OracleError> {
        let value = self.call(
            "<setup>",
            "device_info",
            &[Arg::from(backend.as_str())],
            &[],
        )?;
        let mut info = std::collections::BTreeMap::new();
        if let Value::Dict(d) = value {
            for (k, v) in d {
                if let Value::Str(s) = v {
                    info.insert(k, s);
                }
            }
        }
        Ok(info)
    }

    /// Calls glue function `function` with positional `args` and keyword
    /// `kwargs`, on behalf of case `case` (named in every error).
    pub fn call(
        &self,
        case: &str,
        function: &str,
        args: &[Arg],
        kwargs: &[(&str, Arg)],
    ) -> Result<Value, OracleError> {
        Python::attach(|py| {
            let glue = self.state.glue.bind(py);
            let raised = |e: PyErr| OracleError::Python {
                case: case.to_owned(),
                function: function.to_owned(),
                traceback: format_exception(py, &e),
            };
            let py_args: Vec<Bound<PyAny>> = args
                .iter()
                .map(|a| to_python(py, glue, a))
                .collect::<PyResult<_>>()
                .map_err(raised)?;
            let py_kwargs = PyDict::new(py);
            for (k, v) in kwargs {
                py_kwargs
                    .set_item(k, to_python(py, glue, v).map_err(raised)?)
                    .map_err(raised)?;
            }
            let result = glue
                .getattr(function)
                .and_then(|f| f.call(PyTuple::new(py, py_args)?, Some(&py_kwargs)))
                .map_err(raised)?;
            from_python(glue, &result).map_err(|e| match e {
                Convert::Py(e) => raised(e),
                Convert::Unsupported(what) => OracleError::Unsupported {
                    case: case.to_owned(),
                    function: function.to_owned(),
                    what,
                },
                Convert::Tensor(source) => OracleError::Tensor {
                    case: case.to_owned(),
                    source,
                },
            })
        })
    }
}

fn start_state() -> Result<State, OracleError> {
    // The standard library and the reference packages come from the
    // environment this binary was built against, or from the bundle it runs
    // in; never from PATH, PYTHONHOME or PYTHONPATH (see `python_layout`).
    let layout = python_layout()?;
    start_python(&layout)?;
    Python::initialize();
    Python::attach(|py| check_stdlib(py, &layout))?;
    let site_packages = layout.site_packages.clone();
    let startup = |e: PyErr| Python::attach(|py| OracleError::Startup(format_exception(py, &e)));
    let glue = Python::attach(|py| -> PyResult<Py<PyModule>> {
        let sys = py.import("sys")?;
        let path = sys.getattr("path")?;
        path.call_method1("insert", (0, site_packages.display().to_string()))?;
        Ok(load_glue(py, &site_packages.display().to_string())?.unbind())
    })
    .map_err(startup)?;
    let (mlx_version, gpu_backend) = Python::attach(|py| -> PyResult<(String, Option<String>)> {
        let env = glue.bind(py).getattr("environment")?.call0()?;
        Ok((
            env.get_item("mlx_version")?.extract()?,
            env.get_item("gpu_backend")?.extract()?,
        ))
    })
    .map_err(startup)?;
    let gpu_backend = gpu_backend
        .map(|name| name.parse::<layers::Backend>())
        .transpose()
        .map_err(|e| OracleError::Startup(format!("the glue reported {e}")))?;
    // Rust's MLX must be initialised too before the maps are read.
    mlx_rs::Array::from_int(0)
        .eval()
        .map_err(|e| OracleError::Startup(e.to_string()))?;
    guards::check_versions(&mlx_version)?;
    let libmlx = guards::check_single_libmlx()?;
    Ok(State {
        glue,
        info: ReferenceInfo {
            mlx_version,
            gpu_backend,
            libmlx,
            site_packages,
        },
    })
}

/// Executes the glue package ([`GLUE_MODULES`]) and returns the
/// `reference_glue` namespace Rust calls functions on.
///
/// `reference_glue` is registered in `sys.modules` as a package with an
/// empty `__path__` (nothing is imported from disk); each module is
/// executed by `PyModule::from_code` as `reference_glue.<module>` from file
/// `crates/oracle/python/reference_glue/<module>.py` (the name tracebacks
/// show; its lines are put in `linecache`, so tracebacks quote them even
/// where the file is absent, as in a bundle), registered in `sys.modules`
/// and set on the package. The core module gets `SITE_PACKAGES` before any
/// other module runs. Every public function is copied onto the package; a
/// name claimed twice (two functions, or a function and a module) refuses
/// to start.
fn load_glue<'py>(py: Python<'py>, site_packages: &str) -> PyResult<Bound<'py, PyModule>> {
    let c_string = |text: &str| {
        CString::new(text).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    };
    let sys_modules = py.import("sys")?.getattr("modules")?;
    let linecache = py.import("linecache")?.getattr("cache")?;
    let function_type = py.import("types")?.getattr("FunctionType")?;
    let package = PyModule::new(py, GLUE_PACKAGE)?;
    package.setattr("__path__", PyList::empty(py))?;
    package.setattr("__package__", GLUE_PACKAGE)?;
    sys_modules.set_item(GLUE_PACKAGE, &package)?;
    // Each name on the namespace, and the module that defines it.
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    let mut claim = |name: &str, owner: &str| -> PyResult<()> {
        match owners.insert(name.to_owned(), owner.to_owned()) {
            Some(first) => Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "glue name `{name}` is defined twice: by {first} and by {owner}"
            ))),
            None => Ok(()),
        }
    };
    for (name, source) in GLUE_MODULES {
        let qualified = format!("{GLUE_PACKAGE}.{name}");
        let file = format!("{GLUE_DIR}/{name}.py");
        let lines = PyString::new(py, source).call_method1("splitlines", (true,))?;
        linecache.set_item(&file, (source.len(), py.None(), lines, &file))?;
        let module = PyModule::from_code(
            py,
            &c_string(source)?,
            &c_string(&file)?,
            &c_string(&qualified)?,
        )?;
        if *name == "core" {
            module.setattr("SITE_PACKAGES", site_packages)?;
        }
        claim(name, &format!("the module {qualified}"))?;
        package.setattr(*name, &module)?;
        for (key, value) in module.dict().iter() {
            let key: String = key.extract()?;
            if key.starts_with('_')
                || !value.is_instance(&function_type)?
                || value.getattr("__module__")?.extract::<String>()? != qualified
            {
                continue;
            }
            claim(&key, &qualified)?;
            package.setattr(key.as_str(), value)?;
        }
    }
    Ok(package)
}

/// Set by the bundle launcher (`cargo xtask bundle`) to the bundle
/// directory: the interpreter then takes its standard library and the
/// reference packages from `<home>/python`.
pub const BUNDLE_HOME_ENV: &str = "MLX_CONFORMANCE_HOME";

/// Where the embedded interpreter takes its standard library and the
/// reference packages from. Decided before it starts and never from `PATH`,
/// `PYTHONHOME`, `PYTHONPATH` or the current directory:
///
/// - workspace: the reference venv this binary was built against (the one
///   holding the linked libmlx). CPython starts as that venv's `python`
///   would: it reads the venv's `pyvenv.cfg` for the base interpreter (whose
///   libpython this binary links) and its standard library;
/// - bundle ([`BUNDLE_HOME_ENV`] set): `home` is `<bundle>/python`, holding
///   `lib/python3.X/` (the standard library, with `site-packages/` inside).
#[derive(Debug, Clone)]
struct PythonLayout {
    /// The bundle directory, when running from one.
    bundle: Option<PathBuf>,
    /// CPython's `home` (what `PYTHONHOME` would set); bundle only.
    home: Option<PathBuf>,
    /// `sys.executable`: the venv's python, or (bundle) this binary.
    executable: PathBuf,
    /// The directory that must hold the standard library's `os.py`.
    stdlib: PathBuf,
    /// The reference packages.
    site_packages: PathBuf,
}

/// `python3.X` of the libpython this binary links (the name of its
/// standard library's directory under `<prefix>/lib`).
pub fn python_lib_dir_name() -> String {
    // SAFETY: Py_GetVersion returns a static NUL-terminated string and may
    // be called before the interpreter is initialised.
    let version = unsafe { std::ffi::CStr::from_ptr(pyo3::ffi::Py_GetVersion()) };
    let version = version.to_string_lossy();
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    format!(
        "python{}.{}",
        parts.next().unwrap_or("3"),
        parts.next().unwrap_or("11")
    )
}

/// The fix to name when the interpreter cannot start.
fn startup_fix() -> String {
    match std::env::var_os(BUNDLE_HOME_ENV).filter(|v| !v.is_empty()) {
        Some(home) => format!(
            "the bundle at {} is incomplete or damaged; rebuild it with `cargo xtask bundle`",
            PathBuf::from(home).display()
        ),
        None => "`cargo xtask setup`, then rebuild".to_owned(),
    }
}

fn python_layout() -> Result<PythonLayout, OracleError> {
    let version_dir = python_lib_dir_name();
    if let Some(bundle) = std::env::var_os(BUNDLE_HOME_ENV).filter(|v| !v.is_empty()) {
        let bundle = std::path::absolute(PathBuf::from(bundle))
            .map_err(|e| OracleError::Startup(format!("{BUNDLE_HOME_ENV}: {e}")))?;
        let home = bundle.join("python");
        let stdlib = home.join("lib").join(&version_dir);
        let site_packages = stdlib.join("site-packages");
        for (what, dir) in [
            ("standard library", &stdlib),
            ("reference packages", &site_packages),
        ] {
            if !dir.is_dir() {
                return Err(OracleError::Startup(format!(
                    "{BUNDLE_HOME_ENV}={}: the bundle's {what} ({}) is missing",
                    bundle.display(),
                    dir.display()
                )));
            }
        }
        let executable = std::env::current_exe().unwrap_or_else(|_| bundle.join("bin/conformance"));
        return Ok(PythonLayout {
            bundle: Some(bundle),
            home: Some(home),
            executable,
            stdlib,
            site_packages,
        });
    }
    // The binary links the wheel's libmlx at
    // <venv>/lib/python3.X/site-packages/mlx/lib/libmlx.*: the reference
    // environment is the one this binary was built against.
    let libmlx = PathBuf::from(mlx_sys::LINKED_LIBMLX);
    let (Some(site_packages), Some(venv)) = (libmlx.ancestors().nth(3), libmlx.ancestors().nth(6))
    else {
        return Err(OracleError::Startup(format!(
            "unexpected libmlx path {}",
            libmlx.display()
        )));
    };
    if !site_packages.join("mlx").is_dir() {
        return Err(OracleError::Startup(format!(
            "reference site-packages {} is missing (environment deleted?)",
            site_packages.display()
        )));
    }
    let cfg_path = venv.join("pyvenv.cfg");
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| {
        OracleError::Startup(format!(
            "the reference venv's {} is unreadable ({e}; environment deleted?)",
            cfg_path.display()
        ))
    })?;
    // `home = <base interpreter's bin dir>`: its prefix holds the stdlib.
    let base_bin = cfg
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(key, _)| key.trim() == "home")
        .map(|(_, value)| PathBuf::from(value.trim()))
        .ok_or_else(|| OracleError::Startup(format!("{} names no `home`", cfg_path.display())))?;
    // `<prefix>/bin` next to `<prefix>/lib/python3.X`; CPython follows a
    // symlinked base interpreter (Homebrew) to its real prefix.
    let lib_of = |bin: &std::path::Path| bin.parent().map(|p| p.join("lib").join(&version_dir));
    let real_bin = std::fs::canonicalize(base_bin.join(version_dir.as_str()))
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from));
    let candidates: Vec<PathBuf> = [lib_of(&base_bin), real_bin.as_deref().and_then(lib_of)]
        .into_iter()
        .flatten()
        .collect();
    let Some(stdlib) = candidates
        .iter()
        .find(|dir| dir.join("os.py").is_file())
        .cloned()
    else {
        return Err(OracleError::Startup(format!(
            "the standard library of the reference's base interpreter ({}, from {}) is missing",
            candidates.first().map_or_else(
                || base_bin.display().to_string(),
                |p| p.display().to_string()
            ),
            cfg_path.display()
        )));
    };
    let executable = ["python", "python3"]
        .iter()
        .map(|name| venv.join("bin").join(name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            OracleError::Startup(format!(
                "the reference venv {} has no bin/python",
                venv.display()
            ))
        })?;
    Ok(PythonLayout {
        bundle: None,
        home: None,
        executable,
        stdlib,
        site_packages: site_packages.to_path_buf(),
    })
}

/// Starts CPython with an explicit, isolated configuration (the equivalent
/// of `python -I`: `PYTHONPATH`, `PYTHONHOME` and every other `PYTHON*`
/// variable, the user site directory and the current directory are
/// ignored), UTF-8 mode on whatever the locale, and the program location
/// fixed by `layout` instead of searched on `PATH`.
fn start_python(layout: &PythonLayout) -> Result<(), OracleError> {
    use pyo3::ffi;
    use std::mem::MaybeUninit;
    use std::os::unix::ffi::OsStrExt;

    fn check(status: ffi::PyStatus, step: &str) -> Result<(), OracleError> {
        // SAFETY: PyStatus_Exception reads a status by value; its strings
        // are static C strings or null.
        unsafe {
            if ffi::PyStatus_Exception(status) == 0 {
                return Ok(());
            }
            let text = |p: *const std::ffi::c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            Err(OracleError::Startup(format!(
                "CPython {step} failed: {} {}",
                text(status.func),
                text(status.err_msg)
            )))
        }
    }

    // SAFETY: the interpreter is configured and started once, before any
    // other Python API call of this process (Oracle::start runs this inside
    // a OnceLock); the config is initialised by CPython, filled through its
    // setters, and cleared after use. The GIL is released at the end, as
    // pyo3's own initialisation does.
    unsafe {
        if ffi::Py_IsInitialized() != 0 {
            // Started by someone else: the post-start check still applies.
            return Ok(());
        }
        let mut pre = MaybeUninit::<ffi::PyPreConfig>::zeroed();
        ffi::PyPreConfig_InitIsolatedConfig(pre.as_mut_ptr());
        let mut pre = pre.assume_init();
        pre.utf8_mode = 1;
        check(ffi::Py_PreInitialize(&pre), "pre-initialisation")?;

        let mut config = Box::new(MaybeUninit::<ffi::PyConfig>::zeroed());
        let config = config.as_mut_ptr();
        ffi::PyConfig_InitIsolatedConfig(config);
        let set = |field: *mut *mut libc::wchar_t, value: &std::path::Path, what: &str| {
            let value = CString::new(value.as_os_str().as_bytes()).map_err(|_| {
                OracleError::Startup(format!("{what} {} contains NUL", value.display()))
            })?;
            check(
                ffi::PyConfig_SetBytesString(config, field, value.as_ptr()),
                &format!("configuration of {what}"),
            )
        };
        let configured = (|| {
            set(
                std::ptr::addr_of_mut!((*config).program_name),
                &layout.executable,
                "program_name",
            )?;
            set(
                std::ptr::addr_of_mut!((*config).executable),
                &layout.executable,
                "executable",
            )?;
            if let Some(home) = &layout.home {
                set(std::ptr::addr_of_mut!((*config).home), home, "home")?;
            }
            // A bundle may be read-only and is never modified by a run.
            (*config).write_bytecode = i32::from(layout.bundle.is_none());
            check(ffi::Py_InitializeFromConfig(config), "initialisation")
        })();
        ffi::PyConfig_Clear(config);
        configured?;
        ffi::PyEval_SaveThread();
    }
    Ok(())
}

/// Refuses an interpreter whose standard library is not the one `layout`
/// names (e.g. started by someone else before the oracle).
fn check_stdlib(py: Python<'_>, layout: &PythonLayout) -> Result<(), OracleError> {
    let os_file: PyResult<String> = py
        .import("os")
        .and_then(|os| os.getattr("__file__"))
        .and_then(|f| f.extract());
    let os_file = os_file.map_err(|e| OracleError::Startup(format_exception(py, &e)))?;
    let found = std::fs::canonicalize(&os_file)
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from));
    let expected = std::fs::canonicalize(&layout.stdlib).ok();
    if found.is_none() || found != expected {
        return Err(OracleError::Startup(format!(
            "the embedded Python took its standard library from {os_file}, not from {}",
            layout.stdlib.display()
        )));
    }
    Ok(())
}

fn format_exception(py: Python<'_>, e: &PyErr) -> String {
    let formatted = py.import("traceback").and_then(|tb| {
        tb.getattr("format_exception")?
            .call1((e.get_type(py), e.value(py), e.traceback(py)))?
            .extract::<Vec<String>>()
    });
    match formatted {
        Ok(lines) => lines.concat(),
        Err(_) => e.to_string(),
    }
}

fn to_python<'py>(
    py: Python<'py>,
    glue: &Bound<'py, PyModule>,
    arg: &Arg,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match arg {
        Arg::Tensor(t) => glue.getattr("to_mx")?.call1((
            t.dtype.name(),
            PyTuple::new(py, &t.shape)?,
            PyBytes::new(py, &t.bytes),
        ))?,
        Arg::Int(v) => v.into_pyobject(py)?.into_any(),
        Arg::Float(v) => v.into_pyobject(py)?.into_any(),
        Arg::Bool(v) => PyBool::new(py, *v).to_owned().into_any(),
        Arg::Str(v) => PyString::new(py, v).into_any(),
        Arg::None => py.None().into_bound(py),
        Arg::List(items) => {
            let items = items
                .iter()
                .map(|a| to_python(py, glue, a))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
    })
}

enum Convert {
    Py(PyErr),
    Unsupported(String),
    Tensor(TensorError),
}

impl From<PyErr> for Convert {
    fn from(e: PyErr) -> Self {
        Convert::Py(e)
    }
}

fn from_python(glue: &Bound<'_, PyModule>, obj: &Bound<'_, PyAny>) -> Result<Value, Convert> {
    if obj.is_none() {
        return Ok(Value::None);
    }
    if glue.getattr("is_array")?.call1((obj,))?.extract::<bool>()? {
        let (name, shape, data): (String, Vec<usize>, Vec<u8>) =
            glue.getattr("from_mx")?.call1((obj,))?.extract()?;
        let dtype = DType::from_name(&name).map_err(Convert::Tensor)?;
        return HostTensor::new(dtype, shape, data)
            .map(Value::Tensor)
            .map_err(Convert::Tensor);
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.extract()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Value::Int(obj.extract()?));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(obj.extract()?));
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(Value::Str(obj.extract()?));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for item in obj.try_iter()? {
            items.push(from_python(glue, &item?)?);
        }
        return Ok(Value::List(items));
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = BTreeMap::new();
        for (k, v) in dict.iter() {
            map.insert(k.str()?.to_string(), from_python(glue, &v)?);
        }
        return Ok(Value::Dict(map));
    }
    Err(Convert::Unsupported(obj.get_type().name()?.to_string()))
}
