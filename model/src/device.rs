//! Compute devices. The CPU backend is always available; GPU backends are opt-in features.

use burn::tensor::Device;

/// burn's pure-Rust CPU backend (`flex`): what training, tests and the server use by default.
pub fn cpu() -> Device {
    Device::flex()
}

/// An NVIDIA GPU via CubeCL CUDA (feature `cuda`).
#[cfg(feature = "cuda")]
pub fn cuda(index: usize) -> Device {
    Device::cuda(index)
}

/// The default wgpu adapter (feature `wgpu`).
#[cfg(feature = "wgpu")]
pub fn wgpu() -> Device {
    Device::wgpu(Default::default())
}

/// LibTorch on the CPU (feature `tch`, needs libtorch at build time).
#[cfg(feature = "tch")]
pub fn libtorch_cpu() -> Device {
    Device::libtorch()
}
