//! `--device`: where the predictor's networks train.

use anyhow::Context as _;
use clap::ValueEnum;
use marshal_model::Device;

/// Every backend is named in every build, so asking for one the binary lacks is a clear
/// error naming the cargo feature, not clap's "invalid value".
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// burn's pure-Rust `flex` backend on this CPU: bit-for-bit reproducible on a seed.
    Cpu,
    /// The first NVIDIA GPU through CubeCL CUDA (cargo feature `cuda`; the driver and
    /// NVRTC are loaded at run time). Not bit-for-bit reproducible.
    Cuda,
    /// The first discrete GPU wgpu finds, e.g. through Vulkan (cargo feature `wgpu`; the
    /// Vulkan loader and the driver's ICD are loaded at run time). Not bit-for-bit
    /// reproducible.
    Wgpu,
    /// LibTorch on this CPU (cargo feature `tch`; LibTorch comes from a PyTorch 2.9.0
    /// install at build time and is loaded at run time). Not bit-for-bit reproducible
    /// with `cpu`.
    Libtorch,
}

impl DeviceArg {
    /// The device, checked with [`marshal_model::device::probe`].
    pub fn open(self) -> anyhow::Result<Device> {
        let device = match self {
            Self::Cpu => marshal_model::device::cpu(),
            Self::Cuda => cuda()?,
            Self::Wgpu => wgpu()?,
            Self::Libtorch => libtorch()?,
        };
        marshal_model::device::probe(&device).with_context(|| {
            let name = self.to_possible_value().map(|v| v.get_name().to_owned());
            format!(
                "--device {} is unusable on this machine",
                name.unwrap_or_default()
            )
        })?;
        Ok(device)
    }
}

/// The error for a backend whose cargo feature is off.
#[cfg(not(all(feature = "cuda", feature = "wgpu", feature = "tch")))]
fn built_without(device: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "--device {device}: this binary was built without it; rebuild with `cargo build --release --features {feature}`"
    )
}

#[cfg(feature = "cuda")]
fn cuda() -> anyhow::Result<Device> {
    Ok(marshal_model::device::cuda(0))
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> anyhow::Result<Device> {
    Err(built_without("cuda", "cuda"))
}

#[cfg(feature = "wgpu")]
fn wgpu() -> anyhow::Result<Device> {
    Ok(marshal_model::device::wgpu())
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() -> anyhow::Result<Device> {
    Err(built_without("wgpu", "wgpu"))
}

#[cfg(feature = "tch")]
fn libtorch() -> anyhow::Result<Device> {
    Ok(marshal_model::device::libtorch())
}

#[cfg(not(feature = "tch"))]
fn libtorch() -> anyhow::Result<Device> {
    Err(built_without("libtorch", "tch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_opens_and_a_backend_left_out_of_the_build_is_named() {
        DeviceArg::Cpu.open().unwrap();
        #[cfg(not(feature = "cuda"))]
        {
            let e = DeviceArg::Cuda.open().unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
        #[cfg(not(feature = "wgpu"))]
        {
            let e = DeviceArg::Wgpu.open().unwrap_err().to_string();
            assert!(e.contains("--features wgpu"), "{e}");
        }
        #[cfg(not(feature = "tch"))]
        {
            let e = DeviceArg::Libtorch.open().unwrap_err().to_string();
            assert!(
                e.contains("--device libtorch") && e.contains("--features tch"),
                "{e}"
            );
        }
        #[cfg(feature = "tch")]
        DeviceArg::Libtorch.open().unwrap();
    }
}
