//! Decision latency of the `learned` policy (criterion): `cargo bench -p marshal-scheduler
//! --bench learned`.
//!
//! The same setting as `decision/<policy>` in `benches/scheduler.rs`: a 10,000-GPU cluster
//! (1,250 × 8 H100), about 60 % allocated and churned so that free capacity is scattered,
//! and a stream of 1,000 pending jobs of a mixed shape; one `place()` per job, on one
//! thread. The learned placer does everything a served decision does: the fallback's
//! placement, FGD and best-fit scores of every feasible node, the candidates, the
//! featuriser, the network and the gate. It uses the shipped model
//! (`models/policy-default`); without one it times an untrained network of the default
//! size with the gate open, so the full path is always measured. After the criterion
//! group, p50/p99 of the same decisions timed one by one are printed (target: p99 < 1 ms).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_model::policy::{
    CANDIDATE_FEATURES, DecisionFeatures, FeatureStats, JOB_FEATURES, PolicyConfig, PolicyScorer,
};
use marshal_scheduler::domain::{
    ClusterSpec, ClusterState, CommPattern, GpuDemand, Job, JobId, LinkSpec, NodeGroupSpec,
    Placement, Topology,
};
use marshal_scheduler::framework::{Context, Policy};
use marshal_scheduler::policies::learned::{Gate, LearnedModel, LearnedPlacer, learned_policy};
use marshal_scheduler::policies::{self};
use marshal_scheduler::sim::percentile;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEED: u64 = 42;
const PENDING_JOBS: usize = 1_000;
const TARGET_ALLOCATION: f64 = 0.60;
const CHURN_PER_RUNNING_JOB: usize = 2;

fn rng(stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    rng.set_stream(stream);
    rng
}

fn cluster() -> ClusterSpec {
    ClusterSpec {
        name: "bench-h100-10k".into(),
        nodes_per_rack: 16,
        racks_per_spine: 8,
        links: LinkSpec::default(),
        gpu_models: Vec::new(),
        node_groups: vec![NodeGroupSpec {
            count: 1_250,
            name_prefix: Some("h100".into()),
            names: Vec::new(),
            gpu_model: Some("H100".into()),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 224_000,
            memory_mib: 2 * 1024 * 1024,
        }],
    }
}

/// The decision benchmark's job mix (see `benches/scheduler.rs`).
fn mixed_job(id: u32, rng: &mut ChaCha8Rng) -> Job {
    let (workers, gpu) = match rng.random_range(0..100u32) {
        0..40 => (1, GpuDemand::Milli(100 * rng.random_range(1..=9))),
        40..75 => (1, GpuDemand::Whole(1)),
        75..85 => (1, GpuDemand::Whole(2)),
        85..93 => (1, GpuDemand::Whole(4)),
        93..98 => (1, GpuDemand::Whole(8)),
        _ => (rng.random_range(2..=4), GpuDemand::Whole(8)),
    };
    let mut job = Job::whole_gpus(JobId(id), workers, 0.0, 3_600.0);
    job.workers = workers;
    job.gpu = gpu;
    job.cpu_milli = 2_000 * rng.random_range(1..=8);
    job.memory_mib = 8 * 1024 * rng.random_range(1..=8);
    job.comm = if job.gpu_count() > 1 {
        CommPattern::DataParallel
    } else {
        CommPattern::None
    };
    job
}

/// Fills to 60 % with best fit, then churns (as the decision benchmark does).
fn prefill(mut state: ClusterState) -> ClusterState {
    let placer = policies::build("best-fit", &[]).expect("exists").placer;
    let mut rng = rng(1);
    let target = (state.capacity_milli() as f64 * TARGET_ALLOCATION) as u64;
    let mut running: Vec<(Job, Placement)> = Vec::new();
    let mut next_id = PENDING_JOBS as u32;
    let mut fill =
        |state: &mut ClusterState, running: &mut Vec<(Job, Placement)>, rng: &mut ChaCha8Rng| {
            let mut misses = 0;
            while state.allocated_milli() < target {
                let job = mixed_job(next_id, rng);
                next_id += 1;
                let mut ctx = Context::new(0.0, rng);
                match placer.place(&job, state, &mut ctx) {
                    Ok(p) => {
                        state.allocate(&job, &p).expect("fits");
                        running.push((job, p));
                    }
                    Err(_) => {
                        misses += 1;
                        assert!(misses < 10_000, "cannot reach the target allocation");
                    }
                }
            }
        };
    fill(&mut state, &mut running, &mut rng);
    for _ in 0..running.len() * CHURN_PER_RUNNING_JOB {
        let (job, p) = running.swap_remove(rng.random_range(0..running.len()));
        state.release(&job, &p);
        fill(&mut state, &mut running, &mut rng);
    }
    state
}

fn learned(pending: &[Job]) -> (Policy, &'static str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/policy-default");
    let model = LearnedModel::load(&dir);
    let (scorer, gate, what) = match model.scorer {
        Ok(s) => (s, model.gate, "shipped model"),
        Err(_) => {
            let d = DecisionFeatures {
                job: [0.0; JOB_FEATURES],
                candidates: vec![[0.0; CANDIDATE_FEATURES]],
            };
            let scorer =
                PolicyScorer::initialised(&PolicyConfig::new(), SEED, FeatureStats::fit(&[&d]))
                    .expect("valid");
            let open = Gate {
                margin_threshold: 0.0,
                distance_limit: f32::INFINITY,
            };
            (
                Arc::new(scorer),
                open,
                "untrained network, gate open (no shipped model)",
            )
        }
    };
    let (policy, _) = learned_policy("topo-pack", pending, |fallback| {
        LearnedPlacer::new(fallback, pending, Ok(scorer), gate)
    })
    .expect("topo-pack exists");
    (policy, what)
}

fn bench(c: &mut Criterion) {
    let topo = Arc::new(Topology::build(&cluster()).expect("valid"));
    let mut pending_rng = rng(0);
    let pending: Vec<Job> = (0..PENDING_JOBS as u32)
        .map(|id| mixed_job(id, &mut pending_rng))
        .collect();
    let base = prefill(ClusterState::new(topo));
    let (policy, what) = learned(&pending);
    let mut state = base.clone();
    let mut prng = rng(2);
    let mut next = 0usize;
    c.bench_function("decision/learned", |b| {
        let mut ctx = Context::new(0.0, &mut prng);
        b.iter(|| {
            let job = &pending[next % PENDING_JOBS];
            next += 1;
            policy.placer.place(black_box(job), &mut state, &mut ctx)
        });
    });
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    if !measuring {
        return;
    }
    let mut state = base.clone();
    let mut prng = rng(2);
    let mut ctx = Context::new(0.0, &mut prng);
    let time = |state: &mut ClusterState, ctx: &mut Context| -> Vec<f64> {
        pending
            .iter()
            .map(|job| {
                let t = Instant::now();
                black_box(policy.placer.place(black_box(job), state, ctx)).ok();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect()
    };
    let mut cold = time(&mut state, &mut ctx);
    let mut warm = time(&mut state, &mut ctx);
    let p = |v: &mut [f64], q: f64| percentile(v, q).unwrap_or(f64::NAN);
    eprintln!(
        "learned ({what}), {PENDING_JOBS} decisions timed alone on one thread: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs, cold p99 {:.1} µs",
        p(&mut warm, 0.5),
        p(&mut warm, 0.99),
        p(&mut warm, 1.0),
        p(&mut cold, 0.99)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
