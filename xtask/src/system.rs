//! What the machines need beyond the reference environment.
//!
//! - The build (Linux): libclang for bindgen, {fmt} for mlx-c's
//!   `std::format` on GCC 12. Installed with apt-get when missing and
//!   running as root; otherwise the exact command is printed.
//! - A GPU host running the CUDA environment: the NVIDIA driver and the
//!   NVIDIA libraries that the CUDA libmlx is linked against but that the
//!   environment deliberately does not install ([`CudaRuntime`], read from
//!   libmlx.so's dynamic section and mlx-cuda-13's metadata).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::env::{normalize, Fingerprint};
use crate::util::{self, ElfDynamic};

/// Debian package and a file whose presence shows it is installed.
const PACKAGES: &[(&str, &[&str])] = &[
    (
        "libclang-dev",
        &[
            "/usr/lib/llvm-14/lib/libclang.so",
            "/usr/lib/x86_64-linux-gnu/libclang.so",
            "/usr/lib/aarch64-linux-gnu/libclang.so",
        ],
    ),
    ("libfmt-dev", &["/usr/include/fmt/format.h"]),
];

pub fn ensure() -> Result<()> {
    if cfg!(target_os = "macos") {
        return crate::macos::ensure_sdk();
    }
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(name, files)| {
            !files.iter().any(|f| Path::new(f).exists()) && !dpkg_installed(name)
        })
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!("apt-get install -y {}", missing.join(" "));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc_geteuid() } == 0;
    if !root || Command::new("apt-get").arg("--version").output().is_err() {
        bail!(
            "missing system packages: {}. Fix: `sudo apt-get update && sudo {line}`",
            missing.join(", ")
        );
    }
    println!("setup: installing system packages: {}", missing.join(" "));
    let update = util::status(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    let install = util::status(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(&missing),
        "apt-get install",
    )?;
    if update != 0 || install != 0 {
        bail!(
            "installing {} failed (apt-get exit {update}/{install}); run `{line}` and retry",
            missing.join(", ")
        );
    }
    Ok(())
}

fn dpkg_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// NVIDIA libraries a CUDA libmlx can be linked against, by soname up to
/// `.so`, and the pip package that ships each (`None`: the driver).
const NVIDIA_LIBRARIES: &[(&str, Option<&str>)] = &[
    ("libcuda.so", None),
    ("libnvidia-ml.so", None),
    ("libcublasLt.so", Some("nvidia-cublas")),
    ("libcublas.so", Some("nvidia-cublas")),
    ("libcudnn.so", Some("nvidia-cudnn-cu13")),
    ("libnccl.so", Some("nvidia-nccl-cu13")),
    ("libcufft.so", Some("nvidia-cufft")),
    ("libnvrtc.so", Some("nvidia-cuda-nvrtc")),
    ("libcudart.so", Some("nvidia-cuda-runtime")),
    ("libnvJitLink.so", Some("nvidia-nvjitlink")),
];

/// The CUDA headers MLX's run-time kernel compiler (NVRTC) includes are in
/// nvidia-cuda-runtime, except `crt/` (e.g. `mma.h` includes `crt/mma.h`),
/// which is in this package, which mlx-cuda-13 does not require.
const CRT_HEADERS_PACKAGE: &str = "nvidia-cuda-crt==13.*";

/// Where the example in the requirements installs the NVIDIA pip packages.
const EXAMPLE_PREFIX: &str = "/opt/mlx-cuda-13";

/// What a GPU host must provide at run time for the CUDA environment, as
/// read from the environment itself.
#[derive(Debug, Clone)]
pub struct CudaRuntime {
    pub libmlx: PathBuf,
    pub dynamic: ElfDynamic,
    /// `mlx-cuda-13 <version>`.
    pub wheel: String,
    /// mlx-cuda-13's `Requires-Dist` (extras left out), e.g.
    /// `nvidia-cudnn-cu13==9.*`.
    pub requires_dist: Vec<String>,
}

/// One NEEDED soname of libmlx and who provides it.
#[derive(Debug, Clone, PartialEq)]
pub enum Provider {
    /// The NVIDIA driver (libcuda.so.1).
    Driver,
    /// A pip package, with mlx-cuda-13's version constraint if it states one.
    Pip(String),
    /// Shipped inside the wheel and found through libmlx's RPATH.
    Bundled(PathBuf),
    /// The system (glibc, libstdc++...).
    System,
}

impl CudaRuntime {
    /// Reads libmlx's NEEDED / RPATH and mlx-cuda-13's metadata.
    pub fn read(fingerprint: &Fingerprint) -> Result<CudaRuntime> {
        let dynamic = util::elf_dynamic(&fingerprint.libmlx)?;
        let site = &fingerprint.site_packages;
        let dist_info = std::fs::read_dir(site)
            .with_context(|| format!("listing {}", site.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with("mlx_cuda_13-") && n.ends_with(".dist-info")
                })
            })
            .with_context(|| format!("no mlx_cuda_13-*.dist-info in {}", site.display()))?;
        let metadata = std::fs::read_to_string(dist_info.join("METADATA"))
            .with_context(|| format!("reading {}/METADATA", dist_info.display()))?;
        let field = |name: &str| -> Vec<String> {
            metadata
                .lines()
                .take_while(|l| !l.is_empty())
                .filter_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .collect()
        };
        let version = field("Version:").into_iter().next().unwrap_or_default();
        let requires_dist = field("Requires-Dist:")
            .into_iter()
            .filter(|r| !r.contains("extra =="))
            .collect();
        Ok(CudaRuntime {
            libmlx: fingerprint.libmlx.clone(),
            dynamic,
            wheel: format!("mlx-cuda-13 {version}"),
            requires_dist,
        })
    }

    /// mlx-cuda-13's requirement naming `package` (`package==13.*`), or the
    /// bare name.
    fn requirement(&self, package: &str) -> String {
        self.requires_dist
            .iter()
            .find(|r| {
                let name = r
                    .split(|c: char| "=<>!~;[ (".contains(c))
                    .next()
                    .unwrap_or("");
                normalize(name) == package
            })
            .cloned()
            .unwrap_or_else(|| package.to_owned())
    }

    /// The RPATH (or RUNPATH) directories of libmlx, `$ORIGIN` expanded.
    pub fn search_dirs(&self) -> Vec<PathBuf> {
        let origin = self.libmlx.parent().unwrap_or(Path::new("/"));
        let path = self
            .dynamic
            .runpath
            .as_ref()
            .or(self.dynamic.rpath.as_ref());
        path.map(|p| {
            p.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| {
                    PathBuf::from(
                        d.replace("${ORIGIN}", &origin.to_string_lossy())
                            .replace("$ORIGIN", &origin.to_string_lossy()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// Who provides each NEEDED soname.
    pub fn providers(&self) -> Vec<(String, Provider)> {
        let dirs = self.search_dirs();
        self.dynamic
            .needed
            .iter()
            .map(|soname| {
                let stem = soname
                    .find(".so")
                    .map_or(soname.as_str(), |i| &soname[..i + 3]);
                let provider = match NVIDIA_LIBRARIES.iter().find(|(s, _)| *s == stem) {
                    Some((_, None)) => Provider::Driver,
                    Some((_, Some(package))) => Provider::Pip(self.requirement(package)),
                    None => match dirs.iter().map(|d| d.join(soname)).find(|p| p.exists()) {
                        Some(path) => Provider::Bundled(path),
                        None => Provider::System,
                    },
                };
                (soname.clone(), provider)
            })
            .collect()
    }

    /// The pip requirements a host installs: every NVIDIA library libmlx
    /// needs, then the rest of mlx-cuda-13's NVIDIA requirements (headers),
    /// then the crt headers.
    pub fn pip_requirements(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut push = |r: String| {
            if !out.contains(&r) {
                out.push(r);
            }
        };
        for (_, provider) in self.providers() {
            if let Provider::Pip(r) = provider {
                push(r);
            }
        }
        for r in self
            .requires_dist
            .iter()
            .filter(|r| r.starts_with("nvidia-"))
        {
            push(r.clone());
        }
        push(CRT_HEADERS_PACKAGE.to_owned());
        out
    }

    /// The text `cargo xtask setup --backend cuda` prints.
    pub fn render(&self, root: &Path) -> String {
        let mut t = String::new();
        let providers = self.providers();
        let _ = writeln!(
            t,
            "GPU host requirements (read from {} and {}'s Requires-Dist;\n\
             none of them is installed here, the environment is --no-deps):",
            util::rel(root, &self.libmlx),
            self.wheel
        );
        let _ = writeln!(
            t,
            "  1. an NVIDIA GPU and a driver supporting CUDA 13 (Linux driver 580 or newer);\n     \
             the driver provides libcuda.so.1"
        );
        let _ = writeln!(
            t,
            "  2. the NVIDIA libraries libmlx.so is linked against (NEEDED):"
        );
        for (soname, provider) in &providers {
            match provider {
                Provider::Driver => {
                    let _ = writeln!(t, "       {soname:<20} the NVIDIA driver");
                }
                Provider::Pip(r) => {
                    let _ = writeln!(t, "       {soname:<20} pip {r}");
                }
                Provider::Bundled(_) | Provider::System => {}
            }
        }
        let _ = writeln!(
            t,
            "     found through LD_LIBRARY_PATH (libmlx.so's RPATH only looks in\n     \
             <site-packages>/nvidia/*/lib of its own venv, and installing them there\n     \
             makes this environment drift)"
        );
        let _ = writeln!(
            t,
            "  3. CUDA 13 headers for MLX's run-time kernel compiler (NVRTC): CUDA_HOME\n     \
             (default /usr/local/cuda) with include/cuda_runtime.h and include/crt/: a\n     \
             CUDA 13 toolkit, or pip {} (required by mlx-cuda-13)\n     \
             plus {CRT_HEADERS_PACKAGE} (not required by it, but mma.h needs crt/mma.h)",
            self.requirement("nvidia-cuda-runtime")
        );
        let quoted: Vec<String> = self
            .pip_requirements()
            .iter()
            .map(|r| {
                if r.contains('*') || r.contains('<') || r.contains('>') {
                    format!("'{r}'")
                } else {
                    r.clone()
                }
            })
            .collect();
        let _ = writeln!(t, "  e.g. on the GPU host:");
        let _ = writeln!(
            t,
            "     python3 -m pip install --target {EXAMPLE_PREFIX} {}",
            quoted.join(" ")
        );
        let _ = writeln!(
            t,
            "     export LD_LIBRARY_PATH={p}/nvidia/cu13/lib:{p}/nvidia/cudnn/lib:{p}/nvidia/nccl/lib",
            p = EXAMPLE_PREFIX
        );
        let _ = writeln!(t, "     export CUDA_HOME={EXAMPLE_PREFIX}/nvidia/cu13");
        let _ = writeln!(t, "     cargo xtask conformance --backend cuda");
        let bundled: Vec<&str> = providers
            .iter()
            .filter(|(_, p)| matches!(p, Provider::Bundled(_)))
            .map(|(s, _)| s.as_str())
            .collect();
        if !bundled.is_empty() {
            let _ = writeln!(t, "  bundled in the wheel: {}", bundled.join(", "));
        }
        let _ = writeln!(t, "  details: reference/cuda/README.md");
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> CudaRuntime {
        CudaRuntime {
            libmlx: PathBuf::from("/sp/mlx/lib/libmlx.so"),
            dynamic: ElfDynamic {
                needed: [
                    "liblapack-86b2c207.so.3.10.0",
                    "libnccl.so.2",
                    "libcublasLt.so.13",
                    "libcuda.so.1",
                    "libcudnn.so.9",
                    "libc.so.6",
                ]
                .map(String::from)
                .to_vec(),
                rpath: Some("$ORIGIN/../../nvidia/cu13/lib:$ORIGIN/../../mlx_cuda_13.libs".into()),
                runpath: None,
            },
            wheel: "mlx-cuda-13 0.32.2".into(),
            requires_dist: [
                "nvidia-cudnn-cu13==9.*",
                "nvidia-nccl-cu13",
                "nvidia-cublas==13.*",
                "nvidia-cuda-runtime==13.*",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    #[test]
    fn classifies_needed_libraries() {
        let r = runtime();
        let providers = r.providers();
        assert_eq!(
            providers[1],
            (
                "libnccl.so.2".into(),
                Provider::Pip("nvidia-nccl-cu13".into())
            )
        );
        assert_eq!(providers[2].1, Provider::Pip("nvidia-cublas==13.*".into()));
        assert_eq!(providers[3].1, Provider::Driver);
        assert_eq!(
            providers[4].1,
            Provider::Pip("nvidia-cudnn-cu13==9.*".into())
        );
        assert_eq!(providers[5].1, Provider::System);
        assert_eq!(
            r.search_dirs()[0],
            PathBuf::from("/sp/mlx/lib/../../nvidia/cu13/lib")
        );
        assert_eq!(
            r.pip_requirements(),
            [
                "nvidia-nccl-cu13",
                "nvidia-cublas==13.*",
                "nvidia-cudnn-cu13==9.*",
                "nvidia-cuda-runtime==13.*",
                "nvidia-cuda-crt==13.*"
            ]
        );
    }
}
