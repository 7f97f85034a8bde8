//! Inference latency: one `predict` call on 64 candidate placements of 8 GPUs each.
//!
//! `cargo bench -p marshal-model --bench predict`; the per-pair figure is printed at the end.

use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_model::{PredictorConfig, fit, synthetic};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

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

    let reps = 200;
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(predictor.predict(&batch).expect("predict"));
    }
    let per_pair = start.elapsed().as_secs_f64() * 1e6 / (reps * BATCH) as f64;
    println!("predict: {per_pair:.2} µs per (job, placement) pair, batch {BATCH} × {GPUS} GPUs");
}

criterion_group!(benches, bench);
criterion_main!(benches);
