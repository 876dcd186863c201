//! One embedded CPython 3.11 running the pinned reference.
//!
//! The interpreter is started once per process and shared: every case goes
//! through the same imported modules. Reference submodules are imported by
//! the glue module (`python/reference_glue.py`) without running the
//! packages' `__init__`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::guards::{self, GuardError};
use crate::tensor::{DType, HostTensor, TensorError};

const GLUE_SOURCE: &str = include_str!("../python/reference_glue.py");

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
    #[error("the embedded Python could not start: {0}. Fix: `cargo xtask setup`, then rebuild")]
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
    pub metal_available: bool,
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

    /// Routes the reference's default device (`mx.set_default_device`).
    pub fn set_device(&self, gpu: bool) -> Result<(), OracleError> {
        self.call(
            "<setup>",
            "set_device",
            &[Arg::from(if gpu { "gpu" } else { "cpu" })],
            &[],
        )
        .map(|_| ())
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
    // The binary links the wheel's libmlx at <site-packages>/mlx/lib/libmlx.*:
    // the reference environment is the one this binary was built against.
    let libmlx = PathBuf::from(mlx_sys::LINKED_LIBMLX);
    let site_packages = libmlx
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .ok_or_else(|| {
            OracleError::Startup(format!("unexpected libmlx path {}", libmlx.display()))
        })?;
    if !site_packages.join("mlx").is_dir() {
        return Err(OracleError::Startup(format!(
            "reference site-packages {} is missing (environment deleted?)",
            site_packages.display()
        )));
    }
    Python::initialize();
    let startup = |e: PyErr| Python::attach(|py| OracleError::Startup(format_exception(py, &e)));
    let glue = Python::attach(|py| -> PyResult<Py<PyModule>> {
        let sys = py.import("sys")?;
        let path = sys.getattr("path")?;
        path.call_method1("insert", (0, site_packages.display().to_string()))?;
        let code = CString::new(GLUE_SOURCE).expect("glue source has no NUL");
        let module = PyModule::from_code(py, &code, c"reference_glue.py", c"reference_glue")?;
        module.setattr("SITE_PACKAGES", site_packages.display().to_string())?;
        Ok(module.unbind())
    })
    .map_err(startup)?;
    let (mlx_version, metal_available) = Python::attach(|py| -> PyResult<(String, bool)> {
        let env = glue.bind(py).getattr("environment")?.call0()?;
        Ok((
            env.get_item("mlx_version")?.extract()?,
            env.get_item("metal_available")?.extract()?,
        ))
    })
    .map_err(startup)?;
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
            metal_available,
            libmlx,
            site_packages,
        },
    })
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
