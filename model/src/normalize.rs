//! Input and target standardisation, fitted on the training set and stored with the model.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::features::{
    GPU_FEATURES, JOB_FEATURES, LINK_FEATURES, MEM_PHASES, PlacementGraph, Targets,
};

/// Smallest standard deviation used; constant features are centred but not scaled.
const MIN_STD: f64 = 1e-6;

/// Per-feature mean and standard deviation.
///
/// Unknown fields are refused (here, in [`Normalization`] and in
/// [`crate::LinearResidual`]): `normalization.json` and `linear_residual.json` have no
/// optional fields, and one this build does not know (a transform applied before the
/// mean, say) would change what the statistics mean, so ignoring it would serve wrong
/// inputs without a word. `meta.json` is different: see [`crate::ArtifactMeta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Standardizer {
    /// Means, one per feature.
    pub mean: Vec<f32>,
    /// Standard deviations (≥ 1e-6; 1 for constant features), one per feature.
    pub std: Vec<f32>,
    /// Smallest value seen in training, one per feature (0 for a feature never seen).
    pub min: Vec<f32>,
    /// Largest value seen in training, one per feature (0 for a feature never seen).
    pub max: Vec<f32>,
}

impl Standardizer {
    /// Fits on rows of `width` values; NaNs are skipped (a feature never seen gets mean 0,
    /// std 1).
    pub(crate) fn fit<'a>(width: usize, rows: impl Iterator<Item = &'a [f32]>) -> Self {
        let mut n = vec![0u64; width];
        let mut sum = vec![0f64; width];
        let mut sum_sq = vec![0f64; width];
        let mut min = vec![f32::INFINITY; width];
        let mut max = vec![f32::NEG_INFINITY; width];
        for row in rows {
            for (i, v) in row.iter().enumerate() {
                if !v.is_nan() {
                    n[i] += 1;
                    min[i] = min[i].min(*v);
                    max[i] = max[i].max(*v);
                    sum[i] += f64::from(*v);
                    sum_sq[i] += f64::from(*v) * f64::from(*v);
                }
            }
        }
        let mut mean = Vec::with_capacity(width);
        let mut std = Vec::with_capacity(width);
        for i in 0..width {
            if n[i] == 0 {
                mean.push(0.0);
                std.push(1.0);
                min[i] = 0.0;
                max[i] = 0.0;
                continue;
            }
            let m = sum[i] / n[i] as f64;
            let var = (sum_sq[i] / n[i] as f64 - m * m).max(0.0);
            let s = var.sqrt();
            mean.push(m as f32);
            std.push(if s < MIN_STD { 1.0 } else { s as f32 });
        }
        Self {
            mean,
            std,
            min,
            max,
        }
    }

    /// Standardises an input `value` of feature `i` after holding it within the range
    /// seen in training. Beyond that range the network's weights were never fitted (a
    /// one-hot slot that was always 0, a bandwidth below any trained link), so an input
    /// outside it reads as the nearest trained value; what lies beyond is the prior's
    /// to explain ([`crate::PRIOR_JOB_SLOT`]).
    #[inline]
    pub fn input(&self, i: usize, value: f32) -> f32 {
        self.apply(i, value.clamp(self.min[i], self.max[i]))
    }

    /// Standardises `value` of feature `i`.
    #[inline]
    pub fn apply(&self, i: usize, value: f32) -> f32 {
        (value - self.mean[i]) / self.std[i]
    }

    /// Undoes [`Self::apply`].
    #[inline]
    pub fn invert(&self, i: usize, value: f32) -> f32 {
        value * self.std[i] + self.mean[i]
    }

    pub(crate) fn check(&self, name: &str, width: usize) -> Result<()> {
        if [&self.mean, &self.std, &self.min, &self.max]
            .iter()
            .any(|v| v.len() != width)
        {
            return Err(ModelError::invalid(
                format!("normalization.{name}"),
                format!("expected {width} features, found {}", self.mean.len()),
            ));
        }
        let bad = self.mean.iter().any(|v| !v.is_finite())
            || self.std.iter().any(|v| !(v.is_finite() && *v > 0.0));
        if bad {
            return Err(ModelError::invalid(
                format!("normalization.{name}"),
                "non-finite mean or non-positive std",
            ));
        }
        let bad_range = self
            .min
            .iter()
            .zip(&self.max)
            .any(|(lo, hi)| !(lo.is_finite() && hi.is_finite() && lo <= hi));
        if bad_range {
            return Err(ModelError::invalid(
                format!("normalization.{name}"),
                "non-finite or inverted training range (min > max)",
            ));
        }
        Ok(())
    }
}

/// All statistics the predictor standardises with. Serialised as `normalization.json`
/// (unknown fields refused: see [`Standardizer`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Normalization {
    /// Per-GPU features (over the real GPUs of all training graphs).
    pub gpu: Standardizer,
    /// Per-link features (over all links of all training graphs).
    pub link: Standardizer,
    /// Per-job features.
    pub job: Standardizer,
    /// `ln(step_time_s)` (one value).
    pub log_step_time: Standardizer,
    /// Peak memory per phase (NaNs skipped).
    pub peak_mem: Standardizer,
    /// GPU utilisation (NaNs skipped).
    pub gpu_util: Standardizer,
}

impl Normalization {
    /// Fits every statistic on the training set.
    pub fn fit(train: &[(PlacementGraph, Targets)]) -> Self {
        let graphs = || train.iter().map(|(g, _)| g);
        let log_steps: Vec<[f32; 1]> = train.iter().map(|(_, t)| [t.step_time_s.ln()]).collect();
        let utils: Vec<[f32; 1]> = train.iter().map(|(_, t)| [t.gpu_util_pct]).collect();
        Self {
            gpu: Standardizer::fit(
                GPU_FEATURES,
                graphs().flat_map(|g| g.gpus.iter().map(|n| &n.values[..])),
            ),
            link: Standardizer::fit(
                LINK_FEATURES,
                graphs().flat_map(|g| g.links.iter().map(|l| &l.2.values[..])),
            ),
            job: Standardizer::fit(JOB_FEATURES, graphs().map(|g| &g.job.values[..])),
            log_step_time: Standardizer::fit(1, log_steps.iter().map(|v| &v[..])),
            peak_mem: Standardizer::fit(MEM_PHASES, train.iter().map(|(_, t)| &t.peak_mem_gib[..])),
            gpu_util: Standardizer::fit(1, utils.iter().map(|v| &v[..])),
        }
    }

    /// The prior ([`crate::PRIOR_JOB_SLOT`], raw `ln` seconds) in the standardised units of
    /// the step-time mean: the offset the network's residual is added to.
    #[inline]
    pub fn prior_offset(&self, job: &[f32]) -> f32 {
        self.log_step_time.apply(0, job[crate::PRIOR_JOB_SLOT])
    }

    /// Checks widths and values (used after loading from disk).
    pub fn validate(&self) -> Result<()> {
        self.gpu.check("gpu", GPU_FEATURES)?;
        self.link.check("link", LINK_FEATURES)?;
        self.job.check("job", JOB_FEATURES)?;
        self.log_step_time.check("log_step_time", 1)?;
        self.peak_mem.check("peak_mem", MEM_PHASES)?;
        self.gpu_util.check("gpu_util", 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_skips_nan_and_guards_constant_features() {
        let rows: Vec<[f32; 3]> = vec![[1.0, 5.0, f32::NAN], [3.0, 5.0, f32::NAN]];
        let s = Standardizer::fit(3, rows.iter().map(|r| &r[..]));
        assert_eq!(s.mean, vec![2.0, 5.0, 0.0]);
        assert_eq!(s.std, vec![1.0, 1.0, 1.0]);
        assert_eq!(s.apply(0, 3.0), 1.0);
        assert_eq!(s.invert(0, 1.0), 3.0);
        assert_eq!(
            (s.min.clone(), s.max.clone()),
            (vec![1.0, 5.0, 0.0], vec![3.0, 5.0, 0.0])
        );
        // Inputs are held within the training range before standardising.
        assert_eq!(s.input(0, 10.0), 1.0);
        assert_eq!(s.input(0, -10.0), -1.0);
        assert_eq!(s.input(1, 6.0), 0.0);
        s.check("x", 3).unwrap();
        let mut bad = s.clone();
        bad.min[0] = 4.0;
        assert!(
            bad.check("x", 3)
                .unwrap_err()
                .to_string()
                .contains("min > max")
        );
        let mut short = s;
        short.max.pop();
        assert!(short.check("x", 3).is_err());
    }
}
