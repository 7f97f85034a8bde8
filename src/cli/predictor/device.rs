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
}

impl DeviceArg {
    /// The device, checked with [`marshal_model::device::probe`].
    pub fn open(self) -> anyhow::Result<Device> {
        let device = match self {
            Self::Cpu => marshal_model::device::cpu(),
            Self::Cuda => cuda()?,
            Self::Wgpu => wgpu()?,
        };
        marshal_model::device::probe(&device)
            .with_context(|| format!("--device {} is unusable on this machine", self.name()))?;
        Ok(device)
    }

    fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda() -> anyhow::Result<Device> {
    Ok(marshal_model::device::cuda(0))
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> anyhow::Result<Device> {
    anyhow::bail!(
        "--device cuda: this binary was built without CUDA; rebuild with `cargo build --release --features cuda`"
    )
}

#[cfg(feature = "wgpu")]
fn wgpu() -> anyhow::Result<Device> {
    Ok(marshal_model::device::wgpu())
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() -> anyhow::Result<Device> {
    anyhow::bail!(
        "--device wgpu: this binary was built without wgpu; rebuild with `cargo build --release --features wgpu`"
    )
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
    }
}
