//! How noisy measured step times are, so that a predictor's error can be read against
//! what no predictor can remove.
//!
//! Two estimates of the relative error `ε` of one measurement (`y = truth × e^ε`), both
//! as the mean `|ε|`, which is the MAPE a predictor that knew the truth would score:
//!
//! - **repeats**: two recordings of the same (model, placement, batch size) on the same
//!   hardware (Sia's `dgx` and `dgx-ext` files) differ by `ε₁ − ε₂`; for independent
//!   Gaussian errors `E|ε₁ − ε₂| = √2 · E|ε|`. Pairs with bit-identical step times are
//!   copies, not repeats, and are counted apart.
//! - **neighbours**: step time is smooth in the per-GPU batch size, so within one
//!   (model, GPU type, placement) series each interior point is compared with the line
//!   through its two neighbours; `r = ε₁ − a·ε₀ − b·ε₂` (plus the curve's bend), and for
//!   Gaussian errors `E|r| = √(1 + a² + b²) · E|ε|`. The bend makes this an upper
//!   estimate; the median-based figure (`median |r| / 0.6745 · 0.798` per unit weight)
//!   is less moved by a few wild points.
//!
//! Neither is a proof of a floor: errors need not be Gaussian or independent. They say
//! roughly where a MAPE target stops being about the predictor.

use std::collections::{BTreeMap, HashMap};

use crate::StepTimeProfile;

/// For a standard normal: E|Z| and the median of |Z|.
const MEAN_ABS_NORMAL: f64 = 0.797_884_560_802_865_4;
const MEDIAN_ABS_NORMAL: f64 = 0.674_489_750_196_081_7;

/// Mean and median of the per-measurement relative error estimated from one method.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseEstimate {
    /// Residuals (interior points, or repeated pairs) the estimate rests on.
    pub residuals: usize,
    /// Estimated mean |ε|, as a fraction: the MAPE of a predictor that knew the truth.
    pub mean_abs_error: f64,
    /// The same from the median residual, assuming Gaussian errors.
    pub median_based_error: f64,
}

/// [`repeat_noise`]'s result: the estimate over pairs that differ, and how many pairs
/// were exact copies (left out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RepeatNoise {
    pub estimate: Option<NoiseEstimate>,
    pub copies: usize,
}

/// The neighbour-smoothness estimate over `profiles`' placement series (profiles without
/// a placement, or with a non-positive step time, are left out). `None` when no series
/// has three batch sizes.
pub fn neighbour_noise(profiles: &[StepTimeProfile]) -> Option<NoiseEstimate> {
    let mut series: BTreeMap<(&str, &str, &str), BTreeMap<u32, f64>> = BTreeMap::new();
    for p in profiles {
        let Some(placement) = p.placement.as_deref() else {
            continue;
        };
        if p.step_time_s > 0.0 && p.step_time_s.is_finite() {
            series
                .entry((&p.model, &p.gpu_type, placement))
                .or_default()
                .insert(p.local_bsz, p.step_time_s.ln());
        }
    }
    let mut scaled = Vec::new();
    for points in series.values() {
        let points: Vec<(f64, f64)> = points.iter().map(|(&b, &y)| (f64::from(b), y)).collect();
        for w in points.windows(3) {
            let [(x0, y0), (x1, y1), (x2, y2)] = [w[0], w[1], w[2]];
            let a = (x2 - x1) / (x2 - x0);
            let b = (x1 - x0) / (x2 - x0);
            let r = y1 - (a * y0 + b * y2);
            scaled.push(r.abs() / (1.0 + a * a + b * b).sqrt());
        }
    }
    estimate(scaled)
}

/// The repeat estimate from measurements in `first` and `second` of the same model,
/// placement and batch size (GPU type ignored: the caller passes two recordings of one
/// testbed).
pub fn repeat_noise(first: &[StepTimeProfile], second: &[StepTimeProfile]) -> RepeatNoise {
    let key = |p: &StepTimeProfile| (p.model.clone(), p.placement.clone(), p.local_bsz);
    let firsts: HashMap<_, f64> = first
        .iter()
        .filter(|p| p.placement.is_some() && p.step_time_s > 0.0)
        .map(|p| (key(p), p.step_time_s))
        .collect();
    let mut copies = 0;
    let mut scaled = Vec::new();
    for p in second.iter().filter(|p| p.step_time_s > 0.0) {
        let Some(&y) = firsts.get(&key(p)) else {
            continue;
        };
        if y == p.step_time_s {
            copies += 1;
        } else if y.is_finite() && p.step_time_s.is_finite() {
            scaled.push((y / p.step_time_s).ln().abs() / std::f64::consts::SQRT_2);
        }
    }
    RepeatNoise {
        estimate: estimate(scaled),
        copies,
    }
}

fn estimate(mut scaled: Vec<f64>) -> Option<NoiseEstimate> {
    let n = scaled.len();
    let median = marshal_scheduler::sim::percentile(&mut scaled, 0.5)?;
    Some(NoiseEstimate {
        residuals: n,
        mean_abs_error: scaled.iter().sum::<f64>() / n as f64,
        median_based_error: median / MEDIAN_ABS_NORMAL * MEAN_ABS_NORMAL,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A standard normal draw (Box–Muller).
    fn normal(rng: &mut ChaCha8Rng) -> f64 {
        let u: f64 = 1.0 - rng.random::<f64>();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * rng.random::<f64>()).cos()
    }

    fn profile(model: &str, placement: &str, bsz: u32, step: f64) -> StepTimeProfile {
        StepTimeProfile {
            model: model.into(),
            gpu_type: "dgx".into(),
            placement: Some(placement.into()),
            nodes: placement.len() as u32,
            replicas: placement.len() as u32,
            local_bsz: bsz,
            step_time_s: step,
            sync_time_s: 0.0,
        }
    }

    /// Step times that are exactly `a + b·bsz` in log space have no noise.
    #[test]
    fn a_smooth_series_has_no_neighbour_noise() {
        let ps: Vec<_> = (1..=6)
            .map(|i| profile("bert", "1", 4 * i, (0.1 + 0.01 * f64::from(i)).exp()))
            .collect();
        let e = neighbour_noise(&ps).unwrap();
        assert_eq!(e.residuals, 4);
        assert!(e.mean_abs_error < 1e-12, "{e:?}");
    }

    /// Gaussian log errors of known σ are recovered, within sampling error, by both
    /// methods.
    #[test]
    fn known_gaussian_noise_is_recovered() {
        let sigma = 0.04;
        let truth = sigma * MEAN_ABS_NORMAL;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut first = Vec::new();
        let mut second = Vec::new();
        for placement in ["1", "2", "4", "8", "44", "88"] {
            for bsz in 1..=200 {
                let t = 0.05 + 0.001 * f64::from(bsz);
                first.push(profile(
                    "m",
                    placement,
                    bsz,
                    t * (sigma * normal(&mut rng)).exp(),
                ));
                second.push(profile(
                    "m",
                    placement,
                    bsz,
                    t * (sigma * normal(&mut rng)).exp(),
                ));
            }
        }
        let n = neighbour_noise(&first).unwrap();
        let r = repeat_noise(&first, &second);
        assert_eq!(r.copies, 0);
        let r = r.estimate.unwrap();
        assert_eq!(r.residuals, 1200);
        for got in [
            n.mean_abs_error,
            n.median_based_error,
            r.mean_abs_error,
            r.median_based_error,
        ] {
            assert!((got / truth - 1.0).abs() < 0.1, "{got} vs {truth}");
        }
    }

    #[test]
    fn copies_are_counted_apart_and_unmatched_rows_ignored() {
        let first = vec![profile("m", "1", 8, 0.10), profile("m", "2", 8, 0.20)];
        let second = vec![
            profile("m", "1", 8, 0.10),
            profile("m", "2", 8, 0.22),
            profile("m", "4", 8, 0.30),
            profile("other", "2", 8, 0.5),
        ];
        let r = repeat_noise(&first, &second);
        assert_eq!(r.copies, 1);
        let e = r.estimate.unwrap();
        assert_eq!(e.residuals, 1);
        let want = (0.22f64 / 0.20).ln() / std::f64::consts::SQRT_2;
        assert!((e.mean_abs_error - want).abs() < 1e-12);
    }

    #[test]
    fn too_little_data_gives_none() {
        let two = vec![profile("m", "1", 8, 0.1), profile("m", "1", 16, 0.2)];
        assert_eq!(neighbour_noise(&two), None);
        assert_eq!(neighbour_noise(&[]), None);
        let r = repeat_noise(&two, &[]);
        assert_eq!((r.estimate, r.copies), (None, 0));
        let bad = vec![
            profile("m", "1", 8, 0.1),
            profile("m", "1", 16, f64::NAN),
            profile("m", "1", 24, 0.3),
        ];
        assert_eq!(neighbour_noise(&bad), None);
    }
}
