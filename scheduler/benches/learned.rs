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
//! size with the gate open, so the full path is always measured. `decision/learned` ranks
//! the model's own candidate set, `decision/learned-wide` the same network over the wide
//! set (the classes of place of every feasible node on top). After the criterion group,
//! p50/p99 of the same decisions timed one by one are printed (target: p99 < 1 ms).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use marshal_model::policy::{
    CANDIDATE_FEATURES, CandidateSet, DecisionFeatures, FeatureStats, JOB_FEATURES, PolicyConfig,
    PolicyScorer,
};
use marshal_scheduler::domain::{ClusterState, Job};
use marshal_scheduler::framework::{Context, Policy};
use marshal_scheduler::policies::learned::{Gate, LearnedModel, LearnedPlacer, learned_policy};
use marshal_scheduler::sim::percentile;

#[path = "common/decision.rs"]
mod decision;
use decision::{DecisionSetup, PENDING_JOBS, POLICY_STREAM, SEED, rng};

fn learned(pending: &[Job], set: Option<CandidateSet>) -> (Policy, &'static str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/policy-default");
    let model = LearnedModel::load(&dir);
    let set = set.unwrap_or(model.candidates);
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
        LearnedPlacer::new(fallback, pending, Ok(scorer), gate).with_candidates(set)
    })
    .expect("topo-pack exists");
    (policy, what)
}

fn bench(c: &mut Criterion) {
    let DecisionSetup {
        state: base,
        pending,
    } = DecisionSetup::new();
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    for (name, set) in [
        ("decision/learned", None),
        ("decision/learned-wide", Some(CandidateSet::Wide)),
    ] {
        let (policy, what) = learned(&pending, set);
        let mut state = base.clone();
        let mut prng = rng(POLICY_STREAM);
        let mut next = 0usize;
        c.bench_function(name, |b| {
            let mut ctx = Context::new(0.0, &mut prng);
            b.iter(|| {
                let job = &pending[next % PENDING_JOBS];
                next += 1;
                policy.placer.place(black_box(job), &mut state, &mut ctx)
            });
        });
        if measuring {
            time_one_by_one(name, what, &policy, &base, &pending);
        }
    }
}

/// p50/p99 of the pending jobs' decisions, each timed alone, after a cold pass.
fn time_one_by_one(name: &str, what: &str, policy: &Policy, base: &ClusterState, pending: &[Job]) {
    let mut state = base.clone();
    let mut prng = rng(POLICY_STREAM);
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
        "{name} ({what}), {PENDING_JOBS} decisions timed alone on one thread: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs, cold p99 {:.1} µs",
        p(&mut warm, 0.5),
        p(&mut warm, 0.99),
        p(&mut warm, 1.0),
        p(&mut cold, 0.99)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
