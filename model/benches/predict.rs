//! Inference latency: one `predict` call on 64 candidate placements of 8 GPUs each, with
//! the serving path (`predict`, plain Rust) and the burn network (`predict_on_device`),
//! and the serving path with a linear residual stacked on novel shapes
//! (`predict_64x8gpu_stacked`: every graph of the batch is of a shape never trained on, and
//! the predictor has weights and a widening beyond its trained range: the most expensive
//! case), and with three fold networks serving novel shapes within the trained range
//! (`predict_64x8gpu_folds`: the CV+ interval, four forward passes per graph).
//!
//! `cargo bench -p marshal-model --bench predict`; the per-pair figures are printed at the end.

use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_model::{
    DEFAULT_RIDGE, LinearResidual, PlacementGraph, PredictorConfig, Targets, TrainedPredictor, fit,
    synthetic,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The allocator the `marshal` binary uses, so the latency measured is the one served.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 64;
const GPUS: usize = 8;

fn bench(c: &mut Criterion) {
    let data = synthetic::dataset(128, 1, 0.05);
    let config = PredictorConfig::new().with_max_epochs(1);
    let predictor = fit(&data[..96], &data[96..], &config, &mut |_| {}).expect("fit");
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let batch: Vec<_> = (0..BATCH)
        .map(|_| synthetic::graph(&mut rng, GPUS))
        .collect();
    // Trained on graphs of other sizes than the batch's, so every candidate is novel.
    let other_sizes: Vec<_> = data
        .iter()
        .filter(|(g, _)| g.gpus.len() != GPUS)
        .cloned()
        .collect();
    let stacked = fit(&other_sizes[..64], &data[96..], &config, &mut |_| {})
        .expect("fit")
        .with_linear_residual(LinearResidual::fit(&other_sizes, DEFAULT_RIDGE).expect("ridge"))
        .expect("linear residual")
        .with_novel_weights(0.5, 0.5)
        .expect("weights")
        // Weights and a slope beyond the trained range: each graph's distance (a node
        // count by union-find) is taken, besides the ridge summary's own node count.
        .with_extrapolation(Some((0.5, 0.5)), &[(3.0, 1.0); 20])
        .expect("extrapolation");
    assert!(
        batch
            .iter()
            .all(|g| stacked.calibration().is_novel(g.shape_class())),
        "the stacked case needs novel shapes"
    );

    let (with_folds, novel_batch) = with_fold_networks(&data, &config, &mut rng);

    c.bench_function("predict_64x8gpu", |b| {
        b.iter(|| {
            predictor
                .predict(std::hint::black_box(&batch))
                .expect("predict")
        })
    });
    c.bench_function("predict_on_device_64x8gpu", |b| {
        b.iter(|| {
            predictor
                .predict_on_device(std::hint::black_box(&batch))
                .expect("predict")
        })
    });

    c.bench_function("predict_64x8gpu_stacked", |b| {
        b.iter(|| {
            stacked
                .predict(std::hint::black_box(&batch))
                .expect("predict")
        })
    });

    c.bench_function("predict_64x8gpu_folds", |b| {
        b.iter(|| {
            with_folds
                .predict(std::hint::black_box(&novel_batch))
                .expect("predict")
        })
    });

    let reps = 200;
    for (name, path) in [
        ("predict (plain Rust)", 0),
        ("predict_on_device (burn flex)", 1),
        ("predict, linear residual stacked, all novel", 2),
        ("predict, 3 fold networks (CV+), all novel within range", 3),
    ] {
        let mut calls = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            let out = match path {
                0 => predictor.predict(&batch),
                1 => predictor.predict_on_device(&batch),
                2 => stacked.predict(&batch),
                _ => with_folds.predict(&novel_batch),
            };
            std::hint::black_box(out.expect("predict"));
            calls.push(start.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        }
        calls.sort_by(f64::total_cmp);
        let mean = calls.iter().sum::<f64>() / reps as f64;
        println!(
            "{name}: {mean:.2} µs per (job, placement) pair (p50 {:.2}, p99 {:.2}), batch {BATCH} × {GPUS} GPUs",
            calls[reps / 2],
            calls[reps * 99 / 100],
        );
    }
}

/// A stacked predictor keeping three fold networks (each with 250 residuals, about what
/// a measured training side gives), trained without the multi-machine 8-GPU classes, and
/// a batch of such graphs within its trained range: each is served by the CV+ interval.
fn with_fold_networks(
    data: &[(PlacementGraph, Targets)],
    config: &PredictorConfig,
    rng: &mut ChaCha8Rng,
) -> (TrainedPredictor, Vec<PlacementGraph>) {
    let held_out = |g: &PlacementGraph| g.gpus.len() == GPUS && g.shape_class().1 >= 2;
    let train: Vec<_> = data[..96]
        .iter()
        .filter(|(g, _)| !held_out(g))
        .cloned()
        .collect();
    let stacked = |part: &[(PlacementGraph, Targets)], seed: u64| {
        fit(
            part,
            &data[96..],
            &config.clone().with_seed(seed),
            &mut |_| {},
        )
        .expect("fit")
        .with_linear_residual(LinearResidual::fit(part, DEFAULT_RIDGE).expect("ridge"))
        .expect("linear residual")
    };
    let folds = (0..3)
        .map(|k| {
            let part: Vec<_> = train
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 3 != k)
                .map(|(_, e)| e.clone())
                .collect();
            let ratios = (1..=250).map(|i| i as f32 / 125.0).collect();
            (stacked(&part, k as u64 + 1), ratios)
        })
        .collect();
    let predictor = stacked(&train, 0)
        .with_novel_weights(0.5, 0.5)
        .expect("weights")
        .with_fold_networks(folds)
        .expect("folds");
    let c = predictor.calibration();
    let batch: Vec<_> = std::iter::repeat_with(|| synthetic::graph(rng, GPUS))
        .take(100_000)
        .filter(|g| c.for_graph(g).cross_conformal)
        .take(BATCH)
        .collect();
    assert_eq!(
        batch.len(),
        BATCH,
        "the fold case needs novel shapes within the range"
    );
    (predictor, batch)
}

criterion_group!(benches, bench);
criterion_main!(benches);
