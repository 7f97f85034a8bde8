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
/// normalised residuals (one list per fold, same order), for `coverage` (e.g. 0.9).
/// `None` when there are too few residuals for a finite rank (`⌈(n+1)·coverage⌉ > n`),
/// when the lists do not pair up with the folds, or when a bound is not finite.
pub(crate) fn cv_plus_bounds(
    folds: &[(f32, f32)],
    ratios: &[Vec<f32>],
    coverage: f64,
) -> Option<(f32, f32)> {
    if folds.is_empty() || folds.len() != ratios.len() {
        return None;
    }
    let n: usize = ratios.iter().map(Vec::len).sum();
    let rank = ((n + 1) as f64 * coverage).ceil() as usize;
    if n == 0 || rank > n || rank == 0 {
        return None;
    }
    let mut values = Vec::with_capacity(n);
    let mut kth = |sign: f32| {
        values.clear();
        for (&(mu, s), rs) in folds.iter().zip(ratios) {
            values.extend(rs.iter().map(|r| sign * mu + r * s));
        }
        *values.select_nth_unstable_by(rank - 1, f32::total_cmp).1
    };
    let upper = kth(1.0);
    let lower = -kth(-1.0);
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
