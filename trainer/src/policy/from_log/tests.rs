use marshal_model::policy::{
    CANDIDATE_FEATURES, DecisionFeatures, FeatureStats, JOB_FEATURES, POLICY_SCHEMA_VERSION,
    PolicyConfig, load_policy,
};
use marshal_scheduler::decision_log::{
    DecisionLog, LogBatch, LogOptions, LoggedFeatures, read_decision_log,
};

use super::*;

/// Two candidates told apart by slot 4 (the fast one has 1, the slow one −1).
fn decision(i: usize) -> DecisionFeatures {
    let mut fast = [0.0; CANDIDATE_FEATURES];
    let mut slow = [0.0; CANDIDATE_FEATURES];
    fast[4] = 1.0;
    slow[4] = -1.0;
    DecisionFeatures {
        job: [(i % 4) as f32; JOB_FEATURES],
        candidates: vec![fast, slow],
    }
}

fn row(id: u64, name: &str, taken: usize, path: &str) -> DecisionRow {
    DecisionRow {
        decision_id: id,
        job_id: id.to_string(),
        job_name: name.into(),
        workers: 1,
        gpu_kind: "whole".into(),
        gpu_milli_per_worker: 1000,
        verdict: "place".into(),
        path: path.into(),
        policy: "learned".into(),
        features: Some(LoggedFeatures::of(&decision(id as usize), taken)),
        ..DecisionRow::default()
    }
}

fn outcome(id: u64, state: &str, run_s: Option<f64>) -> OutcomeRow {
    OutcomeRow {
        decision_id: id,
        job_id: id.to_string(),
        state: state.into(),
        at_us: id as i64,
        wait_s: 3.0,
        run_s,
    }
}

#[test]
fn every_row_is_accounted_for_and_faster_runs_weigh_more() {
    let mut heuristic = row(5, "x", 0, "heuristic:topo-pack");
    heuristic.features = None;
    let mut other_layout = row(6, "x", 0, "learned");
    other_layout.features.as_mut().unwrap().version = POLICY_SCHEMA_VERSION + 1;
    let data = DecisionLogData {
        decisions: vec![
            row(1, "resnet", 0, "learned"),
            row(2, "resnet", 1, "fallback:low-margin"),
            row(3, "lonely", 0, "learned"),
            row(4, "running", 0, "learned"),
            heuristic,
            other_layout,
            row(7, "failed", 0, "learned"),
        ],
        outcomes: vec![
            outcome(1, "COMPLETED", Some(100.0)),
            outcome(2, "COMPLETED", Some(400.0)),
            outcome(3, "COMPLETED", Some(50.0)),
            outcome(5, "COMPLETED", Some(10.0)),
            outcome(6, "COMPLETED", Some(10.0)),
            outcome(7, "FAILED", Some(10.0)),
        ],
        files: 0,
        skipped: Vec::new(),
        database: None,
    };
    let opts = LogTrainOptions::default();
    let (samples, report) = log_samples(&data, &opts);
    assert_eq!(report.decisions, 7);
    assert_eq!(report.used, 3);
    assert_eq!(report.no_features, 1);
    assert_eq!(report.no_outcome, 1);
    assert_eq!(report.not_completed, 1);
    assert_eq!(report.unusable, 1);
    assert!(report.first_unusable.unwrap().contains("layout"));
    assert_eq!(report.learned_path, 2);
    assert_eq!(report.own_group, 2);
    // resnet: baseline ln 200; 100 s is ln 2 faster → e^(ln 2 / 0.5) = 4; 400 s → 1/4.
    assert_eq!(samples[0].chosen, 0);
    assert!((samples[0].ret - 4.0).abs() < 1e-4, "{}", samples[0].ret);
    assert_eq!(samples[1].chosen, 1);
    assert!((samples[1].ret - 0.25).abs() < 1e-4, "{}", samples[1].ret);
    // "lonely" has no group of its own; the 1-GPU group is resnet's two and itself:
    // baseline (ln 100 + ln 400 + ln 50) / 3 = ln 126, 50 s is faster → weight > 1, capped.
    assert!(samples[2].ret > 1.0 && samples[2].ret <= opts.max_weight as f32);
}

#[test]
fn retraining_from_a_written_log_moves_the_policy_towards_faster_placements() {
    let tmp = tempfile::tempdir().unwrap();
    // An initial policy cloned to prefer the slow candidate.
    let init = tmp.path().join("init");
    let cloned: Vec<Sample> = (0..200)
        .map(|i| Sample {
            decision: decision(i),
            chosen: 1,
            ret: 0.0,
        })
        .collect();
    let refs: Vec<&DecisionFeatures> = cloned.iter().map(|s| &s.decision).collect();
    let config = PolicyConfig::new().with_hidden_size(16).with_batch_size(64);
    let mut learner = PolicyLearner::new(config, FeatureStats::fit(&refs)).unwrap();
    for _ in 0..15 {
        learner.clone_epoch(&cloned).unwrap();
    }
    let mut meta = PolicyMeta::new(0.3, 7.0);
    meta.fallback.insert("replay".into(), "topo-pack".into());
    save_policy(
        &init,
        &learner.network(),
        learner.config(),
        learner.stats(),
        meta,
    )
    .unwrap();
    let before = load_policy(&init)
        .unwrap()
        .scorer
        .score(&decision(0))
        .unwrap();
    assert!(before.probs[1] > 0.7, "{before:?}");

    // A log in which the same recurring jobs ran both ways: fast when placed on
    // candidate 0, four times slower on candidate 1.
    let log_dir = tmp.path().join("log");
    let log = DecisionLog::open(&log_dir, LogOptions::default());
    for id in 1..=400u64 {
        let taken = (id % 2) as usize;
        log.send(LogBatch {
            decisions: vec![row(id, &format!("job-{}", id % 10), taken, "learned")],
            outcomes: vec![outcome(
                id,
                "COMPLETED",
                Some(if taken == 0 { 100.0 } else { 400.0 }),
            )],
        });
    }
    assert_eq!(log.finish().write_errors, 0);
    let data = read_decision_log(&log_dir).unwrap();

    let out = tmp.path().join("out");
    let opts = LogTrainOptions {
        epochs: 30,
        learning_rate: 5e-3,
        ..LogTrainOptions::default()
    };
    let mut seen = 0;
    let trained = retrain_from_log(&init, &data, &out, &opts, &mut |_, _| seen += 1).unwrap();
    assert_eq!(seen, 30);
    assert_eq!(trained.report.used, 400);
    let after = load_policy(&out).unwrap();
    let p = after.scorer.score(&decision(0)).unwrap();
    assert!(p.probs[0] > 0.6, "before {before:?}, after {p:?}");
    // The gate and fallback come from the initial artifact; the log is recorded.
    assert_eq!(after.meta.margin_threshold, 0.3);
    assert_eq!(after.meta.fallback["replay"], "topo-pack");
    assert_eq!(after.meta.training["log_samples"], 400.0);
    assert!(after.meta.training_data_hash.starts_with("decision-log:"));

    // Same seed, same weights.
    let again = tmp.path().join("again");
    retrain_from_log(&init, &data, &again, &opts, &mut |_, _| {}).unwrap();
    assert_eq!(load_policy(&again).unwrap().scorer, after.scorer);

    // Nothing usable, or a bad initial model: errors that say so.
    let empty = DecisionLogData::default();
    let err = retrain_from_log(&init, &empty, &again, &opts, &mut |_, _| {}).unwrap_err();
    assert!(err.contains("no usable decisions"), "{err}");
    let err = retrain_from_log(&log_dir, &data, &again, &opts, &mut |_, _| {}).unwrap_err();
    assert!(err.contains("initial policy"), "{err}");
    // Never over the initial artifact, however its path is spelled.
    let init_again = tmp.path().join("log/../init");
    let before_files = std::fs::read(init.join("meta.json")).unwrap();
    let err = retrain_from_log(&init, &data, &init_again, &opts, &mut |_, _| {}).unwrap_err();
    assert!(err.contains("is the initial artifact"), "{err}");
    assert_eq!(std::fs::read(init.join("meta.json")).unwrap(), before_files);
}

/// Rows of another feature layout keep their `features_version` through the Parquet
/// files (the reader stamps nothing on them) and are refused by the trainer, counted and
/// named with both versions; rows of this build's layout beside them are used.
#[test]
fn rows_of_another_feature_layout_in_a_written_log_are_counted_and_named_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let log = DecisionLog::open(tmp.path(), LogOptions::default());
    let other = POLICY_SCHEMA_VERSION + 1;
    for id in 1..=4u64 {
        let mut r = row(id, "resnet", 0, "learned");
        if id > 2 {
            r.features.as_mut().unwrap().version = other;
        }
        log.send(LogBatch {
            decisions: vec![r],
            outcomes: vec![outcome(id, "COMPLETED", Some(100.0))],
        });
    }
    assert_eq!(log.finish().write_errors, 0);
    let data = read_decision_log(tmp.path()).unwrap();
    let versions: Vec<u32> = data
        .decisions
        .iter()
        .map(|d| d.features.as_ref().unwrap().version)
        .collect();
    assert_eq!(
        versions,
        [POLICY_SCHEMA_VERSION, POLICY_SCHEMA_VERSION, other, other]
    );
    let (samples, report) = log_samples(&data, &LogTrainOptions::default());
    assert_eq!((report.used, report.unusable), (2, 2));
    assert_eq!(samples.len(), 2);
    assert_eq!(
        report.first_unusable.unwrap(),
        format!("decision 3: feature layout {other} (this build reads {POLICY_SCHEMA_VERSION})")
    );
}

#[test]
fn options_are_validated() {
    let ok = LogTrainOptions::default();
    assert!(ok.validate().is_ok());
    for bad in [
        LogTrainOptions {
            epochs: 0,
            ..ok.clone()
        },
        LogTrainOptions {
            beta: 0.0,
            ..ok.clone()
        },
        LogTrainOptions {
            max_weight: 0.5,
            ..ok.clone()
        },
        LogTrainOptions {
            learning_rate: f64::NAN,
            ..ok.clone()
        },
        LogTrainOptions {
            min_group: 1,
            ..ok.clone()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}
