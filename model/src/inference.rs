//! Batched prediction with a trained predictor.

use burn::module::Module;
use burn::tensor::Device;

use crate::batch::GraphBatch;
use crate::config::PredictorConfig;
use crate::error::{ModelError, Result};
use crate::features::{MEM_PHASES, PlacementGraph};
use crate::network::PredictorNetwork;
use crate::normalize::Normalization;
use crate::train::{TrainingSummary, to_vec};

/// Standard-normal quantile of 0.95 (so ±Z spans the 5 %–95 % interval).
const Z95: f32 = 1.644_853_6;

/// Graphs per forward pass inside [`TrainedPredictor::predict`]; bounds the `B×N×N×H`
/// message tensor for callers that pass thousands of candidates at once.
const PREDICT_CHUNK: usize = 256;
/// Predicted mean log step time is held within this many standard deviations of the
/// training set's: inputs far from anything trained on (an interconnect never seen) must
/// not overflow into an infinite or zero step time. The interval still says how unsure the
/// model is.
const MAX_STEP_Z: f32 = 6.0;

/// Predicted resources for one placement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Median step time in seconds (`exp` of the predicted mean of `ln step time`).
    pub step_time_s: f32,
    /// 5th percentile of the step time under the predicted log-normal.
    pub step_time_p05: f32,
    /// 95th percentile of the step time under the predicted log-normal.
    pub step_time_p95: f32,
    /// Peak memory per GPU per phase (warmup, steady, eval, checkpoint), GiB.
    pub peak_mem_gib: [f32; MEM_PHASES],
    /// Mean GPU utilisation, percent.
    pub gpu_util_pct: f32,
}

impl Prediction {
    /// Relative width of the 90 % interval, `(p95 - p05) / median`: a unit-free
    /// uncertainty the scheduler can threshold to fall back to its heuristic.
    pub fn relative_uncertainty(&self) -> f32 {
        (self.step_time_p95 - self.step_time_p05) / self.step_time_s
    }
}

/// A trained predictor: configuration, normalisation statistics and weights, ready to serve.
#[derive(Debug, Clone)]
pub struct TrainedPredictor {
    config: PredictorConfig,
    normalization: Normalization,
    network: PredictorNetwork,
    summary: TrainingSummary,
    device: Device,
}

impl TrainedPredictor {
    pub(crate) fn from_parts(
        config: PredictorConfig,
        normalization: Normalization,
        network: PredictorNetwork,
        summary: TrainingSummary,
        device: Device,
    ) -> Result<Self> {
        let device = device.without_autodiff();
        let network = network.valid().to_device(&device);
        Ok(Self {
            config,
            normalization,
            network,
            summary,
            device,
        })
    }

    /// The configuration it was trained with.
    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    /// The fitted normalisation statistics.
    pub fn normalization(&self) -> &Normalization {
        &self.normalization
    }

    /// What training achieved.
    pub fn summary(&self) -> &TrainingSummary {
        &self.summary
    }

    /// The device inference runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn network(&self) -> &PredictorNetwork {
        &self.network
    }

    /// Moves the predictor to another device (e.g. a GPU with the `cuda` feature).
    pub fn to_device(self, device: &Device) -> Self {
        let device = device.clone().without_autodiff();
        Self {
            network: self.network.to_device(&device),
            device,
            ..self
        }
    }

    /// Predicts every graph of `batch` in one pass (internally chunked by 256 graphs).
    /// Graphs of different sizes may be mixed. Any invalid graph fails the whole call with
    /// an error naming it (`graph[i]...`); nothing panics on bad input.
    pub fn predict(&self, batch: &[PlacementGraph]) -> Result<Vec<Prediction>> {
        for (i, g) in batch.iter().enumerate() {
            g.validate(&format!("graph[{i}]"))?;
        }
        let mut out = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(PREDICT_CHUNK) {
            let refs: Vec<&PlacementGraph> = chunk.iter().collect();
            self.predict_chunk(&refs, &mut out)?;
        }
        Ok(out)
    }

    fn predict_chunk(&self, graphs: &[&PlacementGraph], out: &mut Vec<Prediction>) -> Result<()> {
        let norm = &self.normalization;
        let inputs = GraphBatch::new(graphs, norm, &self.device);
        let raw = self.network.forward(&inputs);
        let mean = to_vec(raw.step_mean)?;
        let log_var = to_vec(raw.step_log_var)?;
        let mem = to_vec(raw.peak_mem)?;
        let util = to_vec(raw.util)?;
        let log_std = norm.log_step_time.std[0];
        for i in 0..graphs.len() {
            let mu = norm
                .log_step_time
                .invert(0, mean[i].clamp(-MAX_STEP_Z, MAX_STEP_Z));
            let sigma = (0.5 * log_var[i]).exp() * log_std;
            let mut peak_mem_gib = [0.0; MEM_PHASES];
            for (p, slot) in peak_mem_gib.iter_mut().enumerate() {
                *slot = norm.peak_mem.invert(p, mem[i * MEM_PHASES + p]).max(0.0);
            }
            let prediction = Prediction {
                step_time_s: mu.exp(),
                step_time_p05: (mu - Z95 * sigma).exp(),
                step_time_p95: (mu + Z95 * sigma).exp(),
                peak_mem_gib,
                gpu_util_pct: norm.gpu_util.invert(0, util[i]).clamp(0.0, 100.0),
            };
            let finite = [
                prediction.step_time_s,
                prediction.step_time_p05,
                prediction.step_time_p95,
                prediction.gpu_util_pct,
            ]
            .iter()
            .chain(&prediction.peak_mem_gib)
            .all(|v| v.is_finite());
            if !finite || prediction.step_time_s <= 0.0 {
                return Err(ModelError::Backend(format!(
                    "non-finite prediction for graph {}: {prediction:?}",
                    out.len()
                )));
            }
            out.push(prediction);
        }
        Ok(())
    }
}
