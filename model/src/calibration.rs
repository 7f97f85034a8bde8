//! Split-conformal calibration of the step-time interval.
//!
//! The Gaussian head's σ is fitted on the training shapes, where the network is most
//! sure of itself; on a placement shape it has never seen, the same σ is too narrow. So
//! after training, σ is scaled by a multiplier chosen on held-aside examples (split
//! conformal prediction): with `z = (ln y − μ) / σ` on the calibration set, the
//! multiplier is the `⌈(n + 1)·0.9⌉`-th smallest `|z|` over the 95 % normal quantile, so
//! that 90 % of the calibration truths fall inside `μ ± 1.645·m·σ`.
//!
//! There are two multipliers: one for graphs whose [`ShapeClass`] occurs in training and
//! one for novel shapes (calibrated on shape classes held out of training, never below
//! the first). The training shape classes are kept with them, so the serving side can
//! tell which applies.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::features::ShapeClass;

/// Standard-normal quantile of 0.95 (so ±Z spans the 5 %–95 % interval).
pub(crate) const Z95: f32 = 1.644_853_6;

/// Multipliers outside this range are refused on load (a damaged file, not a model).
const MAX_MULTIPLIER: f32 = 1e4;

/// σ multipliers for shapes seen and not seen in training; stored in `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Target share of truths inside the interval (0.9).
    pub coverage: f64,
    /// Shape classes of the training graphs, sorted, without duplicates.
    pub training_shapes: Vec<ShapeClass>,
    /// σ multiplier for a graph whose shape class is in `training_shapes`.
    pub seen_multiplier: f32,
    /// σ multiplier for any other graph (≥ `seen_multiplier`).
    pub novel_multiplier: f32,
    /// Calibration examples behind `seen_multiplier` (0: not calibrated, multiplier 1).
    pub seen_residuals: usize,
    /// Calibration examples behind `novel_multiplier` (0: the seen multiplier is used).
    pub novel_residuals: usize,
}

impl Calibration {
    /// No calibration: both multipliers 1.
    pub fn uncalibrated(shapes: impl IntoIterator<Item = ShapeClass>) -> Self {
        let mut training_shapes: Vec<ShapeClass> = shapes.into_iter().collect();
        training_shapes.sort_unstable();
        training_shapes.dedup();
        Self {
            coverage: 0.9,
            training_shapes,
            seen_multiplier: 1.0,
            novel_multiplier: 1.0,
            seen_residuals: 0,
            novel_residuals: 0,
        }
    }

    /// Whether `shape` never occurred in training.
    pub fn is_novel(&self, shape: ShapeClass) -> bool {
        self.training_shapes.binary_search(&shape).is_err()
    }

    /// The σ multiplier for a graph of `shape`.
    pub fn multiplier(&self, shape: ShapeClass) -> f32 {
        if self.is_novel(shape) {
            self.novel_multiplier
        } else {
            self.seen_multiplier
        }
    }

    /// Sets both multipliers from standardised residuals `z = (ln y − μ) / σ`, each
    /// tagged with whether its graph's shape is novel.
    pub fn fit(&mut self, residuals: &[(f32, bool)]) {
        let pick = |novel: bool| -> Vec<f32> {
            residuals
                .iter()
                .filter(|(z, n)| *n == novel && z.is_finite())
                .map(|(z, _)| z.abs())
                .collect()
        };
        let (seen, novel) = (pick(false), pick(true));
        self.seen_residuals = seen.len();
        self.novel_residuals = novel.len();
        self.seen_multiplier = conformal_multiplier(seen, self.coverage).unwrap_or(1.0);
        // With no novel residuals nothing says how wrong the network is off its training
        // shapes: never narrower than its own σ then (a seen multiplier near 0, from a
        // network that fits its training shapes almost exactly, would give novel shapes
        // zero-width intervals).
        self.novel_multiplier = conformal_multiplier(novel, self.coverage)
            .unwrap_or(self.seen_multiplier.max(1.0))
            .max(self.seen_multiplier);
    }

    /// Checks a loaded calibration; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.coverage > 0.0 && self.coverage < 1.0) {
            return Err(ModelError::invalid(
                "calibration.coverage",
                format!("must be in (0, 1), got {}", self.coverage),
            ));
        }
        for (name, m) in [
            ("seen_multiplier", self.seen_multiplier),
            ("novel_multiplier", self.novel_multiplier),
        ] {
            if !(m.is_finite() && m > 0.0 && m <= MAX_MULTIPLIER) {
                return Err(ModelError::invalid(
                    format!("calibration.{name}"),
                    format!("must be finite and in (0, {MAX_MULTIPLIER}], got {m}"),
                ));
            }
        }
        if self.training_shapes.is_empty() {
            return Err(ModelError::invalid(
                "calibration.training_shapes",
                "no training shape classes",
            ));
        }
        if self.training_shapes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::invalid(
                "calibration.training_shapes",
                "not sorted without duplicates",
            ));
        }
        Ok(())
    }
}

/// The split-conformal σ multiplier for `|z|` values: the `⌈(n + 1)·coverage⌉`-th
/// smallest (the largest when that rank exceeds `n`) over [`Z95`]; `None` without values.
pub fn conformal_multiplier(mut abs_z: Vec<f32>, coverage: f64) -> Option<f32> {
    if abs_z.is_empty() {
        return None;
    }
    abs_z.sort_by(f32::total_cmp);
    let n = abs_z.len();
    let rank = (((n + 1) as f64) * coverage).ceil() as usize;
    let q = abs_z[rank.clamp(1, n) - 1];
    Some((q / Z95).max(1e-3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformal_rank_on_a_toy_set() {
        // 19 values 1..=19: rank ⌈20·0.9⌉ = 18 → 18.
        let z: Vec<f32> = (1..=19).map(|v| v as f32).collect();
        let m = conformal_multiplier(z, 0.9).unwrap();
        assert!((m - 18.0 / Z95).abs() < 1e-5, "{m}");
        // Order does not matter, signs are the caller's: 9 values → rank 9 = the largest.
        let z = vec![0.5, 3.0, 0.1, 0.2, 0.9, 0.4, 0.3, 0.8, 0.7];
        assert!((conformal_multiplier(z, 0.9).unwrap() - 3.0 / Z95).abs() < 1e-6);
        assert_eq!(conformal_multiplier(vec![], 0.9), None);
        // Exactly standard-normal residuals at their own quantiles need no scaling.
        let z: Vec<f32> = (1..1000)
            .map(|i| {
                // |z| quantiles of a standard normal at i/1000 (via the folded-normal inverse).
                let p = i as f64 / 1000.0;
                inverse_folded_normal(p) as f32
            })
            .collect();
        let m = conformal_multiplier(z, 0.9).unwrap();
        assert!((m - 1.0).abs() < 0.01, "{m}");
    }

    /// |z| with P(|Z| ≤ |z|) = p, by bisection on erf.
    fn inverse_folded_normal(p: f64) -> f64 {
        let cdf = |x: f64| {
            // Abramowitz–Stegun 7.1.26 erf, |error| < 1.5e-7.
            let t = 1.0 / (1.0 + 0.327_591_1 * x / 2f64.sqrt());
            let poly = t
                * (0.254_829_592
                    + t * (-0.284_496_736
                        + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
            1.0 - poly * (-(x * x) / 2.0).exp()
        };
        let (mut lo, mut hi) = (0.0, 10.0);
        for _ in 0..100 {
            let mid = (lo + hi) / 2.0;
            if cdf(mid) < p { lo = mid } else { hi = mid }
        }
        lo
    }

    #[test]
    fn seen_and_novel_multipliers() {
        let mut c = Calibration::uncalibrated([(2, 1), (1, 0), (2, 1)]);
        assert_eq!(c.training_shapes, vec![(1, 0), (2, 1)]);
        assert!(c.is_novel((8, 4)) && !c.is_novel((2, 1)));
        // Seen residuals small, novel ones large.
        let mut r: Vec<(f32, bool)> = (1..=19).map(|v| (v as f32 * 0.1, false)).collect();
        r.extend((1..=19).map(|v| (-(v as f32), true)));
        c.fit(&r);
        assert_eq!((c.seen_residuals, c.novel_residuals), (19, 19));
        assert!((c.seen_multiplier - 1.8 / Z95).abs() < 1e-5);
        assert!((c.novel_multiplier - 18.0 / Z95).abs() < 1e-5);
        assert_eq!(c.multiplier((2, 1)), c.seen_multiplier);
        assert_eq!(c.multiplier((16, 4)), c.novel_multiplier);
        // A novel group narrower than the seen one is raised to it; none falls back to it,
        // or to the network's own σ when the seen one is narrower than that.
        let mut c2 = c.clone();
        c2.fit(&[(3.0, false), (0.1, true)]);
        assert_eq!(c2.novel_multiplier, c2.seen_multiplier);
        c2.fit(&[(3.0, false)]);
        assert_eq!(
            (c2.novel_residuals, c2.novel_multiplier),
            (0, c2.seen_multiplier)
        );
        c2.fit(&[(0.01, false)]);
        assert!(c2.seen_multiplier < 0.01);
        assert_eq!((c2.novel_residuals, c2.novel_multiplier), (0, 1.0));
        c.validate().unwrap();
    }

    #[test]
    fn damaged_calibrations_are_refused() {
        let good = Calibration::uncalibrated([(1, 0)]);
        let mut c = good.clone();
        c.novel_multiplier = f32::NAN;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("novel_multiplier")
        );
        let mut c = good.clone();
        c.seen_multiplier = 0.0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("seen_multiplier")
        );
        let mut c = good.clone();
        c.training_shapes.clear();
        assert!(c.validate().is_err());
        let mut c = good.clone();
        c.training_shapes = vec![(2, 1), (1, 0)];
        assert!(c.validate().is_err());
        let mut c = good;
        c.coverage = 1.5;
        assert!(c.validate().is_err());
    }
}
