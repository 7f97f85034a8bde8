//! End-to-end: `marshal train policy`, the learned policy in `sim`/`eval`, and its
//! behaviour on missing, corrupt and mismatched models.

mod common;

use std::path::{Path, PathBuf};

use common::{marshal, stdout_of};
use serde_json::Value;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

/// Trains a tiny policy (small cluster, bundled fixtures, few steps) into `out`.
fn train(out: &Path, seed: &str) {
    let cluster = fixture("small-cluster.toml");
    let openb = format!("{}@{cluster}:inflation", fixture("openb-300.csv"));
    let philly = format!("{}@{cluster}:replay", fixture("philly-150.csv"));
    let out_s = out.display().to_string();
    let stdout = stdout_of(&[
        "train",
        "policy",
        "--traces",
        &format!("{openb},{philly}"),
        "--valid-traces",
        &format!("{openb},{philly}"),
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
    ]);
    assert!(stdout.contains("trained in"), "{stdout}");
}

fn eval_json(model: &Path, extra: &[&str]) -> (Vec<Value>, String) {
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
        "json",
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
    train(&a, "7");
    train(&b, "7");
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
