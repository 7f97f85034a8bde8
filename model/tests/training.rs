//! Training: determinism, learning a known function, input errors.

use marshal_model::{
    DEFAULT_RIDGE, EpochReport, GpuNodeFeatures, LinearResidual, ModelError, PRIOR_JOB_SLOT,
    PlacementGraph, PredictorConfig, Targets, TrainedPredictor, fit, synthetic,
};

fn small_config() -> PredictorConfig {
    PredictorConfig::new()
        .with_hidden_size(16)
        .with_edge_hidden_size(8)
        .with_max_epochs(3)
        .with_batch_size(16)
        .with_seed(7)
}

#[test]
fn same_seed_gives_identical_predictions() {
    let data = synthetic::dataset(80, 3, 0.05);
    let (train, valid) = data.split_at(60);
    let graphs: Vec<PlacementGraph> = valid.iter().map(|(g, _)| g.clone()).collect();
    let mut reports_a = Vec::new();
    let a = fit(train, valid, &small_config(), &mut |r| reports_a.push(r)).unwrap();
    let mut reports_b = Vec::new();
    let b = fit(train, valid, &small_config(), &mut |r| reports_b.push(r)).unwrap();
    assert_eq!(reports_a, reports_b);
    assert_eq!(a.predict(&graphs).unwrap(), b.predict(&graphs).unwrap());

    let c = fit(train, valid, &small_config().with_seed(8), &mut |_| {}).unwrap();
    assert_ne!(a.predict(&graphs).unwrap(), c.predict(&graphs).unwrap());
}

fn mape(pred: &[f32], truth: &[f32]) -> f64 {
    let sum: f64 = pred
        .iter()
        .zip(truth)
        .map(|(p, y)| f64::from((p - y).abs() / y))
        .sum();
    100.0 * sum / truth.len() as f64
}

#[test]
fn learns_a_synthetic_step_time_function() {
    // Sized for unoptimised test builds of burn (~1 min); real training runs far longer.
    let data = synthetic::dataset(400, 11, 0.05);
    let (train, valid) = data.split_at(320);
    let config = PredictorConfig::new()
        .with_hidden_size(16)
        .with_edge_hidden_size(8)
        .with_learning_rate(1e-2)
        .with_max_epochs(30)
        .with_patience(8)
        .with_seed(1);
    let mut reports: Vec<EpochReport> = Vec::new();
    let predictor = fit(train, valid, &config, &mut |r| reports.push(r)).unwrap();

    let truth: Vec<f32> = valid.iter().map(|(_, t)| t.step_time_s).collect();
    let graphs: Vec<PlacementGraph> = valid.iter().map(|(g, _)| g.clone()).collect();
    let predictions = predictor.predict(&graphs).unwrap();
    let model = mape(
        &predictions
            .iter()
            .map(|p| p.step_time_s)
            .collect::<Vec<_>>(),
        &truth,
    );
    // The best constant under MAPE is close to the median; use the training median.
    let mut sorted: Vec<f32> = train.iter().map(|(_, t)| t.step_time_s).collect();
    sorted.sort_by(f32::total_cmp);
    let median = sorted[sorted.len() / 2];
    let constant = mape(&vec![median; truth.len()], &truth);
    eprintln!(
        "epochs {}, best {}, model MAPE {model:.1} %, constant MAPE {constant:.1} %",
        reports.len(),
        predictor.summary().best_epoch
    );
    assert!(
        model < 0.25 * constant,
        "model {model:.1} % vs constant {constant:.1} %"
    );
    assert!(model < 40.0, "model MAPE {model:.1} %");

    // The interval brackets the median and usually the truth.
    let covered = predictions
        .iter()
        .zip(&truth)
        .filter(|(p, y)| p.step_time_p05 <= **y && **y <= p.step_time_p95)
        .count();
    for p in &predictions {
        assert!(p.step_time_p05 < p.step_time_s && p.step_time_s < p.step_time_p95);
        assert!(p.relative_uncertainty() > 0.0);
        assert!((0.0..=100.0).contains(&p.gpu_util_pct));
    }
    assert!(
        covered * 2 > truth.len(),
        "90% interval covers only {covered}/{}",
        truth.len()
    );
    // Validation loss improved over training.
    assert!(
        reports
            .last()
            .unwrap()
            .valid_loss
            .min(predictor.summary().best_valid_loss)
            < reports[0].valid_loss
    );
}

#[test]
fn rejects_bad_training_inputs() {
    let data = synthetic::dataset(10, 1, 0.0);
    let config = small_config();
    let err = fit(&[], &data, &config, &mut |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::InvalidInput { .. }), "{err}");
    let err = fit(&data, &[], &config, &mut |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::InvalidInput { .. }), "{err}");

    let mut bad = data.clone();
    bad[4].0.gpus[0].values[2] = f32::NAN;
    let err = fit(&bad, &data, &config, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("train[4].graph.gpus[0].values[2] (util_pct)"),
        "{err}"
    );

    let mut bad = data.clone();
    bad[1].1 = Targets {
        step_time_s: -1.0,
        ..bad[1].1
    };
    let err = fit(&data, &bad, &config, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("valid[1].targets.step_time_s"), "{err}");

    let err = fit(
        &data,
        &data,
        &config.clone().with_hidden_size(0),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("config.hidden_size"), "{err}");
}

#[test]
fn prediction_ignores_padding_and_gpu_order_and_rejects_bad_graphs() {
    let data = synthetic::dataset(60, 5, 0.05);
    let predictor = fit(&data[..40], &data[40..], &small_config(), &mut |_| {}).unwrap();
    let small = data
        .iter()
        .find(|(g, _)| g.gpus.len() == 2)
        .unwrap()
        .0
        .clone();
    let big = data
        .iter()
        .find(|(g, _)| g.gpus.len() == 8)
        .unwrap()
        .0
        .clone();

    // The tensor path pads a batch to its largest graph.
    let alone = predictor
        .predict_on_device(std::slice::from_ref(&small))
        .unwrap()[0];
    let padded = predictor
        .predict_on_device(&[big.clone(), small.clone()])
        .unwrap()[1];
    assert_close(alone.step_time_s, padded.step_time_s);
    assert_close(alone.gpu_util_pct, padded.gpu_util_pct);

    // Reverse the GPU order (and relabel links): a graph function must not care.
    let n = big.gpus.len() as u16;
    let mut reversed = big.clone();
    reversed.gpus.reverse();
    for link in &mut reversed.links {
        link.0 = n - 1 - link.0;
        link.1 = n - 1 - link.1;
    }
    let p = predictor.predict(&[big.clone(), reversed]).unwrap();
    assert_close(p[0].step_time_s, p[1].step_time_s);
    assert_close(p[0].peak_mem_gib[1], p[1].peak_mem_gib[1]);

    assert!(predictor.predict(&[]).unwrap().is_empty());
    let mut bad = big.clone();
    bad.links.push((0, 9, bad.links[0].2));
    let err = predictor
        .predict(&[small.clone(), bad])
        .unwrap_err()
        .to_string();
    assert!(err.contains("graph[1].links"), "{err}");
    let mut bad = small.clone();
    bad.job.values[1] = f32::INFINITY;
    let err = predictor.predict(&[bad]).unwrap_err().to_string();
    assert!(
        err.contains("graph[0].job.values[1] (log10_params)"),
        "{err}"
    );
    let empty = PlacementGraph {
        gpus: Vec::<GpuNodeFeatures>::new(),
        ..small
    };
    assert!(predictor.predict(&[empty]).is_err());
}

/// The plain-Rust serving path and the burn network compute the same function, also on
/// graphs with missing links, repeated links, a distinct kind for every link and mixed
/// sizes in one batch.
#[test]
fn serving_path_matches_the_tensor_network() {
    let data = synthetic::dataset(60, 9, 0.05);
    let predictor = fit(&data[..40], &data[40..], &small_config(), &mut |_| {}).unwrap();
    let mut graphs: Vec<PlacementGraph> = data.iter().map(|(g, _)| g.clone()).collect();
    let mut most_kinds = 0;
    for (i, g) in graphs.iter_mut().enumerate() {
        match i % 4 {
            // Every link its own bandwidth: beyond the kinds the serving path looks up by
            // comparison, it indexes them by hash.
            3 => {
                for (j, l) in g.links.iter_mut().enumerate() {
                    l.2.values[4] += 0.01 * j as f32;
                }
                let mut kinds: Vec<[u32; 6]> = g
                    .links
                    .iter()
                    .map(|l| l.2.values.map(f32::to_bits))
                    .collect();
                kinds.sort_unstable();
                kinds.dedup();
                most_kinds = most_kinds.max(kinds.len());
            }
            // Drop every other link: GPUs with no link keep degree 0.
            0 => g.links = g.links.iter().copied().step_by(2).collect(),
            // A repeated pair: the later features win on both paths.
            1 if !g.links.is_empty() => {
                let (a, b, mut link) = g.links[0];
                link.values[1] *= 0.5;
                g.links.push((b, a, link));
            }
            // Inputs beyond the training range (held at its edge on both paths) and a
            // prior far from any trained (added unclamped on both).
            _ => {
                g.job.values[PRIOR_JOB_SLOT] += 4.0;
                g.job.values[0] = 9.0;
                for l in &mut g.links {
                    l.2.values[4] = -3.0;
                }
            }
        }
    }
    assert!(
        most_kinds > 16,
        "a graph with many link kinds: {most_kinds}"
    );
    let plain = predictor.predict(&graphs).unwrap();
    let tensor = predictor.predict_on_device(&graphs).unwrap();
    assert_eq!(plain.len(), tensor.len());
    for (p, t) in plain.iter().zip(&tensor) {
        assert_close(p.step_time_s, t.step_time_s);
        assert_close(p.step_time_p05, t.step_time_p05);
        assert_close(p.step_time_p95, t.step_time_p95);
        assert_close(p.gpu_util_pct, t.gpu_util_pct);
        for (a, b) in p.peak_mem_gib.iter().zip(&t.peak_mem_gib) {
            assert_close(*a, *b);
        }
    }
}

fn assert_close(a: f32, b: f32) {
    assert!(
        (a - b).abs() <= 1e-4 * a.abs().max(b.abs()).max(1.0),
        "{a} vs {b}"
    );
}

/// The prior enters the mean unclamped with weight 1: beyond the trained range of the
/// prior slot, multiplying the prior by 10 multiplies the prediction by 10, whatever the
/// untrained weights would have made of it.
#[test]
fn the_prior_carries_predictions_beyond_the_trained_range() {
    let data = synthetic::dataset(60, 9, 0.05);
    let predictor = fit(&data[..40], &data[40..], &small_config(), &mut |_| {}).unwrap();
    let top = predictor.normalization().job.max[PRIOR_JOB_SLOT];
    let mut far = data[45].0.clone();
    far.job.values[PRIOR_JOB_SLOT] = top + 1.0;
    let mut farther = far.clone();
    farther.job.values[PRIOR_JOB_SLOT] = top + 1.0 + 10f32.ln();
    let p = predictor.predict(&[far, farther]).unwrap();
    let ratio = p[1].step_time_s / p[0].step_time_s;
    assert!((ratio - 10.0).abs() < 1e-2, "ratio {ratio}");
}

/// After split-conformal calibration on a set, at least 90 % of that set's truths lie
/// inside the interval, also when the network's own σ is far too narrow for it.
#[test]
fn calibration_makes_the_interval_hold_ninety_percent() {
    let data = synthetic::dataset(120, 5, 0.02);
    let predictor = fit(&data[..60], &data[60..80], &small_config(), &mut |_| {}).unwrap();
    // Calibration truths much noisier than training ones (×/÷ up to 100).
    let mut rng = 17u64;
    let calib: Vec<_> = data[80..]
        .iter()
        .map(|(g, t)| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (rng >> 11) as f32 / (1u64 << 53) as f32;
            let mut t = *t;
            t.step_time_s *= 100f32.powf(2.0 * u - 1.0);
            (g.clone(), t)
        })
        .collect();
    let holds = |p: &TrainedPredictor| {
        let graphs: Vec<PlacementGraph> = calib.iter().map(|(g, _)| g.clone()).collect();
        let preds = p.predict(&graphs).unwrap();
        preds
            .iter()
            .zip(&calib)
            .filter(|(p, (_, t))| {
                p.step_time_p05 <= t.step_time_s && t.step_time_s <= p.step_time_p95
            })
            .count() as f64
            / calib.len() as f64
    };
    let before = holds(&predictor);
    assert!(
        before < 0.9,
        "the test needs an uncalibrated interval too narrow: {before}"
    );
    let calibrated = predictor.calibrate(&calib).unwrap();
    let c = calibrated.calibration();
    assert_eq!(c.seen_residuals + c.novel_residuals, calib.len());
    assert!(c.novel_multiplier >= c.seen_multiplier);
    let after = holds(&calibrated);
    assert!(
        after >= 0.9,
        "calibrated interval holds {after} (before {before})"
    );
    assert!(c.seen_multiplier > 1.0, "{c:?}");
}

/// The plain-Rust and the burn inference paths' predictions of `graphs`.
fn both_paths(
    predictor: &TrainedPredictor,
    graphs: &[PlacementGraph],
) -> [Vec<marshal_model::Prediction>; 2] {
    [
        predictor.predict(graphs).unwrap(),
        predictor.predict_on_device(graphs).unwrap(),
    ]
}

/// On a shape never trained on, the residual weight moves the prediction from the
/// network's (weight 1) to the prior alone (weight 0), and the linear weight adds the
/// linear residual, on both inference paths; seen shapes keep the network's prediction
/// whatever the weights.
#[test]
fn the_novel_weights_blend_the_network_the_prior_and_the_linear_residual_on_novel_shapes_only() {
    let data = synthetic::dataset(60, 9, 0.05);
    let predictor = fit(&data[..40], &data[40..], &small_config(), &mut |_| {}).unwrap();
    let c = predictor.calibration().clone();
    let seen = data
        .iter()
        .map(|(g, _)| g.clone())
        .find(|g| !c.is_novel(g.shape_class()))
        .unwrap();
    // A novel shape: more GPUs than any synthetic graph, all on one kind of link.
    let mut novel = seen.clone();
    while novel.gpus.len() < 12 {
        novel.gpus.push(novel.gpus[0]);
    }
    let link = seen.links.first().map(|l| l.2).unwrap();
    novel.links = (0..novel.gpus.len() as u16 - 1)
        .map(|i| (i, i + 1, link))
        .collect();
    assert!(c.is_novel(novel.shape_class()), "{:?}", novel.shape_class());
    let full = predictor.predict(&[seen.clone(), novel.clone()]).unwrap();
    let prior_only = predictor.clone().with_novel_weights(0.0, 0.0).unwrap();
    let pair = [seen.clone(), novel.clone()];
    for p in both_paths(&prior_only, &pair) {
        assert_close(p[0].step_time_s, full[0].step_time_s);
        assert_close(p[1].step_time_s, novel.job.values[PRIOR_JOB_SLOT].exp());
    }
    let half = predictor.clone().with_novel_weights(0.5, 0.0).unwrap();
    let p = half.predict(&[novel.clone()]).unwrap();
    let expected = (0.5 * (full[1].step_time_s.ln() + novel.job.values[PRIOR_JOB_SLOT])).exp();
    assert_close(p[0].step_time_s, expected);
    assert!(predictor.clone().with_novel_weights(1.5, 0.0).is_err());
    // A linear weight needs a linear residual; with one, it adds v·r(g) on novel shapes.
    assert!(predictor.clone().with_novel_weights(0.5, 0.5).is_err());
    let linear = LinearResidual::fit(&data[..40], DEFAULT_RIDGE).unwrap();
    let r = linear.predict(&novel);
    assert!(r.is_finite() && r != 0.0, "{r}");
    let stacked = predictor
        .clone()
        .with_linear_residual(linear)
        .unwrap()
        .with_novel_weights(0.5, 0.5)
        .unwrap();
    for p in both_paths(&stacked, &pair) {
        assert_close(p[0].step_time_s, full[0].step_time_s);
        assert_close(p[1].step_time_s, expected * (0.5 * r).exp());
    }
    let r40 = stacked.linear_residual().unwrap().predict(&data[40].0);
    assert_eq!(
        stacked.held_out_log_steps(&data[40..41]).unwrap()[0].linear,
        r40
    );
    // What the weight is chosen from: the unweighted mean, the prior and the truth.
    let held = predictor.held_out_log_steps(&data[40..]).unwrap();
    assert_eq!(held.len(), 20);
    for (h, (g, t)) in held.iter().zip(&data[40..]) {
        assert_eq!(h.prior, g.job.values[PRIOR_JOB_SLOT]);
        assert_eq!(h.truth, t.step_time_s.ln());
        assert!(h.sigma > 0.0 && h.mu.is_finite());
    }
}

/// Beyond the trained range of GPUs the interval widens by `1 + k·d` in log space on both
/// inference paths, `k` fitted from an extrapolation run's pairs; inside the range and
/// for the mean nothing changes.
#[test]
fn the_interval_widens_with_the_doublings_beyond_the_trained_range() {
    let data = synthetic::dataset(60, 9, 0.05);
    let predictor = fit(&data[..40], &data[40..], &small_config(), &mut |_| {}).unwrap();
    let range = predictor.calibration().extrapolation.clone();
    let most = data[..40].iter().map(|(g, _)| g.gpus.len()).max().unwrap();
    assert_eq!(range.trained_gpus as usize, most);
    assert_eq!(range.slope, 0.0);
    let inside = data[41].0.clone();
    let mut beyond = inside.clone();
    while beyond.gpus.len() < 2 * most {
        beyond.gpus.push(beyond.gpus[0]);
    }
    let d = range.distance(&beyond);
    assert!(d >= 1.0, "{d}");
    assert_eq!(range.distance(&inside), 0.0);
    // Every pair needs slope 1: a residual of 3 base half-widths at 2 doublings.
    let widened = predictor
        .clone()
        .with_extrapolation(None, &[(3.0, 2.0); 20])
        .unwrap();
    assert_eq!(widened.calibration().extrapolation.slope, 1.0);
    let log_width = |p: &marshal_model::Prediction| p.step_time_p95.ln() - p.step_time_p05.ln();
    let pair = [inside, beyond];
    let before = predictor.predict(&pair).unwrap();
    for after in both_paths(&widened, &pair) {
        assert_close(after[0].step_time_s, before[0].step_time_s);
        assert_close(after[1].step_time_s, before[1].step_time_s);
        assert_close(log_width(&after[0]), log_width(&before[0]));
        assert_close(log_width(&after[1]), (1.0 + d) * log_width(&before[1]));
    }
    // An absurd run caps the slope rather than making every interval infinite.
    let capped = predictor
        .clone()
        .with_extrapolation(None, &[(f32::MAX, 1e-30); 20])
        .unwrap();
    assert!(capped.calibration().extrapolation.slope.is_finite());
    assert!(capped.predict(&pair).is_ok());
    // Weights chosen for graphs beyond the range move their mean only: (0, 0) serves the
    // prior alone there.
    let prior_beyond = predictor
        .clone()
        .with_extrapolation(Some((0.0, 0.0)), &[(3.0, 2.0); 20])
        .unwrap();
    for after in both_paths(&prior_beyond, &pair) {
        assert_close(after[0].step_time_s, before[0].step_time_s);
        assert_close(
            after[1].step_time_s,
            pair[1].job.values[PRIOR_JOB_SLOT].exp(),
        );
    }
    // A linear weight needs a linear residual; weights outside [0, 1] are refused.
    assert!(
        predictor
            .clone()
            .with_extrapolation(Some((0.5, 0.5)), &[])
            .is_err()
    );
    assert!(predictor.with_extrapolation(Some((1.5, 0.0)), &[]).is_err());
}

/// Networks trained with shape classes held out, kept with their residuals, serve a
/// novel shape within the trained range: the median is the mean of their and the main
/// network's `ln` step times, the interval their CV+ interval, each residual read against
/// the scale of the fold it came from, on both inference paths. Seen shapes, and novel
/// shapes when the residuals are too few for a finite rank, keep the main network's
/// prediction.
#[test]
fn fold_networks_give_novel_shapes_their_cv_plus_interval() {
    let data = synthetic::dataset(60, 9, 0.05);
    let calibrated = |train: &[(PlacementGraph, Targets)], seed: u64| {
        fit(
            train,
            &data[40..],
            &small_config().with_seed(seed),
            &mut |_| {},
        )
        .unwrap()
        .calibrate(&data[40..])
        .unwrap()
    };
    let main = calibrated(&data[..40], 7);
    let c = main.calibration().clone();
    let probes = synthetic::dataset(300, 21, 0.05);
    let seen = probes
        .iter()
        .map(|(g, _)| g.clone())
        .find(|g| !c.is_novel(g.shape_class()))
        .unwrap();
    let novel = probes
        .iter()
        .map(|(g, _)| g.clone())
        .find(|g| c.is_novel(g.shape_class()) && c.extrapolation.distance(g) == 0.0)
        .expect("a novel shape within the trained range");
    let folds = [calibrated(&data[..20], 5), calibrated(&data[20..40], 6)];
    // Fold A's residuals small, fold B's large: 40 in all, rank ⌈41·0.9⌉ = 37.
    let ratios = [
        (1..=20).map(|i| i as f32 / 20.0).collect::<Vec<_>>(),
        (1..=20).map(|i| i as f32 / 5.0).collect::<Vec<_>>(),
    ];
    let served = main
        .clone()
        .with_fold_networks(folds.iter().cloned().zip(ratios.iter().cloned()).collect())
        .unwrap();
    assert_eq!(served.fold_networks().len(), 2);
    assert_eq!(served.calibration().fold_ratios, ratios.to_vec());

    let alone = main.predict(&[seen.clone(), novel.clone()]).unwrap();
    // Each fold's mean and scale `σ·1.645·m_seen` at the novel graph, read back from its
    // own prediction (its interval there is `μ ± 1.645·σ·m(shape)`; no widening).
    let (mut mus, mut scales) = (Vec::new(), Vec::new());
    for f in &folds {
        let p = f.predict(std::slice::from_ref(&novel)).unwrap()[0];
        let fc = f.calibration();
        assert_eq!(fc.extrapolation.factor(&novel), 1.0);
        let mu = p.step_time_s.ln();
        mus.push(mu);
        scales.push(
            (p.step_time_p95.ln() - mu) / fc.multiplier(novel.shape_class()) * fc.seen_multiplier,
        );
    }
    let kth = |sign: f32| {
        let mut v: Vec<f32> = (0..2)
            .flat_map(|k| ratios[k].iter().map(move |r| (k, *r)))
            .map(|(k, r)| sign * mus[k] + r * scales[k])
            .collect();
        v.sort_by(f32::total_cmp);
        v[36]
    };
    let (lower, upper) = (-kth(-1.0), kth(1.0));
    let mean = (alone[1].step_time_s.ln() + mus[0] + mus[1]) / 3.0;
    for p in both_paths(&served, &[seen.clone(), novel.clone()]) {
        // A seen shape keeps the main network.
        assert_close(p[0].step_time_s, alone[0].step_time_s);
        assert_close(p[0].step_time_p95, alone[0].step_time_p95);
        assert_close(p[1].step_time_p05.ln(), lower);
        assert_close(p[1].step_time_p95.ln(), upper);
        assert_close(p[1].step_time_s.ln(), mean.clamp(lower, upper));
        assert_ne!(p[1].step_time_p95, alone[1].step_time_p95);
    }

    // Eight residuals cannot vouch for a finite bound: the σ multiplier serves.
    let few = main
        .clone()
        .with_fold_networks(vec![(folds[0].clone(), vec![0.5; 8])])
        .unwrap();
    assert_eq!(
        few.predict(std::slice::from_ref(&novel)).unwrap()[0],
        alone[1]
    );
    // Bad folds are refused; the residuals were measured at the novel weights, which
    // then cannot change.
    assert!(
        main.clone()
            .with_fold_networks(vec![(folds[0].clone(), vec![])])
            .is_err()
    );
    assert!(
        main.clone()
            .with_fold_networks(vec![(folds[0].clone(), vec![f32::NAN; 10])])
            .is_err()
    );
    assert!(
        main.clone()
            .with_fold_networks(vec![(served.clone(), vec![0.5; 10])])
            .is_err()
    );
    assert!(served.clone().with_novel_weights(0.5, 0.0).is_err());
    assert!(served.with_novel_weights(1.0, 0.0).is_ok());
    assert!(
        main.with_fold_networks(vec![])
            .unwrap()
            .fold_networks()
            .is_empty()
    );
}
