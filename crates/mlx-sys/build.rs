//! Builds mlx-c (sources prepared by `cargo xtask setup`) against the pinned
//! MLX wheel's headers and libmlx, links libmlx dynamically, and generates
//! the same bindings as crates.io mlx-sys 0.7.0.

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

struct Reference {
    mlx_dir: PathBuf,
    mlx_c_dir: PathBuf,
    python_libdir: PathBuf,
    mlx_version: String,
}

fn fail(msg: &str) -> ! {
    // A build script's panic is how cargo reports a failed build; the message
    // is what the user reads, so it names the fix.
    panic!("\n\nmlx-sys: {msg}\n  fix: run `cargo xtask setup` in the workspace root\n\n");
}

fn read_reference(workspace: &Path) -> Reference {
    let fingerprint = workspace.join(".reference/fingerprint.json");
    println!("cargo:rerun-if-changed={}", fingerprint.display());
    let text = std::fs::read_to_string(&fingerprint).unwrap_or_else(|_| {
        fail(&format!(
            "the reference environment is not set up ({} is missing)",
            fingerprint.display()
        ))
    });
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| fail(&format!("{} is not valid JSON: {e}", fingerprint.display())));
    let field = |name: &str| -> String {
        json.get(name)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| fail(&format!("{} has no `{name}`", fingerprint.display())))
    };
    Reference {
        mlx_dir: field("mlx_dir").into(),
        mlx_c_dir: workspace.join(field("mlx_c_dir")),
        python_libdir: field("python_libdir").into(),
        mlx_version: field("mlx_version"),
    }
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.join("../..").canonicalize().unwrap();
    let reference = read_reference(&workspace);
    let include = reference.mlx_dir.join("include");
    let libdir = reference.mlx_dir.join("lib");
    let mlx_c = &reference.mlx_c_dir;
    for dir in [&include, &libdir, mlx_c] {
        if !dir.is_dir() {
            fail(&format!(
                "{} does not exist (environment half-built or deleted)",
                dir.display()
            ));
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
    for name in MLX_C_SOURCES {
        build.file(mlx_c.join(format!("mlx/c/{name}.cpp")));
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
        .unwrap_or_else(|e| fail(&format!("bindgen failed on mlx-c headers: {e}")));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("bindings.rs")).unwrap();
}
