//! The interval on novel shapes from the calibration folds' own networks (CV+).
//!
//! The novel-shape calibration trains auxiliary networks with shape classes held out and
//! measures how far they miss on those classes (see [`crate::calibration`]). Scaling the
//! *main* network's σ by what the *auxiliary* networks missed assumes the main network
//! misses novel shapes as much as they do, in its own seen-interval half-widths. On
//! measured data it did not: per held-out shape the main network's needed ratio ranged
//! from 0.3 to 5 where the folds' pooled quantile said 0.9–1.4, depending on the seed, so
//! the pooled coverage over unseen shapes fell to 80–84 % on some seeds and to 82 % on
//! `sia-azure` (README, issue 5).
//!
//! So a predictor that keeps its fold networks serves a novel shape (within its trained
//! range) from them, by the cross-validation+ interval of Barber, Candès, Ramdas and
//! Tibshirani (2021, "Predictive inference with the jackknife+"): with fold `k`'s
//! prediction `μ_k(x)` and scale `s_k(x)` (its σ times its seen half-width `1.645·m_k`),
//! and `r_i` the normalised residuals of fold `k(i)` on its held-out classes,
//! - upper bound: the `⌈(n+1)(1−α)⌉`-th smallest of `μ_{k(i)}(x) + r_i·s_{k(i)}(x)`;
//! - lower bound: the `⌈(n+1)(1−α)⌉`-th largest of `μ_{k(i)}(x) − r_i·s_{k(i)}(x)`.
//!
//! Each residual is compared with the network that produced it, so the interval describes
//! the networks the calibration measured. Its guarantee is `1 − 2α` in the worst case and
//! close to `1 − α` in practice (for exchangeable examples; shape classes are only roughly
//! that). The median is the mean of the main network's and the folds' `ln` step times,
//! held inside the interval.

/// The CV+ bounds of `ln y` from the folds' `(μ_k, s_k)` at one graph and their
/// normalised residuals (one list per fold, same order, each sorted ascending), for
/// `coverage` (e.g. 0.9). `None` when there are too few residuals for a finite rank
/// (`⌈(n+1)·coverage⌉ > n`), when the lists do not pair up with the folds, when a scale is
/// negative, or when anything is not finite.
///
/// Each bound is the `(n − rank + 1)`-th most extreme of its `n` values, and each fold's
/// values are monotone in its sorted residuals, so both are found by walking the folds'
/// lists down from their largest residuals, `n − rank + 1` steps (a tenth of `n` at 90 %),
/// instead of selecting among all `n` values for every graph served.
pub(crate) fn cv_plus_bounds(
    folds: &[(f32, f32)],
    sorted_ratios: &[Vec<f32>],
    coverage: f64,
) -> Option<(f32, f32)> {
    if folds.is_empty() || folds.len() != sorted_ratios.len() {
        return None;
    }
    if !folds
        .iter()
        .all(|(mu, s)| mu.is_finite() && s.is_finite() && *s >= 0.0)
    {
        return None;
    }
    let n: usize = sorted_ratios.iter().map(Vec::len).sum();
    let rank = ((n + 1) as f64 * coverage).ceil() as usize;
    if n == 0 || rank > n || rank == 0 {
        return None;
    }
    let steps = n - rank + 1;
    let mut left = Vec::with_capacity(folds.len());
    let mut heads = Vec::with_capacity(folds.len());
    // `sign` +1: the largest values of `μ_k + r·s_k`; −1: the smallest of `μ_k − r·s_k`,
    // taken as the largest of `−μ_k + r·s_k`. Both grow with `r`. `heads[k]` is fold
    // `k`'s largest value not yet taken (−∞ once its list is used up).
    let mut walk =
        |sign: f32| {
            let value = |k: usize, i: usize| sign * folds[k].0 + sorted_ratios[k][i] * folds[k].1;
            left.clear();
            heads.clear();
            for (k, rs) in sorted_ratios.iter().enumerate() {
                left.push(rs.len());
                heads.push(
                    rs.len()
                        .checked_sub(1)
                        .map_or(f32::NEG_INFINITY, |i| value(k, i)),
                );
            }
            let mut last = f32::NAN;
            for _ in 0..steps {
                let (k, v) = heads.iter().copied().enumerate().fold(
                    (0, f32::NEG_INFINITY),
                    |best, (k, v)| {
                        if v > best.1 { (k, v) } else { best }
                    },
                );
                if v == f32::NEG_INFINITY {
                    return None;
                }
                left[k] -= 1;
                heads[k] = left[k]
                    .checked_sub(1)
                    .map_or(f32::NEG_INFINITY, |i| value(k, i));
                last = v;
            }
            Some(sign * last)
        };
    let upper = walk(1.0)?;
    let lower = walk(-1.0)?;
    (lower.is_finite() && upper.is_finite() && lower <= upper).then_some((lower, upper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fold_gives_the_split_conformal_interval() {
        // Ten residuals 0.1..1.0, rank ⌈11·0.9⌉ = 10: the largest, 1.0.
        let ratios = vec![(1..=10).map(|i| i as f32 / 10.0).collect::<Vec<_>>()];
        let (lo, hi) = cv_plus_bounds(&[(2.0, 0.5)], &ratios, 0.9).unwrap();
        assert!(
            (lo - 1.5).abs() < 1e-6 && (hi - 2.5).abs() < 1e-6,
            "{lo} {hi}"
        );
        // At 50 % the rank is ⌈5.5⌉ = 6: residual 0.6.
        let (lo, hi) = cv_plus_bounds(&[(2.0, 0.5)], &ratios, 0.5).unwrap();
        assert!(
            (lo - 1.7).abs() < 1e-6 && (hi - 2.3).abs() < 1e-6,
            "{lo} {hi}"
        );
    }

    #[test]
    fn each_residual_is_read_against_its_own_fold() {
        // Fold A predicts 0 with scale 1, fold B predicts 10 with scale 2; every residual
        // is 1. Upper values: 1 (×9) and 12 (×9); lower values: −1 and 8. Rank ⌈19·0.9⌉
        // = 18 of 18: the upper bound is the largest upper value, the lower bound the
        // smallest lower value.
        let ratios = vec![vec![1.0; 9], vec![1.0; 9]];
        let (lo, hi) = cv_plus_bounds(&[(0.0, 1.0), (10.0, 2.0)], &ratios, 0.9).unwrap();
        assert_eq!((lo, hi), (-1.0, 12.0));
        // Residuals from fold A only would not see fold B's scale: swapping which fold
        // holds the large residuals moves the bounds.
        let ratios = vec![vec![0.0; 9], vec![3.0; 9]];
        let (lo, hi) = cv_plus_bounds(&[(0.0, 1.0), (10.0, 2.0)], &ratios, 0.9).unwrap();
        assert_eq!((lo, hi), (0.0, 16.0));
    }

    /// The definition, by sorting all `n` values.
    fn by_sorting(folds: &[(f32, f32)], ratios: &[Vec<f32>], coverage: f64) -> (f32, f32) {
        let n: usize = ratios.iter().map(Vec::len).sum();
        let rank = ((n + 1) as f64 * coverage).ceil() as usize;
        let kth = |sign: f32| {
            let mut values: Vec<f32> = folds
                .iter()
                .zip(ratios)
                .flat_map(|(&(mu, s), rs)| rs.iter().map(move |r| sign * mu + r * s))
                .collect();
            values.sort_by(f32::total_cmp);
            values[rank - 1]
        };
        (-kth(-1.0), kth(1.0))
    }

    #[test]
    fn walking_the_sorted_lists_finds_the_order_statistics() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for case in 0..300 {
            let k = rng.random_range(1..=5);
            let folds: Vec<(f32, f32)> = (0..k)
                .map(|_| (rng.random_range(-3.0..3.0), rng.random_range(0.0..2.0)))
                .collect();
            let ratios: Vec<Vec<f32>> = (0..k)
                .map(|_| {
                    let len = rng.random_range(0..60);
                    // Coarse values, so that ties across and within folds are common.
                    let mut rs: Vec<f32> = (0..len)
                        .map(|_| rng.random_range(0..20) as f32 / 8.0)
                        .collect();
                    rs.sort_by(f32::total_cmp);
                    rs
                })
                .collect();
            let coverage = [0.5, 0.8, 0.9, 0.95][case % 4];
            let n: usize = ratios.iter().map(Vec::len).sum();
            let rank = ((n + 1) as f64 * coverage).ceil() as usize;
            let got = cv_plus_bounds(&folds, &ratios, coverage);
            if n == 0 || rank > n {
                assert_eq!(got, None, "case {case}");
            } else {
                assert_eq!(
                    got,
                    Some(by_sorting(&folds, &ratios, coverage)),
                    "case {case}"
                );
            }
        }
    }

    #[test]
    fn a_negative_scale_gives_none() {
        let nine = vec![(1..=9).map(|i| i as f32).collect::<Vec<_>>()];
        assert_eq!(cv_plus_bounds(&[(0.0, -1.0)], &nine, 0.9), None);
        assert!(cv_plus_bounds(&[(0.0, 0.0)], &nine, 0.9).is_some());
    }

    #[test]
    fn too_few_residuals_or_mismatched_folds_give_none() {
        let eight = vec![vec![0.5; 8]];
        assert_eq!(cv_plus_bounds(&[(0.0, 1.0)], &eight, 0.9), None);
        let nine = vec![vec![0.5; 9]];
        assert!(cv_plus_bounds(&[(0.0, 1.0)], &nine, 0.9).is_some());
        assert_eq!(cv_plus_bounds(&[(0.0, 1.0), (1.0, 1.0)], &nine, 0.9), None);
        assert_eq!(cv_plus_bounds(&[], &[], 0.9), None);
        assert_eq!(cv_plus_bounds(&[(f32::NAN, 1.0)], &nine, 0.9), None);
    }
}
