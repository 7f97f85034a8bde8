//! Batched prediction with a trained predictor.

use burn::module::Module;
use burn::tensor::Device;

use crate::batch::GraphBatch;
use crate::calibration::{Calibration, HeldOutLogStep, Z95};
use crate::config::PredictorConfig;
use crate::error::{ModelError, Result};
use crate::features::{MEM_PHASES, PRIOR_JOB_SLOT, PlacementGraph, Targets};
use crate::network::PredictorNetwork;
use crate::normalize::Normalization;
use crate::residual::{LinearResidual, Summarised};
use crate::serving::{PlainNetwork, RawOutput, Scratch};
use crate::train::{TrainingSummary, to_vec};

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
    calibration: Calibration,
    /// Stacked with the network on novel shapes ([`Calibration::novel_linear_weight`]).
    linear: Option<LinearResidual>,
    /// Networks trained with shape classes held out, serving novel shapes with the CV+
    /// interval ([`Self::with_fold_networks`]); their residuals are
    /// [`Calibration::fold_ratios`].
    folds: Vec<TrainedPredictor>,
    device: Device,
}

impl TrainedPredictor {
    pub(crate) fn from_parts(
        config: PredictorConfig,
        normalization: Normalization,
        network: PredictorNetwork,
        summary: TrainingSummary,
        calibration: Calibration,
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
            calibration,
            linear: None,
            folds: Vec::new(),
            device,
        })
    }

    /// The interval's calibration (multipliers 1 until [`Self::calibrate`]).
    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    /// Calibrates the 90 % interval on `data`, examples the network was not trained on
    /// (split-conformal, see [`crate::calibration`]): examples whose shape class occurs in
    /// training set the multiplier for seen shapes, the others the one for novel shapes.
    /// Replaces any earlier calibration.
    pub fn calibrate(mut self, data: &[(PlacementGraph, Targets)]) -> Result<Self> {
        let residuals = self.standardized_residuals(data)?;
        self.calibration.fit(&residuals);
        Ok(self)
    }

    /// Uncalibrated standardised residuals `z = (ln y − μ) / σ` of `data`, each with
    /// whether its shape class is novel to this network.
    pub fn standardized_residuals(
        &self,
        data: &[(PlacementGraph, Targets)],
    ) -> Result<Vec<(f32, bool)>> {
        validate_examples(data, "calibration")?;
        let mut scratch = Scratch::default();
        Ok(data
            .iter()
            .map(|(g, t)| {
                let raw = self.plain.forward(g, &self.normalization, &mut scratch);
                let weights = self.calibration.for_graph(g).weights;
                let (mu, sigma) = self.log_normal(&raw, &Summarised::new(g), weights);
                let z = (t.step_time_s.ln() - mu) / sigma;
                (z, self.calibration.is_novel(g.shape_class()))
            })
            .collect())
    }

    /// The network's uncalibrated mean and σ of `ln step time` at full residual weight,
    /// with the prior and the truth, for each example of `data`: what
    /// The linear residual's prediction is included when the predictor holds one (0
    /// otherwise). What [`crate::choose_novel_weights`] and the novel-shape calibration
    /// read.
    pub fn held_out_log_steps(
        &self,
        data: &[(PlacementGraph, Targets)],
    ) -> Result<Vec<HeldOutLogStep>> {
        validate_examples(data, "held_out")?;
        let mut scratch = Scratch::default();
        Ok(data
            .iter()
            .map(|(g, t)| {
                let raw = self.plain.forward(g, &self.normalization, &mut scratch);
                let (mu, sigma) = self.unweighted_log_normal(&raw);
                HeldOutLogStep {
                    mu,
                    sigma,
                    prior: g.job.values[PRIOR_JOB_SLOT],
                    linear: self.linear.as_ref().map_or(0.0, |l| l.predict(g)),
                    truth: t.step_time_s.ln(),
                    novel: self.calibration.is_novel(g.shape_class()),
                }
            })
            .collect())
    }

    /// Sets the weights of the network's residual and of the linear residual on novel
    /// shapes ([`Calibration::novel_residual_weight`], [`Calibration::novel_linear_weight`]);
    /// an error outside [0, 1], or for a linear weight above 0 without a linear residual.
    pub fn with_novel_weights(mut self, network: f32, linear: f32) -> Result<Self> {
        if !self.folds.is_empty() && (network, linear) != self.novel_weights() {
            return Err(ModelError::invalid(
                "calibration.novel_residual_weight",
                "the fold networks' residuals were measured at other weights: set the weights first",
            ));
        }
        self.calibration.novel_residual_weight = network;
        self.calibration.novel_linear_weight = linear;
        self.check_linear()?;
        self.calibration.validate()?;
        Ok(self)
    }

    /// Attaches a linear residual fitted on the same training side
    /// ([`LinearResidual::fit`]); it takes part in predictions once
    /// [`Self::with_novel_weights`] gives it a weight.
    pub fn with_linear_residual(mut self, linear: LinearResidual) -> Result<Self> {
        linear.validate()?;
        self.linear = Some(linear);
        Ok(self)
    }

    /// The linear residual, if any.
    pub fn linear_residual(&self) -> Option<&LinearResidual> {
        self.linear.as_ref()
    }

    /// Keeps networks trained with shape classes held out, each with its normalised
    /// residuals `|ln y − μ_w| / (1.645·σ·m)` on those classes (`μ_w` its mean at this
    /// predictor's novel weights, `m` its seen multiplier): novel shapes within the
    /// trained range then get their CV+ interval ([`crate::cross_conformal`]). Replaces
    /// any fold networks kept before; none clears them. An error for a fold without
    /// residuals, a non-finite or negative residual, a fold that keeps folds of its own,
    /// or (with a linear weight above 0) a fold without a linear residual.
    pub fn with_fold_networks(mut self, folds: Vec<(TrainedPredictor, Vec<f32>)>) -> Result<Self> {
        let mut ratios = Vec::with_capacity(folds.len());
        self.folds.clear();
        for (k, (fold, mut r)) in folds.into_iter().enumerate() {
            self.check_fold(k, &fold)?;
            r.sort_by(f32::total_cmp);
            ratios.push(r);
            self.folds.push(fold);
        }
        self.calibration.fold_ratios = ratios;
        self.calibration.validate()?;
        Ok(self)
    }

    /// Whether `fold` can serve as fold network `k` of this predictor: no folds of its
    /// own, and a linear residual when the novel linear weight is above 0.
    pub(crate) fn check_fold(&self, k: usize, fold: &TrainedPredictor) -> Result<()> {
        let v = self.calibration.novel_linear_weight;
        if !fold.folds.is_empty() {
            return Err(ModelError::invalid(
                format!("fold network {k}"),
                "keeps fold networks of its own",
            ));
        }
        if v > 0.0 && fold.linear.is_none() {
            return Err(ModelError::invalid(
                format!("fold network {k}"),
                format!("no linear residual, but the novel linear weight is {v}"),
            ));
        }
        Ok(())
    }

    fn novel_weights(&self) -> (f32, f32) {
        (
            self.calibration.novel_residual_weight,
            self.calibration.novel_linear_weight,
        )
    }

    /// The fold networks kept ([`Self::with_fold_networks`]).
    pub fn fold_networks(&self) -> &[TrainedPredictor] {
        &self.folds
    }

    /// Attaches fold networks loaded from an artifact whose calibration already holds
    /// their residuals, each already passed by [`Self::check_fold`]; an error when the
    /// counts differ.
    pub(crate) fn with_loaded_folds(mut self, folds: Vec<TrainedPredictor>) -> Result<Self> {
        if folds.len() != self.calibration.fold_ratios.len() {
            return Err(ModelError::invalid(
                "calibration.fold_ratios",
                format!(
                    "{} residual lists for {} fold networks",
                    self.calibration.fold_ratios.len(),
                    folds.len()
                ),
            ));
        }
        // CV+ walks each list from its largest residual ([`crate::cross_conformal`]); a
        // list is a multiset, so sorting a hand-edited file's loses nothing.
        for ratios in &mut self.calibration.fold_ratios {
            ratios.sort_by(f32::total_cmp);
        }
        self.folds = folds;
        Ok(self)
    }

    pub(crate) fn check_linear(&self) -> Result<()> {
        if self.calibration.uses_linear() && self.linear.is_none() {
            let field = if self.calibration.novel_linear_weight > 0.0 {
                "calibration.novel_linear_weight"
            } else {
                "calibration.extrapolation.weights"
            };
            return Err(ModelError::invalid(
                field,
                "a linear weight above 0 but the predictor has no linear residual",
            ));
        }
        Ok(())
    }

    /// Sets the multiplier for novel shapes from normalised novel residuals made
    /// elsewhere (e.g. pooled over `folds` networks trained with shape classes held out),
    /// see [`Calibration::fit_novel_ratios`].
    pub fn with_novel_ratios(mut self, ratios: &[f32], folds: usize) -> Result<Self> {
        self.calibration.fit_novel_ratios(ratios, folds);
        self.calibration.validate()?;
        Ok(self)
    }

    /// Sets what an extrapolation run chose for graphs beyond the trained range: the
    /// residual weights `(w, v)` of their mean (`None`: their shape class decides) and the
    /// slope of the interval's widening, fitted from `(s, d)` pairs measured at those
    /// weights ([`Extrapolation::fit_slope`]). An error for weights outside [0, 1], or a
    /// linear weight above 0 without a linear residual.
    pub fn with_extrapolation(
        mut self,
        weights: Option<(f32, f32)>,
        pairs: &[(f32, f32)],
    ) -> Result<Self> {
        let coverage = self.calibration.coverage;
        let extrapolation = &mut self.calibration.extrapolation;
        extrapolation.weights = weights.map(|(w, v)| [w, v]);
        extrapolation.fit_slope(pairs, coverage);
        self.check_linear()?;
        self.calibration.validate()?;
        Ok(self)
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
    /// CPU with the plain-Rust forward pass (the private module `serving`). Any invalid graph fails
    /// the whole call with an error naming it (`graph[i]...`); nothing panics on bad input.
    pub fn predict(&self, batch: &[PlacementGraph]) -> Result<Vec<Prediction>> {
        validate(batch)?;
        let mut scratch = Scratch::default();
        batch
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let raw = self.plain.forward(g, &self.normalization, &mut scratch);
                self.prediction(raw, g, i, &mut scratch)
            })
            .collect()
    }

    /// The same predictions from the burn network on [`Self::device`], in padded batches of
    /// up to 256 graphs: the path for a GPU device, and the reference the plain path is
    /// tested against.
    pub fn predict_on_device(&self, batch: &[PlacementGraph]) -> Result<Vec<Prediction>> {
        validate(batch)?;
        // The fold networks of a novel shape run on the CPU path.
        let mut scratch = Scratch::default();
        let mut out = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(PREDICT_CHUNK) {
            let refs: Vec<&PlacementGraph> = chunk.iter().collect();
            let inputs = GraphBatch::new(&refs, &self.normalization, &self.device);
            let raw = self.network.forward(&inputs);
            let mean = to_vec(raw.step_mean)?;
            let log_var = to_vec(raw.step_log_var)?;
            let mem = to_vec(raw.peak_mem)?;
            let util = to_vec(raw.util)?;
            for (i, g) in chunk.iter().enumerate() {
                let mut peak_mem = [0.0; MEM_PHASES];
                peak_mem.copy_from_slice(&mem[i * MEM_PHASES..(i + 1) * MEM_PHASES]);
                let raw = RawOutput {
                    step_mean: mean[i],
                    step_log_var: log_var[i],
                    peak_mem,
                    util: util[i],
                };
                out.push(self.prediction(raw, g, out.len(), &mut scratch)?);
            }
        }
        Ok(out)
    }

    /// Mean and standard deviation of `ln(step time)` before the interval's calibration,
    /// with the network's residual and the linear one weighted by `(w, v)`, the weights
    /// [`Calibration::for_graph`] gives `g`.
    fn log_normal(&self, raw: &RawOutput, g: &Summarised, (w, v): (f32, f32)) -> (f32, f32) {
        let (mu, sigma) = self.unweighted_log_normal(raw);
        if w == 1.0 && v == 0.0 {
            return (mu, sigma);
        }
        let prior = g.graph.job.values[PRIOR_JOB_SLOT];
        let linear = match &self.linear {
            Some(l) if v != 0.0 => v * l.predict_summarised(g),
            _ => 0.0,
        };
        (prior + w * (mu - prior) + linear, sigma)
    }

    fn unweighted_log_normal(&self, raw: &RawOutput) -> (f32, f32) {
        let norm = &self.normalization;
        let log_std = norm.log_step_time.std[0];
        let mu = norm
            .log_step_time
            .invert(0, raw.step_mean.clamp(-MAX_STEP_Z, MAX_STEP_Z));
        (mu, (0.5 * raw.step_log_var).exp() * log_std)
    }

    /// The median and CV+ bounds of `ln step time` from the fold networks on `g` (a novel
    /// shape within the trained range), with the main network's mean `mu` at `weights`;
    /// `None` when they cannot give finite bounds (the σ multiplier serves then).
    fn cross_conformal(
        &self,
        g: &Summarised,
        mu: f32,
        weights: (f32, f32),
        scratch: &mut Scratch,
    ) -> Option<(f32, f32, f32)> {
        let folds: Vec<(f32, f32)> = self
            .folds
            .iter()
            .map(|f| {
                let raw = f.plain.forward(g.graph, &f.normalization, scratch);
                let (mu_k, sigma_k) = f.log_normal(&raw, g, weights);
                (mu_k, sigma_k * Z95 * f.calibration.seen_multiplier)
            })
            .collect();
        let (lower, upper) = crate::cross_conformal::cv_plus_bounds(
            &folds,
            &self.calibration.fold_ratios,
            self.calibration.coverage,
        )?;
        let mean = (mu + folds.iter().map(|(m, _)| m).sum::<f32>()) / (folds.len() + 1) as f32;
        mean.is_finite()
            .then(|| (mean.clamp(lower, upper), lower, upper))
    }

    /// Raw units from standardised outputs; an error when anything is not finite.
    fn prediction(
        &self,
        raw: RawOutput,
        g: &PlacementGraph,
        index: usize,
        scratch: &mut Scratch,
    ) -> Result<Prediction> {
        let norm = &self.normalization;
        let calibration = self.calibration.for_graph(g);
        let summarised = Summarised::new(g);
        let (mu, sigma) = self.log_normal(&raw, &summarised, calibration.weights);
        let sigma = sigma * calibration.multiplier;
        let (mu, lower, upper) = calibration
            .cross_conformal
            .then(|| self.cross_conformal(&summarised, mu, calibration.weights, scratch))
            .flatten()
            .unwrap_or((mu, mu - Z95 * sigma, mu + Z95 * sigma));
        let mut peak_mem_gib = [0.0; MEM_PHASES];
        for (p, slot) in peak_mem_gib.iter_mut().enumerate() {
            *slot = norm.peak_mem.invert(p, raw.peak_mem[p]).max(0.0);
        }
        let prediction = Prediction {
            step_time_s: mu.exp(),
            step_time_p05: lower.exp(),
            // A valid but very wide calibration (far beyond the trained range) must read
            // as "no idea", an interval up to the largest float, not as a failed prediction.
            step_time_p95: upper.min(LARGEST_LN).exp(),
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

/// `ln` of a bound just below `f32::MAX` (ln f32::MAX ≈ 88.72).
const LARGEST_LN: f32 = 88.0;

/// Checks every graph and target of labelled examples; errors name `label[i]`.
fn validate_examples(data: &[(PlacementGraph, Targets)], label: &str) -> Result<()> {
    for (i, (g, t)) in data.iter().enumerate() {
        g.validate(&format!("{label}[{i}].graph"))?;
        t.validate(&format!("{label}[{i}].targets"))?;
    }
    Ok(())
}

fn validate(batch: &[PlacementGraph]) -> Result<()> {
    for (i, g) in batch.iter().enumerate() {
        g.validate(&format!("graph[{i}]"))?;
    }
    Ok(())
}
