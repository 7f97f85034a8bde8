//! Widening the step-time interval beyond the trained range of gang sizes.
//!
//! The split-conformal multipliers of [`crate::calibration`] are measured on shapes inside
//! the training side's range: a held-out GPU count between trained ones, a spread at a
//! known interconnect. A placement on more machines, or with more GPUs, than any training
//! graph is a different question: the network and the prior both extrapolate, and their
//! errors grow with how far. On Pollux's scalability runs (6–16 machines where training
//! has at most 4) the calibrated interval held 64 % of the truths.
//!
//! So the multiplier is scaled by `1 + k·d`, where `d` is the graph's distance beyond the
//! training range in doublings,
//! `d = max(0, log2(machines / trained machines), log2(GPUs / trained GPUs))`,
//! and the slope `k` is fitted on the training side by an extrapolation run of the same
//! kind: a network trained on the graphs spanning at most half the largest machine count,
//! tested on the rest. For each of its test graphs, `s = r / b` is its residual `r` in
//! that network's interval half-widths over the base ratio `b` the interval would already
//! allow (1 on a shape class the network trained on, the novel/seen ratio otherwise), and
//! `k_i = max(0, (s − 1) / d)` the smallest slope that covers it. `k` is the finite-sample
//! conformal quantile of the `k_i`, so that 90 % of the extrapolation run's truths fall
//! inside their widened intervals.
//!
//! The same run chooses the mean beyond the range: the weights of the network's residual
//! and of the linear residual (as [`crate::choose_novel_weights`] does for novel shape
//! classes) with the lowest error on its graphs beyond its own range, since a graph on
//! more machines than any trained is novel to the network whatever its shape class, and
//! the network's residual extrapolated in machine count is what the run can test. The
//! pairs behind the slope are measured at those weights.
//!
//! *The assumption, said plainly:* that the miss grows linearly in doublings beyond the
//! trained range at the rate the training side shows over its own first doubling. Nothing
//! on the training side can check that rate farther out; a test set that goes farther
//! (the scalability runs go two doublings beyond) is the only check.
//!
//! Every field is optional in `meta.json`: an older artifact loads with nothing recorded
//! (`trained_nodes = 0`), which means no widening, what it always meant.

use serde::{Deserialize, Serialize};

use crate::calibration::conformal_quantile;
use crate::error::{ModelError, Result};
use crate::features::PlacementGraph;

/// Slopes above this are refused on load (a damaged file, not a model).
const MAX_SLOPE: f32 = 1e3;

/// How the multiplier widens beyond the trained range; stored in `meta.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Extrapolation {
    /// The most machines any training graph spans (0: not recorded, no widening).
    #[serde(default)]
    pub trained_nodes: u32,
    /// The most GPUs any training graph has (0: not recorded, no widening).
    #[serde(default)]
    pub trained_gpus: u32,
    /// Growth of the multiplier per doubling beyond the trained range (`k`).
    #[serde(default)]
    pub slope: f32,
    /// Residuals behind `slope` (0: not fitted, slope 0).
    #[serde(default)]
    pub residuals: usize,
    /// The weights `[w, v]` of the network's residual and of the linear residual on a
    /// graph beyond the trained range, chosen on the extrapolation run's graphs
    /// ([`crate::choose_novel_weights`]); absent (and in older artifacts) such a graph
    /// gets the weights of its shape class.
    #[serde(default)]
    pub weights: Option<[f32; 2]>,
}

impl Extrapolation {
    /// The trained range of `training` graphs, with no slope yet.
    pub fn of_training<'a>(training: impl IntoIterator<Item = &'a PlacementGraph>) -> Self {
        let (mut nodes, mut gpus) = (0, 0);
        for g in training {
            nodes = nodes.max(g.node_count() as u32);
            gpus = gpus.max(g.gpus.len() as u32);
        }
        Self {
            trained_nodes: nodes,
            trained_gpus: gpus,
            slope: 0.0,
            residuals: 0,
            weights: None,
        }
    }

    /// How many doublings `g` lies beyond the trained range (0 inside it, or when the
    /// range is not recorded).
    pub fn distance(&self, g: &PlacementGraph) -> f32 {
        if self.trained_nodes == 0 || self.trained_gpus == 0 {
            return 0.0;
        }
        let beyond = |n: usize, trained: u32| (n as f32 / trained as f32).log2().max(0.0);
        beyond(g.node_count(), self.trained_nodes).max(beyond(g.gpus.len(), self.trained_gpus))
    }

    /// The residual weights for `g` when it lies beyond the trained range and the run
    /// chose some; `None` otherwise (the shape class decides).
    pub fn weights_for(&self, g: &PlacementGraph) -> Option<(f32, f32)> {
        self.weights_at(self.distance(g))
    }

    /// [`Self::weights_for`] a graph `d` doublings beyond the range.
    pub fn weights_at(&self, d: f32) -> Option<(f32, f32)> {
        let [w, v] = self.weights?;
        (d > 0.0).then_some((w, v))
    }

    /// The factor `1 + k·d` on `g`'s multiplier.
    pub fn factor(&self, g: &PlacementGraph) -> f32 {
        self.factor_at(self.distance(g))
    }

    /// [`Self::factor`] for a graph `d` doublings beyond the range.
    pub fn factor_at(&self, d: f32) -> f32 {
        1.0 + self.slope * d
    }

    /// Fits the slope from `(s, d)` pairs (the residual over its base ratio, the distance
    /// beyond the run's trained range); pairs with `d = 0` or anything non-finite say
    /// nothing about the slope and are skipped. Too few pairs for a finite conformal
    /// quantile (8 or fewer at 90 %) give the largest needed slope, the most cautious
    /// finite choice; none give slope 0.
    pub fn fit_slope(&mut self, pairs: &[(f32, f32)], coverage: f64) {
        let needed: Vec<f32> = pairs
            .iter()
            .filter(|(s, d)| s.is_finite() && d.is_finite() && *d > 0.0)
            .map(|(s, d)| ((s - 1.0) / d).max(0.0))
            .collect();
        self.residuals = needed.len();
        let largest = needed.iter().copied().fold(0.0, f32::max);
        self.slope = match conformal_quantile(needed, coverage) {
            None => 0.0,
            Some(q) if q.is_finite() => q,
            Some(_) => largest,
        }
        .min(MAX_SLOPE);
    }

    /// Checks a loaded record; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.slope.is_finite() && (0.0..=MAX_SLOPE).contains(&self.slope)) {
            return Err(ModelError::invalid(
                "calibration.extrapolation.slope",
                format!("must be in [0, {MAX_SLOPE}], got {}", self.slope),
            ));
        }
        if let Some(w) = self.weights
            && !w.iter().all(|w| w.is_finite() && (0.0..=1.0).contains(w))
        {
            return Err(ModelError::invalid(
                "calibration.extrapolation.weights",
                format!("must be in [0, 1], got {w:?}"),
            ));
        }
        let fitted = self.slope > 0.0 || self.weights.is_some();
        if fitted && (self.trained_nodes == 0 || self.trained_gpus == 0) {
            return Err(ModelError::invalid(
                "calibration.extrapolation",
                "a slope without a trained range",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::uniform_placement as placement;

    #[test]
    fn distance_is_doublings_beyond_the_trained_machines_or_gpus() {
        let trained = [placement(1, 4), placement(2, 2), placement(4, 1)];
        let e = Extrapolation::of_training(&trained);
        assert_eq!((e.trained_nodes, e.trained_gpus), (4, 4));
        assert_eq!(e.distance(&placement(2, 2)), 0.0);
        assert_eq!(e.distance(&placement(1, 1)), 0.0);
        assert!((e.distance(&placement(8, 1)) - 1.0).abs() < 1e-6);
        // 2 machines of 8: within the machines, two doublings beyond the GPUs.
        assert!((e.distance(&placement(2, 8)) - 2.0).abs() < 1e-6);
        assert!((e.distance(&placement(16, 4)) - 4.0).abs() < 1e-6);
        // Chosen weights apply beyond the range only.
        let mut chosen = e.clone();
        chosen.weights = Some([0.2, 0.3]);
        assert_eq!(chosen.weights_for(&placement(8, 1)), Some((0.2, 0.3)));
        assert_eq!(chosen.weights_for(&placement(2, 2)), None);
        assert_eq!(e.weights_for(&placement(8, 1)), None);
        // Not recorded: no distance, no widening.
        let old = Extrapolation::default();
        assert_eq!(old.distance(&placement(16, 4)), 0.0);
        assert_eq!(old.factor(&placement(16, 4)), 1.0);
    }

    #[test]
    fn the_slope_covers_ninety_percent_of_the_needed_slopes() {
        let mut e = Extrapolation::of_training(&[placement(2, 4)]);
        // 19 residuals at d = 1 needing slopes 0.1 … 1.9, one at d = 0 (skipped) and one
        // non-finite (skipped): rank ⌈20·0.9⌉ = 18 → 1.8.
        let mut pairs: Vec<(f32, f32)> = (1..=19).map(|i| (1.0 + i as f32 / 10.0, 1.0)).collect();
        pairs.push((50.0, 0.0));
        pairs.push((f32::NAN, 1.0));
        e.fit_slope(&pairs, 0.9);
        assert_eq!(e.residuals, 19);
        assert!((e.slope - 1.8).abs() < 1e-5, "{}", e.slope);
        assert!((e.factor(&placement(4, 4)) - 2.8).abs() < 1e-5);
        // A residual inside its base interval needs no slope; the distance divides.
        e.fit_slope(&[(0.5, 1.0); 20], 0.9);
        assert_eq!(e.slope, 0.0);
        e.fit_slope(&[(3.0, 2.0); 20], 0.9);
        assert!((e.slope - 1.0).abs() < 1e-6);
        // Too few for a finite quantile: the largest; none: 0.
        e.fit_slope(&[(2.0, 1.0), (4.0, 1.0)], 0.9);
        assert_eq!((e.slope, e.residuals), (3.0, 2));
        e.fit_slope(&[], 0.9);
        assert_eq!((e.slope, e.residuals), (0.0, 0));
    }

    #[test]
    fn damaged_records_are_refused_naming_the_field() {
        let mut e = Extrapolation::of_training(&[placement(2, 4)]);
        e.slope = f32::NAN;
        assert!(e.validate().unwrap_err().to_string().contains("slope"));
        e.slope = -1.0;
        assert!(e.validate().is_err());
        let e = Extrapolation {
            slope: 1.0,
            ..Default::default()
        };
        assert!(
            e.validate()
                .unwrap_err()
                .to_string()
                .contains("trained range")
        );
        assert!(Extrapolation::default().validate().is_ok());
    }
}
