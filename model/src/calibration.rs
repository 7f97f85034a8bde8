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
//! one for novel shapes (never below the first). The training shape classes are kept with
//! them, so the serving side can tell which applies.
//!
//! The novel multiplier is `seen × ratio`, the ratio being the conformal quantile of
//! *normalised novel residuals* `r = |z| / (1.645·m_seen)`: how many seen-shape interval
//! half-widths a novel truth lies from the predicted mean. They may come from the same
//! network ([`Calibration::fit`]) or be pooled over several auxiliary networks trained
//! with shape classes held out, each residual relative to its own network's seen
//! multiplier ([`Calibration::fit_novel_ratios`], cross-conformal over shape classes).
//! The ratio is a finite-sample conformal quantile, honest about small samples:
//! - below [`FEW_NOVEL_RESIDUALS`] residuals the rule says so ([`NovelRule::FewResiduals`]);
//! - with `n < coverage / (1 − coverage)` residuals (8 or fewer at 90 %), the conformal
//!   rank `⌈(n + 1)·0.9⌉` exceeds `n`: the quantile is +∞, the sample cannot vouch for any
//!   finite width. An infinite σ would make every prediction non-finite, so the
//!   documented wide ratio [`WIDE_NOVEL_RATIO`] is used instead ([`NovelRule::WideFallback`]).
//!
//! `novel_rule` and `novel_folds` were added to `meta.json` without a schema bump: both
//! are optional ([`NovelRule::Unrecorded`] and 0 when absent), so an older artifact loads
//! and means what it always meant, and an older build ignores them.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::extrapolation::Extrapolation;
use crate::features::{PlacementGraph, ShapeClass};

/// Standard-normal quantile of 0.95 (so ±Z spans the 5 %–95 % interval).
pub const Z95: f32 = 1.644_853_6;

/// Multipliers outside this range are refused on load (a damaged file, not a model).
const MAX_MULTIPLIER: f32 = 1e4;

/// Below this many novel residuals the novel multiplier rests on few examples: the rule
/// ([`NovelRule::FewResiduals`]) and the training report say so.
pub const FEW_NOVEL_RESIDUALS: usize = 30;

/// The novel/seen ratio used when there are too few novel residuals for a finite
/// conformal quantile ([`NovelRule::WideFallback`]): novel intervals an order of magnitude
/// wider than seen ones (and never narrower than the network's own σ). A fixed, a-priori
/// choice, not fitted to any test set, and no guarantee: the pooled novel/seen ratios
/// measured so far (README, issue 5) range from about 1.2 (Pollux's measured step times)
/// to about 40 (simulated telemetry with stragglers). It marks the multiplier as a
/// guess, which the rule and the training report say.
pub const WIDE_NOVEL_RATIO: f32 = 10.0;

/// How [`Calibration::novel_multiplier`] was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NovelRule {
    /// Not recorded: an artifact written before the rule was (it means what it always
    /// meant: a conformal quantile when `novel_residuals > 0`, else the seen multiplier).
    #[default]
    Unrecorded,
    /// No novel residuals: the seen multiplier, at least 1 (the network's own σ).
    NoResiduals,
    /// The finite-sample conformal quantile of at least [`FEW_NOVEL_RESIDUALS`] residuals.
    Quantile,
    /// The finite-sample conformal quantile of fewer than [`FEW_NOVEL_RESIDUALS`] (one of
    /// the largest residuals: conservative, but itself uncertain).
    FewResiduals,
    /// Too few residuals for a finite conformal quantile: [`WIDE_NOVEL_RATIO`].
    WideFallback,
}

impl NovelRule {
    /// The rule the count of novel residuals implies, for a quantile that is finite or not.
    fn for_count(n: usize, finite: bool) -> Self {
        match n {
            0 => Self::NoResiduals,
            _ if !finite => Self::WideFallback,
            n if n < FEW_NOVEL_RESIDUALS => Self::FewResiduals,
            _ => Self::Quantile,
        }
    }

    /// A short label for reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unrecorded => "rule not recorded",
            Self::NoResiduals => "no novel residuals: seen multiplier, at least 1",
            Self::Quantile => "conformal quantile",
            Self::FewResiduals => "FEW residuals: finite-sample conformal quantile",
            Self::WideFallback => "TOO FEW residuals for a finite quantile: wide fallback ratio",
        }
    }
}

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
    /// How `novel_multiplier` was chosen (absent in older artifacts).
    #[serde(default)]
    pub novel_rule: NovelRule,
    /// Auxiliary networks (shape-class folds) the novel residuals were pooled from; 0 when
    /// they came from the network itself or were not recorded.
    #[serde(default)]
    pub novel_folds: usize,
    /// Weight of the network's residual around the prior on a novel shape: the predicted
    /// mean of `ln step time` there is `ln prior + w·(μ − ln prior)`, so 0 serves the
    /// prior alone and 1 (the default, and what older artifacts load as) the network.
    /// Chosen from networks trained with shape classes held out
    /// ([`crate::choose_novel_weights`]).
    #[serde(default = "full_weight")]
    pub novel_residual_weight: f32,
    /// Weight of the linear residual ([`crate::LinearResidual`]) added on a novel shape:
    /// the mean there is `ln prior + w·(μ − ln prior) + v·r(g)`. 0 (the default, and
    /// what older artifacts load as) leaves it out; above 0 the artifact must hold one.
    #[serde(default)]
    pub novel_linear_weight: f32,
    /// How both multipliers widen beyond the trained range of machines and GPUs
    /// ([`Extrapolation`]; absent in older artifacts: no widening).
    #[serde(default)]
    pub extrapolation: Extrapolation,
    /// Normalised residuals of each fold network on the shape classes it was trained
    /// without, at the novel weights, sorted: one list per fold network kept in the
    /// artifact (`folds/<k>/`). Not empty: novel shapes within the trained range get the
    /// CV+ interval of [`crate::cross_conformal`] instead of `novel_multiplier`. Absent in
    /// older artifacts (and empty): `novel_multiplier` as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fold_ratios: Vec<Vec<f32>>,
}

/// What [`Calibration::for_graph`] gives one graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphCalibration {
    /// The weights `(w, v)` of the network's residual and of the linear residual.
    pub weights: (f32, f32),
    /// The σ multiplier.
    pub multiplier: f32,
    /// Whether the fold networks' CV+ interval serves it (a novel shape within the trained
    /// range, and fold networks kept).
    pub cross_conformal: bool,
}

fn full_weight() -> f32 {
    1.0
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
            novel_rule: NovelRule::NoResiduals,
            novel_folds: 0,
            novel_residual_weight: 1.0,
            novel_linear_weight: 0.0,
            extrapolation: Extrapolation::default(),
            fold_ratios: Vec::new(),
        }
    }

    /// The weights of the network's residual and of the linear residual for a graph of
    /// `shape` (1 and 0 on seen shapes).
    pub fn residual_weights(&self, shape: ShapeClass) -> (f32, f32) {
        if self.is_novel(shape) {
            (self.novel_residual_weight, self.novel_linear_weight)
        } else {
            (1.0, 0.0)
        }
    }

    /// Whether any graph can get a linear residual weight above 0.
    pub fn uses_linear(&self) -> bool {
        self.novel_linear_weight > 0.0 || self.extrapolation.weights.is_some_and(|[_, v]| v > 0.0)
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

    /// What the calibration gives `g`, its shape class and its distance beyond the
    /// trained range each taken once: the residual weights of its mean (those chosen for
    /// graphs beyond the range when it lies beyond, else its shape's) and its σ
    /// multiplier (its shape's, widened by [`Extrapolation::factor_at`]).
    pub fn for_graph(&self, g: &PlacementGraph) -> GraphCalibration {
        let shape = g.shape_class();
        let d = self.extrapolation.distance(g);
        GraphCalibration {
            weights: self
                .extrapolation
                .weights_at(d)
                .unwrap_or_else(|| self.residual_weights(shape)),
            multiplier: (self.multiplier(shape) * self.extrapolation.factor_at(d))
                .min(MAX_MULTIPLIER),
            cross_conformal: d == 0.0 && !self.fold_ratios.is_empty() && self.is_novel(shape),
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
        self.seen_multiplier = conformal_multiplier(seen, self.coverage).unwrap_or(1.0);
        let half_width = Z95 * self.seen_multiplier;
        let ratios: Vec<f32> = novel.into_iter().map(|z| z / half_width).collect();
        self.fit_novel_ratios(&ratios, 0);
    }

    /// Sets the novel multiplier from normalised novel residuals `r = |z| / (1.645·m)`,
    /// `m` the seen multiplier of the network each residual came from (so residuals of
    /// differently scaled networks pool): `seen × ratio`, the ratio the finite-sample
    /// conformal quantile of `r` (see the module doc for small samples), never below 1.
    /// `folds` is the number of auxiliary networks the residuals were pooled from.
    pub fn fit_novel_ratios(&mut self, ratios: &[f32], folds: usize) {
        let ratios: Vec<f32> = ratios.iter().copied().filter(|r| r.is_finite()).collect();
        self.novel_residuals = ratios.len();
        self.novel_folds = folds;
        let q = conformal_quantile(ratios, self.coverage);
        self.novel_rule = NovelRule::for_count(self.novel_residuals, q.is_some_and(f32::is_finite));
        self.novel_multiplier = match self.novel_rule {
            // With no novel residuals nothing says how wrong the network is off its
            // training shapes: never narrower than its own σ then (a seen multiplier near
            // 0, from a network that fits its training shapes almost exactly, would give
            // novel shapes zero-width intervals).
            NovelRule::NoResiduals | NovelRule::Unrecorded => self.seen_multiplier.max(1.0),
            NovelRule::WideFallback => (self.seen_multiplier * WIDE_NOVEL_RATIO).max(1.0),
            NovelRule::Quantile | NovelRule::FewResiduals => {
                self.seen_multiplier * q.unwrap_or(1.0).max(1.0)
            }
        }
        .min(MAX_MULTIPLIER);
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
        for (name, w) in [
            ("novel_residual_weight", self.novel_residual_weight),
            ("novel_linear_weight", self.novel_linear_weight),
        ] {
            if !(w.is_finite() && (0.0..=1.0).contains(&w)) {
                return Err(ModelError::invalid(
                    format!("calibration.{name}"),
                    format!("must be in [0, 1], got {w}"),
                ));
            }
        }
        let n = self.novel_residuals;
        let consistent = match self.novel_rule {
            NovelRule::Unrecorded => true,
            NovelRule::NoResiduals => n == 0,
            NovelRule::WideFallback | NovelRule::FewResiduals => {
                (1..FEW_NOVEL_RESIDUALS).contains(&n)
            }
            NovelRule::Quantile => n >= FEW_NOVEL_RESIDUALS,
        };
        if !consistent {
            return Err(ModelError::invalid(
                "calibration.novel_rule",
                format!("{:?} does not fit {n} novel residuals", self.novel_rule),
            ));
        }
        self.extrapolation.validate()?;
        for (k, ratios) in self.fold_ratios.iter().enumerate() {
            if ratios.is_empty() {
                return Err(ModelError::invalid(
                    format!("calibration.fold_ratios[{k}]"),
                    "a fold network without residuals",
                ));
            }
            if let Some(r) = ratios.iter().find(|r| !(r.is_finite() && **r >= 0.0)) {
                return Err(ModelError::invalid(
                    format!("calibration.fold_ratios[{k}]"),
                    format!("residuals must be finite and ≥ 0, found {r}"),
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

/// One held-out prediction of `ln step time`: the network's mean `mu` and standard
/// deviation `sigma` (uncalibrated, full residual weight), the prior it learned the
/// residual around (`prior`), the truth, and whether the graph's shape is novel to the
/// network.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeldOutLogStep {
    pub mu: f32,
    pub sigma: f32,
    pub prior: f32,
    /// The linear residual's prediction `r(g)` (0 when the network has none).
    pub linear: f32,
    pub truth: f32,
    pub novel: bool,
}

impl HeldOutLogStep {
    /// The mean with the network's residual weighted by `w` and the linear residual by
    /// `v`.
    pub fn weighted_mu(&self, w: f32, v: f32) -> f32 {
        self.prior + w * (self.mu - self.prior) + v * self.linear
    }
}

/// Candidate weights of [`choose_novel_weights`]: 0, 0.05, …, 1 for each.
const WEIGHT_STEPS: u16 = 20;

/// The weights `(w, v)`, each in `{0, 0.05, …, 1}`, of the network's residual and of the
/// linear residual (`ln prior + w·(μ − ln prior) + v·r(g)`) with the lowest mean absolute
/// percentage error of the step time over `held_out`: predictions on shapes their
/// networks never trained on. Ties go to the larger `w`, then the smaller `v`; without a
/// finite example, `(1, 0)`. Pass examples whose `linear` is 0 to choose `w` alone.
///
/// Why weights and not the network or the prior outright: a network that learned its
/// residuals on trained shapes carries them to a novel shape only in part (on measured
/// data it made its prior worse there, on average, while helping on some shapes), a
/// linear residual extrapolates differently, and how far to trust each is a question the
/// held-out shapes of the training side can answer without touching the test.
pub fn choose_novel_weights(held_out: &[HeldOutLogStep]) -> (f32, f32) {
    let finite: Vec<[f64; 4]> = held_out
        .iter()
        .filter(|h| {
            h.mu.is_finite() && h.prior.is_finite() && h.linear.is_finite() && h.truth.is_finite()
        })
        .map(|h| [h.mu, h.prior, h.linear, h.truth].map(f64::from))
        .collect();
    if finite.is_empty() {
        return (1.0, 0.0);
    }
    let error = |w: f64, v: f64| {
        finite
            .iter()
            .map(|[mu, prior, linear, truth]| {
                ((prior + w * (mu - prior) + v * linear - truth).exp() - 1.0).abs()
            })
            .sum::<f64>()
    };
    let uses_linear = finite.iter().any(|h| h[2] != 0.0);
    let v_steps = if uses_linear { WEIGHT_STEPS } else { 0 };
    let mut best = (f64::INFINITY, 1.0, 0.0);
    for w_step in (0..=WEIGHT_STEPS).rev() {
        let w = f64::from(w_step) / f64::from(WEIGHT_STEPS);
        for v_step in 0..=v_steps {
            let v = f64::from(v_step) / f64::from(WEIGHT_STEPS);
            let e = error(w, v);
            if e < best.0 {
                best = (e, w, v);
            }
        }
    }
    (best.1 as f32, best.2 as f32)
}

/// `values` sorted, and the split-conformal rank `⌈(n + 1)·coverage⌉` (at least 1; it
/// exceeds `n` when there are too few values); `None` without values.
fn conformal_rank(mut values: Vec<f32>, coverage: f64) -> Option<(Vec<f32>, usize)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f32::total_cmp);
    let rank = ((((values.len() + 1) as f64) * coverage).ceil() as usize).max(1);
    Some((values, rank))
}

/// The split-conformal σ multiplier for `|z|` values: the `⌈(n + 1)·coverage⌉`-th
/// smallest (the largest when that rank exceeds `n`) over [`Z95`]; `None` without values.
pub fn conformal_multiplier(abs_z: Vec<f32>, coverage: f64) -> Option<f32> {
    let (sorted, rank) = conformal_rank(abs_z, coverage)?;
    Some((sorted[rank.min(sorted.len()) - 1] / Z95).max(1e-3))
}

/// The finite-sample split-conformal quantile: the `⌈(n + 1)·coverage⌉`-th smallest
/// value, +∞ when that rank exceeds `n` (too few values to vouch for any finite bound);
/// `None` without values.
pub fn conformal_quantile(values: Vec<f32>, coverage: f64) -> Option<f32> {
    let (sorted, rank) = conformal_rank(values, coverage)?;
    Some(sorted.get(rank - 1).copied().unwrap_or(f32::INFINITY))
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
        assert_eq!(c.novel_rule, NovelRule::FewResiduals);
        c.validate().unwrap();
        // A novel group narrower than the seen one is raised to it.
        let mut c2 = c.clone();
        let many: Vec<(f32, bool)> = std::iter::once((3.0, false))
            .chain((0..40).map(|_| (0.1, true)))
            .collect();
        c2.fit(&many);
        assert_eq!(c2.novel_multiplier, c2.seen_multiplier);
        assert_eq!(
            (c2.novel_residuals, c2.novel_rule),
            (40, NovelRule::Quantile)
        );
        // None falls back to it, or to the network's own σ when the seen one is narrower.
        c2.fit(&[(3.0, false)]);
        assert_eq!(
            (c2.novel_residuals, c2.novel_multiplier, c2.novel_rule),
            (0, c2.seen_multiplier, NovelRule::NoResiduals)
        );
        c2.fit(&[(0.01, false)]);
        assert!(c2.seen_multiplier < 0.01);
        assert_eq!((c2.novel_residuals, c2.novel_multiplier), (0, 1.0));
        // One small novel residual is no evidence of a narrow interval: the wide fallback.
        c2.fit(&[(3.0, false), (0.1, true)]);
        assert_eq!(c2.novel_rule, NovelRule::WideFallback);
        assert_eq!(c2.novel_multiplier, c2.seen_multiplier * WIDE_NOVEL_RATIO);
        c2.validate().unwrap();
    }

    #[test]
    fn the_finite_sample_quantile_is_infinite_below_nine_values() {
        // n = 8: rank ⌈9·0.9⌉ = 9 > 8.
        let v: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        assert_eq!(conformal_quantile(v, 0.9), Some(f32::INFINITY));
        // n = 9: rank ⌈10·0.9⌉ = 9, the largest.
        let v: Vec<f32> = (1..=9).rev().map(|v| v as f32).collect();
        assert_eq!(conformal_quantile(v, 0.9), Some(9.0));
        // n = 29: rank 27; n = 100: rank ⌈90.9⌉ = 91.
        let v: Vec<f32> = (1..=29).map(|v| v as f32).collect();
        assert_eq!(conformal_quantile(v, 0.9), Some(27.0));
        let v: Vec<f32> = (1..=100).map(|v| v as f32).collect();
        assert_eq!(conformal_quantile(v, 0.9), Some(91.0));
        assert_eq!(conformal_quantile(vec![], 0.9), None);
    }

    #[test]
    fn pooled_novel_ratios_give_the_known_multiplier_and_flag_small_samples() {
        let mut c = Calibration::uncalibrated([(2, 1)]);
        c.seen_multiplier = 0.5;
        // 100 ratios 0.05, 0.10, …, 5.0 (shuffled): rank 91 → 4.55; novel = 0.5 × 4.55.
        let mut r: Vec<f32> = (1..=100).map(|v| v as f32 * 0.05).collect();
        r.reverse();
        r.swap(3, 70);
        r.push(f32::NAN); // not counted
        c.fit_novel_ratios(&r, 3);
        assert_eq!(
            (c.novel_residuals, c.novel_folds, c.novel_rule),
            (100, 3, NovelRule::Quantile)
        );
        assert!(
            (c.novel_multiplier - 0.5 * 4.55).abs() < 1e-5,
            "{}",
            c.novel_multiplier
        );
        c.validate().unwrap();
        // Ratios below 1 never make novel intervals narrower than seen ones.
        c.fit_novel_ratios(&[0.2; 50], 3);
        assert_eq!(c.novel_multiplier, 0.5);
        // 20 residuals: the 19th smallest, flagged as few.
        let r: Vec<f32> = (1..=20).map(|v| v as f32).collect();
        c.fit_novel_ratios(&r, 3);
        assert_eq!(
            (c.novel_rule, c.novel_multiplier),
            (NovelRule::FewResiduals, 0.5 * 19.0)
        );
        // 4 residuals (the case that held 24 % of truths): no finite quantile, so the
        // documented wide ratio, however small the residuals were.
        c.fit_novel_ratios(&[1.2, 0.3, 2.0, 0.9], 3);
        assert_eq!(c.novel_rule, NovelRule::WideFallback);
        assert_eq!(c.novel_multiplier, (0.5 * WIDE_NOVEL_RATIO).max(1.0));
        c.validate().unwrap();
        // Nothing at all: the seen multiplier, at least the network's own σ.
        c.fit_novel_ratios(&[], 0);
        assert_eq!(
            (c.novel_rule, c.novel_multiplier),
            (NovelRule::NoResiduals, 1.0)
        );
    }

    #[test]
    fn older_calibrations_without_the_rule_still_load() {
        let mut c = Calibration::uncalibrated([(1, 0), (4, 1)]);
        c.fit_novel_ratios(&[1.5; 40], 3);
        let mut v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["novel_rule"], "quantile");
        let obj = v.as_object_mut().unwrap();
        obj.remove("novel_rule");
        obj.remove("novel_folds");
        let old: Calibration = serde_json::from_value(v).unwrap();
        assert_eq!(
            (old.novel_rule, old.novel_folds),
            (NovelRule::Unrecorded, 0)
        );
        old.validate().unwrap();
        // A rule that contradicts its residual count is refused, naming the field.
        let mut bad = c.clone();
        bad.novel_residuals = 5;
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("novel_rule")
        );
    }

    fn held(mu: f32, prior: f32, truth: f32) -> HeldOutLogStep {
        HeldOutLogStep {
            mu,
            sigma: 0.1,
            prior,
            linear: 0.0,
            truth,
            novel: true,
        }
    }

    fn only_w(held_out: &[HeldOutLogStep]) -> f32 {
        let (w, v) = choose_novel_weights(held_out);
        assert_eq!(v, 0.0, "no linear residual, so no linear weight");
        w
    }

    #[test]
    fn the_novel_weight_trusts_whichever_was_right_on_held_out_shapes() {
        // The prior exact, the network off by ±0.3: serve the prior.
        let prior_right = [held(1.3, 1.0, 1.0), held(1.7, 2.0, 2.0)];
        assert_eq!(only_w(&prior_right), 0.0);
        // The network exact, the prior off: serve the network.
        let network_right = [held(1.0, 1.4, 1.0), held(2.0, 1.5, 2.0)];
        assert_eq!(only_w(&network_right), 1.0);
        // The truth 40 % of the way from the prior to the network on every example.
        let partway = [
            held(2.0, 1.0, 1.4),
            held(0.0, 1.0, 0.6),
            held(3.0, 2.0, 2.4),
        ];
        assert!((only_w(&partway) - 0.4).abs() < 1e-6);
        // Nothing to judge by (or nothing finite): the network, as before the weight.
        assert_eq!(choose_novel_weights(&[]), (1.0, 0.0));
        assert_eq!(
            choose_novel_weights(&[held(f32::NAN, 1.0, 1.0)]),
            (1.0, 0.0)
        );
        let h = held(2.0, 1.0, 0.0);
        assert_eq!(
            (h.weighted_mu(0.0, 0.0), h.weighted_mu(0.5, 0.0)),
            (1.0, 1.5)
        );
    }

    #[test]
    fn the_linear_weight_stacks_a_second_residual_where_it_helps() {
        let with_linear = |mu, prior, linear, truth| HeldOutLogStep {
            linear,
            ..held(mu, prior, truth)
        };
        // The truth is the prior plus half the network's residual plus half the linear
        // one, on examples where the two residuals disagree.
        let both_half = [
            with_linear(1.4, 1.0, 0.0, 1.2),
            with_linear(1.0, 1.0, 0.4, 1.2),
            with_linear(2.2, 2.0, -0.2, 2.0),
        ];
        let (w, v) = choose_novel_weights(&both_half);
        assert!((w - 0.5).abs() < 1e-6 && (v - 0.5).abs() < 1e-6, "{w} {v}");
        // The linear residual exact, the network wrong: the linear alone.
        let linear_right = [
            with_linear(1.5, 1.0, 0.2, 1.2),
            with_linear(0.4, 1.0, -0.3, 0.7),
        ];
        assert_eq!(choose_novel_weights(&linear_right), (0.0, 1.0));
        let h = with_linear(2.0, 1.0, 0.4, 0.0);
        assert!((h.weighted_mu(0.5, 0.5) - 1.7).abs() < 1e-6);
    }

    #[test]
    fn the_novel_weights_apply_to_novel_shapes_only_and_load_as_before_when_absent() {
        let mut c = Calibration::uncalibrated([(1, 0), (4, 1)]);
        c.novel_residual_weight = 0.25;
        c.novel_linear_weight = 0.5;
        c.validate().unwrap();
        assert_eq!(
            (c.residual_weights((4, 1)), c.residual_weights((8, 3))),
            ((1.0, 0.0), (0.25, 0.5))
        );
        let mut v = serde_json::to_value(&c).unwrap();
        v.as_object_mut().unwrap().remove("novel_residual_weight");
        v.as_object_mut().unwrap().remove("novel_linear_weight");
        let old: Calibration = serde_json::from_value(v).unwrap();
        assert_eq!(
            (old.novel_residual_weight, old.novel_linear_weight),
            (1.0, 0.0)
        );
        for bad in [-0.1, 1.5, f32::NAN] {
            let mut d = c.clone();
            d.novel_residual_weight = bad;
            let err = d.validate().unwrap_err().to_string();
            assert!(err.contains("novel_residual_weight"), "{err}");
            let mut d = c.clone();
            d.novel_linear_weight = bad;
            let err = d.validate().unwrap_err().to_string();
            assert!(err.contains("novel_linear_weight"), "{err}");
        }
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
        let mut c = good.clone();
        c.fold_ratios = vec![vec![0.5, 1.0], vec![]];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("fold_ratios[1]")
        );
        c.fold_ratios = vec![vec![0.5, -1.0]];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("fold_ratios[0]")
        );
        c.fold_ratios = vec![vec![0.5, f32::NAN]];
        assert!(c.validate().is_err());
        c.fold_ratios = vec![vec![0.5, 1.0]];
        assert!(c.validate().is_ok());
        let mut c = good;
        c.coverage = 1.5;
        assert!(c.validate().is_err());
    }
}
