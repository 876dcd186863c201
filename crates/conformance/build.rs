// Test and bench binaries of this package find libmlx without LD_LIBRARY_PATH.
fn main() {
    for dir in std::env::split_paths(&std::env::var_os("DEP_MLX_RUNTIME_DIRS").unwrap_or_default())
    {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
