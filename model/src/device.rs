//! Compute devices. The CPU backend is always available; GPU backends are opt-in features.

use burn::tensor::{Device, Tensor, TensorData};

use crate::error::{ModelError, Result};

/// burn's pure-Rust CPU backend (`flex`): what training, tests and the server use by default.
pub fn cpu() -> Device {
    Device::flex()
}

/// An NVIDIA GPU via CubeCL CUDA (feature `cuda`).
#[cfg(feature = "cuda")]
pub fn cuda(index: usize) -> Device {
    Device::cuda(index)
}

/// The first discrete GPU wgpu finds, on whichever graphics API it settles (feature
/// `wgpu`). Named explicitly: wgpu's default adapter is a software rasteriser (llvmpipe)
/// on a machine with Mesa and no GPU, which would train on the CPU under a GPU's name.
#[cfg(feature = "wgpu")]
pub fn wgpu() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DiscreteGpu(0))
}

/// LibTorch on the CPU (feature `tch`, which links LibTorch at build time).
///
/// burn 0.22 marks its LibTorch backend deprecated (in favour of CubeCL); it stays as an
/// opt-in for sites that standardise on LibTorch, and builds from PyPI's PyTorch wheel.
#[cfg(feature = "tch")]
#[allow(deprecated)]
pub fn libtorch() -> Device {
    Device::libtorch()
}

/// Checks that `device` computes: `[1, 2] × 2` there and back. burn's GPU backends report
/// a missing driver, runtime compiler or adapter by panicking on first use; the probe
/// turns that into [`ModelError::Backend`] before any training starts, so a command can
/// say why and stop instead of crashing halfway through a run.
pub fn probe(device: &Device) -> Result<()> {
    let device = device.clone();
    // The panic is the backend's way of reporting; its message goes into the error, so the
    // default hook's "thread panicked" line (which reads as a crash) is silenced meanwhile.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let answered = std::panic::catch_unwind(move || {
        let t = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device);
        crate::train::to_vec(t * 2.0)
    });
    std::panic::set_hook(hook);
    judge(answered)
}

/// The probe's verdict on what the device returned (or how it panicked).
fn judge(answered: std::thread::Result<Result<Vec<f32>>>) -> Result<()> {
    match answered {
        Ok(Ok(v)) if v == [2.0, 4.0] => Ok(()),
        Ok(Ok(v)) => Err(ModelError::Backend(format!(
            "the device computed {v:?} for [1, 2] × 2"
        ))),
        Ok(Err(e)) => Err(e),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(ModelError::Backend(format!("the device failed: {reason}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_answers_the_probe() {
        probe(&cpu()).unwrap();
    }

    /// Runs only in a build with `--features tch` (never in CI: it needs LibTorch).
    #[cfg(feature = "tch")]
    #[test]
    fn libtorch_answers_the_probe() {
        probe(&libtorch()).unwrap();
    }

    #[test]
    fn a_panicking_or_miscomputing_device_is_an_error_with_the_reason() {
        let panicked = std::panic::catch_unwind(|| -> Result<Vec<f32>> {
            std::panic::panic_any(String::from("no adapter found"))
        });
        let e = judge(panicked).unwrap_err().to_string();
        assert!(e.contains("no adapter found"), "{e}");
        let e = judge(Ok(Ok(vec![2.0, 5.0]))).unwrap_err().to_string();
        assert!(e.contains("[2.0, 5.0]"), "{e}");
        judge(Ok(Ok(vec![2.0, 4.0]))).unwrap();
    }
}
