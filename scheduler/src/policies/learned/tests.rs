use std::sync::{Arc, Mutex};

use marshal_model::policy::{FeatureStats, PolicyConfig, PolicyScorer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::domain::{ClusterSpec, JobId, Topology};
use crate::sim::{SimConfig, run_inflation};

fn cluster() -> Arc<Topology> {
    let spec = ClusterSpec::from_toml(
        "name='c'\n[[nodes]]\ncount=10\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
    )
    .unwrap();
    Arc::new(Topology::build(&spec).unwrap())
}

fn workload() -> Vec<Job> {
    (0..30)
        .map(|i| {
            let mut j = Job::whole_gpus(JobId(i), 1, 0.0, 0.0);
            j.cpu_milli = 4000;
            j.gpu = match i % 4 {
                0 => GpuDemand::Milli(600),
                1 => GpuDemand::Whole(1),
                2 => GpuDemand::Milli(300),
                _ => GpuDemand::Whole(2),
            };
            j
        })
        .collect()
}

/// An untrained network (random weights): its choices are arbitrary but must be valid.
fn random_scorer(seed: u64) -> Arc<PolicyScorer> {
    let config = PolicyConfig::new().with_hidden_size(8);
    let d = DecisionFeatures {
        job: [0.0; marshal_model::policy::JOB_FEATURES],
        candidates: vec![[0.0; marshal_model::policy::CANDIDATE_FEATURES]],
    };
    let mut stats = FeatureStats::fit(&[&d]);
    stats.distance_p999 = 1.0;
    Arc::new(PolicyScorer::initialised(&config, seed, stats).unwrap())
}

fn open_gate() -> Gate {
    Gate {
        margin_threshold: 0.0,
        distance_limit: f32::INFINITY,
    }
}

#[test]
fn without_a_model_it_says_why_and_schedules_exactly_like_its_fallback() {
    let w = workload();
    let model = LearnedModel::load(std::path::Path::new("/nonexistent/policy"));
    let err = model.scorer.as_ref().unwrap_err();
    assert!(
        err.contains("/nonexistent/policy") && err.contains("missing"),
        "{err}"
    );
    let (policy, stats) = build_learned(&model, "fgd", &w).unwrap();
    let fgd = crate::policies::build("fgd", &w).unwrap();
    let config = SimConfig::inflation(3);
    let (ours, curve) = run_inflation(&policy, cluster(), &w, "t", &config).unwrap();
    let (theirs, their_curve) = run_inflation(&fgd, cluster(), &w, "t", &config).unwrap();
    assert_eq!(curve, their_curve);
    assert_eq!(ours.unallocated_gpus_at_100, theirs.unallocated_gpus_at_100);
    let counts = stats.snapshot();
    assert!(counts.no_model > 0);
    assert_eq!(counts.learned, 0);
    assert_eq!(counts.fallback_rate(), 1.0);
}

#[test]
fn an_artifact_naming_a_heuristic_this_build_lacks_is_refused_and_the_default_decides() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/policy-default");
    let tmp = tempfile::tempdir().unwrap();
    for (objective, was, name, says) in [
        (
            "replay",
            "topo-pack",
            "nope",
            "the replay fallback: unknown policy \"nope\"",
        ),
        (
            "inflation",
            "fgd",
            LEARNED,
            "the inflation fallback is the learned policy itself",
        ),
    ] {
        let dir = tmp.path().join(format!("{objective}-{name}"));
        std::fs::create_dir(&dir).unwrap();
        for f in std::fs::read_dir(&shipped).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
        }
        let meta = dir.join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        let entry = format!("\"{objective}\": \"{was}\"");
        assert!(text.contains(&entry), "{text}");
        let renamed = text.replace(&entry, &format!("\"{objective}\": \"{name}\""));
        std::fs::write(&meta, renamed).unwrap();
        let model = LearnedModel::load(&dir);
        let err = model.scorer.as_ref().unwrap_err();
        assert!(err.contains("meta.json") && err.contains(says), "{err}");
        let setup = LearnedSetup::with_model(model, None, objective);
        let default = if objective == "replay" {
            "topo-pack"
        } else {
            "fgd"
        };
        assert_eq!(setup.fallback, default);
        assert!(build_policy(LEARNED, &workload(), Some(&setup)).is_ok());
    }
}

#[test]
fn a_fallback_without_a_threshold_closes_the_gate_and_says_so() {
    use std::collections::BTreeMap;
    let w = workload();
    let model = LearnedModel {
        scorer: Ok(random_scorer(2)),
        gate: open_gate(),
        fallback: BTreeMap::from([("inflation".to_string(), "fgd".to_string())]),
        thresholds: BTreeMap::from([("fgd".to_string(), 0.0)]),
        candidates: CandidateSet::Ranked,
        decline: None,
    };
    let run = |setup: &LearnedSetup| {
        let (policy, stats) = build_policy(LEARNED, &w, Some(setup)).unwrap();
        let (_, curve) =
            run_inflation(&policy, cluster(), &w, "t", &SimConfig::inflation(3)).unwrap();
        (curve, stats.unwrap().snapshot())
    };
    // Its own fallback: the threshold chosen for it, no warning, the network decides.
    let own = LearnedSetup::with_model(model.clone(), None, "inflation");
    assert_eq!((own.fallback.as_str(), own.gate), ("fgd", open_gate()));
    assert!(own.gate_warning.is_none());
    assert!(run(&own).1.learned > 0);
    // A heuristic nobody chose a threshold for: warned, closed, and exactly that
    // heuristic's schedule.
    let other = LearnedSetup::with_model(model.clone(), Some("best-fit"), "inflation");
    let warning = other.gate_warning.as_deref().expect("a warning");
    assert!(
        warning.contains("no gate threshold for fallback best-fit") && warning.contains("fgd"),
        "{warning}"
    );
    assert_eq!(other.gate.margin_threshold, CLOSED_MARGIN);
    let (curve, counts) = run(&other);
    let best_fit = crate::policies::build("best-fit", &w).unwrap();
    let (_, theirs) =
        run_inflation(&best_fit, cluster(), &w, "t", &SimConfig::inflation(3)).unwrap();
    assert_eq!(curve, theirs);
    assert_eq!(
        (counts.learned, counts.fallback_rate()),
        (0, 1.0),
        "{counts:?}"
    );
    // A per-fallback threshold opens it.
    let mut regated = model;
    regated.thresholds.insert("best-fit".into(), 0.0);
    let setup = LearnedSetup::with_model(regated, Some("best-fit"), "inflation");
    assert!(setup.gate_warning.is_none());
    assert!(run(&setup).1.learned > 0);
}

#[test]
fn learned_placements_are_valid_seeded_and_counted() {
    let w = workload();
    let run = |seed| {
        let (policy, stats) = learned_policy("fgd", &w, |fallback| {
            LearnedPlacer::new(fallback, &w, Ok(random_scorer(seed)), open_gate())
        })
        .unwrap();
        let (result, curve) =
            run_inflation(&policy, cluster(), &w, "t", &SimConfig::inflation(5)).unwrap();
        (result.unallocated_gpus_at_100, curve, stats.snapshot())
    };
    let (a, curve, counts) = run(1);
    assert!(
        counts.learned > 0 && counts.fallback_rate() == 0.0,
        "{counts:?}"
    );
    for &(arrived, alloc) in &curve.points {
        assert!(alloc <= arrived + 1e-9 && alloc <= 100.0 + 1e-9);
    }
    let (b, curve_b, _) = run(1);
    assert_eq!((a, &curve), (b, &curve_b), "same seed, same schedule");
}

#[test]
fn a_closed_gate_and_an_out_of_distribution_input_hand_decisions_back() {
    let w = workload();
    let state = &mut ClusterState::new(cluster());
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let fgd = crate::policies::build("fgd", &w).unwrap();
    for (gate, expect) in [
        (
            Gate {
                margin_threshold: 2.0,
                distance_limit: f32::INFINITY,
            },
            "low_margin",
        ),
        (
            Gate {
                margin_threshold: 0.0,
                distance_limit: 1e-9,
            },
            "ood",
        ),
    ] {
        let placer = LearnedPlacer::new(
            crate::policies::build("fgd", &w).unwrap().placer,
            &w,
            Ok(random_scorer(2)),
            gate,
        );
        for job in &w {
            let ours = placer.place(job, state, &mut Context::new(0.0, &mut rng));
            let theirs = fgd
                .placer
                .place(job, state, &mut Context::new(0.0, &mut rng));
            assert_eq!(ours, theirs);
        }
        let c = placer.stats().snapshot();
        let n = match expect {
            "low_margin" => c.low_margin,
            _ => c.out_of_distribution,
        };
        assert_eq!(n, w.len() as u64, "{expect}: {c:?}");
    }
}

#[test]
fn imitation_records_the_fallback_choice_through_the_shared_featuriser() {
    let w = workload();
    let recorder = Arc::new(Mutex::new(Vec::new()));
    let (policy, _) = learned_policy("fgd", &w, |fallback| {
        LearnedPlacer::new(fallback, &w, Err("none yet".into()), open_gate())
            .with_recorder(Act::Imitate, recorder.clone())
    })
    .unwrap();
    run_inflation(&policy, cluster(), &w, "t", &SimConfig::inflation(1)).unwrap();
    let records = recorder.lock().unwrap();
    assert!(records.len() > 10);
    for r in records.iter() {
        r.features.validate().unwrap();
        // The fallback's own choice is what was recorded, and it is flagged as such.
        assert_eq!(r.features.candidates[r.chosen][14], 1.0);
    }
}

#[test]
fn traces_carry_the_features_and_the_executed_candidate_on_every_path() {
    let w = workload();
    let closed = Gate {
        margin_threshold: 2.0,
        distance_limit: f32::INFINITY,
    };
    for (model, gate, path) in [
        (Ok(random_scorer(4)), open_gate(), DecisionPath::Learned),
        (Ok(random_scorer(4)), closed, DecisionPath::LowMargin),
        (Err("none".to_string()), open_gate(), DecisionPath::NoModel),
    ] {
        let sink = TraceSink::default();
        let placer = LearnedPlacer::new(
            crate::policies::build("fgd", &w).unwrap().placer,
            &w,
            model,
            gate,
        )
        .with_trace(sink.clone());
        let state = &mut ClusterState::new(cluster());
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        for job in &w[..8] {
            let placed = placer.place(job, state, &mut Context::new(0.0, &mut rng));
            if let Ok(p) = placed {
                state.allocate(job, &p).unwrap();
            }
        }
        let traces = sink.lock().unwrap();
        assert_eq!(traces.len(), 8);
        for t in traces.iter() {
            assert_eq!(t.path, path);
            let f = t
                .features
                .as_ref()
                .expect("every traced decision is featurised");
            f.validate().unwrap();
            assert_eq!(f.candidates.len(), t.candidates.len());
            let taken = t.taken.expect("an executed candidate");
            if path.is_learned() {
                assert_eq!(Some(taken), t.chosen);
            } else {
                // The fallback's placement is what ran (slot 14 flags it).
                assert!(t.candidates[taken].fallback);
                assert_eq!(f.candidates[taken][14], 1.0);
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Whatever the network's weights, every placement the learned placer returns is
    /// accepted by the state (capacity, whole gangs, constraints) and leaves it consistent,
    /// and a wait is only offered to gangs while something runs.
    #[test]
    fn learned_placements_always_fit(
        seed in 0u64..1_000,
        shapes in proptest::collection::vec((0u8..5, 1u32..4), 5..40),
    ) {
        let w: Vec<Job> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(kind, workers))| {
                let mut j = Job::whole_gpus(JobId(i as u32), 1, 0.0, 0.0);
                j.cpu_milli = 2000;
                j.gpu = match kind {
                    0 => GpuDemand::Milli(250 + 100 * (i as u16 % 7)),
                    1 => GpuDemand::Whole(1),
                    2 => GpuDemand::Whole(2),
                    3 => GpuDemand::Whole(4),
                    _ => GpuDemand::None,
                };
                if kind == 2 || kind == 3 {
                    j.workers = workers;
                }
                j
            })
            .collect();
        let placer = LearnedPlacer::new(
            crate::policies::build("topo-pack", &w).unwrap().placer,
            &w,
            Ok(random_scorer(seed)),
            open_gate(),
        );
        let mut state = ClusterState::new(cluster());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for job in &w {
            let before = state.allocated_milli();
            match placer.place(job, &mut state, &mut Context::new(0.0, &mut rng)) {
                Ok(p) => {
                    proptest::prop_assert_eq!(p.workers.len(), job.workers as usize);
                    proptest::prop_assert!(state.allocate(job, &p).is_ok());
                }
                Err(Status::Deferred(_)) => {
                    proptest::prop_assert!(before > 0 && job.gpu_count() > 1);
                }
                Err(_) => {}
            }
            proptest::prop_assert!(state.check_consistency().is_ok());
        }
    }
}

#[test]
fn wide_candidates_extend_the_ranked_ones_with_distinct_feasible_places() {
    let w = workload();
    let state = &mut ClusterState::new(cluster());
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // A partly used cluster, placed at random so that GPUs and nodes differ in what they
    // have free.
    let random = crate::policies::build("random", &w).unwrap();
    for job in &w[..20] {
        if let Ok(p) = random
            .placer
            .place(job, state, &mut Context::new(0.0, &mut rng))
        {
            state.allocate(job, &p).unwrap();
        }
    }
    let placer = |set| {
        LearnedPlacer::new(
            crate::policies::build("fgd", &w).unwrap().placer,
            &w,
            Err("candidates only".into()),
            open_gate(),
        )
        .with_candidates(set)
    };
    let (ranked, wide) = (placer(CandidateSet::Ranked), placer(CandidateSet::Wide));
    let mut widened = 0;
    for demand in [
        GpuDemand::Milli(300),
        GpuDemand::Milli(600),
        GpuDemand::Whole(1),
        GpuDemand::Whole(2),
    ] {
        let mut job = Job::whole_gpus(JobId(99), 1, 0.0, 0.0);
        job.cpu_milli = 4000;
        job.gpu = demand;
        let mut ctx = Context::new(0.0, &mut rng);
        let fb = ranked.fallback_place(&job, state, &mut ctx);
        let (r, rf) = ranked.decision(&job, state, &mut ctx, &fb).unwrap();
        let (c, cf) = wide.decision(&job, state, &mut ctx, &fb).unwrap();
        cf.validate().unwrap();
        assert_eq!(cf.candidates.len(), c.len());
        assert!(c.len() <= MAX_CANDIDATES);
        // A whole-GPU gang may wait; the wait stays last in both sets.
        let waits = usize::from(r.last() == Some(&Choice::Wait));
        assert_eq!(waits, usize::from(c.last() == Some(&Choice::Wait)));
        let places = r.len() - waits;
        // The ranked candidates come first, unchanged, and the features agree on them.
        assert_eq!(&c[..places], &r[..places], "{demand:?}");
        assert_eq!(&cf.candidates[..places], &rf.candidates[..places]);
        widened += c.len() - r.len();
        let placements: Vec<&Placement> = c[..c.len() - waits]
            .iter()
            .map(|choice| match choice {
                Choice::Place { placement, .. } => placement,
                Choice::Wait => panic!("a wait before the last candidate"),
            })
            .collect();
        for (i, p) in placements.iter().enumerate() {
            // Every extra candidate is a new place that the job fits.
            assert!(!placements[..i].contains(p), "{demand:?}: {p:?} twice");
            let mut copy = state.clone();
            copy.allocate(&job, p).unwrap();
            assert_eq!(p.workers[0].gpus.len(), job.gpu_count().max(1) as usize);
        }
    }
    assert!(widened > 0, "no class of place beyond the rankings");
    // A MIG or CPU-only worker gets the ranked candidates only.
    let mut cpu_only = Job::whole_gpus(JobId(100), 1, 0.0, 0.0);
    cpu_only.gpu = GpuDemand::None;
    cpu_only.cpu_milli = 1000;
    let mut ctx = Context::new(0.0, &mut rng);
    let fb = ranked.fallback_place(&cpu_only, state, &mut ctx);
    assert_eq!(
        ranked
            .decision(&cpu_only, state, &mut ctx, &fb)
            .map(|d| d.0),
        wide.decision(&cpu_only, state, &mut ctx, &fb).map(|d| d.0)
    );
}

/// DESIGN: the model only ranks feasible options. A gang that fits idle capacity and for
/// which the network chooses to wait stays queued, and nothing is preempted for it (its
/// wait once came back as "unschedulable", and the fallback's preemptor then evicted a
/// lower-priority job to place it).
#[test]
fn a_gang_the_network_makes_wait_preempts_nothing() {
    let mut low = Job::whole_gpus(JobId(1), 1, 0.0, 0.0);
    low.cpu_milli = 4000;
    let mut gang = Job::whole_gpus(JobId(2), 2, 0.0, 0.0);
    gang.cpu_milli = 4000;
    gang.priority = 5;
    let w = [low.clone(), gang.clone()];
    let mut state = ClusterState::new(cluster());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let on_node_0 = crate::policies::build("priority", &w)
        .unwrap()
        .placer
        .place(&low, &mut state, &mut Context::new(0.0, &mut rng))
        .unwrap();
    state.allocate(&low, &on_node_0).unwrap();
    assert!(state.idle_gpus() >= gang.gpu_count());
    let pending = [crate::framework::Pending {
        job: &gang,
        stats: Default::default(),
    }];
    let running = [crate::framework::Running {
        job: &low,
        placement: &on_node_0,
        stats: Default::default(),
        started_at: 0.0,
        lost_work_s: 0.0,
    }];
    // An untrained network whose choice here is to wait: the first such seed.
    let mut waited = false;
    for seed in 0..64 {
        let (policy, stats) = learned_policy("priority", &w, |placer| {
            LearnedPlacer::new(placer, &w, Ok(random_scorer(seed)), open_gate())
        })
        .unwrap();
        let mut state = state.clone();
        // Past the fallback's ten-minute protection: `low` may be preempted.
        let mut ctx = Context::new(1_000.0, &mut rng);
        let d = crate::framework::run_cycle(&policy, &mut state, &pending, &running, &mut ctx);
        if stats.snapshot().waits == 0 {
            continue;
        }
        waited = true;
        assert!(d.preempted.is_empty(), "seed {seed}: {:?}", d.preempted);
        assert!(d.placed.is_empty() && d.errors.is_empty() && d.rejected.is_empty());
        assert_eq!(state.allocated_milli(), 1000, "seed {seed}");
        break;
    }
    assert!(waited, "no seed in 0..64 makes the network wait");
}

/// The context of an inflation episode's first arrival.
fn inflation_ctx(rng: &mut ChaCha8Rng) -> Context<'_> {
    Context {
        arrived_milli: Some(0),
        ..Context::new(0.0, rng)
    }
}

/// A decline head that declines every share it is asked about (within its range).
fn always_decline(range: Vec<[f32; 2]>) -> Arc<DeclineHead> {
    let mut weights = vec![0.0; marshal_model::policy::DECLINE_FEATURES];
    weights[0] = 10.0;
    Arc::new(DeclineHead::new(weights, range, "fgd", 0.0))
}

fn wide_range() -> Vec<[f32; 2]> {
    let mut range = vec![[0.0, 1.0]; marshal_model::policy::DECLINE_FEATURES];
    range[7] = [0.0, decline::MAX_WHOLE_GPU_PRESSURE];
    range[8] = [0.0, 10.0];
    range
}

/// A placer on FGD behind an open gate with `model`, and `head`.
fn with_head(
    w: &[Job],
    model: Result<Arc<PolicyScorer>, String>,
    head: Option<Arc<DeclineHead>>,
) -> LearnedPlacer {
    LearnedPlacer::new(build("fgd", w).unwrap().placer, w, model, open_gate()).with_decline(head, w)
}

#[test]
fn the_decline_head_leaves_only_shares_that_would_open_an_idle_gpu_unplaced() {
    let w = workload();
    let topo = cluster();
    let placer = |head| with_head(&w, Err("none".into()), head);
    let share = |m| Job {
        gpu: GpuDemand::Milli(m),
        ..w[0].clone()
    };
    let mut state = ClusterState::new(topo.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let declining = placer(Some(always_decline(wide_range())));
    // An empty cluster: a share opens an idle GPU, so it is declined …
    let err = declining
        .place(&share(600), &mut state, &mut inflation_ctx(&mut rng))
        .unwrap_err();
    assert!(
        matches!(&err, Status::Deferred(why) if why.contains("idle GPU")),
        "{err:?}"
    );
    // … while a whole-GPU job is placed.
    let whole = w[1].clone();
    let p = declining
        .place(&whole, &mut state, &mut inflation_ctx(&mut rng))
        .unwrap();
    state.allocate(&whole, &p).unwrap();
    // Once a GPU is partly used, a share that fits beside it is placed there.
    let first = placer(None)
        .place(&share(600), &mut state, &mut inflation_ctx(&mut rng))
        .unwrap();
    state.allocate(&share(600), &first).unwrap();
    let beside = declining
        .place(&share(300), &mut state, &mut inflation_ctx(&mut rng))
        .unwrap();
    assert_eq!(
        beside.gpu_ids().collect::<Vec<_>>(),
        first.gpu_ids().collect::<Vec<_>>()
    );
    let counts = declining.stats().snapshot();
    assert_eq!((counts.declines, counts.decline_out_of_range), (1, 0));
    // Outside the inflation experiment the pressure is unknown: the head abstains.
    let mut empty = ClusterState::new(topo.clone());
    assert!(
        declining
            .place(&share(600), &mut empty, &mut Context::new(0.0, &mut rng))
            .is_ok()
    );
    let counts = declining.stats().snapshot();
    assert_eq!((counts.declines, counts.decline_out_of_range), (1, 1));
    // A head whose trained range excludes this workload's mix abstains: it places.
    let mut narrow = wide_range();
    narrow[5] = [0.9, 1.0];
    let abstaining = placer(Some(always_decline(narrow)));
    assert!(
        abstaining
            .place(&share(600), &mut state, &mut inflation_ctx(&mut rng))
            .is_ok()
    );
    let counts = abstaining.stats().snapshot();
    assert_eq!((counts.declines, counts.decline_out_of_range), (0, 1));
}

#[test]
fn the_decline_head_acts_on_the_inflation_objective_only_with_its_fallback_and_gate() {
    use std::collections::BTreeMap;
    let model = LearnedModel {
        scorer: Ok(random_scorer(2)),
        gate: open_gate(),
        fallback: BTreeMap::from([("inflation".to_string(), "fgd".to_string())]),
        thresholds: BTreeMap::from([("fgd".to_string(), 0.0), ("best-fit".to_string(), 0.0)]),
        candidates: CandidateSet::Ranked,
        decline: Some(always_decline(wide_range())),
    };
    let inflation = LearnedSetup::with_model(model.clone(), None, "inflation");
    let replay = LearnedSetup::with_model(model.clone(), None, "replay");
    assert!(inflation.decline.is_some() && inflation.decline_warning.is_none());
    assert!(replay.decline.is_none() && replay.decline_warning.is_none());
    // Not with a fallback it was not searched with, nor behind another gate: it says so.
    let other = LearnedSetup::with_model(model.clone(), Some("best-fit"), "inflation");
    assert!(other.decline.is_none());
    assert!(
        other
            .decline_warning
            .as_deref()
            .is_some_and(|w| w.contains("fallback fgd, not best-fit")),
        "{other:?}"
    );
    // Nor one trained on another build's inputs (the seven before the pressures).
    let mut older = model.clone();
    let mut head = (*always_decline(wide_range())).clone();
    head.feature_names.truncate(7);
    head.weights.truncate(7);
    older.decline = Some(Arc::new(head));
    let older = LearnedSetup::with_model(older, None, "inflation");
    assert!(older.decline.is_none());
    assert!(
        older
            .decline_warning
            .as_deref()
            .is_some_and(|w| w.contains("differ") && w.contains("marshal train decline")),
        "{older:?}"
    );
    let mut regated = model;
    regated.thresholds.insert("fgd".into(), 0.3);
    let regated = LearnedSetup::with_model(regated, None, "inflation");
    assert!(regated.decline.is_none());
    assert!(
        regated
            .decline_warning
            .as_deref()
            .is_some_and(|w| w.contains("gate margin of 0")),
        "{regated:?}"
    );
    let w = workload();
    let run = |setup: &LearnedSetup| {
        let (policy, stats) = build_policy(LEARNED, &w, Some(setup)).unwrap();
        let (result, _) =
            run_inflation(&policy, cluster(), &w, "t", &SimConfig::inflation(3)).unwrap();
        (result.gpu_alloc_pct, stats.unwrap().snapshot())
    };
    let (with, counts) = run(&inflation);
    let (without, none) = run(&replay);
    assert!(counts.declines > 0 && none.declines == 0);
    // Every share that would open an idle GPU was left out: another allocation.
    assert_ne!(with, without);
}

#[test]
fn the_pressure_inputs_forecast_whole_gpu_demand_and_compare_cpu_per_gpu() {
    let w = workload();
    let topo = cluster();
    let mut state = ClusterState::new(topo.clone());
    let mix = decline::WorkloadMix::of(&w);
    // 8 × 0.6 + 8 × 1 + 7 × 0.3 + 7 × 2 = 28.9 GPUs, 22 of them whole; 4 cores a task.
    let whole = mix.whole_any_model + mix.whole_given_models;
    assert!((whole - 22.0 / 28.9).abs() < 1e-6, "{mix:?}");
    let capacity = state.capacity_milli();
    let pressure = |state: &ClusterState, arrived| decline::whole_gpu_pressure(state, arrived, mix);
    // Nothing arrived and every GPU idle: the whole mix of the capacity is to come.
    assert!((pressure(&state, Some(0)) - whole).abs() < 1e-6);
    assert!((pressure(&state, Some(capacity / 2)) - whole / 2.0).abs() < 1e-6);
    assert_eq!(pressure(&state, Some(capacity)), 0.0);
    // Outside the inflation experiment it is unknown.
    assert!(pressure(&state, None).is_nan());
    // Fewer idle GPUs, more pressure; capped when they run out.
    let job = Job {
        gpu: GpuDemand::Whole(4),
        ..w[1].clone()
    };
    let fgd = build("fgd", &w).unwrap().placer;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for _ in 0..9 {
        let placement = fgd
            .place(&job, &mut state, &mut Context::new(0.0, &mut rng))
            .unwrap();
        state.allocate(&job, &placement).unwrap();
    }
    assert_eq!(pressure(&state, Some(0)), decline::MAX_WHOLE_GPU_PRESSURE);
    assert!((pressure(&state, Some(capacity * 9 / 10)) - whole * 4.0 / 4.0).abs() < 1e-5);
    // Twice the cores per GPU, twice the CPU pressure; 120 cores for 28.9 GPUs asked,
    // 16 cores per GPU had.
    let heavy: Vec<Job> = w
        .iter()
        .map(|j| Job {
            cpu_milli: j.cpu_milli * 2,
            ..j.clone()
        })
        .collect();
    let light = decline::cpu_pressure(&topo, mix);
    assert!((light - 120.0 / 28.9 / 16.0).abs() < 1e-5, "{light}");
    let doubled = decline::cpu_pressure(&topo, decline::WorkloadMix::of(&heavy));
    assert!((doubled - 2.0 * light).abs() < 1e-5);
}

/// A head that never declines, without a share-ties switch.
fn never_declines() -> DeclineHead {
    let mut weights = vec![0.0; marshal_model::policy::DECLINE_FEATURES];
    weights[0] = -10.0;
    DeclineHead::new(weights, wide_range(), "fgd", 0.0)
}

/// A head that never declines, with a share-ties switch on inside `bounds`.
fn ties_within(bounds: Vec<[f32; 2]>) -> Arc<DeclineHead> {
    let mut head = never_declines();
    head.share_ties = Some(ShareTies::new(bounds));
    Arc::new(head)
}

#[test]
fn the_share_ties_switch_hands_shares_to_fgd_sumsq_where_it_is_on_and_the_network_elsewhere() {
    let w = workload();
    let topo = cluster();
    // A network that decides every decision it is asked (open gate).
    let placer = |head| with_head(&w, Ok(random_scorer(3)), Some(head));
    let everywhere = vec![[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 10.0]];
    let on = placer(ties_within(everywhere.clone()));
    // The workload's multi-GPU share (half its GPU demand) lies outside this box.
    let mut narrow = everywhere;
    narrow[2] = [0.0, 0.4];
    let off = placer(ties_within(narrow));
    let network = placer(Arc::new(never_declines()));
    let sumsq = build("fgd-sumsq", &w).unwrap().placer;
    let mut state = ClusterState::new(topo.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let (mut shares, mut differ) = (0, 0);
    for (i, milli) in [
        600, 300, 700, 200, 500, 400, 300, 600, 100, 800, 250, 450, 350,
    ]
    .into_iter()
    .cycle()
    .take(60)
    .enumerate()
    {
        let job = Job {
            id: JobId(1000 + i as u32),
            gpu: GpuDemand::Milli(milli),
            ..w[0].clone()
        };
        let mut ask = |p: &dyn Placer, state: &mut ClusterState| {
            p.place(&job, state, &mut inflation_ctx(&mut rng)).unwrap()
        };
        let by_network = ask(&network, &mut state);
        let by_sumsq = ask(sumsq.as_ref(), &mut state);
        assert_eq!(ask(&on, &mut state), by_sumsq, "share {i}");
        assert_eq!(ask(&off, &mut state), by_network, "share {i}");
        // Outside the inflation experiment the pressure is unknown: off.
        let outside = on
            .place(&job, &mut state, &mut Context::new(0.0, &mut rng))
            .unwrap();
        assert_eq!(outside, by_network, "share {i}");
        differ += usize::from(by_network != by_sumsq);
        shares += 1;
        state.allocate(&job, &by_network).unwrap();
    }
    assert!(
        differ > 0,
        "the network and fgd-sumsq chose alike on every share"
    );
    let counts = on.stats().snapshot();
    assert_eq!(counts.sum_of_squares_ties, shares);
    // Every share was a fallback decision; the network decided the rest.
    assert_eq!(counts.fallbacks(), shares);
    assert_eq!(off.stats().snapshot().sum_of_squares_ties, 0);
    // Whole GPUs never consult the switch.
    on.place(&w[1], &mut state, &mut inflation_ctx(&mut rng))
        .unwrap();
    assert_eq!(on.stats().snapshot().sum_of_squares_ties, shares);
}

#[test]
fn the_share_ties_artifact_loads_with_its_switch_on_for_default_only_among_its_neighbours() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/policy-share-ties");
    let model = LearnedModel::load(&dir);
    assert!(model.scorer.is_ok(), "{:?}", model.scorer.err());
    let (gate, warning) = model.gate_for("fgd");
    assert_eq!(warning, None);
    let (head, warning) = model.decline_for("fgd", gate.margin_threshold, "inflation");
    assert_eq!(warning, None);
    let ties = head
        .unwrap()
        .share_ties
        .clone()
        .expect("a share-ties switch");
    // openb `default` (whole-GPU any-model share, given models, multi-GPU, CPU pressure)
    // is inside; `multigpu20` and `gpuspec10` are not.
    assert!(ties.on(&[0.715, 0.0, 0.073, 0.815]));
    assert!(!ties.on(&[0.756, 0.0, 0.204, 0.780]));
    assert!(!ties.on(&[0.632, 0.084, 0.073, 0.815]));
}
