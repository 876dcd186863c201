//! Builds mlx-c (sources prepared by `cargo xtask setup`) against the pinned
//! MLX wheel's headers and libmlx, links libmlx dynamically, and generates
//! the same bindings as crates.io mlx-sys 0.7.0.
//!
//! The reference environment is `$MLX_REFERENCE_DIR` (relative to the
//! workspace root or absolute; default `.reference`, the CUDA one is
//! `.reference-cuda`); its `fingerprint.json` says where the wheel is and
//! which backend (`cpu`, `metal`, `cuda`) it is for.
//!
//! Exported to this crate (`env!`): `MLX_SYS_BACKEND`,
//! `MLX_SYS_REFERENCE_DIR` (absolute), `MLX_SYS_RUNTIME_DIRS`,
//! `MLX_SYS_LINKED_LIBMLX`, `MLX_SYS_MLX_VERSION`. Exported to dependents'
//! build scripts (`links = "mlx"`): `DEP_MLX_RUNTIME_DIRS` (rpath
//! directories) and `DEP_MLX_LINK_ARGS` (extra linker arguments, separated
//! by spaces), since link arguments printed here do not reach their binaries.

use std::env;
use std::path::{Path, PathBuf};

/// mlx-c's own source list (its CMakeLists.txt; object.cpp is disabled there).
const MLX_C_SOURCES: &[&str] = &[
    "array",
    "closure",
    "compile",
    "cuda",
    "device",
    "distributed",
    "distributed_group",
    "error",
    "export",
    "fast",
    "fft",
    "graph_utils",
    "io",
    "io_types",
    "linalg",
    "map",
    "memory",
    "metal",
    "ops",
    "random",
    "stream",
    "string",
    "transforms",
    "transforms_impl",
    "vector",
    "version",
];

/// The variable that selects the reference environment.
const REFERENCE_DIR_VAR: &str = "MLX_REFERENCE_DIR";
const DEFAULT_REFERENCE_DIR: &str = ".reference";

struct Reference {
    /// Absolute env dir.
    dir: PathBuf,
    backend: String,
    mlx_dir: PathBuf,
    mlx_c_dir: PathBuf,
    python_libdir: PathBuf,
    mlx_version: String,
}

fn fail(msg: &str, setup: &str) -> ! {
    // A build script's panic is how cargo reports a failed build; the message
    // is what the user reads, so it names the fix.
    panic!("\n\nmlx-sys: {msg}\n  fix: run `{setup}` in the workspace root\n\n");
}

/// The set-up command that (re)builds the env in `dir`.
fn setup_command(dir: &Path) -> &'static str {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    if name.is_some_and(|n| n.ends_with("-cuda")) {
        "cargo xtask setup --backend cuda"
    } else {
        "cargo xtask setup"
    }
}

fn read_reference(workspace: &Path) -> Reference {
    println!("cargo:rerun-if-env-changed={REFERENCE_DIR_VAR}");
    let selected = env::var_os(REFERENCE_DIR_VAR)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_REFERENCE_DIR.into());
    let dir = workspace.join(&selected);
    let dir = dir.canonicalize().unwrap_or(dir);
    let setup = setup_command(&dir);
    let fingerprint = dir.join("fingerprint.json");
    println!("cargo:rerun-if-changed={}", fingerprint.display());
    let text = std::fs::read_to_string(&fingerprint).unwrap_or_else(|_| {
        fail(
            &format!(
                "the reference environment is not set up ({} is missing; \
                 {REFERENCE_DIR_VAR}={})",
                fingerprint.display(),
                Path::new(&selected).display()
            ),
            setup,
        )
    });
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        fail(
            &format!("{} is not valid JSON: {e}", fingerprint.display()),
            setup,
        )
    });
    let field = |name: &str| -> String {
        json.get(name)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                fail(
                    &format!(
                        "{} has no `{name}` (written by an older set-up?)",
                        fingerprint.display()
                    ),
                    setup,
                )
            })
    };
    let backend = field("backend");
    if !matches!(backend.as_str(), "cpu" | "metal" | "cuda") {
        fail(
            &format!(
                "{} names an unknown backend `{backend}`",
                fingerprint.display()
            ),
            setup,
        );
    }
    Reference {
        dir,
        backend,
        mlx_dir: field("mlx_dir").into(),
        mlx_c_dir: workspace.join(field("mlx_c_dir")),
        python_libdir: field("python_libdir").into(),
        mlx_version: field("mlx_version"),
    }
}

/// MLX 0.32.3 added `global_scale` to `mlx::core::gather_qmm` before
/// `sorted_indices`; mlx-c 0.x (mlx-sys 0.7.0) still passes
/// `sorted_indices` there, which no longer compiles. When the headers
/// declare it, `ops.cpp` is compiled from a copy that passes
/// `std::nullopt` for it (the C API, and so the port, has no global scale
/// for `gather_qmm`). Other sources, and older MLX, compile unchanged.
fn gather_qmm_compat(source: &Path, include: &Path, out_dir: &Path) -> Option<PathBuf> {
    if source.file_name()? != "ops.cpp" {
        return None;
    }
    let header = std::fs::read_to_string(include.join("mlx/ops.h")).ok()?;
    let declaration = header
        .split("array gather_qmm(")
        .nth(1)?
        .split(';')
        .next()?;
    if !declaration.contains("global_scale") {
        return None;
    }
    let text = std::fs::read_to_string(source).ok()?;
    let (head, tail) = text.split_once("int mlx_gather_qmm(")?;
    let (body, rest) = tail.split_once("extern \"C\"")?;
    let call = "std::string(mode),\n            sorted_indices,";
    if !body.contains(call) {
        return None;
    }
    let patched_body = body.replacen(
        call,
        "std::string(mode),\n            std::nullopt,\n            sorted_indices,",
        1,
    );
    let patched = format!("{head}int mlx_gather_qmm({patched_body}extern \"C\"{rest}");
    let file = out_dir.join("ops_gather_qmm_compat.cpp");
    std::fs::write(&file, patched).ok()?;
    println!("cargo:warning=mlx-sys: MLX headers declare gather_qmm(..., global_scale, sorted_indices): compiling mlx-c ops.cpp with std::nullopt for it");
    Some(file)
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.join("../..").canonicalize().unwrap();
    let reference = read_reference(&workspace);
    let setup = setup_command(&reference.dir);
    let include = reference.mlx_dir.join("include");
    let libdir = reference.mlx_dir.join("lib");
    let mlx_c = &reference.mlx_c_dir;
    for dir in [&include, &libdir, mlx_c] {
        if !dir.is_dir() {
            fail(
                &format!(
                    "{} does not exist (environment half-built or deleted)",
                    dir.display()
                ),
                setup,
            );
        }
    }
    let native = manifest.join("native");
    println!("cargo:rerun-if-changed={}", native.display());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(mlx_c)
        .include(&include)
        .flag_if_supported("-w")
        .flag(format!(
            "-include{}",
            native.join("format_compat.h").display()
        ));
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    for name in MLX_C_SOURCES {
        let source = mlx_c.join(format!("mlx/c/{name}.cpp"));
        build.file(gather_qmm_compat(&source, &include, &out_dir).unwrap_or(source));
    }
    build.file(native.join("half_accessors.cpp"));
    build.compile("mlxc");

    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    let libmlx = if cfg!(target_os = "macos") {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    };
    let runtime_dirs = env::join_paths([&libdir, &reference.python_libdir]).unwrap();
    // Dependents read these as DEP_MLX_* to set their binaries' rpath.
    println!("cargo:runtime_dirs={}", runtime_dirs.to_string_lossy());
    println!(
        "cargo:rustc-env=MLX_SYS_RUNTIME_DIRS={}",
        runtime_dirs.to_string_lossy()
    );
    println!(
        "cargo:rustc-env=MLX_SYS_LINKED_LIBMLX={}",
        libdir.join(libmlx).display()
    );
    println!(
        "cargo:rustc-env=MLX_SYS_MLX_VERSION={}",
        reference.mlx_version
    );
    println!("cargo:rustc-env=MLX_SYS_BACKEND={}", reference.backend);
    println!(
        "cargo:rustc-env=MLX_SYS_REFERENCE_DIR={}",
        reference.dir.display()
    );

    // The CUDA libmlx.so is linked against NVIDIA libraries (libcuda.so.1
    // from the driver, cuBLASLt, cuDNN, NCCL, cuFFT, NVRTC) that a build
    // machine need not have: they are provided by the GPU host at run time.
    // GNU ld would fail on libmlx.so's symbols from those libraries; this
    // tells it not to check a shared library's own undefined symbols (the
    // binary's own references must still resolve, against libmlx.so).
    let link_args: Vec<&str> = match reference.backend.as_str() {
        "cuda" => vec!["-Wl,--allow-shlib-undefined"],
        _ => Vec::new(),
    };
    // For this package's own test binaries...
    for arg in &link_args {
        println!("cargo:rustc-link-arg={arg}");
    }
    // ...and, as DEP_MLX_LINK_ARGS (separated by spaces: no argument
    // contains one), for the build scripts of the packages whose binaries
    // link.
    println!("cargo:link_args={}", link_args.join(" "));

    let mut headers: Vec<PathBuf> = std::fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let bindings = headers
        .iter()
        .fold(
            bindgen::Builder::default()
                .rust_target("1.73.0".parse().expect("rust-version"))
                .clang_arg(format!("-I{}", mlx_c.display()))
                .clang_arg(format!("-include{}", native.join("half_shim.h").display()))
                .blocklist_function("malloc")
                .blocklist_function("realloc")
                // mlx-rs reads `float16_t.0` and treats `bfloat16_t` as u16.
                .blocklist_type("float16_t")
                .blocklist_type("bfloat16_t")
                .raw_line("#[repr(transparent)] #[derive(Debug, Default, Copy, Clone, PartialEq, Eq, Hash)] pub struct float16_t(pub u16);")
                .raw_line("pub type bfloat16_t = u16;"),
            |b, h| b.header(h.to_string_lossy()),
        )
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed on mlx-c headers: {e}"), "cargo xtask setup"));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("bindings.rs")).unwrap();
}
