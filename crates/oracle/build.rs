// Test and bench binaries of this package find libmlx without LD_LIBRARY_PATH
// (rpath to the reference environment's libmlx and libpython), and link
// against a libmlx whose own dependencies may be absent from the build
// machine (the CUDA build: see crates/mlx-sys/build.rs). Both come from
// mlx-sys (`links = "mlx"`) as DEP_MLX_*, because link arguments printed by a
// dependency's build script do not reach this package's binaries.
fn main() {
    for dir in std::env::split_paths(&std::env::var_os("DEP_MLX_RUNTIME_DIRS").unwrap_or_default())
    {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    let link_args = std::env::var("DEP_MLX_LINK_ARGS").unwrap_or_default();
    for arg in link_args.split_whitespace() {
        println!("cargo:rustc-link-arg={arg}");
    }
}
