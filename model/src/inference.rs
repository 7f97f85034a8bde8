//! Batched prediction with a trained predictor.

use burn::module::Module;
use burn::tensor::Device;

use crate::batch::GraphBatch;
use crate::config::PredictorConfig;
use crate::error::{ModelError, Result};
use crate::features::{MEM_PHASES, PlacementGraph};
use crate::network::PredictorNetwork;
use crate::normalize::Normalization;
use crate::serving::{PlainNetwork, RawOutput, Scratch};
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
    /// The same weights as `network`, for [`TrainedPredictor::predict`].
    plain: PlainNetwork,
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
        let plain = PlainNetwork::new(&network)?;
        Ok(Self {
            config,
            normalization,
            network,
            plain,
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

    /// Predicts every graph of `batch` (graphs of different sizes may be mixed), on the
    /// CPU with the plain-Rust forward pass ([`crate::serving`]). Any invalid graph fails
    /// the whole call with an error naming it (`graph[i]...`); nothing panics on bad input.
    pub fn predict(&self, batch: &[PlacementGraph]) -> Result<Vec<Prediction>> {
        validate(batch)?;
        let mut scratch = Scratch::default();
        batch
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let raw = self.plain.forward(g, &self.normalization, &mut scratch);
                self.prediction(raw, i)
            })
            .collect()
    }

    /// The same predictions from the burn network on [`Self::device`], in padded batches of
    /// up to 256 graphs: the path for a GPU device, and the reference the plain path is
    /// tested against.
    pub fn predict_on_device(&self, batch: &[PlacementGraph]) -> Result<Vec<Prediction>> {
        validate(batch)?;
        let mut out = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(PREDICT_CHUNK) {
            let refs: Vec<&PlacementGraph> = chunk.iter().collect();
            let inputs = GraphBatch::new(&refs, &self.normalization, &self.device);
            let raw = self.network.forward(&inputs);
            let mean = to_vec(raw.step_mean)?;
            let log_var = to_vec(raw.step_log_var)?;
            let mem = to_vec(raw.peak_mem)?;
            let util = to_vec(raw.util)?;
            for i in 0..chunk.len() {
                let mut peak_mem = [0.0; MEM_PHASES];
                peak_mem.copy_from_slice(&mem[i * MEM_PHASES..(i + 1) * MEM_PHASES]);
                let raw = RawOutput {
                    step_mean: mean[i],
                    step_log_var: log_var[i],
                    peak_mem,
                    util: util[i],
                };
                out.push(self.prediction(raw, out.len())?);
            }
        }
        Ok(out)
    }

    /// Raw units from standardised outputs; an error when anything is not finite.
    fn prediction(&self, raw: RawOutput, index: usize) -> Result<Prediction> {
        let norm = &self.normalization;
        let log_std = norm.log_step_time.std[0];
        let mu = norm
            .log_step_time
            .invert(0, raw.step_mean.clamp(-MAX_STEP_Z, MAX_STEP_Z));
        let sigma = (0.5 * raw.step_log_var).exp() * log_std;
        let mut peak_mem_gib = [0.0; MEM_PHASES];
        for (p, slot) in peak_mem_gib.iter_mut().enumerate() {
            *slot = norm.peak_mem.invert(p, raw.peak_mem[p]).max(0.0);
        }
        let prediction = Prediction {
            step_time_s: mu.exp(),
            step_time_p05: (mu - Z95 * sigma).exp(),
            step_time_p95: (mu + Z95 * sigma).exp(),
            peak_mem_gib,
            gpu_util_pct: norm.gpu_util.invert(0, raw.util).clamp(0.0, 100.0),
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
                "non-finite prediction for graph {index}: {prediction:?}"
            )));
        }
        Ok(prediction)
    }
}

fn validate(batch: &[PlacementGraph]) -> Result<()> {
    for (i, g) in batch.iter().enumerate() {
        g.validate(&format!("graph[{i}]"))?;
    }
    Ok(())
}
