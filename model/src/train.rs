//! Fitting a predictor: AdamW on Gaussian NLL + masked MSE, early stopping on validation loss.

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Tensor};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::batch::{GraphBatch, TargetBatch};
use crate::calibration::Calibration;
use crate::config::PredictorConfig;
use crate::error::{ModelError, Result};
use crate::extrapolation::Extrapolation;
use crate::features::{PlacementGraph, Targets};
use crate::inference::TrainedPredictor;
use crate::network::{NetworkOutput, PredictorNetwork};
use crate::normalize::Normalization;

/// Progress of one epoch, handed to the caller's callback.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches (weighted by batch size).
    pub train_loss: f64,
    /// Validation loss of the model after this epoch.
    pub valid_loss: f64,
    /// Validation mean absolute percentage error of the predicted (median) step time, in %.
    pub valid_step_time_mape: f64,
    /// Epoch of the best validation loss so far.
    pub best_epoch: usize,
    /// Whether this epoch improved on the best validation loss.
    pub improved: bool,
}

/// What training achieved; stored in the artifact's `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingSummary {
    /// Epochs actually run (early stopping may end before `max_epochs`).
    pub epochs_run: usize,
    /// Epoch whose weights were kept.
    pub best_epoch: usize,
    /// Validation loss of the kept weights.
    pub best_valid_loss: f64,
    /// Validation step-time MAPE (%) of the kept weights.
    pub valid_step_time_mape: f64,
    /// Training examples.
    pub train_examples: usize,
    /// Validation examples.
    pub valid_examples: usize,
}

/// Trains on burn's pure-Rust CPU backend (`flex`), then serves from it.
pub fn fit(
    train: &[(PlacementGraph, Targets)],
    valid: &[(PlacementGraph, Targets)],
    config: &PredictorConfig,
    progress: &mut dyn FnMut(EpochReport),
) -> Result<TrainedPredictor> {
    fit_on(&Device::flex(), train, valid, config, progress)
}

/// [`fit`] on a chosen device (e.g. a CUDA device with the `cuda` feature). Autodiff is
/// added to `device` for training; the returned predictor runs on `device` without it.
/// Bit-for-bit determinism is only promised on the single-threaded `flex` backend.
pub fn fit_on(
    device: &Device,
    train: &[(PlacementGraph, Targets)],
    valid: &[(PlacementGraph, Targets)],
    config: &PredictorConfig,
    progress: &mut dyn FnMut(EpochReport),
) -> Result<TrainedPredictor> {
    config.validate()?;
    if train.is_empty() {
        return Err(ModelError::invalid("train", "training set is empty"));
    }
    if valid.is_empty() {
        return Err(ModelError::invalid(
            "valid",
            "validation set is empty (early stopping needs one)",
        ));
    }
    validate_examples("train", train)?;
    validate_examples("valid", valid)?;

    let infer_device = device.clone().without_autodiff();
    let train_device = infer_device.clone().autodiff();
    // The backend RNG is process-global on some backends; nothing below draws from it
    // (initialisation uses our own ChaCha8 stream), it is seeded for any op that might.
    train_device.seed(config.seed);
    let mut init_rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut shuffle_rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0x5348_5546_464c_4521);

    let norm = Normalization::fit(train);
    let mut net = PredictorNetwork::init(config, &mut init_rng, &train_device);
    let mut optim = AdamWConfig::new()
        .with_weight_decay(config.weight_decay as f32)
        .init();
    let valid_batches = prepare(valid, &norm, config.batch_size, &infer_device);

    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut best: Option<(PredictorNetwork, usize, f64, f64)> = None;
    let mut epochs_run = 0;
    for epoch in 1..=config.max_epochs {
        epochs_run = epoch;
        order.shuffle(&mut shuffle_rng);
        let mut loss_sum = 0.0;
        for chunk in order.chunks(config.batch_size) {
            let graphs: Vec<&PlacementGraph> = chunk.iter().map(|&i| &train[i].0).collect();
            let targets: Vec<&Targets> = chunk.iter().map(|&i| &train[i].1).collect();
            let inputs = GraphBatch::new(&graphs, &norm, &train_device);
            let target = TargetBatch::new(&targets, &norm, &train_device);
            let loss = loss(&net.forward(&inputs), &target, config.nll_beta);
            let value = scalar(&loss)?;
            if !value.is_finite() {
                return Err(ModelError::Training(format!(
                    "training loss became {value} in epoch {epoch}; lower the learning rate"
                )));
            }
            loss_sum += value * chunk.len() as f64;
            let grads = GradientsParams::from_grads(loss.backward(), &net);
            net = optim.step(config.learning_rate, net, grads);
        }
        let train_loss = loss_sum / train.len() as f64;

        let snapshot = net.valid();
        let (valid_loss, mape) = evaluate(&snapshot, &valid_batches, &norm)?;
        let improved = best
            .as_ref()
            .is_none_or(|(_, _, best_loss, _)| valid_loss < *best_loss);
        if improved {
            best = Some((snapshot, epoch, valid_loss, mape));
        }
        let best_epoch = best.as_ref().map_or(epoch, |b| b.1);
        progress(EpochReport {
            epoch,
            train_loss,
            valid_loss,
            valid_step_time_mape: mape,
            best_epoch,
            improved,
        });
        if epoch - best_epoch >= config.patience.max(1) {
            break;
        }
    }
    let (network, best_epoch, best_valid_loss, mape) =
        best.ok_or_else(|| ModelError::Training("no epoch produced a finite loss".into()))?;
    if !best_valid_loss.is_finite() {
        return Err(ModelError::Training(format!(
            "validation loss is {best_valid_loss}"
        )));
    }
    let summary = TrainingSummary {
        epochs_run,
        best_epoch,
        best_valid_loss,
        valid_step_time_mape: mape,
        train_examples: train.len(),
        valid_examples: valid.len(),
    };
    let mut calibration = Calibration::uncalibrated(train.iter().map(|(g, _)| g.shape_class()));
    calibration.extrapolation = Extrapolation::of_training(train.iter().map(|(g, _)| g));
    TrainedPredictor::from_parts(
        config.clone(),
        norm,
        network,
        summary,
        calibration,
        infer_device,
    )
}

fn validate_examples(name: &str, data: &[(PlacementGraph, Targets)]) -> Result<()> {
    for (i, (g, t)) in data.iter().enumerate() {
        g.validate(&format!("{name}[{i}].graph"))?;
        t.validate(&format!("{name}[{i}].targets"))?;
    }
    Ok(())
}

/// Validation data as ready tensors plus the raw step times for MAPE.
struct Prepared {
    inputs: GraphBatch,
    targets: TargetBatch,
    step_time_s: Vec<f32>,
}

fn prepare(
    data: &[(PlacementGraph, Targets)],
    norm: &Normalization,
    batch_size: usize,
    device: &Device,
) -> Vec<Prepared> {
    data.chunks(batch_size)
        .map(|chunk| {
            let graphs: Vec<&PlacementGraph> = chunk.iter().map(|(g, _)| g).collect();
            let targets: Vec<&Targets> = chunk.iter().map(|(_, t)| t).collect();
            Prepared {
                inputs: GraphBatch::new(&graphs, norm, device),
                targets: TargetBatch::new(&targets, norm, device),
                step_time_s: chunk.iter().map(|(_, t)| t.step_time_s).collect(),
            }
        })
        .collect()
}

/// Mean loss and step-time MAPE (%) over prepared batches.
fn evaluate(
    net: &PredictorNetwork,
    batches: &[Prepared],
    norm: &Normalization,
) -> Result<(f64, f64)> {
    let (mut loss_sum, mut ape_sum, mut n) = (0.0, 0.0, 0usize);
    for batch in batches {
        let out = net.forward(&batch.inputs);
        let len = batch.step_time_s.len();
        // Early stopping reads the plain NLL: the β weights are a training device, and a
        // β-weighted validation loss falls by shrinking σ rather than by fitting better.
        loss_sum += scalar(&loss(&out, &batch.targets, 0.0))? * len as f64;
        let means = to_vec(out.step_mean)?;
        for (mu, y) in means.iter().zip(&batch.step_time_s) {
            let pred = norm.log_step_time.invert(0, *mu).exp();
            ape_sum += f64::from((pred - y).abs() / y);
        }
        n += len;
    }
    let n = n.max(1) as f64;
    Ok((loss_sum / n, 100.0 * ape_sum / n))
}

/// β-NLL of standardised ln step time (see [`PredictorConfig::nll_beta`]) + masked MSE of
/// memory and utilisation.
pub(crate) fn loss(out: &NetworkOutput, t: &TargetBatch, nll_beta: f64) -> Tensor<1> {
    let sq_err = (t.log_step.clone() - out.step_mean.clone()).square();
    let per_example =
        (out.step_log_var.clone() + sq_err * out.step_log_var.clone().neg().exp()).mul_scalar(0.5);
    let nll = if nll_beta == 0.0 {
        per_example.mean()
    } else {
        let weight = out.step_log_var.clone().detach().mul_scalar(nll_beta).exp();
        (per_example * weight).mean()
    };
    let mem = ((out.peak_mem.clone() - t.peak_mem.clone()).square() * t.peak_mem_mask.clone())
        .sum()
        .div_scalar(t.peak_mem_count);
    let util = ((out.util.clone() - t.util.clone()).square() * t.util_mask.clone())
        .sum()
        .div_scalar(t.util_count);
    nll + mem + util
}

fn scalar(t: &Tensor<1>) -> Result<f64> {
    let v = to_vec(t.clone())?;
    v.first()
        .map(|v| f64::from(*v))
        .ok_or_else(|| ModelError::Backend("empty loss tensor".into()))
}

pub(crate) fn to_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.try_into_data()
        .map_err(|e| ModelError::Backend(format!("{e:?}")))?
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Backend(format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::features::MEM_PHASES;

    fn column(values: &[f32], device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(values.to_vec(), [values.len(), 1]), device)
    }

    /// Two examples with the same error but different predicted variances; memory and
    /// utilisation unknown, so the loss is the step-time term alone.
    fn loss_of(nll_beta: f64) -> f64 {
        let device = Device::flex();
        let log_var = [0.0f32, 2.0];
        let out = NetworkOutput {
            step_mean: column(&[1.0, 1.0], &device),
            step_log_var: column(&log_var, &device),
            peak_mem: Tensor::zeros([2, MEM_PHASES], &device),
            util: column(&[0.0, 0.0], &device),
        };
        let targets = TargetBatch {
            log_step: column(&[0.0, 0.0], &device),
            peak_mem: Tensor::zeros([2, MEM_PHASES], &device),
            peak_mem_mask: Tensor::zeros([2, MEM_PHASES], &device),
            peak_mem_count: 1.0,
            util: column(&[0.0, 0.0], &device),
            util_mask: column(&[0.0, 0.0], &device),
            util_count: 1.0,
        };
        scalar(&loss(&out, &targets, nll_beta)).unwrap()
    }

    #[test]
    fn beta_weights_each_examples_nll_by_its_variance_to_the_power_beta() {
        // NLL per example: ½(log σ² + err²/σ²) with err = 1.
        let nll = |log_var: f64| 0.5 * (log_var + (-log_var).exp());
        let plain = (nll(0.0) + nll(2.0)) / 2.0;
        assert!((loss_of(0.0) - plain).abs() < 1e-5, "{}", loss_of(0.0));
        let weighted = (nll(0.0) + 2f64.exp() * nll(2.0)) / 2.0;
        assert!((loss_of(1.0) - weighted).abs() < 1e-4, "{}", loss_of(1.0));
        let half = (nll(0.0) + 1f64.exp() * nll(2.0)) / 2.0;
        assert!((loss_of(0.5) - half).abs() < 1e-4, "{}", loss_of(0.5));
    }
}
