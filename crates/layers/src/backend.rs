//! The one backend vocabulary: which MLX backend a computation runs on.
//!
//! MLX 0.32.2 has three: the CPU backend (every build), Metal (the
//! `mlx-metal` wheel on Apple Silicon) and CUDA (the `mlx-cuda-13` wheel on
//! Linux x86-64). A libmlx build has at most one GPU backend, so "the GPU"
//! of a process is Metal or CUDA depending on which libmlx is linked.
//! Layers, the oracle's glue, the conformance runner, snapshot set names
//! and reports all use these three names (`cpu`, `metal`, `cuda`).

use std::fmt;
use std::str::FromStr;

use mlx_rs::error::Exception;

/// An MLX backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// MLX's CPU backend (`mx.cpu`), present in every build.
    Cpu,
    /// MLX's Metal backend (`mx.gpu` on a build where
    /// `mx.metal.is_available()`).
    Metal,
    /// MLX's CUDA backend (`mx.gpu` on a build where
    /// `mx.cuda.is_available()`).
    Cuda,
}

impl Backend {
    /// Every backend, in a fixed order.
    pub const ALL: [Backend; 3] = [Backend::Cpu, Backend::Metal, Backend::Cuda];

    /// The backend's name in reports, set names and the glue: `cpu`,
    /// `metal` or `cuda`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Metal => "metal",
            Backend::Cuda => "cuda",
        }
    }

    /// Whether this backend runs on a GPU (`mx.gpu`).
    pub fn is_gpu(self) -> bool {
        !matches!(self, Backend::Cpu)
    }

    /// The GPU backend of the linked libmlx that can run here now: Metal
    /// (`mlx_metal_is_available`) or CUDA (`mlx_cuda_is_available`), or
    /// `None` (a CPU-only build, or a GPU build on a host without the GPU).
    ///
    /// # Errors
    /// An [`Exception`] if mlx-c cannot answer.
    pub fn linked_gpu() -> Result<Option<Backend>, Exception> {
        // Any wrapped op installs mlx-rs's error handler; without it a
        // failing raw mlx-c call would print and exit the process.
        mlx_rs::Device::try_default()?;
        let mut metal = false;
        let mut cuda = false;
        // SAFETY: the out-pointers are valid for the duration of each call.
        let (s1, s2) = unsafe {
            (
                mlx_sys::mlx_metal_is_available(&mut metal),
                mlx_sys::mlx_cuda_is_available(&mut cuda),
            )
        };
        if s1 != 0 || s2 != 0 {
            return Err(Exception::custom(
                "mlx-c could not say whether Metal or CUDA is available",
            ));
        }
        Ok(if metal {
            Some(Backend::Metal)
        } else if cuda {
            Some(Backend::Cuda)
        } else {
            None
        })
    }

    /// The backend of MLX's default device now (`Device::default()`): the
    /// CPU, or the linked GPU backend.
    ///
    /// # Errors
    /// An [`Exception`] if mlx-c cannot answer, or the default device is a
    /// GPU this libmlx cannot run.
    pub fn of_default_device() -> Result<Backend, Exception> {
        match mlx_rs::Device::default().get_type()? {
            mlx_rs::DeviceType::Cpu => Ok(Backend::Cpu),
            mlx_rs::DeviceType::Gpu => Backend::linked_gpu()?.ok_or_else(|| {
                Exception::custom(
                    "the default device is a GPU, and this libmlx has no usable GPU backend here",
                )
            }),
        }
    }

    /// The mlx-rs device that runs this backend (`Device::gpu()` for Metal
    /// and CUDA).
    pub fn device(self) -> mlx_rs::Device {
        if self.is_gpu() {
            mlx_rs::Device::gpu()
        } else {
            mlx_rs::Device::cpu()
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not `cpu`, `metal` or `cuda`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown MLX backend `{0}`: expected one of cpu, metal, cuda")]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_typed_errors() {
        for b in Backend::ALL {
            assert_eq!(b.as_str().parse::<Backend>(), Ok(b));
        }
        let err = "gpu".parse::<Backend>().unwrap_err();
        assert!(err.to_string().contains("cpu, metal, cuda"));
    }

    #[test]
    fn only_cpu_is_not_a_gpu() {
        assert!(!Backend::Cpu.is_gpu());
        assert!(Backend::Metal.is_gpu() && Backend::Cuda.is_gpu());
    }
}
