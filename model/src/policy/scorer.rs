//! Serving: the network's weights as flat arrays, scores and confidence per decision.

use serde::{Deserialize, Serialize};

use super::features::{DecisionFeatures, INPUT_FEATURES};
use super::network::PolicyNetwork;
use crate::dense::Dense;
use crate::error::{ModelError, Result};

/// Standardisation of the network input, fitted on the training decisions, and how far
/// from them inputs may stray before the gate distrusts the model. Stored as a policy
/// artifact's `normalization.json`, whose unknown fields are refused: it has no optional
/// field, and one this build does not know could change what the statistics mean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureStats {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// 99.9th percentile of [`Scored::distance`] over the training decisions.
    pub distance_p999: f32,
}

impl FeatureStats {
    /// Fits mean and standard deviation per input slot over every candidate of `decisions`
    /// (constant slots get std 1, so they standardise to 0 and never divide by 0).
    pub fn fit(decisions: &[&DecisionFeatures]) -> FeatureStats {
        let mut sum = [0.0f64; INPUT_FEATURES];
        let mut sq = [0.0f64; INPUT_FEATURES];
        let mut n = 0usize;
        for d in decisions {
            for c in 0..d.candidates.len() {
                for (i, v) in d.input(c).iter().enumerate() {
                    sum[i] += f64::from(*v);
                    sq[i] += f64::from(*v) * f64::from(*v);
                }
                n += 1;
            }
        }
        let n = n.max(1) as f64;
        let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
        let std: Vec<f32> = sq
            .iter()
            .zip(&sum)
            .map(|(q, s)| {
                let var = (q / n - (s / n).powi(2)).max(0.0);
                if var.sqrt() < 1e-6 {
                    1.0
                } else {
                    var.sqrt() as f32
                }
            })
            .collect();
        let mut stats = FeatureStats {
            mean,
            std,
            distance_p999: f32::INFINITY,
        };
        let mut distances: Vec<f32> = decisions.iter().map(|d| stats.distance(d)).collect();
        distances.sort_by(f32::total_cmp);
        if let Some(&last) = distances.last() {
            let idx = ((distances.len() as f64 - 1.0) * 0.999).round() as usize;
            stats.distance_p999 = distances.get(idx).copied().unwrap_or(last);
        }
        stats
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.mean.len() != INPUT_FEATURES || self.std.len() != INPUT_FEATURES {
            return Err(ModelError::invalid(
                "feature_stats",
                format!("needs {INPUT_FEATURES} means and stds"),
            ));
        }
        if self.mean.iter().any(|m| !m.is_finite())
            || self.std.iter().any(|s| !(s.is_finite() && *s > 0.0))
            || self.distance_p999.is_nan()
        {
            return Err(ModelError::invalid(
                "feature_stats",
                "non-finite mean or non-positive std",
            ));
        }
        Ok(())
    }

    /// Standardised input of candidate `c`.
    pub fn standardise(&self, d: &DecisionFeatures, c: usize) -> [f32; INPUT_FEATURES] {
        let mut x = d.input(c);
        for (i, v) in x.iter_mut().enumerate() {
            *v = (*v - self.mean[i]) / self.std[i];
        }
        x
    }

    /// Distance of a decision from the training data: the largest, over its candidates,
    /// RMS of the standardised inputs (each slot clipped at 10σ so one wild slot cannot
    /// hide behind an average but cannot overflow either).
    pub fn distance(&self, d: &DecisionFeatures) -> f32 {
        (0..d.candidates.len())
            .map(|c| {
                let x = self.standardise(d, c);
                (x.iter().map(|v| v.clamp(-10.0, 10.0).powi(2)).sum::<f32>()
                    / INPUT_FEATURES as f32)
                    .sqrt()
            })
            .fold(0.0, f32::max)
    }
}

/// Scores and confidence of one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Logit per candidate, in the decision's order.
    pub logits: Vec<f32>,
    /// Softmax of the logits.
    pub probs: Vec<f32>,
    /// Index of the highest logit (first on ties).
    pub best: usize,
    /// Probability of the best minus that of the runner-up (1 with one candidate).
    pub margin: f32,
    /// [`FeatureStats::distance`] of the decision.
    pub distance: f32,
}

/// The candidate scorer with plain-Rust arithmetic: the same function as
/// [`PolicyNetwork::logits`], without tensor overhead.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyScorer {
    layers: [Dense; 3],
    stats: FeatureStats,
}

impl PolicyScorer {
    /// Copies the weights out of `network`.
    pub fn new(network: &PolicyNetwork, stats: FeatureStats) -> Result<PolicyScorer> {
        stats.validate()?;
        Ok(PolicyScorer {
            layers: [
                Dense::from_linear(&network.hidden1)?,
                Dense::from_linear(&network.hidden2)?,
                Dense::from_linear(&network.logit)?,
            ],
            stats,
        })
    }

    /// A freshly initialised (untrained) network's scorer: arbitrary but valid rankings,
    /// for tests and as the starting point of training.
    pub fn initialised(
        config: &super::PolicyConfig,
        seed: u64,
        stats: FeatureStats,
    ) -> Result<PolicyScorer> {
        use rand::SeedableRng;
        let net = PolicyNetwork::init(
            config,
            &mut rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            &burn::tensor::Device::flex(),
        );
        PolicyScorer::new(&net, stats)
    }

    /// The standardisation and distance statistics.
    pub fn stats(&self) -> &FeatureStats {
        &self.stats
    }

    /// Scores every candidate of `d` and measures the confidence. Errors on a decision
    /// that fails [`DecisionFeatures::validate`].
    pub fn score(&self, d: &DecisionFeatures) -> Result<Scored> {
        d.validate()?;
        let (mut h1, mut h2, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let logits: Vec<f32> = (0..d.candidates.len())
            .map(|c| {
                let x = self.stats.standardise(d, c);
                self.layers[0].forward(&x, &mut h1, true);
                self.layers[1].forward(&h1, &mut h2, true);
                self.layers[2].forward(&h2, &mut out, false);
                out[0]
            })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f32 = exp.iter().sum();
        let probs: Vec<f32> = exp.iter().map(|e| e / total).collect();
        let best = logits
            .iter()
            .enumerate()
            .fold(0, |b, (i, l)| if *l > logits[b] { i } else { b });
        let runner_up = probs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != best)
            .map(|(_, p)| *p)
            .fold(0.0, f32::max);
        if !logits.iter().all(|l| l.is_finite()) {
            return Err(ModelError::Backend(
                "policy produced a non-finite logit".into(),
            ));
        }
        Ok(Scored {
            margin: probs[best] - runner_up,
            distance: self.stats.distance(d),
            best,
            probs,
            logits,
        })
    }
}
