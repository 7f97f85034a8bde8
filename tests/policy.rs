//! End-to-end: `marshal train policy`, the learned policy in `sim`/`eval`, and its
//! behaviour on missing, corrupt and mismatched models.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, marshal, stdout_of};
use serde_json::Value;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

/// Trains a tiny policy (small cluster, bundled fixtures, few steps) into `out`.
fn train(out: &Path, seed: &str, extra: &[&str]) {
    let cluster = fixture("small-cluster.toml");
    let openb = format!("{}@{cluster}:inflation", fixture("openb-300.csv"));
    let philly = format!("{}@{cluster}:replay", fixture("philly-150.csv"));
    let out_s = out.display().to_string();
    let traces = format!("{openb},{philly}");
    let mut args = vec![
        "train",
        "policy",
        "--traces",
        &traces,
        "--valid-traces",
        &traces,
        "--out",
        &out_s,
        "--seed",
        seed,
        "--seeds-per-trace",
        "1",
        "--bc-epochs",
        "2",
        "--episodes",
        "2",
        "--episodes-per-iteration",
        "1",
        "--eval-every",
        "1",
        "--hidden",
        "8",
    ];
    args.extend_from_slice(extra);
    let stdout = stdout_of(&args);
    assert!(stdout.contains("trained in"), "{stdout}");
}

/// `train policy` on openb with `extra` options that must be refused before any training
/// (no artifact directory is made); returns the error output.
fn refused_before_training(tmp: &Path, extra: &[&str]) -> String {
    let out = tmp.join("refused").display().to_string();
    let mut args = vec![
        "train",
        "policy",
        "--traces",
        "openb-default",
        "--valid-traces",
        "openb-default",
        "--out",
        &out,
    ];
    args.extend_from_slice(extra);
    let run = marshal(&args);
    assert!(!run.status.success(), "{extra:?} was accepted");
    assert!(!tmp.join("refused").exists());
    String::from_utf8_lossy(&run.stderr).into_owned()
}

/// `marshal eval` of FGD and `model` on the small openb fixture (inflation, 2 seeds) in
/// `format`, with `extra` arguments; asserts it succeeded.
fn eval_output(model: &Path, format: &str, extra: &[&str]) -> std::process::Output {
    let cluster = fixture("small-cluster.toml");
    let trace = fixture("openb-300.csv");
    let model = model.display().to_string();
    let mut args = vec![
        "eval",
        "--policies",
        "fgd,learned",
        "--trace",
        &trace,
        "--cluster",
        &cluster,
        "--mode",
        "inflation",
        "--seeds",
        "2",
        "--format",
        format,
        "--model",
        &model,
    ];
    args.extend_from_slice(extra);
    let out = marshal(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn eval_json(model: &Path, extra: &[&str]) -> (Vec<Value>, String) {
    let out = eval_output(model, "json", extra);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v.as_array().unwrap().clone(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn training_writes_a_checked_artifact_with_curves_and_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    train(&a, "7", &[]);
    train(&b, "7", &[]);
    for f in [
        "weights.bpk",
        "config.json",
        "normalization.json",
        "meta.json",
        "curves.csv",
        "training.json",
    ] {
        assert!(a.join(f).exists(), "{f} missing");
    }
    // The weight files also hold burn's parameter ids, which are random per process; the
    // weights themselves must be identical.
    let (wa, wb) = (
        marshal_model::policy::load_policy(&a).unwrap(),
        marshal_model::policy::load_policy(&b).unwrap(),
    );
    assert!(wa.scorer == wb.scorer, "same seed, same weights");
    let curves = std::fs::read_to_string(a.join("curves.csv")).unwrap();
    assert!(
        curves.contains("clone,") && curves.contains("reinforce,"),
        "{curves}"
    );

    // The trained model serves: the learned policy reports its fallback rate, and its
    // schedule is valid (the simulator refuses invalid placements) and complete.
    let (runs, stderr) = eval_json(&a, &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    let learned = &runs[1]["mean"];
    let rate = learned["fallback_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&rate));
    assert!(runs[0]["mean"].get("fallback_rate").is_none());
    assert!(learned["unallocated_gpus_at_100"].as_f64().is_some());
}

#[test]
fn the_snapshot_and_gate_can_be_chosen_on_several_validation_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    train(&out, "7", &["--valid-seeds-per-trace", "2"]);
    let training: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("training.json")).unwrap()).unwrap();
    assert_eq!(training["valid_seeds"], serde_json::json!([2007, 2008]));
    let episodes: Vec<&str> = training["validation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["episode"].as_str().unwrap())
        .collect();
    assert_eq!(
        episodes.len(),
        4,
        "two traces, two seeds each: {episodes:?}"
    );
    assert!(
        episodes.iter().any(|e| e.ends_with("seed 2008")),
        "{episodes:?}"
    );
}

#[test]
fn a_policy_trained_on_wide_candidates_records_and_serves_them() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("w");
    train(&out, "7", &["--candidates", "wide"]);
    let meta = std::fs::read_to_string(out.join("meta.json")).unwrap();
    assert!(meta.contains("\"candidates\": \"wide\""), "{meta}");
    let model = marshal_scheduler::policies::learned::LearnedModel::load(&out);
    assert!(model.scorer.is_ok());
    assert_eq!(model.candidates, marshal_model::policy::CandidateSet::Wide);
    let (runs, stderr) = eval_json(&out, &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        runs[1]["mean"]["unallocated_gpus_at_100"]
            .as_f64()
            .is_some()
    );
    // An unknown set is refused before any training, naming the choices.
    let stderr = refused_before_training(tmp.path(), &["--candidates", "all"]);
    assert!(stderr.contains("`ranked` or `wide`"), "{stderr}");
}

#[test]
fn ppo_trains_records_its_settings_and_refuses_a_bad_clip() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    train(
        &out,
        "3",
        &[
            "--policy-gradient",
            "ppo",
            "--ppo-epochs",
            "2",
            "--ppo-clip",
            "0.1",
        ],
    );
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["training"]["ppo_epochs"], 2.0);
    assert!((meta["training"]["ppo_clip"].as_f64().unwrap() - 0.1).abs() < 1e-6);
    let (runs, stderr) = eval_json(&out, &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(runs[1]["mean"]["fallback_rate"].as_f64().is_some());
    // A clip PPO cannot use is refused before any episode is loaded or run.
    let stderr = refused_before_training(
        tmp.path(),
        &["--policy-gradient", "ppo", "--ppo-clip", "1.5"],
    );
    assert!(stderr.contains("--ppo-clip"), "{stderr}");
}

#[test]
fn a_missing_corrupt_or_mismatched_model_is_reported_and_the_fallback_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("none");
    let corrupt: PathBuf = tmp.path().join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("meta.json"), "{\"schema_version\": 1, trunc").unwrap();
    let other = tmp.path().join("other-schema");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("meta.json"), r#"{"schema_version": 999}"#).unwrap();
    for (dir, needle) in [
        (&missing, "missing"),
        (&corrupt, "corrupt"),
        (&other, "schema version 999"),
    ] {
        let (runs, stderr) = eval_json(dir, &[]);
        assert!(
            stderr.contains("learned policy") && stderr.contains(needle),
            "{stderr}"
        );
        let (fgd, learned) = (&runs[0]["mean"], &runs[1]["mean"]);
        assert_eq!(learned["fallback_rate"].as_f64(), Some(1.0));
        assert_eq!(
            fgd["unallocated_gpus_at_100"], learned["unallocated_gpus_at_100"],
            "without a model the learned policy is its fallback"
        );
    }
    // An explicit fallback is honoured.
    let (runs, _) = eval_json(&missing, &["--fallback", "best-fit"]);
    assert_eq!(runs[1]["mean"]["fallback_rate"].as_f64(), Some(1.0));
}

#[test]
fn a_gate_is_chosen_per_fallback_and_a_model_is_promoted_only_if_it_wins() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    train(&a, "5", &[]);
    let a_s = a.display().to_string();
    // The tiny model was gated for FGD: with best fit nobody chose a threshold, so it
    // says so and every decision falls back.
    let (runs, stderr) = eval_json(&a, &["--fallback", "best-fit"]);
    assert!(
        stderr.contains("no gate threshold for fallback best-fit"),
        "{stderr}"
    );
    assert_eq!(runs[1]["mean"]["fallback_rate"].as_f64(), Some(1.0));

    // `marshal train gate` chooses one on validation episodes and records it.
    let openb = format!(
        "{}@{}:inflation",
        fixture("openb-300.csv"),
        fixture("small-cluster.toml")
    );
    let out = stdout_of(&[
        "train",
        "gate",
        "--model",
        &a_s,
        "--fallback",
        "best-fit",
        "--valid-traces",
        &openb,
        "--seeds",
        "2000,2001",
    ]);
    assert!(out.contains("gate for fallback best-fit"), "{out}");
    let meta: Value = serde_json::from_slice(&std::fs::read(a.join("meta.json")).unwrap()).unwrap();
    let gate = &meta["gates"]["best-fit"];
    assert!(gate["margin_threshold"].as_f64().is_some(), "{meta}");
    assert_eq!(gate["episodes"].as_array().unwrap().len(), 2);
    assert!(
        gate["scores"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.ends_with("seed_2001/gated")),
        "{gate}"
    );
    let (_, stderr) = eval_json(&a, &["--fallback", "best-fit"]);
    assert!(!stderr.contains("warning"), "{stderr}");

    // Promotion: the same model against itself wins nowhere, so nothing is installed.
    let current = tmp.path().join("current");
    std::fs::create_dir_all(&current).unwrap();
    for e in std::fs::read_dir(&a).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), current.join(e.file_name())).unwrap();
    }
    let cur_s = current.display().to_string();
    let before = std::fs::read(current.join("meta.json")).unwrap();
    let promote = [
        "model",
        "promote",
        "--candidate",
        &a_s,
        "--current",
        &cur_s,
        "--valid-traces",
        &openb,
    ];
    let out = stdout_of(&promote);
    assert!(
        out.contains("not promoted") && out.contains("is unchanged"),
        "{out}"
    );
    assert_eq!(std::fs::read(current.join("meta.json")).unwrap(), before);
    let record: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("current.promotion.json")).unwrap())
            .unwrap();
    assert_eq!(record["promoted"], Value::Bool(false));
    assert_eq!(record["traces"].as_array().unwrap().len(), 1);
    // A corrupt candidate is refused with the reason, and current stays as it was.
    std::fs::write(a.join("weights.bpk"), b"truncated").unwrap();
    common::fails_with(&promote, "checksum");
    assert_eq!(std::fs::read(current.join("meta.json")).unwrap(), before);
}

#[test]
fn a_decline_head_is_searched_recorded_and_used_by_eval_on_inflation_only() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    train(&a, "5", &[]);
    let a_s = a.display().to_string();
    let cluster = fixture("small-cluster.toml");
    let openb = format!("{}@{cluster}:inflation", fixture("openb-300.csv"));
    let philly = format!("{}@{cluster}:replay", fixture("philly-150.csv"));
    let decline = |traces: &str| {
        vec![
            "train".to_string(),
            "decline".into(),
            "--model".into(),
            a_s.clone(),
            "--traces".into(),
            traces.to_string(),
            "--valid-traces".into(),
            openb.clone(),
            "--iterations".into(),
            "2".into(),
            "--population".into(),
            "4".into(),
            "--elite".into(),
            "2".into(),
            "--threads".into(),
            "2".into(),
        ]
    };
    let args = decline(&philly);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(&args, "inflation episodes only");

    let args = decline(&openb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = stdout_of(&args);
    assert!(
        out.contains("iteration  1:") && out.contains("validation"),
        "{out}"
    );
    let meta: Value = serde_json::from_slice(&std::fs::read(a.join("meta.json")).unwrap()).unwrap();
    let (runs, stderr) = eval_json(&a, &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    // Recorded or not, the command says which, and eval reports the declines of a
    // recorded head (none without one).
    match meta.get("decline") {
        Some(head) => {
            assert!(out.contains("decline head recorded"), "{out}");
            assert_eq!(
                head["weights"].as_array().unwrap().len(),
                marshal_model::policy::DECLINE_FEATURES,
                "{head}"
            );
            assert!(
                runs[1]["mean"]["declined_shares"].as_f64().is_some(),
                "{runs:?}"
            );
        }
        None => {
            assert!(out.contains("no decline head recorded"), "{out}");
            assert!(runs[1]["mean"].get("declined_shares").is_none(), "{runs:?}");
        }
    }

    // A head that declines every share it is asked about, written by hand for the
    // artifact's fallback and gate: eval reports its declines, in JSON and in the table,
    // and with another fallback it is not used and says why.
    let meta_path = a.join("meta.json");
    let mut meta: Value = serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    let names = marshal_model::policy::DECLINE_FEATURE_NAMES;
    meta["decline"] = serde_json::json!({
        "feature_names": names,
        "weights": [10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        "input_range": [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0],
                        [0.0, 1.0], [0.0, 1.0], [0.0, 3.0], [0.0, 10.0]],
        "margin_threshold": 0.0,
        "fallback": "fgd",
        "network_margin_threshold": meta["margin_threshold"].clone(),
        "training": {},
        "scores": {},
    });
    std::fs::write(&meta_path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    let (runs, stderr) = eval_json(&a, &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    let declined = runs[1]["mean"]["declined_shares"].as_f64().unwrap();
    assert!(declined > 0.0, "{runs:?}");
    assert_ne!(
        runs[0]["mean"]["unallocated_gpus_at_100"], runs[1]["mean"]["unallocated_gpus_at_100"],
        "{runs:?}"
    );
    let table = String::from_utf8(eval_output(&a, "table", &[]).stdout).unwrap();
    assert!(
        table.contains(&format!("the decline head left {declined:.1} GPU shares")),
        "{table}"
    );
    let (runs, stderr) = eval_json(&a, &["--fallback", "best-fit"]);
    assert!(
        stderr.contains("the decline head was searched with fallback fgd, not best-fit"),
        "{stderr}"
    );
    assert!(runs[1]["mean"].get("declined_shares").is_none(), "{runs:?}");
}
