use std::sync::Arc;

use marshal_scheduler::domain::{ClusterSpec, GpuDemand, Job, JobId, Topology};
use marshal_scheduler::sim::SimConfig;

use super::*;

fn topo() -> Arc<Topology> {
    let spec = ClusterSpec::from_toml(
        "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=6\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
    )
    .unwrap();
    Arc::new(Topology::build(&spec).unwrap())
}

fn jobs(n: u32, replay: bool) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let mut j = Job::whole_gpus(JobId(i), 1, i as f64 * 120.0, 0.0);
            j.cpu_milli = 4000;
            j.gpu = match i % 4 {
                0 => GpuDemand::Milli(500),
                1 => GpuDemand::Whole(1),
                2 => GpuDemand::Milli(250),
                _ => GpuDemand::Whole(2),
            };
            if replay {
                j.gpu = GpuDemand::Whole(1);
                j.workers = 1 + i % 3;
                j.total_work = 600.0 + (i % 5) as f64 * 900.0;
            }
            j
        })
        .collect()
}

fn specs() -> (Vec<EpisodeSpec>, Vec<EpisodeSpec>) {
    let inflation = |seeds: &[u64]| EpisodeSpec {
        name: "tiny-inflation".into(),
        topo: topo(),
        jobs_by_seed: seeds.iter().map(|&s| (s, jobs(24, false))).collect(),
        config: SimConfig::inflation(0),
        fallback: "fgd".into(),
    };
    let replay = |seeds: &[u64]| EpisodeSpec {
        name: "tiny-replay".into(),
        topo: topo(),
        jobs_by_seed: seeds.iter().map(|&s| (s, jobs(40, true))).collect(),
        config: SimConfig::replay(0),
        fallback: "topo-pack".into(),
    };
    (
        vec![inflation(&[1, 2]), replay(&[1])],
        vec![inflation(&[9]), replay(&[9])],
    )
}

fn options(seed: u64) -> TrainOptions {
    TrainOptions {
        seed,
        hidden_size: 8,
        bc_epochs: 3,
        rl_iterations: 2,
        episodes_per_iteration: 2,
        eval_every: 1,
        max_samples: 2_000,
        margins: vec![0.0, 0.5],
        tolerance: 0.01,
        distance_factor: 2.0,
    }
}

#[test]
fn training_is_reproducible_and_the_gate_is_safe_on_validation() {
    let (train, valid) = specs();
    let mut events = 0;
    let a = train_policy(&train, &valid, &options(3), &mut |_| events += 1).unwrap();
    assert!(events > 0);
    let b = train_policy(&train, &valid, &options(3), &mut |_| {}).unwrap();
    let sa = PolicyScorer::new(&a.network, a.stats.clone()).unwrap();
    let sb = PolicyScorer::new(&b.network, b.stats.clone()).unwrap();
    assert_eq!(sa, sb, "same seed, same weights");
    assert_eq!(a.gate, b.gate);
    assert_eq!(a.curve, b.curve);
    assert!(a.curve.iter().any(|p| p.phase == "clone"));
    assert!(a.curve.iter().any(|p| p.phase == "reinforce"));
    // The stored gate is nowhere worse than the fallback beyond the tolerance.
    for row in &a.validation {
        assert!(
            row.gated <= row.fallback * 1.01 + 1e-9,
            "{row:?} (gate {:?})",
            a.gate
        );
    }
}

#[test]
fn returns_compare_with_the_fallback_on_the_same_seed() {
    let (train, _) = specs();
    let spec = &train[0];
    let imitate = Driver::Learned {
        scorer: None,
        act: Act::Imitate,
        gate: Gate {
            margin_threshold: 0.0,
            distance_limit: f32::INFINITY,
        },
    };
    let fb = run_episode(spec, 0, &Driver::Fallback).unwrap();
    let copy = run_episode(spec, 0, &imitate).unwrap();
    // Imitation schedules exactly as the fallback does …
    assert_eq!(fb.score, copy.score);
    assert_eq!(fb.alloc_before_call, copy.alloc_before_call);
    // … so every return against the fallback is zero.
    let samples = pg_samples(Objective::Inflation, &copy, &fb);
    assert!(!samples.is_empty());
    assert!(
        samples.iter().all(|s| s.ret == 0.0),
        "{:?}",
        samples.iter().map(|s| s.ret).collect::<Vec<_>>()
    );
}
