//! A ridge regression of the prior's residual on a placement's summary: the "wide" half
//! the network's novel-shape prediction is stacked with.
//!
//! Why it exists: on measured step times, the graph network's residual around the prior
//! carries over to a shape class it never trained on only in part, while a linear
//! residual on a few graph-level quantities (how many nodes, how many GPUs per node, the
//! slowest link, the job) extrapolates smoothly between the GPU counts it saw. Neither is
//! best everywhere, so on a novel shape the predicted mean is
//! `ln prior + w·(μ − ln prior) + v·r(g)`, with `w` and `v` chosen on networks trained with
//! shape classes held out ([`crate::choose_novel_weights`]). Seen shapes keep the network.
//!
//! Every input is held within its training range before it is used, as the network's are,
//! so a gang larger than any trained reads as the largest trained one here and whatever
//! lies beyond is the prior's to explain.

use std::cell::OnceCell;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::features::{JOB_FEATURES, PRIOR_JOB_SLOT, PlacementGraph, Targets};
use crate::normalize::Standardizer;
use crate::{GPU_FEATURES, LINK_FEATURES};

/// Summary features: the job's (without the prior), the mean of each GPU and link feature,
/// and five graph quantities.
pub const SUMMARY_FEATURES: usize = JOB_FEATURES - 1 + GPU_FEATURES + LINK_FEATURES + 5;

/// `log2` bandwidth a graph without links reads as its slowest link: faster than any
/// interconnect, so a single GPU is never mistaken for a slow gang.
const NO_LINK_LOG2_GBPS: f32 = 20.0;

/// Ridge penalty on the standardised features.
pub const DEFAULT_RIDGE: f64 = 1.0;

/// A fitted linear residual: `ln y − ln prior ≈ bias + Σ wᵢ·zᵢ`, `zᵢ` the standardised,
/// range-clamped summary features. Stored as `linear_residual.json` in an artifact
/// (unknown fields refused, as in `normalization.json`: see [`Standardizer`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearResidual {
    /// Standardisation and training range of each summary feature.
    pub features: Standardizer,
    /// One weight per summary feature.
    pub weights: Vec<f64>,
    pub bias: f64,
    /// The ridge penalty it was fitted with.
    pub ridge: f64,
    /// Training examples.
    pub examples: usize,
}

impl LinearResidual {
    /// Fits on labelled graphs (each example weighs the same); an error without examples,
    /// with a non-finite target, or when the system cannot be solved.
    pub fn fit(train: &[(PlacementGraph, Targets)], ridge: f64) -> Result<Self> {
        if train.is_empty() {
            return Err(ModelError::invalid(
                "train",
                "no examples for the linear residual",
            ));
        }
        if !(ridge.is_finite() && ridge > 0.0) {
            return Err(ModelError::invalid("ridge", "must be finite and > 0"));
        }
        for (i, (g, _)) in train.iter().enumerate() {
            g.validate(&format!("train[{i}].graph"))?;
        }
        let rows: Vec<[f32; SUMMARY_FEATURES]> = train.iter().map(|(g, _)| summary(g)).collect();
        let features = Standardizer::fit(SUMMARY_FEATURES, rows.iter().map(|r| &r[..]));
        let targets: Vec<f64> = train
            .iter()
            .map(|(g, t)| f64::from(t.step_time_s.ln()) - f64::from(g.job.values[PRIOR_JOB_SLOT]))
            .collect();
        if let Some(i) = targets.iter().position(|y| !y.is_finite()) {
            return Err(ModelError::invalid(
                format!("train[{i}]"),
                "step time or prior gives a non-finite residual",
            ));
        }
        // Centred target and features: the bias is the mean residual, left unpenalised.
        let n = targets.len() as f64;
        let bias = targets.iter().sum::<f64>() / n;
        let d = SUMMARY_FEATURES;
        let mut gram = vec![0.0; d * d];
        let mut rhs = vec![0.0; d];
        for (row, y) in rows.iter().zip(&targets) {
            let z = standardised(&features, row);
            for i in 0..d {
                rhs[i] += z[i] * (y - bias);
                for j in 0..d {
                    gram[i * d + j] += z[i] * z[j];
                }
            }
        }
        for i in 0..d {
            gram[i * d + i] += ridge;
        }
        let weights = solve_spd(gram, rhs).ok_or_else(|| {
            ModelError::Training("the ridge system is not positive definite".into())
        })?;
        let fitted = Self {
            features,
            weights,
            bias,
            ridge,
            examples: train.len(),
        };
        fitted.validate()?;
        Ok(fitted)
    }

    /// The predicted residual `ln y − ln prior` for `g`.
    pub fn predict(&self, g: &PlacementGraph) -> f32 {
        self.predict_summary(&summary(g))
    }

    /// [`Self::predict`] from a summary several networks share.
    pub(crate) fn predict_summarised(&self, g: &Summarised) -> f32 {
        self.predict_summary(g.summary())
    }

    fn predict_summary(&self, summary: &[f32; SUMMARY_FEATURES]) -> f32 {
        let z = standardised(&self.features, summary);
        (self.bias + z.iter().zip(&self.weights).map(|(z, w)| z * w).sum::<f64>()) as f32
    }

    /// Rejects a residual read from disk that cannot serve (wrong width, non-finite).
    pub fn validate(&self) -> Result<()> {
        self.features
            .check("linear_residual.features", SUMMARY_FEATURES)?;
        if self.weights.len() != SUMMARY_FEATURES {
            return Err(ModelError::invalid(
                "linear_residual.weights",
                format!("expected {SUMMARY_FEATURES}, found {}", self.weights.len()),
            ));
        }
        if !(self.bias.is_finite() && self.weights.iter().all(|w| w.is_finite())) {
            return Err(ModelError::invalid(
                "linear_residual.weights",
                "non-finite weight or bias",
            ));
        }
        Ok(())
    }
}

/// A graph with its summary computed on first use, so that the networks serving one graph
/// (the main one and its fold networks) take its node count and link statistics once.
pub(crate) struct Summarised<'a> {
    pub(crate) graph: &'a PlacementGraph,
    summary: OnceCell<[f32; SUMMARY_FEATURES]>,
}

impl<'a> Summarised<'a> {
    pub(crate) fn new(graph: &'a PlacementGraph) -> Self {
        Self {
            graph,
            summary: OnceCell::new(),
        }
    }

    fn summary(&self) -> &[f32; SUMMARY_FEATURES] {
        self.summary.get_or_init(|| summary(self.graph))
    }
}

fn standardised(features: &Standardizer, row: &[f32; SUMMARY_FEATURES]) -> [f64; SUMMARY_FEATURES] {
    let mut z = [0.0; SUMMARY_FEATURES];
    for (i, v) in row.iter().enumerate() {
        z[i] = f64::from(features.input(i, *v));
    }
    z
}

/// The summary of a graph: job features except the prior, mean GPU and link features,
/// then the slowest link's `log2` bandwidth, the widest topology level, `log2` of the
/// nodes (groups of GPUs joined by NVLink or PCIe), `log2` of the GPUs per node, and the
/// job's communication ratio times the share of links that cross nodes.
fn summary(g: &PlacementGraph) -> [f32; SUMMARY_FEATURES] {
    let mut x = [0.0f32; SUMMARY_FEATURES];
    let mut at = 0;
    for (i, v) in g.job.values.iter().enumerate() {
        if i != PRIOR_JOB_SLOT {
            x[at] = *v;
            at += 1;
        }
    }
    let gpus = g.gpus.len().max(1) as f32;
    for f in 0..GPU_FEATURES {
        x[at] = g.gpus.iter().map(|n| n.values[f]).sum::<f32>() / gpus;
        at += 1;
    }
    let links = g.links.len().max(1) as f32;
    for f in 0..LINK_FEATURES {
        x[at] = g.links.iter().map(|l| l.2.values[f]).sum::<f32>() / links;
        at += 1;
    }
    let slowest = g
        .links
        .iter()
        .map(|l| l.2.values[4])
        .fold(NO_LINK_LOG2_GBPS, f32::min);
    let widest = g.links.iter().map(|l| l.2.values[5]).fold(0.0, f32::max);
    let nodes = g.node_count() as f32;
    let crossing = g
        .links
        .iter()
        .filter(|l| l.2.values[2] > 0.5 || l.2.values[3] > 0.5)
        .count() as f32
        / links;
    let comm_ratio = g.job.values[10];
    for v in [
        slowest,
        widest,
        nodes.log2(),
        (gpus / nodes).log2(),
        comm_ratio * crossing,
    ] {
        x[at] = v;
        at += 1;
    }
    debug_assert_eq!(at, SUMMARY_FEATURES);
    x
}

/// Solves `a x = b` for a symmetric positive-definite `a` (row-major, `n × n`) by
/// Cholesky decomposition; `None` when `a` is not positive definite.
pub fn solve_spd(mut a: Vec<f64>, b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    if a.len() != n * n {
        return None;
    }
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d.is_nan() || d <= 0.0 {
            return None;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    // L y = b, then Lᵀ x = y.
    let mut y = b;
    for i in 0..n {
        let mut s = y[i];
        for k in 0..i {
            s -= a[i * n + k] * y[k];
        }
        y[i] = s / a[i * n + i];
    }
    for i in (0..n).rev() {
        let mut s = y[i];
        for k in i + 1..n {
            s -= a[k * n + i] * y[k];
        }
        y[i] = s / a[i * n + i];
    }
    Some(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::uniform_placement as placement;

    fn labelled(g: PlacementGraph, residual: f32) -> (PlacementGraph, Targets) {
        let t = Targets {
            step_time_s: (g.job.values[PRIOR_JOB_SLOT] + residual).exp(),
            peak_mem_gib: [f32::NAN; crate::MEM_PHASES],
            gpu_util_pct: f32::NAN,
        };
        (g, t)
    }

    #[test]
    fn the_summary_counts_nodes_and_gpus_per_node_and_finds_the_slowest_link() {
        let x = summary(&placement(2, 4));
        let tail = &x[SUMMARY_FEATURES - 5..];
        // 28 links, 16 of them between the two nodes.
        assert_eq!(tail[0], 50f32.log2());
        assert_eq!(tail[1], 2.0);
        assert_eq!(tail[2], 1.0);
        assert_eq!(tail[3], 2.0);
        assert!((tail[4] - 0.5 * 16.0 / 28.0).abs() < 1e-6, "{}", tail[4]);
        let single = summary(&placement(1, 1));
        let tail = &single[SUMMARY_FEATURES - 5..];
        assert_eq!(tail, &[NO_LINK_LOG2_GBPS, 0.0, 0.0, 0.0, 0.0]);
        // The prior is not a feature: the residual is what is left of it.
        let mut shifted = placement(2, 4);
        shifted.job.values[PRIOR_JOB_SLOT] = 3.0;
        assert_eq!(summary(&shifted), summary(&placement(2, 4)));
    }

    #[test]
    fn a_fit_recovers_a_residual_that_grows_with_the_nodes_and_clamps_inputs_to_the_trained_range()
    {
        // The residual is 0.3 per doubling of nodes, at any GPUs per node.
        let mut train = Vec::new();
        for nodes in [1, 2, 4] {
            for per_node in [1, 2, 4] {
                train.push(labelled(
                    placement(nodes, per_node),
                    0.3 * (nodes as f32).log2(),
                ));
            }
        }
        let fitted = LinearResidual::fit(&train, 1e-6).unwrap();
        for (g, t) in &train {
            let r = t.step_time_s.ln() - g.job.values[PRIOR_JOB_SLOT];
            assert!(
                (fitted.predict(g) - r).abs() < 1e-3,
                "{} vs {r}",
                fitted.predict(g)
            );
        }
        assert!((fitted.predict(&placement(3, 2)) - 0.3 * 3f32.log2()).abs() < 0.05);
        // Inputs beyond the trained range read as its edge: a gang size past the largest
        // trained, or a feature that was constant in training.
        let edge = placement(4, 4);
        let mut beyond = edge.clone();
        beyond.job.values[0] = 10.0;
        beyond.job.values[1] = 5.0;
        assert_eq!(fitted.predict(&beyond), fitted.predict(&edge));
        // A ridge penalty shrinks the slope towards the mean residual.
        let shrunk = LinearResidual::fit(&train, 100.0).unwrap();
        assert!(shrunk.predict(&placement(4, 1)) < fitted.predict(&placement(4, 1)));
        assert!((shrunk.bias - fitted.bias).abs() < 1e-9);
    }

    #[test]
    fn bad_inputs_and_damaged_residuals_are_errors() {
        assert!(LinearResidual::fit(&[], 1.0).is_err());
        let one = [labelled(placement(1, 2), 0.1)];
        assert!(LinearResidual::fit(&one, 0.0).is_err());
        assert!(LinearResidual::fit(&one, f64::NAN).is_err());
        let mut nan_feature = one.clone();
        nan_feature[0].0.gpus[0].values[2] = f32::NAN;
        let err = LinearResidual::fit(&nan_feature, 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("train[0].graph"), "{err}");
        let mut bad_target = one.clone();
        bad_target[0].1.step_time_s = 0.0;
        let err = LinearResidual::fit(&bad_target, 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("train[0]"), "{err}");
        let good = LinearResidual::fit(&one, 1.0).unwrap();
        let mut short = good.clone();
        short.weights.pop();
        assert!(
            short
                .validate()
                .unwrap_err()
                .to_string()
                .contains("weights")
        );
        let mut nan = good.clone();
        nan.bias = f64::NAN;
        assert!(nan.validate().is_err());
        let mut narrow = good;
        narrow.features.mean.pop();
        assert!(
            narrow
                .validate()
                .unwrap_err()
                .to_string()
                .contains("features")
        );
    }

    #[test]
    fn cholesky_solves_positive_definite_systems_only() {
        let x = solve_spd(vec![4.0, 2.0, 2.0, 3.0], vec![2.0, 1.0]).unwrap();
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12, "{x:?}");
        assert!(solve_spd(vec![0.0], vec![1.0]).is_none());
        assert!(solve_spd(vec![1.0, 2.0, 2.0, 1.0], vec![1.0, 1.0]).is_none());
        assert!(solve_spd(vec![1.0; 3], vec![1.0, 1.0]).is_none());
    }
}
