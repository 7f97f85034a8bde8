//! Inference latency: one `predict` call on 64 candidate placements of 8 GPUs each, with
//! the serving path (`predict`, plain Rust) and the burn network (`predict_on_device`).
//!
//! `cargo bench -p marshal-model --bench predict`; the per-pair figures are printed at the end.

use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_model::{PredictorConfig, fit, synthetic};
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

    let reps = 200;
    for (name, path) in [
        ("predict (plain Rust)", false),
        ("predict_on_device (burn flex)", true),
    ] {
        let mut calls = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            let out = if path {
                predictor.predict_on_device(&batch)
            } else {
                predictor.predict(&batch)
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

criterion_group!(benches, bench);
criterion_main!(benches);
