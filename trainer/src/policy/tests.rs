use std::sync::Arc;

use marshal_scheduler::domain::{
    ClusterSpec, GpuDemand, GpuShare, Job, JobId, NodeId, Placement, Topology, WorkerPlacement,
};
use marshal_scheduler::policies;
use marshal_scheduler::policies::learned::Choice;
use marshal_scheduler::sim::{InflationRun, SimConfig};

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
        expert_rounds: 2,
        expert_epochs: 2,
        expert_weight: 2,
        rollout: RolloutOptions {
            decisions: 8,
            from_pct: 0.0,
            to_pct: 130.0,
            until_pct: 1000.0,
            horizon: 50,
            futures: 2,
            threads: 2,
            seed,
        },
        rl_iterations: 2,
        episodes_per_iteration: 2,
        policy_gradient: PolicyGradient::Reinforce,
        eval_every: 1,
        max_samples: 2_000,
        margins: vec![0.0, 0.5],
        tolerance: 0.01,
        distance_factor: 2.0,
        candidates: CandidateSet::Ranked,
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
    assert_eq!(a.curve.iter().filter(|p| p.phase == "expert").count(), 2);
    // The settings saved beside the artifact include expert iteration's.
    let opts = options(3);
    let summary = training_summary(&opts, &a, 1.0);
    assert_eq!(summary["expert_rounds"], 2.0);
    assert_eq!(summary["expert_weight"], opts.expert_weight as f64);
    assert_eq!(summary["rollout_decisions"], opts.rollout.decisions as f64);
    // The stored gate is nowhere worse than the fallback beyond the tolerance.
    assert_eq!(
        a.validation.len(),
        2,
        "one inflation and one replay episode"
    );
    for row in &a.validation {
        assert!(
            row.gated <= row.fallback * 1.01 + 1e-9,
            "{row:?} (gate {:?})",
            a.gate
        );
    }
}

#[test]
fn ppo_training_is_reproducible_differs_from_reinforce_and_is_recorded() {
    let (train, valid) = specs();
    let ppo = TrainOptions {
        expert_rounds: 0,
        policy_gradient: PolicyGradient::Ppo {
            epochs: 3,
            clip: 0.2,
        },
        ..options(5)
    };
    let scorer = |t: &TrainedPolicy| PolicyScorer::new(&t.network, t.stats.clone()).unwrap();
    let a = train_policy(&train, &valid, &ppo, &mut |_| {}).unwrap();
    let b = train_policy(&train, &valid, &ppo, &mut |_| {}).unwrap();
    assert_eq!(a.curve, b.curve, "same seed, same PPO run");
    assert_eq!(scorer(&a), scorer(&b));
    let rl = |t: &TrainedPolicy| {
        t.curve
            .iter()
            .filter(|p| p.phase == "reinforce")
            .map(|p| (p.nll, p.value_mse))
            .collect::<Vec<_>>()
    };
    let reinforce = TrainOptions {
        policy_gradient: PolicyGradient::Reinforce,
        ..ppo.clone()
    };
    let c = train_policy(&train, &valid, &reinforce, &mut |_| {}).unwrap();
    assert_eq!(rl(&a).len(), 2);
    assert_ne!(rl(&a), rl(&c), "PPO's passes are not REINFORCE's");
    let summary = training_summary(&ppo, &a, 1.0);
    assert_eq!(
        (summary["ppo_epochs"], summary["ppo_clip"]),
        (3.0, 0.2f32 as f64)
    );
    assert!(!training_summary(&reinforce, &c, 1.0).contains_key("ppo_epochs"));
    let bad = TrainOptions {
        policy_gradient: PolicyGradient::Ppo {
            epochs: 2,
            clip: 1.5,
        },
        ..ppo
    };
    let err = train_policy(&train, &valid, &bad, &mut |_| {}).unwrap_err();
    assert!(err.contains("clip"), "{err}");
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
        candidates: CandidateSet::Ranked,
        decline: None,
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

/// Two nodes of two GPUs; one GPU taken on node `a`. The next 1-GPU task either goes
/// beside it (leaving node `b` whole for the 2-GPU task that follows) or onto `b` (then
/// the 2-GPU task cannot fit).
#[test]
fn the_rollout_label_is_the_candidate_with_the_best_continuation() {
    let spec = ClusterSpec::from_toml(
        "name='two'\n[[nodes]]\ncount=2\ngpu_model='T4'\ngpus=2\ncpu_milli=64000\nmemory_mib=262144\n",
    )
    .unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let task = |id: u32, gpus: u16| {
        let mut j = Job::whole_gpus(JobId(id), 1, 0.0, 0.0);
        j.cpu_milli = 1000;
        j.gpu = GpuDemand::Whole(gpus);
        j
    };
    let arrivals = vec![task(0, 1), task(1, 1), task(2, 2)];
    let base = policies::build("fgd", &arrivals).unwrap();
    let mut run =
        InflationRun::from_arrivals(topo.clone(), arrivals.clone(), &SimConfig::inflation(3))
            .unwrap();
    assert_eq!(run.step(base.placer.as_ref()), Some(true));
    let used: Vec<NodeId> = (0..2)
        .map(NodeId)
        .filter(|&n| run.state().node_idle_gpus(n) < 2)
        .collect();
    assert_eq!(used.len(), 1);
    let (a, b) = (used[0], NodeId(1 - used[0].0));
    let on = |node: NodeId, fallback: bool| {
        let gpu = topo
            .node(node)
            .gpu_ids()
            .find(|&g| run.state().free_milli(g) == 1000)
            .unwrap();
        Choice::Place {
            placement: Placement {
                workers: vec![WorkerPlacement {
                    node,
                    gpus: vec![GpuShare::whole(gpu)],
                }],
            },
            fallback,
        }
    };
    // The fallback's choice (listed first) is the bad one here.
    let choices = [on(b, true), on(a, false)];
    for threads in [1, 2] {
        let failed = rollout_failures(&run, &choices, base.placer.as_ref(), 1000.0, 3, threads);
        assert_eq!(failed, vec![2000, 0], "{threads} threads");
        assert_eq!(best_of(&failed, 0), 1);
    }
    // Ties keep the fallback's choice; otherwise the first best wins.
    assert_eq!(best_of(&[5, 5, 5], 1), 1);
    assert_eq!(best_of(&[7, 3, 3], 0), 1);
    // A horizon that ends before the 2-GPU task arrives sees no difference.
    let failed = rollout_failures(&run, &choices, base.placer.as_ref(), 1000.0, 2, 1);
    assert_eq!(failed, vec![0, 0]);
}

/// Ten labelled decisions over the whole episode, rolled out to its end or `horizon`.
fn labelling(horizon: usize, futures: usize, seed: u64) -> RolloutOptions {
    RolloutOptions {
        decisions: 10,
        from_pct: 0.0,
        to_pct: 130.0,
        until_pct: 1000.0,
        horizon,
        futures,
        threads: 1,
        seed,
    }
}

/// A gate that lets every learned choice through (labelling uses no network anyway).
const OPEN: Gate = Gate {
    margin_threshold: 0.0,
    distance_limit: f32::INFINITY,
};

#[test]
fn rollout_labels_are_reproducible_and_consistent_with_the_base_run() {
    let (train, _) = specs();
    let spec = &train[0];
    let opts = labelling(1000, 0, 0);
    let gate = OPEN;
    let labels = rollout_labels(spec, 0, None, gate, CandidateSet::Ranked, &opts).unwrap();
    assert!(labels.len() >= 5, "{}", labels.len());
    assert_eq!(
        labels,
        rollout_labels(spec, 0, None, gate, CandidateSet::Ranked, &opts).unwrap()
    );
    assert_eq!(
        labels,
        rollout_labels(
            spec,
            0,
            None,
            gate,
            CandidateSet::Ranked,
            &RolloutOptions {
                threads: 3,
                ..opts.clone()
            }
        )
        .unwrap()
    );
    // Rolling out to the end, the fallback's candidate fails exactly what the fallback's
    // own episode fails from that arrival on.
    let (seed, jobs) = &spec.jobs_by_seed[0];
    let config = SimConfig {
        seed: *seed,
        ..spec.config.clone()
    };
    let base = policies::build("fgd", jobs).unwrap();
    let mut run = InflationRun::new(spec.topo.clone(), jobs, &config).unwrap();
    let mut failed_before = vec![0u64];
    while run.step(base.placer.as_ref()).is_some() {
        failed_before.push(run.failed_milli());
    }
    let total = run.failed_milli();
    assert!(total > 0);
    for l in &labels {
        assert!(l.failed[l.best] <= l.failed[l.fallback]);
        assert_eq!(
            l.failed[l.fallback],
            total - failed_before[l.position],
            "{l:?}"
        );
    }
}

/// Resampled futures are a random choice like any other: the same training seed gives
/// the same labels, and another seed (or another episode) draws other futures.
#[test]
fn resampled_futures_follow_the_training_seed() {
    let (train, _) = specs();
    let spec = &train[0];
    let label = |seed: u64| {
        let opts = labelling(40, 3, seed);
        rollout_labels(spec, 0, None, OPEN, CandidateSet::Ranked, &opts).unwrap()
    };
    let failed = |labels: &[Labelled]| -> Vec<Vec<u64>> {
        labels.iter().map(|l| l.failed.clone()).collect()
    };
    let first = label(0);
    assert!(first.len() >= 5, "{}", first.len());
    assert!(
        first.iter().any(|l| l.failed.iter().any(|&f| f > 0)),
        "the futures must fail something for the seed to show"
    );
    assert_eq!(first, label(0));
    // The decisions (positions, candidates) are the episode's; only the futures move.
    let other = label(1);
    assert_eq!(
        first.iter().map(|l| l.position).collect::<Vec<_>>(),
        other.iter().map(|l| l.position).collect::<Vec<_>>()
    );
    assert_ne!(failed(&first), failed(&other));
    use super::rollout::futures_seed;
    assert_ne!(futures_seed(0, 1000), futures_seed(0, 1001));
    assert_ne!(futures_seed(0, 1000), futures_seed(1, 1000));
}

#[test]
fn the_gate_is_chosen_again_for_another_fallback_and_recorded() {
    use marshal_model::policy::load_policy;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    // An untrained network with an open trained gate, for best fit.
    crate::testkit::tiny_artifact(&dir, "best-fit", 7, 0.0);
    let spec = crate::testkit::inflation_spec();
    let margins = [0.0, 0.3, 1.1];
    let mut regated = Vec::new();
    for fallback in ["fgd", "random"] {
        let (choice, meta) = regate(
            &dir,
            fallback,
            std::slice::from_ref(&spec),
            &margins,
            0.01,
            &mut |_| {},
        )
        .unwrap();
        // The references are that heuristic's own runs, on every seed …
        let theirs = fallback_references(&[EpisodeSpec {
            fallback: fallback.into(),
            ..spec.clone()
        }])
        .unwrap();
        assert_eq!(choice.validation.len(), 2);
        for (row, r) in choice.validation.iter().zip(&theirs) {
            assert_eq!(row.fallback, r.fallback.score, "{fallback}");
            assert_eq!(row.episode, r.episode());
            // … and the chosen gate keeps within the tolerance of it.
            assert!(
                row.gated <= row.fallback * 1.01 + 1e-9,
                "{fallback}: {row:?}"
            );
        }
        assert!(margins.contains(&choice.gate.margin_threshold));
        // Recorded for that fallback, with its scores; the trained gate is untouched.
        let g = &meta.gates[fallback];
        assert_eq!(g.margin_threshold, choice.gate.margin_threshold);
        assert_eq!(g.scores, validation_scores(&choice.validation));
        assert_eq!(
            meta.margin_threshold_for(fallback),
            Some(g.margin_threshold)
        );
        assert_eq!(meta.margin_threshold_for("best-fit"), Some(0.0));
        assert_eq!(load_policy(&dir).unwrap().meta, meta);
        regated.push(choice);
    }
    // Two heuristics, two selections on their own references.
    let references = |c: &GateChoice| c.validation.iter().map(|r| r.fallback).collect::<Vec<_>>();
    assert_ne!(references(&regated[0]), references(&regated[1]));
    // Bad settings and a missing artifact are refused before anything is written.
    let meta_before = std::fs::read(dir.join("meta.json")).unwrap();
    assert!(
        regate(
            &dir,
            "fgd",
            std::slice::from_ref(&spec),
            &[],
            0.01,
            &mut |_| {}
        )
        .is_err()
    );
    assert!(
        regate(
            &dir,
            "fgd",
            std::slice::from_ref(&spec),
            &[0.0],
            f64::NAN,
            &mut |_| {}
        )
        .is_err()
    );
    assert_eq!(std::fs::read(dir.join("meta.json")).unwrap(), meta_before);
    let err = regate(
        &tmp.path().join("nope"),
        "fgd",
        &[spec],
        &[0.0],
        0.01,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.contains("nope"), "{err}");
}
