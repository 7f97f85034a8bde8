//! Calibration runs: the auxiliary networks behind the predictor's interval on shapes
//! and gang sizes it never trained on.

use marshal_model::calibration::Z95;
use marshal_model::{DEFAULT_RIDGE, Device, LinearResidual, PredictorConfig};
use marshal_trainer::{
    ClusterContext, Split, StepExample, StepHistory, split_holding_out, split_unseen_placements,
};

use super::{PriorSource, graphs, rebalanced};

/// Number of auxiliary calibration runs of [`train_calibrated`] (cross-conformal folds
/// over the training side's shape classes).
const CALIBRATION_FOLDS: usize = 3;

/// The multi-GPU (span, GPU count) classes of `train`, assigned to folds by
/// [`fold_classes`].
fn calibration_folds(train: &[StepExample], k: usize, seed: u64) -> Vec<Vec<(&str, u32)>> {
    let classes: Vec<(&str, u32)> = train
        .iter()
        .filter(|e| e.num_gpus > 1)
        .map(|e| (e.span.as_str(), e.num_gpus))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    fold_classes(&classes, k, seed)
}

/// Splits shape classes into `k` (at least 2) folds, each to be held out of one auxiliary
/// training run. Per interconnect level (span), the level's classes in GPU-count order go
/// round-robin over the folds from a starting fold drawn from `seed` and the level's name:
/// every class of a level with two or more classes is held out exactly once, neighbouring
/// GPU counts land in different folds, and no fold holds out more than `⌈c/k⌉ < c` of a
/// level's `c` classes, so every level keeps training classes in every fold (the novelty
/// calibrated is a new GPU count or spread at a known interconnect, the novelty of the
/// "unseen shapes" test, not a level never trained on). A level's only class is never
/// held out: without it the fold's network would not know the level at all.
fn fold_classes<'a>(classes: &[(&'a str, u32)], k: usize, seed: u64) -> Vec<Vec<(&'a str, u32)>> {
    let k = k.max(2);
    let mut levels: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for &(span, n) in classes {
        levels.entry(span).or_default().push(n);
    }
    let mut folds = vec![Vec::new(); k];
    for (span, mut counts) in levels {
        counts.sort_unstable();
        counts.dedup();
        if counts.len() < 2 {
            continue;
        }
        // SplitMix64 of the seed and an FNV-1a of the level's name: a start that depends
        // on both and on nothing else (no platform or library hashing).
        let mut h = span.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let start = ((h ^ (h >> 31)) % k as u64) as usize;
        for (i, n) in counts.into_iter().enumerate() {
            folds[(start + i) % k].push((span, n));
        }
    }
    folds
}

/// Epoch cap and patience of the auxiliary calibration runs of [`train_calibrated`].
const AUX_MAX_EPOCHS: usize = 40;
const AUX_PATIENCE: usize = 8;

/// What [`train_calibrated`] spent.
#[derive(Debug, Default)]
pub(super) struct TrainingCost {
    /// Epochs of the main run.
    pub(super) epochs: usize,
    /// Seconds of the auxiliary calibration runs (training and residuals).
    pub(super) aux_seconds: f64,
}

/// Trains on `split` and calibrates the interval (split conformal, see
/// `marshal_model::calibration`). The multiplier for trained shapes comes from the
/// validation jobs. The one for novel shapes is cross-conformal over shape classes: the
/// training side's multi-GPU classes are split into [`CALIBRATION_FOLDS`] folds
/// ([`fold_classes`]), and for each fold a short auxiliary network is trained without
/// that fold's classes (and without their jobs). Each auxiliary network gives
/// - its own seen multiplier `m_f`, on the validation examples of shapes it trained on
///   (also its early-stopping set, so nothing novel steers its training);
/// - normalised residuals `|ln y − μ| / (1.645·σ·m_f)` on the examples of shapes it never
///   saw (the fold's training-side examples plus validation examples of novel shapes).
///
/// Each training side, the main run's and each auxiliary run's, also gets its own ridge
/// residual (`marshal_model::LinearResidual`, unweighted examples). The pooled novel
/// predictions first choose the weights of the network's residual and of the ridge
/// residual on novel shapes (`marshal_model::choose_novel_weights`); the residuals, taken
/// at those weights, are then pooled and their finite-sample conformal quantile, times the main
/// network's seen multiplier, is the novel multiplier (with the small-sample rules of
/// `marshal_model::calibration`). The auxiliary networks are then kept with their
/// residuals (`TrainedPredictor::with_fold_networks`): a novel shape within the trained
/// range is served by their CV+ interval and the mean of their and the main network's
/// medians, and the novel multiplier serves where CV+ cannot (too few residuals). Every
/// training side, the main run's and each auxiliary run's, gets its prior's constants from `prior` on that side alone; the
/// returned context is the main run's.
///
/// Why normalise by each fold's own seen multiplier rather than pool raw `|z|`: the σ
/// scale differs from network to network (the seen multipliers of runs on the same data
/// have ranged from 0.02 to 0.13), and none of the auxiliary networks is the one served.
/// What is assumed to carry over to the main network is how much wider than on trained
/// shapes the interval must be on novel ones, so each residual is measured in its own
/// network's seen-interval half-widths. Pooling over folds (cross-conformal, Vovk 2015)
/// turns the few examples of one held-out group into every multi-GPU training example
/// of a level with two or more classes; its coverage guarantee is approximate (the folds'
/// networks differ, and `m_f` is itself estimated), not the exact one of a single split.
/// Examples are pooled unweighted: the 85–95 % target is over examples, and a class
/// weighting would trade that for a per-class guarantee no test reports.
pub(super) fn train_calibrated(
    prior: &PriorSource,
    split: &Split,
    config: &PredictorConfig,
    device: &Device,
    cost: &mut TrainingCost,
) -> anyhow::Result<(marshal_model::TrainedPredictor, StepHistory, ClusterContext)> {
    let ctx = &prior.context(&split.train)?;
    let history = ctx.history(&split.train);
    let predictor = marshal_model::train::fit_on(
        device,
        &rebalanced(graphs(ctx, &history, &split.train)),
        &graphs(ctx, &history, &split.valid),
        config,
        &mut |r| cost.epochs = r.epoch,
    )?;
    let valid = graphs(ctx, &history, &split.valid);
    let linear = LinearResidual::fit(&graphs(ctx, &history, &split.train), DEFAULT_RIDGE)?;
    let predictor = predictor.calibrate(&valid)?.with_linear_residual(linear)?;

    let started = std::time::Instant::now();
    // Only each network's miss on novel shapes relative to trained ones is used, so
    // shorter runs will do.
    let aux_config = config
        .clone()
        .with_max_epochs(config.max_epochs.min(AUX_MAX_EPOCHS))
        .with_patience(config.patience.min(AUX_PATIENCE));
    let folds = calibration_folds(&split.train, CALIBRATION_FOLDS, config.seed);
    let (mut pooled, mut used) = (Vec::new(), 0);
    let mut fold_networks = Vec::new();
    for (f, held) in folds.iter().enumerate() {
        let inner = split_unseen_placements(&split.train, held, config.seed, 0.0);
        if held.is_empty() || inner.train.is_empty() || inner.test.is_empty() {
            continue;
        }
        let fold_started = std::time::Instant::now();
        let ctx = &prior.context(&inner.train)?;
        let inner_history = ctx.history(&inner.train);
        let unweighted = graphs(ctx, &inner_history, &inner.train);
        let linear = LinearResidual::fit(&unweighted, DEFAULT_RIDGE)?;
        let train = rebalanced(unweighted);
        let trained: std::collections::BTreeSet<_> =
            train.iter().map(|(g, _)| g.shape_class()).collect();
        let (seen_valid, novel_valid): (Vec<_>, Vec<_>) = graphs(ctx, &inner_history, &split.valid)
            .into_iter()
            .partition(|(g, _)| trained.contains(&g.shape_class()));
        if seen_valid.is_empty() {
            continue;
        }
        let mut aux_epochs = 0;
        let aux =
            marshal_model::train::fit_on(device, &train, &seen_valid, &aux_config, &mut |r| {
                aux_epochs = r.epoch
            })?
            .calibrate(&seen_valid)?
            .with_linear_residual(linear)?;
        let half_width = marshal_model::calibration::Z95 * aux.calibration().seen_multiplier;
        let novel: Vec<_> = graphs(ctx, &inner_history, &inner.test)
            .into_iter()
            .chain(novel_valid)
            .collect();
        let before = pooled.len();
        pooled.extend(
            aux.held_out_log_steps(&novel)?
                .into_iter()
                .filter(|h| h.novel && h.mu.is_finite() && h.sigma.is_finite())
                .map(|h| (h, half_width, fold_networks.len())),
        );
        used += 1;
        let classes: Vec<String> = held.iter().map(|(s, n)| format!("{n}@{s}")).collect();
        eprintln!(
            "    calibration fold {}/{}: held out {}: {} novel residuals, seen σ × {:.3}, {aux_epochs} epochs, {:.1} s",
            f + 1,
            folds.len(),
            classes.join(" "),
            pooled.len() - before,
            aux.calibration().seen_multiplier,
            fold_started.elapsed().as_secs_f64()
        );
        fold_networks.push(aux);
    }
    // Without any usable fold (no level with two classes), the main network's own
    // calibration stands (novel residuals from its validation jobs, if any, and the
    // network's full residual).
    let predictor = if used > 0 {
        let held_out: Vec<_> = pooled.iter().map(|(h, _, _)| *h).collect();
        let (w, v) = marshal_model::choose_novel_weights(&held_out);
        let mut per_fold = vec![Vec::new(); fold_networks.len()];
        for (h, half_width, k) in &pooled {
            let r = (h.truth - h.weighted_mu(w, v)).abs() / (h.sigma * half_width);
            if r.is_finite() {
                per_fold[*k].push(r);
            }
        }
        let ratios: Vec<f32> = per_fold.iter().flatten().copied().collect();
        let kept: Vec<_> = fold_networks
            .into_iter()
            .zip(per_fold)
            .filter(|(_, r)| !r.is_empty())
            .collect();
        predictor
            .with_novel_weights(w, v)?
            .with_novel_ratios(&ratios, used)?
            .with_fold_networks(kept)?
    } else {
        predictor
    };
    let predictor = match extrapolation_run(prior, split, &aux_config, device, &predictor)? {
        Some((weights, pairs)) => predictor.with_extrapolation(Some(weights), &pairs)?,
        None => {
            eprintln!(
                "    extrapolation run: skipped (the training side spans fewer than 2 machines, or a side is empty): no widening beyond the trained range"
            );
            predictor
        }
    };
    cost.aux_seconds = started.elapsed().as_secs_f64();
    Ok((predictor, history, ctx.clone()))
}

/// What [`extrapolation_run`] chose: the residual weights `(w, v)` beyond the trained
/// range, and the `(s, d)` pairs the widening's slope is fitted from.
type ExtrapolationRun = ((f32, f32), Vec<(f32, f32)>);

/// The extrapolation run behind the mean and the interval beyond the trained range
/// (`marshal_model::Extrapolation`, whose module doc gives the rules and the assumption).
/// A short auxiliary network, with its own ridge residual, is trained on the training
/// side's examples that span at most half its largest machine count (validation
/// examples likewise, for early stopping and its seen multiplier). Every other
/// training-side and validation example is beyond its range: on them
/// `marshal_model::choose_novel_weights` chooses the weights `(w, v)` of the mean beyond
/// the range, and at those weights each gives an `(s, d)` pair: `s` its residual in the
/// auxiliary network's seen-interval half-widths over the base ratio `main` would
/// already allow (1 on a shape class the auxiliary network trained on, `main`'s
/// novel/seen ratio otherwise), `d` its doublings beyond the auxiliary network's range.
/// `None` when the training side spans fewer than 2 machines or a side is empty.
fn extrapolation_run(
    prior: &PriorSource,
    split: &Split,
    aux_config: &PredictorConfig,
    device: &Device,
    main: &marshal_model::TrainedPredictor,
) -> anyhow::Result<Option<ExtrapolationRun>> {
    let near = split.train.iter().map(|e| e.nodes).max().unwrap_or(0) / 2;
    if near == 0 {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let inner = split_holding_out(&split.train, &|e| e.nodes > near, aux_config.seed, 0.0);
    let (near_valid, far_valid): (Vec<StepExample>, Vec<StepExample>) =
        split.valid.iter().cloned().partition(|e| e.nodes <= near);
    if inner.train.is_empty() || inner.test.is_empty() || near_valid.is_empty() {
        return Ok(None);
    }
    let ctx = &prior.context(&inner.train)?;
    let history = ctx.history(&inner.train);
    let unweighted = graphs(ctx, &history, &inner.train);
    let linear = LinearResidual::fit(&unweighted, DEFAULT_RIDGE)?;
    let near_valid = graphs(ctx, &history, &near_valid);
    let mut epochs = 0;
    let aux = marshal_model::train::fit_on(
        device,
        &rebalanced(unweighted),
        &near_valid,
        aux_config,
        &mut |r| epochs = r.epoch,
    )?
    .calibrate(&near_valid)?
    .with_linear_residual(linear)?;
    let half_width = Z95 * aux.calibration().seen_multiplier;
    let c = main.calibration();
    let novel_ratio = c.novel_multiplier / c.seen_multiplier;
    let far: Vec<_> = graphs(ctx, &history, &inner.test)
        .into_iter()
        .chain(graphs(ctx, &history, &far_valid))
        .collect();
    let held = aux.held_out_log_steps(&far)?;
    let (w, v) = marshal_model::choose_novel_weights(&held);
    let range = &aux.calibration().extrapolation;
    let pairs: Vec<(f32, f32)> = far
        .iter()
        .zip(held)
        .map(|((g, _), h)| {
            let base = if h.novel { novel_ratio } else { 1.0 };
            let r = (h.truth - h.weighted_mu(w, v)).abs() / (h.sigma * half_width);
            (r / base, range.distance(g))
        })
        .collect();
    eprintln!(
        "    extrapolation run: trained on ≤ {near} machines ({} GPUs at most), {} residuals beyond, weights there: network {w:.2}, linear {v:.2}; seen σ × {:.3}, {epochs} epochs, {:.1} s",
        range.trained_gpus,
        pairs.len(),
        aux.calibration().seen_multiplier,
        started.elapsed().as_secs_f64()
    );
    Ok(Some(((w, v), pairs)))
}

/// The novel multiplier, its residuals, folds and rule, for reports.
pub(super) fn novel_summary(c: &marshal_model::Calibration) -> String {
    format!(
        "× {:.2} novel ({} residuals from {} fold{}; {}), weights on novel shapes: network {:.2}, linear {:.2}",
        c.novel_multiplier,
        c.novel_residuals,
        c.novel_folds,
        if c.novel_folds == 1 { "" } else { "s" },
        c.novel_rule.label(),
        c.novel_residual_weight,
        c.novel_linear_weight
    ) + &if c.fold_ratios.is_empty() {
        String::new()
    } else {
        format!(
            "; within the trained range, novel shapes get the CV+ interval of {} fold networks",
            c.fold_ratios.len()
        )
    } + &format!(
        "; beyond {} machines / {} GPUs: σ × (1 + {:.2} per doubling; {} extrapolation residuals), weights {}",
        c.extrapolation.trained_nodes,
        c.extrapolation.trained_gpus,
        c.extrapolation.slope,
        c.extrapolation.residuals,
        c.extrapolation
            .weights
            .map_or("of the shape class".into(), |[w, v]| format!(
                "network {w:.2}, linear {v:.2}"
            ))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_held_out_once_and_every_level_keeps_training_classes() {
        let classes: Vec<(&str, u32)> = [
            ("nvlink-island", 2),
            ("nvlink-island", 4),
            ("nvlink-island", 8),
            ("node", 8),
            ("rack", 4),
            ("rack", 16),
            ("spine", 2),
            ("spine", 4),
            ("spine", 8),
            ("spine", 16),
            ("spine", 32),
        ]
        .into();
        let mut assignments = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let folds = fold_classes(&classes, 3, seed);
            assert_eq!(folds.len(), 3);
            assert_eq!(folds, fold_classes(&classes, 3, seed), "seed {seed}");
            for &c in &classes {
                let times = folds.iter().filter(|f| f.contains(&c)).count();
                // A level's only class stays in training; every other is held out once.
                let expected = usize::from(c.0 != "node");
                assert_eq!(times, expected, "seed {seed}: {c:?} in {folds:?}");
            }
            for (i, fold) in folds.iter().enumerate() {
                assert!(!fold.is_empty(), "seed {seed}: fold {i} is empty");
                for level in ["nvlink-island", "node", "rack", "spine"] {
                    let kept = classes
                        .iter()
                        .filter(|c| c.0 == level && !fold.contains(c))
                        .count();
                    assert!(kept >= 1, "seed {seed}: fold {i} holds out all of {level}");
                }
                // Neighbouring GPU counts of a level are never held out together.
                for w in classes.windows(2) {
                    assert!(
                        !(w[0].0 == w[1].0 && fold.contains(&w[0]) && fold.contains(&w[1])),
                        "seed {seed}: {w:?} both in fold {i}"
                    );
                }
            }
            assignments.insert(folds);
        }
        // The seed moves the assignment.
        assert!(assignments.len() > 1);
        // k below 2 would hold out whole levels: at least 2 folds.
        assert_eq!(fold_classes(&classes, 1, 0).len(), 2);
        assert!(fold_classes(&[("node", 8)], 3, 0).iter().all(Vec::is_empty));
    }
}
